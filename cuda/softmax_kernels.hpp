#pragma once
// Launch API of the fused softmax kernels (cuda/softmax.cu). Plain C++:
// ops/softmax.cpp calls these for CUDA tensors in fused mode after validating.
#include <cstdint>

#include "core/softmax_layout.hpp"
#include "core/tensor.hpp"
#include "cuda/lab_switch.hpp"

namespace hg::gpu {

// The old name of hg::SoftmaxRows (core/softmax_layout.hpp), kept until
// bench/bench_softmax.cpp spells the new one; the same struct, not a copy.
using SoftmaxLayout = SoftmaxRows;

// y = softmax(scale * x + mask) per row, rows as in hg::SoftmaxRows (mask F32,
// on the GPU; scale rounded to float); x, y both F32 or both BF16.
// A row with every key masked is written as zeros.
void softmax_forward_fused(const Tensor& x, const SoftmaxRows& layout, Tensor& y);

// dx = scale * y * (dy - sum(dy * y)) per row; dy, y, dx all F32 or all BF16.
void softmax_backward_fused(const Tensor& dy, const Tensor& y, int64_t rows, int64_t tk, float scale,
                            Tensor& dx);

// Lab variants of the forward's register layouts (16-byte rows, Tk <= 16384;
// bench/lab/layernorm.md): 0 is the kernel of
// 2026-11-26. HG_SOFTMAX_VARIANT=V forces V wherever it applies; unset, each
// dtype runs the variant of the production table in cuda/softmax.cu.
constexpr int kSoftmaxVariantCount = 4;
inline LabSwitch& softmax_lab_switch() {
  static LabSwitch s("HG_SOFTMAX_VARIANT", kSoftmaxVariantCount);
  return s;
}

}  // namespace hg::gpu
