#pragma once
#include "core/softmax_layout.hpp"  // kSoftmaxMaskThreshold
#include "core/tensor.hpp"

namespace hg {

// Softmax over the last dim, and its attention form. Derivation, stability
// and kernel design: docs/softmax.md.
//
// Attention form: scores (B, H, Tq, Tk). The row that is softmaxed is
//   z = scale * scores + mask   (mask additive, broadcast from (B, 1, 1, Tk)
//                                or (B, 1, Tq, Tk); -inf or a large negative masks a key)
// with, if causal, key j of query i masked when j > i + (Tk - Tq).
// A row whose keys are all masked gives all zeros (never NaN) and zero grad.
// An additive mask value at or below kSoftmaxMaskThreshold (-1e9, in
// core/softmax_layout.hpp so the CUDA kernels share it; -inf included) masks
// its key outright: the key gets weight exactly 0, so a row whose every key is
// masked this way (e.g. mask -1e9 everywhere) gives zeros, as a -inf row does.
// Larger negative values (ALiBi biases, -1e4) stay ordinary additive biases.

struct SoftmaxOptions {
  Tensor mask;  // optional (undefined = none); same dtype family as scores (F32/F64)
  bool causal = false;
  double scale = 1.0;
};

// y = softmax(x) over the last dim (any shape).
Tensor softmax_forward(const Tensor& x);

// y = softmax(scale * scores + mask, causal) over the last dim of (B, H, Tq, Tk).
Tensor attention_softmax_forward(const Tensor& scores, const SoftmaxOptions& options);

// d scores from dy and the saved output y (no exp recomputed):
//   dx = scale * y * (dy - sum(dy * y)).  Pass the forward's scale (1 for plain softmax).
Tensor softmax_backward(const Tensor& dy, const Tensor& y, double scale = 1.0);

// The attention forward and the backward writing into memory the caller owns
// (PyTorch's, for handgrad.torch): y like scores, dx like y, checked
// (hg::Error) before anything is written. Unfused mode computes, then copies.
void attention_softmax_forward_into(const Tensor& scores, const SoftmaxOptions& options, Tensor& y);
void softmax_backward_into(const Tensor& dy, const Tensor& y, double scale, Tensor& dx);

// For a fused caller that runs the softmax rows itself (the CPU's packed
// attention): the checks attention_softmax_forward makes of scores (here
// any tensor of the scores' shape, dtype and device, such as the output)
// and options, and the row layout of the scores; its mask points into
// `options`. Plus the scale check of softmax_backward.
SoftmaxRows attention_softmax_rows(const Tensor& scores, const SoftmaxOptions& options);
void check_softmax_backward_scale(double scale, DType dtype);

}  // namespace hg
