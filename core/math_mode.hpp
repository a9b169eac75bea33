#pragma once

namespace hg {

// Whether float32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs,
// float32 accumulation). Off by default: an fp32 model gets exact FP32
// GEMMs (CUBLAS_COMPUTE_32F) unless the user asks for speed over precision
// (train / bench_train --tf32). Read by the CUDA backend at each GEMM.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace hg
