#include "examples/common/text_corpus.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/logging.hpp"

namespace hg::cli {

namespace {
constexpr const char* kOp = "train";
}

TextSplit split_text_file(const std::string& path, int64_t seq_len) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(kOp, "cannot open --data file '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  const int64_t need = 2 * (seq_len + 1);
  if (static_cast<int64_t>(text.size()) < need)
    fail(kOp, "--data file '", path, "' has ", text.size(), " bytes; seq-len ", seq_len, " needs at least ", need);
  // Last 10% (at least one window) held out for validation.
  const size_t held = std::max<size_t>(static_cast<size_t>(seq_len + 1), text.size() / 10);
  TextSplit s;
  s.held_out = text.substr(text.size() - held);
  text.resize(text.size() - held);
  s.train = std::move(text);
  return s;
}

TextTokenizer train_tokenizer(const std::string& kind, const TextSplit& split, int vocab_size) {
  if (kind == "bytes") return TextTokenizer::bytes();
  HG_CHECK(kind == "bpe", kOp, "unknown tokenizer '", kind, "' (allowed: bytes, bpe)");
  const auto t0 = std::chrono::steady_clock::now();
  TextTokenizer t = TextTokenizer::train_bpe(split.train, vocab_size);
  spdlog::info("trained a bpe vocabulary of {} pieces on the training part ({:.1f} MB) in {:.1f} s", t.vocab_size(),
               static_cast<double>(split.train.size()) * 1e-6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return t;
}

TextCorpus tokenize_split(const TextSplit& split, const TextTokenizer& tokenizer, int64_t seq_len,
                          const std::string& path) {
  TextCorpus c;
  c.train = tokenizer.encode(split.train);
  c.held_out = tokenizer.encode(split.held_out);
  const auto check = [&](const std::vector<int32_t>& ids, const char* part, size_t bytes) {
    if (static_cast<int64_t>(ids.size()) <= seq_len)
      fail(kOp, "--data file '", path, "': its ", part, " (", bytes, " bytes) holds ", ids.size(), " tokens of the ",
           tokenizer.kind(), " tokenizer; --seq-len ", seq_len, " needs at least ", seq_len + 1,
           " (use more text or a smaller --seq-len)");
  };
  check(c.train, "training part", split.train.size());
  check(c.held_out, "held-out part, the last 10%", split.held_out.size());
  // The sample's prompt: the first 32 bytes, never half a UTF-8 character.
  size_t n = std::min<size_t>(32, split.held_out.size());
  while (n > 0 && n < split.held_out.size() && (static_cast<unsigned char>(split.held_out[n]) & 0xC0) == 0x80) --n;
  c.prompt = split.held_out.substr(0, n);
  return c;
}

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), 0 if there is none.
size_t utf8_length_at(const unsigned char* s, size_t i, size_t n) {
  const unsigned char c = s[i];
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  bool ok = len > 0 && i + len <= n && !(len == 2 && c < 0xC2) && !(len == 4 && c > 0xF4);
  for (size_t k = 1; ok && k < len; ++k) ok = (s[i + k] & 0xC0) == 0x80;
  if (ok && len == 3) ok = !(c == 0xE0 && s[i + 1] < 0xA0) && !(c == 0xED && s[i + 1] > 0x9F);  // overlong, surrogate
  if (ok && len == 4) ok = !(c == 0xF0 && s[i + 1] < 0x90) && !(c == 0xF4 && s[i + 1] > 0x8F);  // overlong, > U+10FFFF
  return ok ? len : 0;
}

}  // namespace

int64_t invalid_utf8_bytes(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  int64_t bad = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_length_at(s, i, text.size());
    bad += len == 0;
    i += len == 0 ? 1 : len;
  }
  return bad;
}

std::string printable_text(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_length_at(s, i, text.size());
    const bool control = len == 1 && (s[i] < 32 || s[i] == 127) && s[i] != '\n' && s[i] != '\t';
    if (len == 0 || control) {
      out += '?';
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace hg::cli
