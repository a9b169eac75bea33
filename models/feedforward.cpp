#include "models/feedforward.hpp"

#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

FeedForward::FeedForward(int64_t d_model, int64_t hidden, Generator& gen, double dropout, uint64_t dropout_seed,
                         DType dtype)
    : fc1(d_model, hidden, gen, true, dtype),
      fc2(hidden, d_model, gen, true, dtype),
      drop(dropout, dropout_seed),
      d_model_(d_model) {
  register_module("fc1", fc1);
  register_module("act", act);
  register_module("fc2", fc2);
  register_module("drop", drop);
}

Tensor FeedForward::forward(const Tensor& x) {
  HG_CHECK(x.ndim() >= 1 && x.size(-1) == d_model_, "FeedForward::forward", "x must end in d_model ", d_model_,
           ", got ", x.shape());
  x_shape_ = x.shape();
  const Tensor rows = x.reshape({-1, d_model_});
  if (kernel_mode() == KernelMode::Fused && fc1.gelu_fusable()) {
    Tensor hidden = fc1.forward_gelu(rows, pre_);
    Tensor out = fc2.forward(hidden);
    if (recompute_gelu_) fc2.forget_input([this] { return gelu(pre_); });  // the last reference to hidden: freed here
    return drop.forward(out).reshape(x_shape_);
  }
  pre_ = Tensor();
  return drop.forward(fc2.forward(act.forward(fc1.forward(rows)))).reshape(x_shape_);
}

Tensor FeedForward::apply(const Tensor& x) {
  HG_CHECK(x.ndim() >= 1 && x.size(-1) == d_model_, "FeedForward::apply", "x must end in d_model ", d_model_, ", got ",
           x.shape());
  const Tensor rows = x.reshape({-1, d_model_});
  Tensor hidden;
  if (kernel_mode() == KernelMode::Fused && fc1.gelu_fusable()) {
    Tensor pre;  // the epilogue writes it; inference does not need it
    hidden = fc1.apply_gelu(rows, pre);
  } else {
    hidden = act.apply(fc1.apply(rows));
  }
  return fc2.apply(hidden).reshape(x.shape());
}

Tensor FeedForward::backward(const Tensor& dy) {
  HG_CHECK(dy.shape() == x_shape_, "FeedForward::backward", "dy ", dy.shape(), " must match the forward input ",
           x_shape_);
  const Tensor dout = drop.backward(dy.reshape({-1, d_model_}));
  if (pre_.defined()) {
    const Tensor dpre = fc2.backward_to_gelu_input(dout, pre_);
    pre_ = Tensor();  // used up: its memory can serve fc1's backward
    return fc1.backward(dpre).reshape(x_shape_);
  }
  return fc1.backward(act.backward(fc2.backward(dout))).reshape(x_shape_);
}

}  // namespace hg
