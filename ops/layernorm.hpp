#pragma once
#include "core/tensor.hpp"

namespace hg {

// LayerNorm over the last dim: y = gamma * (x - mean) * rstd + beta,
// rstd = 1 / sqrt(var + eps), var biased. x has any leading shape (..., D);
// gamma and beta are (D,). Derivation and stability notes: docs/layernorm.md.

// What forward keeps for backward: O(rows) floats, never an O(rows*D) x_hat.
struct LayerNormSaved {
  Tensor mean;  // (rows,) float32 (float64 for float64 input)
  Tensor rstd;  // (rows,)
};

struct LayerNormGrads {
  Tensor dx;      // like x
  Tensor dgamma;  // (D,)
  Tensor dbeta;   // (D,)
};

// Dispatches on x.device() and hg::kernel_mode(): CPU fused (Eigen), unfused
// (primitive backend, any device), CUDA fused. eps must be finite and > 0.
// saved may be nullptr when no backward will follow.
Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, LayerNormSaved* saved);

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved);

// Parameter gradients a backward adds into, in place: a module's gamma.grad
// and beta.grad. (D,) in gamma's dtype on x's device.
struct LayerNormParamGrads {
  Tensor gamma;  // += dgamma
  Tensor beta;   // += dbeta
};

// layernorm_backward that adds dgamma / dbeta into `into` and returns dx.
// The result is bitwise that of adding layernorm_backward's dgamma / dbeta
// elementwise; CUDA fused mode with F32 grads adds them in the kernel that
// sums them (no temporaries, no launches of their own), every other path
// adds the temporaries elementwise.
Tensor layernorm_backward_accumulate(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const LayerNormSaved& saved, const LayerNormParamGrads& into);

// The same two, writing into memory the caller owns (PyTorch's, for
// handgrad.torch): y like x; saved.mean / saved.rstd (rows,) and the grads
// shaped as above, on x's device. Each output is checked (hg::Error) before
// anything is written. The unfused mode computes into its own tensors and copies.
void layernorm_forward_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                            LayerNormSaved& saved);
void layernorm_backward_into(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved,
                             LayerNormGrads& grads);

// The eps rule of layernorm_forward (finite, > 0, and still so as a float32
// unless x is F64), for callers that hold an eps before any x exists (the
// LayerNorm module checks it at construction). Throws hg::Error naming `op`.
void check_layernorm_eps(double eps, DType x_dtype, const char* op);

}  // namespace hg
