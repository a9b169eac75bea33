#pragma once
// The pieces of `train --task translate` that train.cpp calls: building the
// task (corpus, splits, subword vocabulary: trained, or on --resume loaded
// from CHECKPOINT.vocab) and its evaluation (held-out loss and BLEU).
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.hpp"
#include "examples/translation/parallel_task.hpp"

namespace hg {
class DecoderLM;
}

namespace hg::translation {

struct TranslateOptions {
  std::string pairs, valid, test;  // valid/test empty: split off --pairs
  int64_t valid_pairs = 500, test_pairs = 1000;
  int vocab_size = 8000;
  std::string tokenizer_type = "bpe";
  int beam = 1;
  int64_t bleu_sentences = 300;  // valid pairs translated at each evaluation (0: all)
};

// Reads and splits the corpora, reports malformed lines, and trains the
// vocabulary on the training split (both sides), or loads `vocab_from` (a
// checkpoint whose .vocab file holds it) when not empty.
std::unique_ptr<ParallelTask> build_parallel_task(const TranslateOptions& o, int64_t max_seq_len, uint64_t seed,
                                                  const std::string& vocab_from);

struct TranslateEval {
  double loss = 0;  // teacher forced, per target token
  BleuScore bleu;   // of the first bleu_sentences pairs
};
TranslateEval evaluate_valid(DecoderLM& model, const ParallelTask& task, const TranslateOptions& o, Device dev);

// Test BLEU over the whole test split and a few sample translations, printed.
void report_test(DecoderLM& model, const ParallelTask& task, const TranslateOptions& o, Device dev);

}  // namespace hg::translation
