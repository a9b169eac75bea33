// Translation pieces: corpus BLEU against hand-computed values, the 13a
// tokenizer, TSV parsing with malformed lines, the subword tokenizer's round
// trip and storage, beam search (beam 1 = greedy) and a tiny train + translate.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/optim.hpp"
#include "examples/common/subword_tokenizer.hpp"
#include "examples/translation/bleu.hpp"
#include "examples/translation/decoding.hpp"
#include "examples/translation/parallel_corpus.hpp"
#include "examples/translation/parallel_task.hpp"
#include "examples/translation/translation_checkpoint.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using namespace hg::translation;

namespace {

std::vector<SentencePair> toy_pairs() {
  return {{"open the file", "öffne die Datei"},         {"close the file", "schließe die Datei"},
          {"open the window", "öffne das Fenster"},     {"close the window", "schließe das Fenster"},
          {"save the file", "speichere die Datei"},     {"delete the file", "lösche die Datei"},
          {"open the folder", "öffne den Ordner"},      {"close the folder", "schließe den Ordner"},
          {"save the window", "speichere das Fenster"}, {"delete the folder", "lösche den Ordner"},
          {"open a file", "öffne eine Datei"},          {"close a window", "schließe ein Fenster"}};
}

std::vector<std::string> sides(const std::vector<SentencePair>& pairs) {
  std::vector<std::string> s;
  for (const auto& p : pairs) {
    s.push_back(p.source);
    s.push_back(p.target);
  }
  return s;
}

}  // namespace

TEST_CASE("13a tokenization splits punctuation as sacrebleu does") {
  using V = std::vector<std::string>;
  CHECK(tokenize_13a("Hello, world!") == V{"Hello", ",", "world", "!"});
  CHECK(tokenize_13a("3.14, yes.") == V{"3.14", ",", "yes", "."});  // '.' inside a number stays
  CHECK(tokenize_13a("1,000 items") == V{"1,000", "items"});
  CHECK(tokenize_13a("pages 10-20") == V{"pages", "10", "-", "20"});  // '-' after a digit splits
  CHECK(tokenize_13a("well-known") == V{"well-known"});               // ... elsewhere not
  CHECK(tokenize_13a("&quot;a&quot; (b)") == V{"\"", "a", "\"", "(", "b", ")"});
  CHECK(tokenize_13a("don't") == V{"don't"});
  CHECK(tokenize_13a("a_b{c}~d[e]^f`g|h@i/j=k") == V{"a", "_", "b", "{", "c", "}", "~", "d", "[", "e", "]", "^",
                                                     "f", "`", "g", "|", "h", "@", "i", "/", "j", "=", "k"});
  CHECK(tokenize_13a("Größe: »%s«") == V{"Größe", ":", "»", "%", "s«"});  // non-ASCII is not punctuation to 13a
  CHECK(tokenize_13a("   ").empty());
}

TEST_CASE("corpus BLEU matches hand-computed values") {
  SECTION("a perfect match is 100") {
    const BleuScore s = corpus_bleu({"the cat sat on the mat"}, {"the cat sat on the mat"});
    CHECK(s.bleu == Approx(100.0));
    CHECK(s.brevity_penalty == 1.0);
  }
  SECTION("one word wrong: p = 5/6, 3/5, 2/4, 1/3, BLEU = 100 (1/12)^(1/4) = 53.7285") {
    // 1-grams: "the" appears twice in the hypothesis, once in the reference: clipped to 1.
    const BleuScore s = corpus_bleu({"the cat sat on the mat"}, {"the cat sat on a mat"});
    CHECK(s.precision[0] == Approx(100.0 * 5 / 6));
    CHECK(s.precision[1] == Approx(100.0 * 3 / 5));
    CHECK(s.precision[2] == Approx(100.0 * 2 / 4));
    CHECK(s.precision[3] == Approx(100.0 * 1 / 3));
    CHECK(s.bleu == Approx(53.7285).epsilon(1e-5));
  }
  SECTION("a short hypothesis pays the brevity penalty exp(1 - 6/4) = 0.60653") {
    const BleuScore s = corpus_bleu({"the cat sat on"}, {"the cat sat on the mat"});
    CHECK(s.brevity_penalty == Approx(std::exp(-0.5)));
    CHECK(s.bleu == Approx(100 * std::exp(-0.5)));
  }
  SECTION("counts add up over the corpus before the precisions: 5/6, 3/4, 2/2, 1/1 -> 88.9140") {
    // Sentence 2 alone has no 3-gram: corpus BLEU is not a mean of sentence scores.
    const BleuScore s = corpus_bleu({"a b c d", "x y"}, {"a b c d", "x z"});
    CHECK(s.bleu == Approx(88.9140).epsilon(1e-5));
    CHECK(s.hyp_len == 6);
    CHECK(s.ref_len == 6);
  }
  SECTION("no matching 4-gram gives 0 (no smoothing)") {
    CHECK(corpus_bleu({"a b c x e f"}, {"a b c d e f"}).bleu == 0.0);
    CHECK(corpus_bleu({""}, {"a b"}).bleu == 0.0);
  }
  SECTION("punctuation is tokenized before counting") {
    CHECK(corpus_bleu({"Hello, world!"}, {"Hello , world !"}).bleu == Approx(100.0));
  }
  CHECK_THROWS_WITH(corpus_bleu({"a"}, {}), Catch::Contains("1 hypotheses but 0 references"));
}

TEST_CASE("TSV parsing counts and reports malformed lines") {
  const std::string text = "Open\tÖffnen\n"
                           "no tab here\n"
                           "\tempty source\n"
                           "empty target\t  \n"
                           "\n"
                           "two\ttabs\there\n"
                           "Close\tSchließen\r\n";
  const ParallelCorpus c = parse_parallel_tsv(text, "toy.tsv");
  REQUIRE(c.pairs.size() == 2);
  CHECK(c.pairs[1].source == "Close");
  CHECK(c.pairs[1].target == "Schließen");  // "\r\n" line end
  CHECK(c.malformed == 4);
  REQUIRE(c.malformed_notes.size() == 4);
  CHECK(c.malformed_notes[0] == "toy.tsv line 2: no tab");
  CHECK(c.malformed_notes[1] == "toy.tsv line 3: empty source");
  CHECK(c.malformed_notes[2] == "toy.tsv line 4: empty target");
  CHECK(c.malformed_notes[3] == "toy.tsv line 6: more than one tab");
  CHECK_THROWS_WITH(parse_parallel_tsv("just text\n\n", "empty.tsv"),
                    Catch::Contains("empty.tsv: no valid source<TAB>target pair in 2 lines (1 malformed)"));
  CHECK_THROWS_WITH(parse_parallel_tsv("", "nothing.tsv"), Catch::Contains("nothing.tsv: no valid"));
  CHECK_THROWS_WITH(read_parallel_tsv("/nonexistent/x.tsv"), Catch::Contains("cannot open '/nonexistent/x.tsv'"));
}

TEST_CASE("corpus splits are disjoint, fixed by the seed") {
  std::vector<SentencePair> pairs;
  for (int i = 0; i < 100; ++i) pairs.push_back({"s" + std::to_string(i), "t" + std::to_string(i)});
  const CorpusSplits a = split_corpus(pairs, 5, 1000, 7), b = split_corpus(pairs, 5, 1000, 7);
  CHECK(a.valid.size() == 5);
  CHECK(a.test.size() == 10);  // capped at a tenth
  CHECK(a.train.size() == 85);
  CHECK(a.valid[0].source == b.valid[0].source);
  CHECK_THROWS_WITH(split_corpus({{"a", "b"}}, 1, 1, 0), Catch::Contains("need at least 3"));
}

TEST_CASE("the subword tokenizer round-trips text and survives storage") {
  const SubwordTokenizer t = SubwordTokenizer::train(sides(toy_pairs()), 60, "bpe");
  CHECK(t.vocab_size() <= 60);
  for (const std::string& s :
       {std::string("öffne die Datei"), std::string("close the window"), std::string("Ordner")}) {
    const std::vector<int32_t> ids = t.encode(s);
    REQUIRE(!ids.empty());
    for (int32_t id : ids) CHECK(id > SubwordTokenizer::kSep);
    CHECK(t.decode(ids) == s);
  }
  const SubwordTokenizer back = SubwordTokenizer::from_bytes(t.model_bytes());
  CHECK(back.encode("schließe den Ordner") == t.encode("schließe den Ordner"));
  const SubwordTokenizer unigram = SubwordTokenizer::train(sides(toy_pairs()), 60, "unigram");
  CHECK(unigram.decode(unigram.encode("öffne den Ordner")) == "öffne den Ordner");
  CHECK_THROWS_WITH(SubwordTokenizer::from_bytes("not a model"), Catch::Contains("not a SentencePiece model"));
  CHECK_THROWS_WITH(SubwordTokenizer::train({"a"}, 60, "wordpiece"), Catch::Contains("must be bpe or unigram"));
}

TEST_CASE("beam search: beam 1 is greedy; a wider beam finds a likelier line") {
  // A scripted scorer over 4 tokens (3 = </s>). After the prompt, token 1 is
  // likelier than 2, but 1 is followed by a flat distribution and 2 by a
  // near-certain </s>: greedy takes 1, beam 2 finds "2 </s>".
  const NextTokenScorer scorer = [](const std::vector<Tokens>& lines) {
    std::vector<std::vector<double>> out;
    for (const Tokens& l : lines) {
      std::vector<double> p;
      if (l.size() == 1) p = {0.0, 0.5, 0.4, 0.1};
      else if (l.back() == 2) p = {0.0, 0.0, 0.01, 0.99};
      else p = {0.25, 0.25, 0.25, 0.25};
      for (double& v : p) v = std::log(std::max(v, 1e-12));
      out.push_back(p);
    }
    return out;
  };
  const std::vector<Tokens> prompts{{0}};
  CHECK(greedy_decode(scorer, prompts, 3, 3) == std::vector<Tokens>{{1, 0}});
  CHECK(beam_decode(scorer, prompts, 1, 3, 3) == greedy_decode(scorer, prompts, 3, 3));
  CHECK(beam_decode(scorer, prompts, 2, 3, 3) == std::vector<Tokens>{{2}});

  // And on a real (untrained) model, over prompts of different lengths in one batch.
  DecoderLMConfig cfg;
  cfg.vocab_size = 23;
  cfg.max_seq_len = 12;
  cfg.d_model = 16;
  cfg.n_heads = 2;
  cfg.n_layers = 1;
  cfg.seed = 5;
  DecoderLM model(cfg);
  const std::vector<Tokens> mixed{{2, 7, 4}, {2, 9, 9, 11, 4}, {2, 4}, {2, 15, 16, 17, 18, 19, 4}};
  const NextTokenScorer s = model_scorer(model, Device::CPU);
  CHECK(beam_decode(s, mixed, 1, 12, 3) == greedy_decode(s, mixed, 12, 3));
  // Batching does not change a line's result.
  for (size_t i = 0; i < mixed.size(); ++i)
    CHECK(greedy_decode(s, {mixed[i]}, 12, 3)[0] == greedy_decode(s, mixed, 12, 3)[i]);
}

TEST_CASE("tiny end to end: train on a dozen pairs, save, reload, translate") {
  CorpusSplits splits;
  splits.train = toy_pairs();
  splits.valid = {toy_pairs()[0]};
  splits.test = {toy_pairs()[1]};
  ParallelTask task(SubwordTokenizer::train(sides(toy_pairs()), 60, "bpe"), splits, 24);
  DecoderLMConfig cfg;
  cfg.vocab_size = task.vocab_size();
  cfg.max_seq_len = 24;
  cfg.d_model = 32;
  cfg.n_heads = 2;
  cfg.n_layers = 1;
  cfg.seed = 1;
  DecoderLM model(cfg);
  AdamWOptions adam;
  adam.lr = 1e-2;
  AdamW opt(model.parameters(), adam);
  std::vector<const EncodedPair*> all;
  for (const EncodedPair& p : task.train().pairs) all.push_back(&p);
  const examples::Batch b = task.make_batch(all);
  double loss = 0;
  for (int step = 0; step < 150; ++step) {
    model.zero_grad();
    const Tensor logits = model.forward(Tensor::from_vector(b.inputs, {b.batch, b.seq}));
    CrossEntropySaved saved;
    loss = cross_entropy_forward(logits, Tensor::from_vector(b.targets, {b.batch, b.seq}), examples::kIgnore, &saved)
               .item();
    model.backward(cross_entropy_backward(saved));
    opt.step();
  }
  CHECK(loss < 0.1);  // memorized
  const Translations t = translate_split(model_scorer(model, Device::CPU), task, task.train(), 1, 24, 0);
  // Memorized: every training pair comes back exactly (3-word lines have no
  // 4-gram, so BLEU itself would be 0 here).
  CHECK(t.hypotheses == t.references);

  const auto dir = hg::test::make_temp_dir("translate_e2e");
  const std::string ck = (dir / "ck").string();
  model.save(ck, 150);
  save_translation_info(ck, {task.tokenizer().model_bytes(), model.config()});
  const TranslationModelInfo info = load_translation_info(ck);
  CHECK(info.config.vocab_size == cfg.vocab_size);
  CHECK(info.config.d_model == 32);
  DecoderLM reloaded(info.config);
  reloaded.load(ck);
  const SubwordTokenizer tok = SubwordTokenizer::from_bytes(info.tokenizer_bytes);
  const std::vector<std::string> src{"open the window", "delete the folder"};
  CHECK(translate_sentences(model_scorer(reloaded, Device::CPU), tok, src, 3, 24) ==
        translate_sentences(model_scorer(model, Device::CPU), task.tokenizer(), src, 3, 24));
  CHECK_THROWS_WITH(load_translation_info(ck + ".missing"), Catch::Contains(".missing.vocab"));
  std::filesystem::remove_all(dir);
}
