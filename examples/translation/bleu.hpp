#pragma once
// Corpus BLEU (Papineni et al. 2002) as sacrebleu computes it by default:
// 13a tokenization, clipped 1..4-gram counts summed over the whole corpus,
// geometric mean of the four precisions, brevity penalty exp(1 - r/c) when
// the hypotheses are shorter than the references; one reference per line.
// No smoothing: an order with zero matches gives BLEU 0 (sacrebleu's default
// 'exp' smoothing differs only then). Worked examples: docs/translation.md.
#include <array>
#include <string>
#include <vector>

namespace hg::translation {

// sacrebleu's "13a" tokenizer (mteval-v13a): punctuation split off, '.' and
// ',' kept inside numbers, '-' split after a digit. Returns the tokens.
std::vector<std::string> tokenize_13a(const std::string& line);

struct BleuScore {
  double bleu = 0;                    // 0..100
  std::array<double, 4> precision{};  // p_1..p_4 in percent
  double brevity_penalty = 0;
  long hyp_len = 0, ref_len = 0;
};

// hypotheses[i] is scored against references[i]; the sizes must match.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references);

}  // namespace hg::translation
