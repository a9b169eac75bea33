#pragma once
// Internal to ops/: the fused CPU softmax (float32: SIMD, float64: Eigen),
// rows on hg::num_threads() threads.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::cpu {

// The rows of a softmax, viewed as (rows, tk). Same meaning as
// hg::gpu::SoftmaxLayout: row r is query r % tq of batch r / (heads * tq), and
// its mask row starts at b * mask_batch_stride + q * mask_query_stride.
struct SoftmaxRows {
  int64_t rows = 0;
  int64_t tk = 0;
  int64_t tq = 1;
  int64_t heads = 1;
  const Tensor* mask = nullptr;  // same dtype as x, on the CPU
  int64_t mask_batch_stride = 0;
  int64_t mask_query_stride = 0;
  bool causal = false;
  double scale = 1.0;
};

// y = softmax(scale * x + mask (+ causal)) per row; x, y (and mask) F32 or F64.
void softmax_forward(const Tensor& x, const SoftmaxRows& layout, Tensor& y);

// dx = scale * y * (dy - sum(dy * y)) per row of length tk.
void softmax_backward(const Tensor& dy, const Tensor& y, int64_t tk, double scale, Tensor& dx);

}  // namespace hg::cpu
