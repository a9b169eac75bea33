#pragma once
// Backend::gemm on the GPU through cuBLASLt (cuda/gemm_lt.cu). Plain C++:
// cuda/cuda_backend.cu calls it after check_gemm (core/gemm_check.hpp).
#include "core/backend.hpp"
#include "core/matmul_shape.hpp"

namespace hg::gpu {

// a, b: F32 or BF16 (one dtype); out: their dtype, or F32 for BF16 inputs.
// fp32 accumulation (CUBLAS_COMPUTE_32F; _FAST_TF32 for F32 inputs when
// hg::allow_tf32()). One plan (descriptors + heuristic's algorithm) is cached
// per shape / dtype / epilogue / alignment; the workspace is one block from
// the caching allocator, held for the life of the process (safe to capture
// in a CUDA graph). GELU epilogues need N % 8 == 0 (cuBLASLt's aux leading
// dimension); bias gradients are summed by deterministic kernels after the
// GEMM (cuda/column_sum_kernels.hpp), written or added (bias_grad_accumulate).
void gemm_lt(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args, const MatmulShape& shape);

}  // namespace hg::gpu
