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
// dimension); bias gradients that cuBLASLt cannot fuse for a combination are
// summed by a deterministic kernel after the GEMM instead.
void gemm_lt(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args, const MatmulShape& shape);

}  // namespace hg::gpu
