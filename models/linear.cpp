#include "models/linear.hpp"
#include "models/weight_grads_beside.hpp"

#include <cmath>
#include <utility>

#include "core/backend.hpp"
#include "core/bias_grad_sink.hpp"
#include "core/kernel_mode.hpp"
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

namespace {

// f32 weights serve bf16 input through their bf16 copies; otherwise x and W share a dtype.
bool mixed(const Tensor& x, const Tensor& w) { return x.dtype() == DType::BF16 && w.dtype() == DType::F32; }

void check_input(const char* op, const Tensor& x, const Tensor& w) {
  check_same_device(op, x, w);
  if (!mixed(x, w)) check_same_dtype(op, x, w);
}

}  // namespace

const Tensor& Linear::weight_for(const Tensor& x) { return mixed(x, weight.value) ? bf16_copy(weight) : weight.value; }

const Tensor& Linear::bias_for(const Tensor& x) { return mixed(x, bias.value) ? bf16_copy(bias) : bias.value; }

Tensor Linear::forward(const Tensor& x) {
  Tensor y = apply(x);
  save_input(x);
  return y;
}

Tensor Linear::apply(const Tensor& x) {
  HG_PROFILE("linear", x.device());
  HG_CHECK(x.defined(), "Linear::forward", "x is an undefined tensor");
  HG_CHECK(x.ndim() >= 1 && x.shape().back() == in_, "Linear::forward", "x shape ", x.shape(),
           " should end in in_features=", in_, " (weight ", weight.value.shape(), ")");
  check_input("Linear::forward", x, weight.value);
  // Every leading dim folds into rows, so one 2-D GEMM does the whole batch.
  Shape y_shape = x.shape();
  y_shape.back() = out_;
  const Tensor x2 = x.reshape({-1, in_});
  const Tensor& w = weight_for(x);
  Tensor y = Tensor::empty({x2.size(0), out_}, x.dtype(), x.device());
  GemmArgs args;
  args.transpose_b = true;
  if (has_bias_ && kernel_mode() == KernelMode::Fused) {
    args.epilogue = GemmEpilogue::Bias;  // bf16 x: the bias's bf16 copy (cuBLASLt's bias has D's dtype)
    args.bias = &bias_for(x);
    backend_for(x.device()).gemm(x2, w, y, args);
    return y.reshape(y_shape);
  }
  backend_for(x.device()).gemm(x2, w, y, args);
  if (has_bias_) y = add(y, bias_for(x));
  return y.reshape(y_shape);
}

Tensor Linear::forward_gelu(const Tensor& x, Tensor& pre) {
  Tensor y = apply_gelu(x, pre);
  save_input(x);
  return y;
}

Tensor Linear::apply_gelu(const Tensor& x, Tensor& pre) {
  HG_PROFILE("linear", x.device());
  HG_CHECK(gelu_fusable(), "Linear::forward_gelu", "needs a bias and out_features % 8 == 0, got out_features ", out_);
  HG_CHECK(x.defined() && x.ndim() == 2 && x.size(1) == in_, "Linear::forward_gelu", "x must be (rows, ", in_,
           "), got ", x.defined() ? x.shape() : Shape{});
  check_input("Linear::forward_gelu", x, weight.value);
  pre = Tensor::empty({x.size(0), out_}, x.dtype(), x.device());
  Tensor y = Tensor::empty({x.size(0), out_}, x.dtype(), x.device());
  GemmArgs args;
  args.transpose_b = true;
  args.epilogue = GemmEpilogue::BiasGelu;
  args.bias = &bias_for(x);
  args.aux = &pre;
  backend_for(x.device()).gemm(x, weight_for(x), y, args);
  return y;
}

void Linear::save_input(const Tensor& x) {
  x_ = x;
  x_shape_ = x.shape();
  x_dtype_ = x.dtype();
  recompute_input_ = nullptr;
}

void Linear::forget_input(std::function<Tensor()> recompute) {
  HG_CHECK(recompute != nullptr, "Linear::forget_input", "needs the function that recomputes the input");
  x_ = Tensor();
  recompute_input_ = std::move(recompute);
}

void Linear::restore_input(Tensor x) {
  HG_CHECK(x.defined() && x.shape() == x_shape_ && x.dtype() == x_dtype_, "Linear::backward",
           "the recomputed input must be ", dtype_name(x_dtype_), " ", x_shape_, " as in the forward, got ",
           x.defined() ? dtype_name(x.dtype()) : "undefined", " ", x.defined() ? x.shape() : Shape{});
  x_ = std::move(x);
}

Tensor Linear::backward(const Tensor& dy) { return backward_impl(dy, nullptr); }

Tensor Linear::backward_bias_summed(const Tensor& dy) { return backward_impl(dy, nullptr, true); }

Tensor Linear::backward_to_gelu_input(const Tensor& dy, const Tensor& pre) { return backward_impl(dy, &pre); }

Tensor Linear::backward_impl(const Tensor& dy, const Tensor* gelu_pre, bool bias_summed) {
  // Before the profiler scope: the recompute is timed as the op it runs.
  if (!x_.defined() && recompute_input_) restore_input(std::exchange(recompute_input_, nullptr)());
  HG_PROFILE("linear", dy.device());
  HG_CHECK(x_.defined(), "Linear::backward", "called before forward");
  HG_CHECK(dy.defined(), "Linear::backward", "dy is an undefined tensor");
  Shape y_shape = x_.shape();
  y_shape.back() = out_;
  HG_CHECK(dy.shape() == y_shape, "Linear::backward", "dy shape ", dy.shape(), " should be ", y_shape,
           " for the forward input ", x_.shape());
  HG_CHECK(dy.dtype() == x_.dtype(), "Linear::backward", "dy ", dy.shape(), " is ", dtype_name(dy.dtype()),
           " but the forward input was ", dtype_name(x_.dtype()));
  check_input("Linear::backward", dy, weight.value);
  const Tensor dy2 = dy.reshape({-1, out_});
  Tensor x2 = x_.reshape({-1, in_});
  Backend& be = backend_for(dy.device());
  // dW += dy^T x, in f32 for f32 weights whatever the activations' dtype;
  // db = sum over rows of dy (f32 for bf16 dy), added into bias.grad by the
  // same backend call in fused mode.
  const auto weight_grads = [&] {
    GemmArgs dw;
    dw.transpose_a = true;
    dw.accumulate = true;
    if (!has_bias_ || bias_summed) return be.gemm(dy2, x2, weight.grad, dw);
    if (kernel_mode() != KernelMode::Fused) {
      be.gemm(dy2, x2, weight.grad, dw);
      Tensor db = Tensor::empty({1, out_}, bias.grad.dtype(), dy.device());
      be.reduce(ReduceOp::Sum, dy2, 0, db);
      be.zip(BinaryOp::Add, bias.grad, db.reshape({out_}), bias.grad);  // elementwise, in place
      return;
    }
    BiasGradSink db(bias.grad, bias.grad.dtype());
    dw.epilogue = GemmEpilogue::BiasGradA;
    db.attach(dw);
    be.gemm(dy2, x2, weight.grad, dw);
    db.finish(be);
  };
  // Beside the backward when the training step asks for it (fused mode) and
  // the bias sums go straight into their grad (work beside may not allocate).
  const bool beside_ok = kernel_mode() == KernelMode::Fused &&
                         (!has_bias_ || bias_summed || BiasGradSink::adds_directly(bias.grad, bias.grad.dtype()));
  if (!beside_ok || !WeightGradsBeside::run(weight_grads, {dy2, x2})) weight_grads();
  // The forward input is used up: its memory can serve dx (stream order
  // keeps the dW GEMM's reads ahead of any reuse; beside, the scope keeps it).
  x2 = Tensor();
  x_ = Tensor();
  Tensor dx = Tensor::empty({dy2.size(0), in_}, dy.dtype(), dy.device());
  GemmArgs dx_args;
  if (gelu_pre != nullptr) {
    // dx is d gelu(pre): the product multiplied by gelu'(pre) in the same GEMM.
    dx_args.epilogue = GemmEpilogue::GeluBackward;
    dx_args.aux = const_cast<Tensor*>(gelu_pre);  // read only by GeluBackward
  }
  be.gemm(dy2, weight_for(dy), dx, dx_args);
  return dx.reshape(x_shape_);
}

}  // namespace hg
