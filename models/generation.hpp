#pragma once
#include <cstdint>
#include <functional>

#include "core/tensor.hpp"
#include "models/decoder_lm.hpp"
#include "models/sampling.hpp"

namespace hg {

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // >= 0
  SamplingOptions sampling;     // temperature, top_k, top_p (models/sampling.hpp)
  uint64_t seed = 0;            // the draws' Generator: same seed, same tokens
  // true: prefill the cache with the prompt, then one token a step
  // (DecoderLM::forward_cached). false: recompute the whole context for
  // every token, nanoGPT's loop; the same tokens, for comparison and timing.
  bool kv_cache = true;
  // Called after each step with the (B,) new token ids (host), e.g. to print
  // text as it comes.
  std::function<void(const std::vector<int64_t>& tokens)> on_step;
};

// Continues each of the B prompts of prompt (B, T) by max_new_tokens tokens
// and returns (B, T + max_new_tokens) ids, prompt first, as F32 on the CPU.
// Every prompt has length T (there is no padding). The context is at most
// max_seq_len tokens: a longer prompt is cropped to its last max_seq_len
// tokens, and once the cache is full each new token prefills it again with
// the last max_seq_len tokens (what nanoGPT does; the model has no position
// past max_seq_len). Runs in the model's device and precision and the current
// kernel mode; the rows of a step are drawn in batch order from one
// Generator(seed). Dropout is off whatever the model's mode.
Tensor generate(DecoderLM& model, const Tensor& prompt, const GenerateOptions& options);

}  // namespace hg
