#pragma once
// Launch API of the cross-entropy kernels that keep no probabilities
// (cuda/cross_entropy_lse.cu): the forward saves two floats per row (the row
// max m and log sum exp(x - m)); the backward recomputes softmax - onehot
// from the logits, writing dlogits in the logits' dtype. Float32 math for
// F32 and BF16 logits. No host synchronisation: the count of counted rows
// and 1 / count live on the device, so the pair can be captured in a graph.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::gpu {

// logits (rows, V) F32 or BF16; targets (rows) F32: class ids or
// ignore_index. A target that is neither (not checked on the host by the
// caller) makes its row loss, hence the loss, NaN. Writes row_stats (rows, 2)
// F32 = (m, log s), loss (0-d F32) = mean over counted rows (0 when none)
// and inv_count (1,) F32 = 1 / count (0 when none). Deterministic.
void cross_entropy_lse_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& row_stats,
                               Tensor& loss, Tensor& inv_count);

// dlogits (rows, V) of logits' dtype = (softmax - onehot) * inv_count * dloss,
// zero rows where the target is ignore_index.
void cross_entropy_lse_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                const Tensor& row_stats, const Tensor& inv_count, float dloss, Tensor& dlogits);

}  // namespace hg::gpu
