#pragma once
// Launch API of the fused softmax kernels (cuda/softmax.cu). Plain C++:
// ops/softmax.cpp calls these for CUDA tensors in fused mode after validating.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::gpu {

// How rows map onto the attention layout. x is viewed as (rows, Tk) with
// rows = B * H * Tq. Row r belongs to batch b = r / (H * Tq) and query
// q = r % Tq. The additive mask element for (r, k) is
//   mask[b * mask_batch_stride + q * mask_query_stride + k]
// (mask_query_stride = 0 for a (B, 1, 1, Tk) key-padding mask).
struct SoftmaxLayout {
  int64_t rows = 0;
  int64_t tk = 0;
  int64_t tq = 1;          // queries per (b, h); 1 for plain softmax
  int64_t heads = 1;
  const Tensor* mask = nullptr;  // optional F32, on the GPU
  int64_t mask_batch_stride = 0;
  int64_t mask_query_stride = 0;
  bool causal = false;     // key k masked for query q when k > q + (tk - tq)
  float scale = 1.0f;      // applied to x before the mask
};

// y = softmax(scale * x + mask) per row; x, y both F32 or both BF16.
// A row with every key masked is written as zeros.
void softmax_forward_fused(const Tensor& x, const SoftmaxLayout& layout, Tensor& y);

// dx = scale * y * (dy - sum(dy * y)) per row; dy, y, dx all F32 or all BF16.
void softmax_backward_fused(const Tensor& dy, const Tensor& y, int64_t rows, int64_t tk, float scale,
                            Tensor& dx);

}  // namespace hg::gpu
