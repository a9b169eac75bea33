#pragma once
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"

namespace hg {

// Residual add + LayerNorm, the pre-LN Transformer's seam:
//   h = x + r          (the new residual stream)
//   y = LN(h)          (input of the next sublayer)
// x, r: (..., D) of one dtype (F32, F64, or BF16 on CUDA); gamma, beta (D,)
// in the math dtype. CUDA fused mode runs one kernel that writes h and y
// (cuda/residual_layernorm.cu); the CPU and the unfused mode compose the add
// with layernorm_forward. Derivation: docs/residual_layernorm.md.
struct ResidualLayerNormOutput {
  Tensor h;  // like x
  Tensor y;  // like x
};

ResidualLayerNormOutput residual_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma,
                                                   const Tensor& beta, double eps, LayerNormSaved* saved);

// y of residual_layernorm_forward again, from its output h alone (nothing
// saved): for a caller that dropped y and kept h (activation recomputation).
// The forward's path without the add, so y is bitwise the forward's: CUDA
// fused mode the same kernels run on the stored h (where the forward's x and
// r were 16-byte aligned as h: whole tensors are), elsewhere
// layernorm_forward of h, as the forward composes it.
Tensor residual_layernorm_output(const Tensor& h, const Tensor& gamma, const Tensor& beta, double eps);

// dy: gradient of y; dh_in: gradient reaching h from the rest of the
// network (the residual path), or an undefined tensor when there is none.
// Returns dx = dh_in + LN_backward(dy) (the gradient of h, hence of both x
// and r), dgamma, dbeta; on CUDA fused mode in one pass.
LayerNormGrads residual_layernorm_backward(const Tensor& dy, const Tensor& dh_in, const Tensor& h, const Tensor& gamma,
                                           const LayerNormSaved& saved);

// residual_layernorm_backward that adds dgamma / dbeta into `into` (as
// layernorm_backward_accumulate: bitwise the elementwise add of the returned
// grads; CUDA fused mode adds them in its kernels) and returns dx, the
// gradient of h.
Tensor residual_layernorm_backward_accumulate(const Tensor& dy, const Tensor& dh_in, const Tensor& h,
                                              const Tensor& gamma, const LayerNormSaved& saved,
                                              const LayerNormParamGrads& into);

}  // namespace hg
