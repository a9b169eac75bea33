#include "models/dropout.hpp"

#include <cmath>

#include "core/backend.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

Dropout::Dropout(double p, uint64_t seed) : p_(p), gen_(seed) {
  HG_CHECK(std::isfinite(p) && p >= 0.0 && p < 1.0, "Dropout", "p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  x.check_defined("Dropout::forward");
  if (!training() || p_ == 0.0) {
    mask_ = Tensor();
    return x;
  }
  HG_PROFILE("dropout", x.device());
  // Drawn where x lives (a kernel on CUDA), element i from the generator's
  // (counter + i)-th number: the mask a host loop of uniform() would make.
  mask_ = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).dropout_mask(mask_, gen_.seed(), gen_.counter(), p_);
  gen_.advance(static_cast<uint64_t>(x.numel()));
  return mul(x, mask_);
}

Tensor Dropout::backward(const Tensor& dy) {
  if (!mask_.defined()) return dy;
  HG_CHECK(dy.shape() == mask_.shape(), "Dropout::backward", "dy ", dy.shape(), " does not match the mask ",
           mask_.shape());
  HG_PROFILE("dropout", dy.device());
  return mul(dy, mask_);
}

}  // namespace hg
