// The tokenizers of `train --data` (examples/common/text_tokenizer.hpp):
// bytes and bpe give back exactly the text they encoded, bpe on text it never
// saw too; a saved bpe tokenizer loads to the same encoding; missing,
// damaged and foreign files are refused, naming the file.
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "examples/common/subword_tokenizer.hpp"
#include "examples/common/text_tokenizer.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
using hg::cli::SubwordTokenizer;
using hg::cli::TextTokenizer;
using hg::cli::tokenizer_path;

namespace {

// A few KB of code-like text: indentation, blank lines, repeated words.
std::string code_text() {
  std::string s;
  for (int i = 0; i < 60; ++i) {
    const std::string n = std::to_string(i);
    s += "def function_" + n + "(value, other=None):\n";
    s += "    \"\"\"Return the value plus " + n + ".\"\"\"\n";
    s += "    if other is None:\n        return value + " + n + "\n";
    s += "    return value * other  # scaled\n\n";
  }
  return s;
}

// Text the tokenizer never saw: other words, characters and bytes, odd spacing.
const std::vector<std::string>& unseen_texts() {
  static const std::vector<std::string> texts{
      "",
      "\n",
      "\n\n\n",
      "  leading and trailing spaces  ",
      "tabs\tand  double  spaces\t\n",
      "class Zebra:\r\n    pass\r\n",
      "Größe: »%s« ✓ 日本語 😀",
      std::string("control \x01\x02 and a zero \0 byte", 27),
      "def function_7(value, other=None):\n    return value\n",
  };
  return texts;
}

}  // namespace

TEST_CASE("bytes tokenizer: one id per byte, exact on any bytes, nothing stored") {
  const TextTokenizer t = TextTokenizer::bytes();
  CHECK(std::string(t.kind()) == "bytes");
  CHECK(t.vocab_size() == 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<int32_t> ids = t.encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[b] == b);
  CHECK(t.decode(ids) == all);
  for (const std::string& s : unseen_texts()) CHECK(t.decode(t.encode(s)) == s);
  CHECK_THROWS_WITH(t.decode({65, 256}), Contains("id 256 is not a byte"));
  CHECK_THROWS_WITH(t.decode({-1}), Contains("id -1 is not a byte"));

  const auto dir = hg::test::make_temp_dir("bytes_tokenizer");
  const std::string ck = (dir / "lm").string();
  t.save(ck);
  CHECK_FALSE(std::filesystem::exists(tokenizer_path(ck)));
  CHECK(TextTokenizer::load(ck, "bytes").vocab_size() == 256);
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "wordpiece"),
                    Contains("unknown tokenizer 'wordpiece' (allowed: bytes, bpe)"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("bpe tokenizer: exact on seen and unseen text, shorter than bytes, saved and loaded") {
  if (!TextTokenizer::bpe_available()) {
    CHECK_THROWS_WITH(TextTokenizer::train_bpe("some text", 400), Contains("without SentencePiece"));
    HG_SKIP("SKIPPED: this build has no SentencePiece; the bpe tokenizer did not run");
  }
  const std::string text = code_text();
  const TextTokenizer t = TextTokenizer::train_bpe(text, 400);
  CHECK(std::string(t.kind()) == "bpe");
  CHECK(t.vocab_size() <= 400);
  CHECK(t.vocab_size() > TextTokenizer::kMinBpeVocab);
  const std::vector<int32_t> ids = t.encode(text);
  CHECK(t.decode(ids) == text);
  // Deterministic: every rank of a data-parallel run trains its own copy.
  const TextTokenizer again = TextTokenizer::train_bpe(text, 400);
  REQUIRE(again.vocab_size() == t.vocab_size());
  for (int32_t id = 0; id < t.vocab_size(); ++id) CHECK(again.decode({id}) == t.decode({id}));
  CHECK(again.encode(text) == ids);
  CHECK(ids.size() * 3 < text.size());  // merges learned: well under one id per byte
  for (int32_t id : ids) {
    CHECK(id > SubwordTokenizer::kSep);  // no <unk> or other special id in exact text
    CHECK(id < t.vocab_size());
  }
  for (const std::string& s : unseen_texts()) {
    INFO("text: " << s);
    CHECK(t.decode(t.encode(s)) == s);
  }
  // Exact on UTF-8 only: SentencePiece reads a byte that is not UTF-8 as U+FFFD.
  CHECK(t.decode(t.encode("a\xff b")) == "a\xef\xbf\xbd b");
  // The training text is cut into lines: '\n' is one piece, never part of another.
  CHECK(t.encode("\n") == std::vector<int32_t>{5});
  // Special ids decode to nothing (a sampled <unk> or <s> leaves no mark).
  CHECK(t.decode({SubwordTokenizer::kUnk, ids[0], SubwordTokenizer::kBos}) == t.decode({ids[0]}));

  const auto dir = hg::test::make_temp_dir("bpe_tokenizer");
  const std::string ck = (dir / "lm").string();
  t.save(ck);
  CHECK_FALSE(std::filesystem::exists(tokenizer_path(ck) + ".tmp"));
  const TextTokenizer back = TextTokenizer::load(ck, "bpe");
  CHECK(back.vocab_size() == t.vocab_size());
  CHECK(back.encode(text) == ids);
  for (const std::string& s : unseen_texts()) CHECK(back.encode(s) == t.encode(s));
  std::filesystem::remove_all(dir);
}

TEST_CASE("bpe tokenizer: missing, damaged and foreign files are refused, naming the file") {
  if (!TextTokenizer::bpe_available()) HG_SKIP("SKIPPED: this build has no SentencePiece; bpe files not checked");
  const auto dir = hg::test::make_temp_dir("bpe_tokenizer_bad");
  const std::string ck = (dir / "lm").string(), path = tokenizer_path(ck);
  CHECK(path == ck + ".tokenizer");
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "bpe"), Contains(path) && Contains("does not exist"));

  TextTokenizer::train_bpe(code_text(), 400).save(ck);
  const std::string good = hg::test::read_bytes(path);
  hg::test::write_bytes(path, "");
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "bpe"), Contains(path));
  hg::test::write_bytes(path, "this is not a SentencePiece model at all");
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "bpe"), Contains(path) && Contains("not a SentencePiece model"));
  hg::test::write_bytes(path, good.substr(0, good.size() / 3));  // cut short
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "bpe"), Contains(path));

  // A SentencePiece model of another kind: translate's vocabulary.
  const SubwordTokenizer translation =
      SubwordTokenizer::train({"open the file", "close the window", "öffne die Datei"}, 60, "bpe");
  hg::test::write_bytes(path, translation.model_bytes());
  CHECK_THROWS_WITH(TextTokenizer::load(ck, "bpe"), Contains(path) && Contains("not a bpe tokenizer of train --data"));

  CHECK_THROWS_WITH(TextTokenizer::train_bpe(code_text(), 100), Contains("needs at least 263"));
  CHECK_THROWS_WITH(TextTokenizer::train_bpe("\n\n\n", 400), Contains("no line with text"));
  std::filesystem::remove_all(dir);
}
