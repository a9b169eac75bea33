#pragma once
// Launch API of the fused softmax kernels (cuda/softmax.cu). Plain C++:
// ops/softmax.cpp calls these for CUDA tensors in fused mode after validating.
#include <cstdint>

#include "core/softmax_layout.hpp"
#include "core/tensor.hpp"

namespace hg::gpu {

// y = softmax(scale * x + mask) per row, rows as in hg::SoftmaxRows (mask F32,
// on the GPU; scale rounded to float); x, y both F32 or both BF16.
// A row with every key masked is written as zeros.
void softmax_forward_fused(const Tensor& x, const SoftmaxRows& layout, Tensor& y);

// Whether softmax_forward_fused(x, layout, y) runs the staged forward
// (sm_90+, non-causal 16-byte rows of Tk 1024..16384; docs/softmax.md):
// what the tests check the layout choice with.
bool softmax_forward_is_staged(const Tensor& x, const SoftmaxRows& layout, const Tensor& y);

// Whether that staged forward keeps the mask row in registers across the
// rows that share it (a mask of query stride 0, Tk >= 2048; docs/softmax.md).
bool softmax_forward_keeps_mask_row(const Tensor& x, const SoftmaxRows& layout, const Tensor& y);

// dx = scale * y * (dy - sum(dy * y)) per row; dy, y, dx all F32 or all BF16.
void softmax_backward_fused(const Tensor& dy, const Tensor& y, int64_t rows, int64_t tk, float scale, Tensor& dx);

}  // namespace hg::gpu
