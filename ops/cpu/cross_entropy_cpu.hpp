#pragma once
// Internal to ops/: the fused CPU cross-entropy, one pass per row.
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg::cpu {

// logits (rows, vocab) F32 or F64 on the CPU, targets one per row (already
// checked: a class in [0, vocab) or ignore_index). Writes d loss / d logits
// for an upstream gradient of 1 into dlogits (same shape and dtype; zero rows
// where ignored) and returns the mean loss, both scaled by inv_count.
double cross_entropy_forward(const Tensor& logits, const std::vector<double>& targets, int64_t vocab,
                             int64_t ignore_index, double inv_count, Tensor& dlogits);

// The same rows for a caller that sums the losses itself: logits and
// dlogits (rows, vocab) F32 or F64, dlogits may be logits (the gradient is
// written over them); targets has one entry per row, already checked.
// row_loss[r] = log s - (x_t - m) (0 where ignored), not scaled by inv_count;
// dlogits as above.
void cross_entropy_rows(const Tensor& logits, const double* targets, int64_t ignore_index, double inv_count,
                        Tensor& dlogits, double* row_loss);

}  // namespace hg::cpu
