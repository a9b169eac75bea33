#include "models/generation.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"

namespace hg {
namespace {

// The last `window` tokens of every row of seqs, as (B, window) ids.
Tensor last_tokens(const std::vector<std::vector<double>>& seqs, int64_t window) {
  std::vector<double> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.end() - window, s.end());
  return Tensor::from_vector(flat, {static_cast<int64_t>(seqs.size()), window});
}

}  // namespace

Tensor generate(DecoderLM& model, const Tensor& prompt, const GenerateOptions& options) {
  const char* op = "generate";
  check_sampling_options(options.sampling);
  HG_CHECK(options.max_new_tokens >= 0, op, "max_new_tokens must be >= 0, got ", options.max_new_tokens);
  prompt.check_defined(op);
  HG_CHECK(prompt.ndim() == 2 && prompt.size(0) >= 1 && prompt.size(1) >= 1, op,
           "the prompt must be (B, T) ids with B, T >= 1, got ", prompt.shape());
  const int64_t b = prompt.size(0), t = prompt.size(1), vocab = model.config().vocab_size;
  const int64_t context = model.config().max_seq_len;
  std::vector<std::vector<double>> seqs(static_cast<size_t>(b));
  const std::vector<double> flat = prompt.to_vector();
  for (int64_t i = 0; i < b; ++i) {
    auto& s = seqs[static_cast<size_t>(i)];
    s.assign(flat.begin() + i * t, flat.begin() + (i + 1) * t);
    for (double id : s)
      HG_CHECK(id == static_cast<double>(static_cast<int64_t>(id)) && id >= 0 && id < static_cast<double>(vocab), op,
               "prompt ", i, " holds id ", id, ", not a token of the model's vocabulary [0, ", vocab, ")");
  }

  KvCache cache = model.make_kv_cache(b);
  // The logits of the next token: (B, 1, V) from the cache, or a fresh prefill.
  const auto next_logits = [&](bool extend) {
    const int64_t length = static_cast<int64_t>(seqs[0].size());
    if (extend && options.kv_cache && cache.length() < context)
      return model.forward_cached(last_tokens(seqs, 1), cache, DecoderLM::CachedLogits::Last);
    cache.reset();  // first step, a full context, or no cache: prefill the last `context` tokens
    return model.forward_cached(last_tokens(seqs, std::min(length, context)), cache, DecoderLM::CachedLogits::Last);
  };

  Generator gen(options.seed);
  std::vector<int64_t> step_tokens(static_cast<size_t>(b));
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const std::vector<double> logits = next_logits(n > 0).to_vector();  // (B, 1, V) on the host
    for (int64_t i = 0; i < b; ++i) {
      const int64_t id = sample_token(logits.data() + i * vocab, vocab, options.sampling, gen);
      step_tokens[static_cast<size_t>(i)] = id;
      seqs[static_cast<size_t>(i)].push_back(static_cast<double>(id));
    }
    if (options.on_step) options.on_step(step_tokens);
  }
  std::vector<double> out;
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return Tensor::from_vector(out, {b, t + options.max_new_tokens});
}

}  // namespace hg
