// The launcher of the GELU backward GEMM on sm_90a
// (cuda/gelu_backward_gemm_kernel.cuh). Only an sm_90a compile holds the
// device code (cuda/CMakeLists.txt builds this file for 90a where the build
// targets 90); elsewhere the kernel body is empty and no call applies.
#include <cuda.h>  // CUtensorMap, CUresult (types only: the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gelu_backward_gemm.hpp"
#include "cuda/gelu_backward_gemm_kernel.cuh"
#include "cuda/launch.cuh"
#include "cuda/tensor_map.cuh"

namespace hg::gpu {
namespace {

std::atomic<bool> allowed{true};
std::atomic<int64_t> runs{0};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

CUtensorMap matrix_map(const void* p, int64_t cols, int64_t rows, int box_rows, const char* name) {
  CUtensorMap map;
  const CUresult r = encode_matrix_map(&map, p, int(cols), int(rows), cols, box_rows);
  HG_CHECK(r == CUDA_SUCCESS, "cuda gemm GeluBackward", "cuTensorMapEncodeTiled refused ", name, " (error ", int(r),
           "; ", rows, " x ", cols, ")");
  return map;
}

}  // namespace

void allow_wgmma_gelu_backward(bool a) { allowed.store(a); }

int64_t wgmma_gelu_backward_runs() { return runs.load(); }

int64_t gelu_backward_wgmma_sum_rows(int64_t m) { return (m + gelu_gemm::kRows - 1) / gelu_gemm::kRows; }

bool gelu_backward_wgmma_applies(const void* dy, const void* w, const void* pre, const void* out, int64_t m, int64_t n,
                                 int64_t k) {
#if defined(HG_WGMMA_BUILT)
  static const bool device_ok = compute_capability() == 90 && tensor_map_encoder() != nullptr;
  return allowed.load() && device_ok && m >= 1 && n >= 8 && k >= 8 && n % 8 == 0 && k % 8 == 0 &&
         n <= INT32_MAX && k <= INT32_MAX && gelu_backward_wgmma_sum_rows(m) <= 65535 && aligned16(dy) &&
         aligned16(w) && aligned16(pre) && aligned16(out);
#else
  (void)dy, (void)w, (void)pre, (void)out, (void)m, (void)n, (void)k;
  return false;
#endif
}

void gelu_backward_wgmma(const void* dy, const void* w, const void* pre, void* out, float* col_sums, int64_t m,
                         int64_t n, int64_t k) {
  HG_CHECK(gelu_backward_wgmma_applies(dy, w, pre, out, m, n, k), "cuda gemm GeluBackward",
           "the wgmma kernel does not apply to m ", m, ", n ", n, ", k ", k);
  using namespace gelu_gemm;
  const CUtensorMap amap = matrix_map(dy, k, m, kRows, "dy");
  const CUtensorMap bmap = matrix_map(w, n, k, kDepth, "W");
  const CUtensorMap pmap = matrix_map(pre, n, m, kRows, "pre");
  const Args args{static_cast<bf16*>(out), col_sums, int(m), int(n), int(k)};
  static const bool configured = [] {
    allow_dynamic_smem(gelu_backward_gemm_kernel, Plan::kSmem);
    // Two blocks a SM need the most shared memory the SM gives (2 x 101 KB).
    HG_CUDA_CHECK(cudaFuncSetAttribute(gelu_backward_gemm_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned((n + kCols - 1) / kCols), unsigned(gelu_backward_wgmma_sum_rows(m)));
  gelu_backward_gemm_kernel<<<grid, kThreads, Plan::kSmem, stream()>>>(amap, bmap, pmap, args);
  HG_CUDA_CHECK_LAUNCH("gelu_backward_gemm");
  runs.fetch_add(1);
}

}  // namespace hg::gpu
