#include "models/layernorm.hpp"

#include "core/profiler.hpp"

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
  residual_ = false;
  return y;
}

Tensor LayerNorm::apply(const Tensor& x) {
  HG_PROFILE("layernorm", x.device());
  return layernorm_forward(x, gamma.value, beta.value, eps_, nullptr);
}

Tensor LayerNorm::backward(const Tensor& dy) {
  HG_PROFILE("layernorm", dy.device());  // the op and the grad accumulation
  HG_CHECK(x_.defined(), "LayerNorm::backward", "backward called before forward");
  Tensor dx = layernorm_backward_accumulate(dy, x_, gamma.value, saved_, param_grads());
  release();
  return dx;
}

ResidualLayerNormOutput LayerNorm::forward_residual(const Tensor& x, const Tensor& r) {
  HG_PROFILE("layernorm", x.device());
  ResidualLayerNormOutput out = residual_layernorm_forward(x, r, gamma.value, beta.value, eps_, &saved_);
  x_ = out.h;
  residual_ = true;
  return out;
}

ResidualLayerNormOutput LayerNorm::apply_residual(const Tensor& x, const Tensor& r) {
  HG_PROFILE("layernorm", x.device());
  return residual_layernorm_forward(x, r, gamma.value, beta.value, eps_, nullptr);
}

ResidualLayerNormOutput LayerNorm::forward_stream(ResidualStream s) {
  if (s.branch.defined()) return forward_residual(s.h, s.branch);
  return {s.h, forward(s.h)};
}

Tensor LayerNorm::backward_residual(const Tensor& dy, const Tensor& dh_in) {
  HG_PROFILE("layernorm", dy.device());
  HG_CHECK(x_.defined(), "LayerNorm::backward_residual", "backward called before forward");
  Tensor dh = residual_layernorm_backward_accumulate(dy, dh_in, x_, gamma.value, saved_, param_grads());
  release();
  return dh;
}

Tensor LayerNorm::recompute_output() {
  HG_CHECK(x_.defined(), "LayerNorm::recompute_output", "no kept input: called before forward or after backward");
  HG_PROFILE("layernorm", x_.device());
  if (residual_) return residual_layernorm_output(x_, gamma.value, beta.value, eps_);
  return layernorm_forward(x_, gamma.value, beta.value, eps_, nullptr);
}

void LayerNorm::release() {
  x_ = Tensor();
  saved_ = LayerNormSaved();
}

LayerNormParamGrads LayerNorm::param_grads() const {
  // In place: the grad tensors keep their storage (optimizers hold them).
  return {gamma.grad, beta.grad};
}

}  // namespace hg
