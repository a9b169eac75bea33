#pragma once
// Internal to ops/: softmax composed from primitive backend passes (miniTorch
// style), on any device. Inputs are validated by ops/softmax.cpp.
#include "core/tensor.hpp"

namespace hg::unfused {

// y = softmax(scale * x + mask (+ causal)) over the last dim. mask is
// undefined or broadcasts to x as (B|1, 1, 1|Tq, Tk); causal needs a 4-D x.
// BF16 x is computed in F32 and cast back. With lse, also writes the row's
// log-sum-exp of z (keepdim shape, F32 for BF16 x; -inf for a fully masked row).
Tensor softmax_forward(const Tensor& x, const Tensor& mask, bool causal, double scale, Tensor* lse = nullptr);

// dx = scale * y * (dy - sum(dy * y)) over the last dim.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, double scale);

}  // namespace hg::unfused
