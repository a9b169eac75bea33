#pragma once
#include <cstdint>

#include "core/random.hpp"

namespace hg {

// How the next token is drawn from a row of logits (docs/generation.md):
//   temperature 0: greedy, the largest logit (the lowest id among equals);
//   otherwise p = softmax(logits / temperature) over the kept tokens, where
//   top_k > 0 keeps the k tokens of largest logits and top_p < 1 keeps the
//   fewest tokens, largest first, whose probabilities (after top-k) sum to at
//   least top_p. Ties are broken by the lower id, so top_k = 1 and a tiny
//   top_p are greedy exactly.
struct SamplingOptions {
  double temperature = 1.0;  // >= 0
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // in (0, 1]; 1: no limit
};

// Throws hg::Error naming the bad value and what is allowed.
void check_sampling_options(const SamplingOptions& options);

// One token id from logits[0 .. vocab) (host memory, any float dtype read as
// double), drawing at most one number from `gen` (none when greedy). A NaN
// or +inf logit, or a row with no finite logit, is an error.
int64_t sample_token(const double* logits, int64_t vocab, const SamplingOptions& options, Generator& gen);

}  // namespace hg
