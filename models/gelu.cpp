#include "models/gelu.hpp"

#include "core/backend.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

Tensor GELU::forward(const Tensor& x) {
  HG_PROFILE("gelu", x.device());
  x_ = x;
  y_ = gelu(x);
  return y_;
}

Tensor GELU::apply(const Tensor& x) {
  HG_PROFILE("gelu", x.device());
  return gelu(x);
}

Tensor GELU::backward(const Tensor& dy) {
  HG_CHECK(x_.defined(), "GELU::backward", "backward called before forward");
  HG_PROFILE("gelu", dy.device());
  const Tensor dx = map_backward(UnaryOp::Gelu, dy, x_, y_);
  x_ = y_ = Tensor();  // used up
  return dx;
}

}  // namespace hg
