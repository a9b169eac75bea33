#pragma once
// Launch API of the fused cross-entropy kernel (cuda/cross_entropy.cu).
// ops/cross_entropy.cpp validates targets on the host before calling it.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::gpu {

// logits (rows, V) F32, targets (rows) F32 holding valid ids or ignore_index.
// One kernel writes dlogits = (softmax - onehot) * inv_count per row and the
// row's loss; a second, single-block kernel sums the row losses in a fixed
// order into loss (0-d F32) = sum * inv_count. Deterministic.
void cross_entropy_fused(const Tensor& logits, const Tensor& targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                         float inv_count, Tensor& dlogits, Tensor& loss);

}  // namespace hg::gpu
