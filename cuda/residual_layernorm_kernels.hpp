#pragma once
// Launch API of the fused residual add + LayerNorm kernels
// (cuda/residual_layernorm.cu). Plain C++: ops/residual_layernorm.cpp calls
// these for CUDA tensors in fused mode after validating every input and
// allocating every output.
#include "core/tensor.hpp"

namespace hg::gpu {

// x, r, h, y: (rows, D), all F32 or all BF16; gamma, beta (D,) F32; mean,
// rstd (rows,) F32. h = x + r (rounded to the storage dtype), y = LN(h) of
// that stored h, statistics in float32 (corrected two-pass mean). h may be
// x or r (in place).
void residual_layernorm_forward_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                      float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);

// dh = dh_in + LN_backward(dy) in one pass (dh_in may be nullptr: no residual
// gradient; dh may be *dh_in). dy, h, dh, *dh_in: (rows, D) of h's dtype; dgamma, dbeta (D,)
// F32, overwritten, summed deterministically (per-block partials, then a
// fixed-order column sum; no float atomics).
void residual_layernorm_backward_fused(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                       Tensor& dbeta);

}  // namespace hg::gpu
