#include "models/layernorm.hpp"

#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

LayerNorm::LayerNorm(int64_t dim, double eps, DType dtype) : dim_(dim), eps_(eps) {
  HG_CHECK(dim > 0, "LayerNorm", "dim must be positive, got ", dim);
  // The op's own rule, applied now so a bad eps fails at construction, not at the first forward.
  check_layernorm_eps(eps, dtype, "LayerNorm");
  register_parameter("gamma", gamma, Tensor::ones({dim}, dtype));
  register_parameter("beta", beta, Tensor::zeros({dim}, dtype));
}

Tensor LayerNorm::forward(const Tensor& x) {
  HG_PROFILE("layernorm", x.device());  // the op and the caching, one kind
  Tensor y = layernorm_forward(x, gamma.value, beta.value, eps_, &saved_);
  x_ = x;
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  HG_PROFILE("layernorm", dy.device());  // the op and the grad accumulation
  HG_CHECK(x_.defined(), "LayerNorm::backward", "backward called before forward");
  LayerNormGrads g = layernorm_backward(dy, x_, gamma.value, saved_);
  // Accumulate in place: the grad tensors keep their storage (optimizers hold them).
  gamma.grad.copy_(add(gamma.grad, g.dgamma));
  beta.grad.copy_(add(beta.grad, g.dbeta));
  return g.dx;
}

}  // namespace hg
