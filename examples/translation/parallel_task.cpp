#include "examples/translation/parallel_task.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace hg::translation {

using examples::Batch;
using examples::kIgnore;

namespace {
constexpr size_t kDecodeChunk = 64;  // prompts decoded together (x beam rows)
}

Tokens make_prompt(const Tokens& source) {
  Tokens line{SubwordTokenizer::kBos};
  line.insert(line.end(), source.begin(), source.end());
  line.push_back(SubwordTokenizer::kSep);
  return line;
}

ParallelTask::ParallelTask(SubwordTokenizer tokenizer, CorpusSplits splits, int64_t max_seq_len)
    : tokenizer_(std::move(tokenizer)), max_seq_len_(max_seq_len) {
  train_ = encode(std::move(splits.train));
  valid_ = encode(std::move(splits.valid));
  test_ = encode(std::move(splits.test));
  HG_CHECK(!train_.pairs.empty() && !valid_.pairs.empty() && !test_.pairs.empty(), "translate",
           "no pair fits a context of ", max_seq_len, " tokens in some split (train ", train_.pairs.size(), ", valid ",
           valid_.pairs.size(), ", test ", test_.pairs.size(), "): raise --seq-len");
}

EncodedSplit ParallelTask::encode(std::vector<SentencePair> text) const {
  EncodedSplit s;
  s.text = std::move(text);
  for (const SentencePair& p : s.text) {
    EncodedPair e{tokenizer_.encode(p.source), tokenizer_.encode(p.target), &p};
    // Line = <s> src <sep> tgt </s>; the model reads all of it but the last token.
    if (static_cast<int64_t>(e.source.size() + e.target.size() + 3) > max_seq_len_ + 1) {
      ++s.too_long;
      continue;
    }
    s.pairs.push_back(std::move(e));
  }
  return s;
}

std::string ParallelTask::describe() const {
  auto part = [](const char* name, const EncodedSplit& s) {
    return std::string(name) + " " + std::to_string(s.pairs.size()) +
           (s.too_long ? " (+" + std::to_string(s.too_long) + " too long, skipped)" : "");
  };
  return part("train", train_) + ", " + part("valid", valid_) + ", " + part("test", test_) + " pairs; " +
         std::to_string(vocab_size()) + " subword pieces";
}

Batch ParallelTask::train_batch(int64_t batch, Generator& g) const {
  std::vector<const EncodedPair*> pick;
  for (int64_t i = 0; i < batch; ++i) pick.push_back(&train_.pairs[g.next_u64() % train_.pairs.size()]);
  return make_batch(pick);
}

Batch ParallelTask::make_batch(const std::vector<const EncodedPair*>& pairs) const {
  Batch b;
  b.batch = static_cast<int64_t>(pairs.size());
  for (const EncodedPair* p : pairs)
    b.seq = std::max<int64_t>(b.seq, static_cast<int64_t>(p->source.size() + p->target.size() + 2));
  b.inputs.assign(static_cast<size_t>(b.batch * b.seq), SubwordTokenizer::kPad);
  b.targets.assign(static_cast<size_t>(b.batch * b.seq), static_cast<double>(kIgnore));
  for (size_t i = 0; i < pairs.size(); ++i) {
    Tokens line = make_prompt(pairs[i]->source);
    const size_t answer_from = line.size();
    line.insert(line.end(), pairs[i]->target.begin(), pairs[i]->target.end());
    line.push_back(SubwordTokenizer::kEos);
    for (size_t p = 0; p + 1 < line.size(); ++p) {
      b.inputs[i * b.seq + p] = line[p];
      if (p + 1 >= answer_from) b.targets[i * b.seq + p] = line[p + 1];
    }
  }
  return b;
}

std::vector<std::string> translate_sentences(const NextTokenScorer& scorer, const SubwordTokenizer& tokenizer,
                                             const std::vector<std::string>& sources, int beam, int64_t max_line,
                                             std::vector<size_t>* truncated) {
  std::vector<std::string> out;
  for (size_t from = 0; from < sources.size(); from += kDecodeChunk) {
    std::vector<Tokens> prompts;
    for (size_t i = from; i < std::min(sources.size(), from + kDecodeChunk); ++i) {
      Tokens source = tokenizer.encode(sources[i]);
      if (static_cast<int64_t>(source.size()) + 2 >= max_line) {
        source.resize(static_cast<size_t>(std::max<int64_t>(0, max_line / 2)));
        if (truncated) truncated->push_back(i);
      }
      prompts.push_back(make_prompt(source));
    }
    const std::vector<Tokens> gen = beam <= 1 ? greedy_decode(scorer, prompts, max_line, SubwordTokenizer::kEos)
                                              : beam_decode(scorer, prompts, beam, max_line, SubwordTokenizer::kEos);
    for (const Tokens& t : gen) out.push_back(tokenizer.decode(t));
  }
  return out;
}

Translations translate_split(const NextTokenScorer& scorer, const ParallelTask& task, const EncodedSplit& split,
                             int beam, int64_t max_line, int64_t limit) {
  Translations t;
  const size_t n = limit > 0 ? std::min<size_t>(split.pairs.size(), static_cast<size_t>(limit)) : split.pairs.size();
  for (size_t i = 0; i < n; ++i) {
    t.sources.push_back(split.pairs[i].text->source);
    t.references.push_back(split.pairs[i].text->target);
  }
  t.hypotheses = translate_sentences(scorer, task.tokenizer(), t.sources, beam, max_line);
  t.bleu = corpus_bleu(t.hypotheses, t.references);
  return t;
}

}  // namespace hg::translation
