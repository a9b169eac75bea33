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

// ---- the chunked classifier (ops/classifier.hpp): counted once, then rows
// chunk by chunk, then one sum; nothing read back, so it can be captured.

// inv_count (1,) F32 = 1 / (number of targets != ignore_index), 0 when none.
// One block, fixed order (the count is exact: integers below 2^24).
void cross_entropy_count_targets(const Tensor& targets, int64_t ignore_index, Tensor& inv_count);

// The row pass's kernels. Staged: a block per row holds the row in shared
// memory, so it reads the logits once (sm_90+, V up to
// cross_entropy_staged_max_vocab) and passes over its copy twice (max and
// sum of exponentials together, then g). Strided: a block per row reads
// them three times (max, sum, g), at any V. The same arithmetic but for how
// the sum of exponentials is formed (within the same float64 bounds, not the
// same bits). Best: staged where the row fits and is long enough to give each of
// its threads a 16-byte word (cross_entropy_staged_min_vocab), else strided.
enum class RowPassKernel { Best, Staged, Strided };

// The longest row of `dtype` (F32 or BF16) the staged row pass holds on the
// current device; 0 where it cannot run.
int64_t cross_entropy_staged_max_vocab(DType dtype);
// The shortest row of `dtype` that Best stages: shorter rows leave most of
// the staged block's threads idle, where the strided kernel's smaller block
// is faster (V 256 bf16, 8192 rows, H200: 0.022 against 0.067 ms).
int64_t cross_entropy_staged_min_vocab(DType dtype);

// logits (rows, V) F32 or BF16, overwritten in place by
// (softmax - onehot) * inv_count (zero rows where the target is
// ignore_index); row_loss (rows,) F32 = log s - (x_t - m), 0 where ignored,
// NaN for a target that is neither a class nor ignore_index. Staged where
// the row does not fit: hg::Error.
void cross_entropy_lse_rows_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& inv_count,
                                 Tensor& row_loss, RowPassKernel kernel = RowPassKernel::Best);

// loss (0-d F32) = inv_count * sum of row_loss (rows,), one block, fixed order.
void cross_entropy_sum_row_losses(const Tensor& row_loss, const Tensor& inv_count, Tensor& loss);

}  // namespace hg::gpu
