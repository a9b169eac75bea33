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

// The same rows on the calling thread, for a caller that runs a few rows at a
// time while they are in cache (ops/cpu/attention_softmax_packed_cpu.cpp):
// rows [r0, r1) of the layout, x and y pointing at row r0 (x may be a buffer
// of the caller's own); each row gets exactly softmax_forward's operations.
void softmax_forward_rows(const float* x, const SoftmaxRows& layout, int64_t r0, int64_t r1, float* y);
void softmax_forward_rows(const double* x, const SoftmaxRows& layout, int64_t r0, int64_t r1, double* y);
// `rows` rows of tk as softmax_backward computes them; dx may be dy.
void softmax_backward_rows(const float* dy, const float* y, int64_t rows, int64_t tk, double scale, float* dx);
void softmax_backward_rows(const double* dy, const double* y, int64_t rows, int64_t tk, double scale, double* dx);

}  // namespace hg::cpu
