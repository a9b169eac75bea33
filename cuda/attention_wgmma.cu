// The BF16 flash attention forward on sm_90a (wgmma + TMA): the library's
// launcher of the kernel in cuda/attention_wgmma_kernel.cuh (which the
// attention lab runs too, as its forward variant 9). Only an sm_90a compile
// holds the device code (cuda/CMakeLists.txt builds this file for 90a where
// the build targets 90); elsewhere the kernel body is empty and
// wgmma_forward_available() says no.
#include <cuda.h>  // CUtensorMap, CUresult (types only: the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/attention_tensor_map.cuh"
#include "cuda/attention_wgmma.cuh"
#include "cuda/attention_wgmma_kernel.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"

namespace hg::gpu::attn {
namespace {

// The map of a bf16 operand (cuda/attention_tensor_map.cuh). The caller
// checked what TMA needs (16-byte aligned base and byte strides); a refusal
// is an error.
CUtensorMap make_map(const void* p, int dh, int rows, int heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                     int64_t batch_stride, int box_rows, const char* name) {
  CUtensorMap map;
  const CUresult r = encode_map(&map, p, dh, rows, heads, batch, row_stride, head_stride, batch_stride, box_rows);
  HG_CHECK(r == CUDA_SUCCESS, "attention_forward", "cuTensorMapEncodeTiled refused ", name, " (error ", int(r), "; dh ",
           dh, ", rows ", rows, ", heads ", heads, ", batch ", batch, ", element strides ", row_stride, ", ",
           head_stride, ", ", batch_stride, ")");
  return map;
}

template <int DH>
void launch(const Args& a, int64_t batch) {
  const CUtensorMap qmap = make_map(a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, kRows, "q");
  const CUtensorMap kmap = make_map(a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kKeys, "k");
  const CUtensorMap vmap = make_map(a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kKeys, "v");
  const auto kernel = forward_wgmma_kernel<DH>;
  allow_dynamic_smem(kernel, Plan<DH>::kSmem);
  const dim3 grid(unsigned((a.tq + kRows - 1) / kRows), unsigned(batch * a.heads));
  kernel<<<grid, kThreadsPerBlock, Plan<DH>::kSmem, stream()>>>(qmap, kmap, vmap, a);
  HG_CUDA_CHECK_LAUNCH("attention_forward_wgmma");
}

}  // namespace

bool wgmma_forward_available() {
#if defined(HG_WGMMA_BUILT)
  static const bool ok = compute_capability() == 90 && tensor_map_encoder() != nullptr;
  return ok;
#else
  return false;
#endif
}

void forward_wgmma(const Args& a, int64_t batch, int dh) {
  HG_CHECK(dh == 64 || dh == 128, "attention_forward", "the wgmma forward has head dims 64 and 128, not ", dh);
  if (dh == 64) launch<64>(a, batch);
  else launch<128>(a, batch);
}

}  // namespace hg::gpu::attn
