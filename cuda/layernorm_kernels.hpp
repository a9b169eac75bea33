#pragma once
// Launch API of the fused LayerNorm kernels (cuda/layernorm.cu). Plain C++:
// ops/layernorm.cpp calls these for CUDA tensors in fused mode, after it has
// validated shapes and allocated every output on the GPU.
#include "core/tensor.hpp"

namespace hg::gpu {

// x, y: (rows, D) contiguous, both F32 or both BF16 (math in float32).
// gamma, beta: (D,) F32. mean, rstd: (rows,) F32, written for backward.
void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             Tensor& y, Tensor& mean, Tensor& rstd);

// dy, x, dx: (rows, D), all F32 or all BF16. gamma (D,) F32; mean, rstd (rows,) F32.
// dgamma, dbeta: (D,) F32, overwritten. Deterministic: per-block partial sums
// reduced by a second kernel in a fixed order (no float atomics).
void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dgamma,
                              Tensor& dbeta);

}  // namespace hg::gpu
