#pragma once
// Greedy decoding and beam search for a decoder-only model: each prompt
// (<s> source <sep>) is extended one token at a time until </s> or until the
// line reaches max_line tokens. Both run many prompts as one batch: lines of
// different lengths are right-padded and each row reads the logits at its
// own last position (the causal mask keeps padding out of earlier positions).
#include <cstdint>
#include <functional>
#include <vector>

#include "core/device.hpp"

namespace hg {
class DecoderLM;
}

namespace hg::translation {

using Tokens = std::vector<int32_t>;

// log p(next token | line) for every line: one row of vocab values per line.
using NextTokenScorer = std::function<std::vector<std::vector<double>>(const std::vector<Tokens>& lines)>;

// The scorer of a model in eval mode on `device`.
NextTokenScorer model_scorer(DecoderLM& model, Device device);

// The generated tokens of each prompt, without the prompt and without </s>.
std::vector<Tokens> greedy_decode(const NextTokenScorer& score, const std::vector<Tokens>& prompts, int64_t max_line,
                                  int32_t eos);

// Beam search with `beam` hypotheses per prompt; finished hypotheses are
// ranked by log-probability per generated token (</s> included). beam 1 is
// greedy decoding exactly.
std::vector<Tokens> beam_decode(const NextTokenScorer& score, const std::vector<Tokens>& prompts, int beam,
                                int64_t max_line, int32_t eos);

}  // namespace hg::translation
