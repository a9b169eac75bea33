#pragma once
// Translation on parallel text, framed decoder-only like the built-in task:
//   <s> source-pieces <sep> target-pieces </s>
// with the loss on the target pieces and </s> only. Pairs whose line does not
// fit the model's context (max_seq_len + 1 tokens) are left out of every split
// and counted.
#include <cstdint>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "examples/common/subword_tokenizer.hpp"
#include "examples/translation/bleu.hpp"
#include "examples/translation/decoding.hpp"
#include "examples/translation/parallel_corpus.hpp"
#include "examples/translation_task.hpp"  // Batch, kIgnore

namespace hg::translation {

using cli::SubwordTokenizer;

struct EncodedPair {
  Tokens source, target;
  const SentencePair* text;  // the pair it came from
};

struct EncodedSplit {
  std::vector<SentencePair> text;
  std::vector<EncodedPair> pairs;
  int64_t too_long = 0;
};

Tokens make_prompt(const Tokens& source);  // <s> source <sep>

class ParallelTask {
 public:
  ParallelTask(SubwordTokenizer tokenizer, CorpusSplits splits, int64_t max_seq_len);
  ParallelTask(const ParallelTask&) = delete;

  const SubwordTokenizer& tokenizer() const { return tokenizer_; }
  int64_t vocab_size() const { return tokenizer_.vocab_size(); }
  const EncodedSplit& train() const { return train_; }
  const EncodedSplit& valid() const { return valid_; }
  const EncodedSplit& test() const { return test_; }
  std::string describe() const;

  // Pairs drawn uniformly from the training split, padded to the longest line.
  examples::Batch train_batch(int64_t batch, Generator& g) const;
  examples::Batch make_batch(const std::vector<const EncodedPair*>& pairs) const;

 private:
  EncodedSplit encode(std::vector<SentencePair> text) const;
  SubwordTokenizer tokenizer_;
  int64_t max_seq_len_;
  EncodedSplit train_, valid_, test_;
};

struct Translations {
  std::vector<std::string> sources, hypotheses, references;
  BleuScore bleu;
};

// Translates the first `limit` pairs of a split (all when limit <= 0) with
// greedy decoding (beam 1) or beam search, and scores them with corpus BLEU.
Translations translate_split(const NextTokenScorer& scorer, const ParallelTask& task, const EncodedSplit& split,
                             int beam, int64_t max_line, int64_t limit);

// Detokenized translations of raw source sentences. A source too long to
// leave room for any output (prompt >= max_line) is cut to its first
// max_line / 2 pieces; `truncated` (if given) receives the indices of those.
std::vector<std::string> translate_sentences(const NextTokenScorer& scorer, const SubwordTokenizer& tokenizer,
                                             const std::vector<std::string>& sources, int beam, int64_t max_line,
                                             std::vector<size_t>* truncated = nullptr);

}  // namespace hg::translation
