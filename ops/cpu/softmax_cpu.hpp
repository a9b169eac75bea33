#pragma once
// Internal to ops/: the fused CPU softmax (float32: SIMD, float64: Eigen),
// rows on hg::num_threads() threads.
#include <cstdint>

#include "core/softmax_layout.hpp"
#include "core/tensor.hpp"

namespace hg::cpu {

// y = softmax(scale * x + mask (+ causal)) per row, rows as in hg::SoftmaxRows
// (core/softmax_layout.hpp); x, y (and mask) F32 or F64, on the CPU.
void softmax_forward(const Tensor& x, const SoftmaxRows& layout, Tensor& y);

// dx = scale * y * (dy - sum(dy * y)) per row of length tk.
void softmax_backward(const Tensor& dy, const Tensor& y, int64_t tk, double scale, Tensor& dx);

}  // namespace hg::cpu
