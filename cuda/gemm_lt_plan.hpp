#pragma once
// What cuda/gemm_lt.cu and cuda/gemm_algorithm_choice.cu share: the
// cuBLASLt handle and workspaces, one cached plan (descriptors and the kept
// algorithm) and the call it serves. Internal to the CUDA backend.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

#include "core/backend.hpp"
#include "core/matmul_shape.hpp"
#include "cuda/cublas_handle.hpp"

namespace hg::gpu::gemm_lt_detail {

// cuBLASLt's recommendation for Hopper; held for the life of the process, so
// the same pointer is used by every launch (and by a captured CUDA graph).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cublasLtHandle_t lt_handle();
// One per stream a GEMM may run on: handgrad's, and a Beside's, whose GEMMs
// can run at the same time (core/cuda_runtime.hpp).
void* workspace();

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_d = nullptr;  // cuBLASLt's A = our b, B = our a
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

struct Call {
  const Tensor& a;
  const Tensor& b;
  Tensor& out;
  const GemmArgs& args;
  const MatmulShape& s;
  cublasLtEpilogue_t epilogue;
  const Tensor* vec;  // bias (read) or bias gradient (written), or nullptr
};

// The largest of 16, 8, 4 and 2 bytes that p is aligned to: cuBLASLt's
// candidates depend on it, so plans (and saved choices) are kept per alignment.
inline int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  for (int a : {16, 8, 4})
    if (v % a == 0) return a;
  return 2;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  HG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

// Whether the handgrad stream is being captured into a CUDA graph (nothing
// can be timed then).
bool stream_capturing();

// GemmAlgorithms::Measured (cuda/gemm_algorithm_choice.cu): the index of the
// fastest of the heuristic's `found` candidates, timed on the call's
// operands into scratch buffers and recorded (hg::gemm_algorithm_choices);
// 0, the heuristic's first, when scratch memory is short.
int fastest_candidate(Plan& p, const Call& c, const cublasLtMatmulHeuristicResult_t* results, int found);

}  // namespace hg::gpu::gemm_lt_detail
