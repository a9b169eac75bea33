#include "examples/translation/translate_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/error.hpp"
#include "core/logging.hpp"
#include "examples/translation/translation_checkpoint.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"

namespace hg::translation {

namespace {

// Whether s can be a line of text: valid UTF-8 without control bytes.
bool looks_like_text(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

// Binary data or a file of another format still splits into "lines", a few
// with a tab: refuse a file in which most lines are not text pairs, rather
// than let the later steps fail on it with a message about lengths.
void check_mostly_pairs(const std::string& path, const ParallelCorpus& c) {
  const int64_t lines = static_cast<int64_t>(c.pairs.size()) + c.malformed;
  const int64_t text = std::count_if(c.pairs.begin(), c.pairs.end(), [](const SentencePair& p) {
    return looks_like_text(p.source) && looks_like_text(p.target);
  });
  if (lines > 0 && text * 2 < lines)
    fail("translate", path, ": only ", text, " of its ", lines, " lines are source<TAB>target pairs of text (",
         c.malformed, " malformed, ", static_cast<int64_t>(c.pairs.size()) - text,
         " with control bytes or invalid UTF-8): the file holds almost no valid pairs; is it a parallel text corpus?");
}

std::vector<SentencePair> read_pairs(const std::string& path) {
  ParallelCorpus c = read_parallel_tsv(path);
  check_mostly_pairs(path, c);
  if (c.malformed > 0) {
    spdlog::warn("{}: {} malformed line{} skipped (a line must be source<TAB>target, both non-empty):", path,
                 c.malformed, c.malformed == 1 ? "" : "s");
    for (const std::string& note : c.malformed_notes) spdlog::warn("  {}", note);
    if (c.malformed > static_cast<int64_t>(c.malformed_notes.size()))
      spdlog::warn("  ... and {} more", c.malformed - static_cast<int64_t>(c.malformed_notes.size()));
  }
  return std::move(c.pairs);
}

}  // namespace

std::unique_ptr<ParallelTask> build_parallel_task(const TranslateOptions& o, int64_t max_seq_len, uint64_t seed,
                                                  const std::string& vocab_from) {
  CorpusSplits splits;
  if (o.valid.empty() || o.test.empty()) {
    splits =
        split_corpus(read_pairs(o.pairs), o.valid.empty() ? o.valid_pairs : 0, o.test.empty() ? o.test_pairs : 0, seed);
    // A split given as a file replaces the one cut from --pairs; cut pairs go back to train.
    if (!o.valid.empty()) splits.train.insert(splits.train.end(), splits.valid.begin(), splits.valid.end());
    if (!o.test.empty()) splits.train.insert(splits.train.end(), splits.test.begin(), splits.test.end());
  } else {
    splits.train = read_pairs(o.pairs);
  }
  if (!o.valid.empty()) splits.valid = read_pairs(o.valid);
  if (!o.test.empty()) splits.test = read_pairs(o.test);

  SubwordTokenizer tokenizer = [&] {
    if (!vocab_from.empty()) return SubwordTokenizer::from_bytes(load_translation_info(vocab_from).tokenizer_bytes);
    std::vector<std::string> text;
    for (const SentencePair& p : splits.train) {
      text.push_back(p.source);
      text.push_back(p.target);
    }
    const auto t0 = std::chrono::steady_clock::now();
    SubwordTokenizer t = SubwordTokenizer::train(text, o.vocab_size, o.tokenizer_type);
    spdlog::info("trained a {} vocabulary of {} pieces on {} training sentences in {:.1f} s", o.tokenizer_type,
                 t.vocab_size(), text.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return t;
  }();
  return std::make_unique<ParallelTask>(std::move(tokenizer), std::move(splits), max_seq_len);
}

TranslateEval evaluate_valid(DecoderLM& model, const ParallelTask& task, const TranslateOptions& o, Device dev) {
  TranslateEval e;
  double loss_sum = 0, tokens = 0;
  const auto& pairs = task.valid().pairs;
  for (size_t from = 0; from < pairs.size(); from += 64) {
    std::vector<const EncodedPair*> chunk;
    for (size_t i = from; i < std::min(pairs.size(), from + 64); ++i) chunk.push_back(&pairs[i]);
    const examples::Batch b = task.make_batch(chunk);
    double n = 0;
    for (double t : b.targets) n += t != examples::kIgnore;
    model.eval();
    const Tensor logits = model.forward(Tensor::from_vector(b.inputs, {b.batch, b.seq}, DType::F32, dev));
    model.train();
    loss_sum += n * cross_entropy_forward(logits, Tensor::from_vector(b.targets, {b.batch, b.seq}, DType::F32, dev),
                                          examples::kIgnore, nullptr)
                        .item();
    tokens += n;
  }
  e.loss = loss_sum / std::max(1.0, tokens);
  e.bleu = translate_split(model_scorer(model, dev), task, task.valid(), o.beam, model.config().max_seq_len,
                           o.bleu_sentences)
               .bleu;
  return e;
}

void report_test(DecoderLM& model, const ParallelTask& task, const TranslateOptions& o, Device dev) {
  const auto t0 = std::chrono::steady_clock::now();
  const Translations t =
      translate_split(model_scorer(model, dev), task, task.test(), o.beam, model.config().max_seq_len, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const BleuScore& b = t.bleu;
  std::printf("test BLEU %.2f (%zu pairs, %s, %.1f s): %.1f/%.1f/%.1f/%.1f, BP %.3f, hyp/ref length %ld/%ld\n", b.bleu,
              t.hypotheses.size(), o.beam <= 1 ? "greedy" : ("beam " + std::to_string(o.beam)).c_str(), s,
              b.precision[0], b.precision[1], b.precision[2], b.precision[3], b.brevity_penalty, b.hyp_len, b.ref_len);
  for (size_t i = 0; i < std::min<size_t>(5, t.hypotheses.size()); ++i)
    std::printf("  src: %s\n  out: %s\n  ref: %s\n", t.sources[i].c_str(), t.hypotheses[i].c_str(),
                t.references[i].c_str());
}

}  // namespace hg::translation
