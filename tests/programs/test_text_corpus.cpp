// The text of train --data (examples/common/text_corpus.hpp): the held-out
// split, a bpe vocabulary that never sees the held-out part, the checks
// that name the file, and the UTF-8 utilities of the sample.
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "examples/common/text_corpus.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using namespace hg::cli;
using Catch::Contains;

namespace {

// Lines of common words; `word` repeated in the last `tail` lines only.
std::string corpus_with_tail_word(const std::string& word, int lines, int tail) {
  std::string s;
  for (int i = 0; i < lines; ++i) {
    s += "the quick brown fox jumps over the lazy dog number " + std::to_string(i % 7);
    if (i >= lines - tail) s += " " + word + " " + word;
    s += "\n";
  }
  return s;
}

bool has_piece(const TextTokenizer& t, const std::string& word) {
  return t.encode(word).size() == 1;  // one id: the whole word is a piece
}

}  // namespace

TEST_CASE("text corpus: the last 10% is held out, at least one window") {
  const auto dir = hg::test::make_temp_dir("text_corpus_split");
  const std::string path = (dir / "t.txt").string();
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  hg::test::write_bytes(path, text);
  const TextSplit s = split_text_file(path, 8);
  CHECK(s.held_out.size() == 100);
  CHECK(s.train + s.held_out == text);
  const TextSplit wide = split_text_file(path, 300);  // 10% is less than one window of 301
  CHECK(wide.held_out.size() == 301);
  CHECK(wide.train.size() == 699);
  CHECK_THROWS_WITH(split_text_file(path, 500),
                    Contains("'" + path + "' has 1000 bytes; seq-len 500 needs at least 1002"));
  CHECK_THROWS_WITH(split_text_file((dir / "none.txt").string(), 8), Contains("none.txt"));

  const TextCorpus c = tokenize_split(s, TextTokenizer::bytes(), 8, path);
  CHECK(c.train.size() == 900);
  CHECK(c.held_out.size() == 100);
  CHECK(c.held_out[0] == 'a' + 900 % 26);
  CHECK(c.prompt == s.held_out.substr(0, 32));
  std::filesystem::remove_all(dir);
}

TEST_CASE("text corpus: too few tokens in a part is refused, naming the file") {
  TextSplit s{std::string(50, 'x'), "abc"};
  CHECK_THROWS_WITH(tokenize_split(s, TextTokenizer::bytes(), 8, "f.txt"),
                    Contains("--data file 'f.txt': its held-out part, the last 10% (3 bytes) holds 3 tokens of the "
                             "bytes tokenizer; --seq-len 8 needs at least 9"));
  TextSplit t{"ab", std::string(50, 'x')};
  CHECK_THROWS_WITH(tokenize_split(t, TextTokenizer::bytes(), 8, "f.txt"), Contains("its training part (2 bytes)"));
}

TEST_CASE("text corpus: the prompt never ends inside a UTF-8 character") {
  TextSplit s{std::string(100, 'x'), std::string(31, 'a') + "\xc3\xa9" + std::string(40, 'b')};  // 'é' at 31..32
  const TextCorpus c = tokenize_split(s, TextTokenizer::bytes(), 4, "f.txt");
  CHECK(c.prompt == std::string(31, 'a'));
}

TEST_CASE("text corpus: bpe is trained on the training part only") {
  if (!TextTokenizer::bpe_available()) HG_SKIP("SKIPPED: this build has no SentencePiece; bpe not trained");
  // "zyzzyva" stands 400 times in the last 5% of the text: held out, never a piece.
  const std::string text = corpus_with_tail_word("zyzzyva", 4000, 200);
  const TextSplit split{text.substr(0, text.size() * 9 / 10), text.substr(text.size() * 9 / 10)};
  REQUIRE(split.train.find("zyzzyva") == std::string::npos);
  REQUIRE(split.held_out.find("zyzzyva") != std::string::npos);
  const TextTokenizer t = train_tokenizer("bpe", split, 400);
  CHECK(std::string(t.kind()) == "bpe");
  CHECK_FALSE(has_piece(t, "zyzzyva"));
  CHECK(has_piece(t, "quick"));
  // The check can fail: trained on the whole text, the word becomes a piece.
  const TextTokenizer all = train_tokenizer("bpe", TextSplit{text, ""}, 400);
  CHECK(has_piece(all, "zyzzyva"));
  CHECK(std::string(train_tokenizer("bytes", split, 0).kind()) == "bytes");
  CHECK_THROWS_WITH(train_tokenizer("unigram", split, 400), Contains("unknown tokenizer 'unigram'"));
}

TEST_CASE("UTF-8: invalid bytes are counted, printable text keeps characters") {
  CHECK(invalid_utf8_bytes("plain ascii\n") == 0);
  CHECK(invalid_utf8_bytes("Größe ✓ 😀") == 0);
  CHECK(invalid_utf8_bytes("\xff") == 1);
  CHECK(invalid_utf8_bytes("a\xc3") == 1);             // cut short
  CHECK(invalid_utf8_bytes("\xc0\xaf") == 2);          // overlong
  CHECK(invalid_utf8_bytes("\xed\xa0\x80") == 3);      // a surrogate
  CHECK(invalid_utf8_bytes("\xf4\x90\x80\x80") == 4);  // above U+10FFFF
  CHECK(invalid_utf8_bytes("\xe2\x9c\x93\x93") == 1);  // a stray continuation byte
  CHECK(printable_text("a\tb\nÄ✓") == "a\tb\nÄ✓");
  CHECK(printable_text(std::string("x\x01y\x7f\xff", 5)) == "x?y??");
}
