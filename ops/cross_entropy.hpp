#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// Mean cross-entropy of logits (..., V) against integer class targets (...)
// stored as F32, over the positions whose target is not ignore_index:
//   loss = (1 / n_valid) * sum_valid ( logsumexp(logits_i) - logits_i[target_i] )
// When every position is ignored the loss is 0 and every gradient is 0 (a
// finite answer, not 0/0). Derivation: docs/cross_entropy.md.
//
// Fused (CPU Eigen-free loop, CUDA one kernel): one pass per row computes the
// row loss and d loss / d logits together; backward only scales that saved
// gradient. Unfused: log-softmax and the NLL pick composed from primitives.
struct CrossEntropySaved {
  Tensor dlogits;        // fused paths: d loss / d logits for an upstream grad of 1, (N, V)
  Tensor log_probs;      // unfused path: (N, V)
  Tensor onehot;         // unfused path: (N, V), zero rows at ignored positions
  Tensor valid;          // unfused path: (N, 1), 1 where the target counts
  double inv_count = 0;  // 1 / n_valid, or 0 when nothing counts
  Shape logits_shape;
  int64_t n_valid = 0;  // -1 when counted on the device (cross_entropy_forward_on_device)
  // CUDA, BF16 logits (or the on-device variant): no probabilities kept; the
  // backward recomputes them from the logits and two floats per row.
  Tensor logits;            // (N, V) as given
  Tensor targets;           // (N,)
  Tensor row_stats;         // (N, 2) F32: row max m, log sum exp(x - m)
  Tensor inv_count_device;  // (1,) F32: 1 / n_valid, or 0
  int64_t ignore_index = 0;
  DType grad_dtype = DType::F32;  // dtype of the returned gradient (the logits')
};

// Returns a 0-d tensor on logits' device. Targets must be integers in [0, V)
// or equal to ignore_index (hg::Error otherwise). saved may be nullptr.
// Logits F32 or F64; BF16 on CUDA (float32 math: fused mode keeps no
// probabilities and writes BF16 dlogits; unfused mode computes in F32).
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             CrossEntropySaved* saved);

// The same loss without reading anything back to the host, for a step that
// is captured in a CUDA graph: on CUDA in fused mode (F32 / BF16 logits) the
// targets are not checked on the host and the counted rows are counted on
// the device; a target that is neither a class nor ignore_index makes the
// loss NaN (the caller's non-finite check reports it) instead of throwing.
// Elsewhere it is cross_entropy_forward.
Tensor cross_entropy_forward_on_device(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                       CrossEntropySaved* saved);

// d loss / d logits (logits' shape), scaled by the upstream gradient dloss.
Tensor cross_entropy_backward(const CrossEntropySaved& saved, double dloss = 1.0);

// The same for a caller that has no further use for the logits: where the
// saved state holds them (the CUDA log-sum-exp path) the gradient is written
// over them, in place, and they are returned (one (N, V) buffer fewer: 786
// MiB of bf16 at GPT-2 small's batch); elsewhere cross_entropy_backward.
Tensor cross_entropy_backward_over_logits(const CrossEntropySaved& saved, double dloss = 1.0);

// The targets' check, shared by every caller that checks on the host: reads
// targets (any shape, F32) to the host and requires each to be a class in
// [0, vocab) or ignore_index (hg::Error from `op` naming the value and its flat
// position otherwise). Returns them; *n_valid (when given) = how many count.
std::vector<double> read_cross_entropy_targets(const Tensor& targets, int64_t vocab, int64_t ignore_index,
                                               const char* op, int64_t* n_valid = nullptr);

}  // namespace hg
