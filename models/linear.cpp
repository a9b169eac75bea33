#include "models/linear.hpp"

#include <cmath>

#include "core/backend.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, bool with_bias, DType dtype)
    : in_(in_features), out_(out_features), has_bias_(with_bias) {
  HG_CHECK(in_features > 0 && out_features > 0, "Linear", "features must be positive, got in=", in_features,
           " out=", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  register_parameter("weight", weight,
                     Tensor::rand({out_features, in_features}, gen, dtype, Device::CPU, -bound, bound));
  if (with_bias) register_parameter("bias", bias, Tensor::rand({out_features}, gen, dtype, Device::CPU, -bound, bound));
}

Tensor Linear::forward(const Tensor& x) {
  HG_PROFILE("linear", x.device());
  HG_CHECK(x.defined(), "Linear::forward", "x is an undefined tensor");
  HG_CHECK(x.ndim() >= 1 && x.shape().back() == in_, "Linear::forward", "x shape ", x.shape(),
           " should end in in_features=", in_, " (weight ", weight.value.shape(), ")");
  check_same_device("Linear::forward", x, weight.value);
  check_same_dtype("Linear::forward", x, weight.value);
  x_ = x;
  // Every leading dim folds into rows, so one 2-D matmul does the whole batch.
  Shape y_shape = x.shape();
  y_shape.back() = out_;
  Tensor y = matmul(x.reshape({-1, in_}), weight.value, false, true);
  if (has_bias_) y = add(y, bias.value);
  return y.reshape(y_shape);
}

Tensor Linear::backward(const Tensor& dy) {
  HG_PROFILE("linear", dy.device());
  HG_CHECK(x_.defined(), "Linear::backward", "called before forward");
  HG_CHECK(dy.defined(), "Linear::backward", "dy is an undefined tensor");
  Shape y_shape = x_.shape();
  y_shape.back() = out_;
  HG_CHECK(dy.shape() == y_shape, "Linear::backward", "dy shape ", dy.shape(), " should be ", y_shape,
           " for the forward input ", x_.shape());
  check_same_device("Linear::backward", dy, weight.value);
  check_same_dtype("Linear::backward", dy, weight.value);
  const Tensor dy2 = dy.reshape({-1, out_});
  const Tensor x2 = x_.reshape({-1, in_});
  Backend& be = backend_for(dy.device());
  be.matmul(dy2, x2, weight.grad, /*transpose_a=*/true, /*transpose_b=*/false, /*accumulate=*/true);  // dW += dy^T x
  if (has_bias_) be.zip(BinaryOp::Add, bias.grad, sum(dy2, 0, false), bias.grad);  // elementwise, in place
  return matmul(dy2, weight.value).reshape(x_.shape());
}

}  // namespace hg
