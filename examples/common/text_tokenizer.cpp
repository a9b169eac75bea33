#include "examples/common/text_tokenizer.hpp"

#include "core/checkpoint.hpp"
#include "core/error.hpp"

namespace hg::cli {

namespace {
constexpr const char* kOp = "tokenizer";
}

std::string tokenizer_path(const std::string& checkpoint) { return checkpoint + ".tokenizer"; }

TextTokenizer TextTokenizer::bytes() { return TextTokenizer(); }

TextTokenizer TextTokenizer::train_bpe(const std::string& training_text, int vocab_size) {
  HG_CHECK(vocab_size >= kMinBpeVocab, kOp, "a bpe vocabulary of ", vocab_size, " pieces: needs at least ",
           kMinBpeVocab, " (5 special ids, '\\n' and 256 byte pieces, then the merges)");
  // SentencePiece trains on sentences: the lines, '\n' being a piece of its own.
  std::vector<std::string> lines;
  size_t from = 0;
  while (from < training_text.size()) {
    size_t end = training_text.find('\n', from);
    if (end == std::string::npos) end = training_text.size();
    if (end > from) lines.push_back(training_text.substr(from, end - from));
    from = end + 1;
  }
  HG_CHECK(!lines.empty(), kOp, "the training text (", training_text.size(),
           " bytes) has no line with text to train a bpe vocabulary on");
  TextTokenizer t;
  t.bpe_ = std::make_shared<const SubwordTokenizer>(SubwordTokenizer::train(lines, vocab_size, "bpe", true));
  return t;
}

void TextTokenizer::save(const std::string& checkpoint) const {
  if (bpe_) write_file_durably(tokenizer_path(checkpoint), bpe_->model_bytes(), kOp);
}

TextTokenizer TextTokenizer::load(const std::string& checkpoint, const std::string& kind) {
  if (kind == "bytes") return bytes();
  HG_CHECK(kind == "bpe", kOp, "unknown tokenizer '", kind, "' (allowed: bytes, bpe)");
  const std::string path = tokenizer_path(checkpoint);
  const std::string model = read_whole_file(path, kOp);
  TextTokenizer t;
  try {
    t.bpe_ = std::make_shared<const SubwordTokenizer>(SubwordTokenizer::from_bytes(model));
  } catch (const Error& e) {
    fail(kOp, path, ": ", e.what());
  }
  // Written by train_bpe: its layout starts with '\n' and the 256 byte pieces.
  HG_CHECK(t.vocab_size() >= kMinBpeVocab && t.bpe_->piece(5) == "\n" && t.bpe_->piece(6) == "<0x00>", kOp, path,
           ": a SentencePiece model, but not a bpe tokenizer of train --data ('\\n' and the byte pieces missing)");
  return t;
}

std::vector<int32_t> TextTokenizer::encode(const std::string& text) const {
  if (bpe_) return bpe_->encode(text);
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::string TextTokenizer::decode(const std::vector<int32_t>& ids) const {
  if (bpe_) return bpe_->decode(ids);
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    HG_CHECK(id >= 0 && id < 256, kOp, "id ", id, " is not a byte (the bytes tokenizer has ids 0..255)");
    out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return out;
}

int64_t TextTokenizer::vocab_size() const { return bpe_ ? bpe_->vocab_size() : 256; }

}  // namespace hg::cli
