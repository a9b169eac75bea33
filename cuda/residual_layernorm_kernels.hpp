#pragma once
// Launch API of the fused residual add + LayerNorm kernels
// (cuda/residual_layernorm.cu). Plain C++: ops/residual_layernorm.cpp calls
// these for CUDA tensors in fused mode after validating every input and
// allocating every output.
#include "core/tensor.hpp"
#include "cuda/lab_switch.hpp"

namespace hg::gpu {

// Which kernels the two calls below run (HG_RESIDUAL_LN_VARIANT): 0 the
// one-block-per-row kernels of cuda/residual_layernorm.cu (any D); 1 the
// resident LayerNorm rows (cuda/layernorm_residual.cuh) for 16-byte aligned
// rows of D <= 16384, variant 0 elsewhere; 2 as 1, the backward reading
// dh_in as it stores dh instead of holding it. Unset: the production
// constant in cuda/residual_layernorm.cu. docs/residual_layernorm.md,
// "Variants 1 and 2".
constexpr int kResidualLayerNormVariants = 3;
inline LabSwitch& residual_layernorm_lab_switch() {
  static LabSwitch s("HG_RESIDUAL_LN_VARIANT", kResidualLayerNormVariants);
  return s;
}

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

// Variants 1 and 2 (cuda/layernorm.cu), for the two calls above: runs the
// case and returns true where it qualifies (16-byte aligned rows of
// 1 <= D <= 16384; the backward without dh_in is layernorm_backward_fused),
// else launches nothing and returns false. Same arguments and aliasing as
// above; stream_dh_in picks variant 2's backward.
bool residual_layernorm_forward_resident(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                         float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);
bool residual_layernorm_backward_resident(const Tensor& dy, const Tensor* dh_in, const Tensor& h,
                                          const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Tensor& dh,
                                          Tensor& dgamma, Tensor& dbeta, bool stream_dh_in);

}  // namespace hg::gpu
