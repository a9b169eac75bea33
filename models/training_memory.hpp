#pragma once
// How much memory a DecoderLM training step with AdamW needs, estimated from
// its configuration alone, so that a program can refuse a configuration that
// cannot fit before it allocates anything (and before the OS kills it).
#include <cstdint>

#include "models/decoder_lm.hpp"

namespace hg {

// The number of parameters DecoderLM(config) has, without building it.
int64_t parameter_count(const DecoderLMConfig& config);

struct TrainingMemory {
  int64_t parameters = 0;
  double weight_bytes = 0;        // values, gradients and AdamW's two moments
  double per_sequence_bytes = 0;  // activations kept for the backward, its temporaries, logits: per sequence
  int64_t batch = 0;
  double activation_bytes() const { return per_sequence_bytes * static_cast<double>(batch); }
  double total_bytes() const { return weight_bytes + activation_bytes(); }
};

// A step on `batch` sequences of `seq_len` tokens. Calibrated against the
// peak RSS of `train` on the CPU (fp32, softmax attention core, nothing
// recomputed), which it undershoots by 0-15%: a configuration it says does
// not fit, does not. recompute_gelu / recompute_layernorm leave the
// activations they recompute out of the count.
TrainingMemory estimate_training_memory(const DecoderLMConfig& config, int64_t batch, int64_t seq_len);

}  // namespace hg
