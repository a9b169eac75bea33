#pragma once
// Launch API of the fused LayerNorm kernels (cuda/layernorm.cu). Plain C++:
// ops/layernorm.cpp calls these for CUDA tensors in fused mode, after it has
// validated shapes and allocated every output on the GPU.
#include "core/tensor.hpp"
#include "cuda/layernorm_table.hpp"

namespace hg::gpu {

// x, y: (rows, D) contiguous, both F32 or both BF16 (math in float32).
// gamma, beta: (D,) F32. mean, rstd: (rows,) F32, written for backward.
// Runs the production table of this device's memory system.
void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd);

// How a backward stores dgamma / dbeta. Overwrite: the column sums.
// Accumulate: each sum, computed exactly as for Overwrite, added once in
// float32 to what the tensor holds, in the kernel that makes the sum: bitwise
// the elementwise add (grad + dgamma) of an overwritten temporary, without
// the temporary and the add's launch (a module adds into gamma.grad).
enum class ParamGradWrite { Overwrite, Accumulate };

// dy, x, dx: (rows, D), all F32 or all BF16. gamma (D,) F32; mean, rstd (rows,) F32.
// dgamma, dbeta: (D,) F32, written as `write` says. Deterministic: per-block
// partial sums reduced by a second kernel in a fixed order (no float atomics).
void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                              ParamGradWrite write = ParamGradWrite::Overwrite);

// The same with a given kernel configuration for 16-byte aligned rows of
// D <= 16384 (other rows run the chunked, cluster or scalar kernels, as
// above): tests and benchmarks run every table entry this way on one
// device, e.g. with ln_production_kernel(MemorySystem::HBM3, ...). A
// configuration not compiled for the pass, dtype and width class
// (ln_kernel_compiled) is an hg::Error naming the ones that are.
void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd, const LnKernel& kernel);
void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, const LnKernel& kernel,
                              ParamGradWrite write = ParamGradWrite::Overwrite);

// This device's memory system (by gpu::dram_peak_gbps against kHbm3eGbps):
// the table the two production calls above run.
MemorySystem device_memory_system();

}  // namespace hg::gpu
