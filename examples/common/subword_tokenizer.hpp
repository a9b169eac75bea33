#pragma once
// A SentencePiece subword vocabulary (bpe or unigram), trained on a training
// split: shared by source and target for translation (examples/translation),
// and the `bpe` tokenizer of `train --data` (text_tokenizer.hpp). Fixed
// special ids, the same for every model:
//   0 <pad>, 1 <unk>, 2 <s>, 3 </s>, 4 <sep> (between source and target).
// The trained model is a byte string (SentencePiece's serialized proto,
// readable by SentencePiece's own tools), which the trainer stores next to the
// checkpoint.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace hg::cli {

class SubwordTokenizer {
 public:
  static constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3, kSep = 4;

  // False in a build without SentencePiece, where every constructor throws.
  static bool available();

  // Trains a "bpe" or "unigram" model on `sentences`. vocab_size is an upper
  // bound: a small corpus may give fewer pieces (hard_vocab_limit off).
  // exact_text false (translation): the text is NFKC-normalized and runs of
  // spaces are collapsed. true (language modelling): the text is kept as it
  // is, '\n' is a piece of its own and bytes outside the vocabulary become
  // byte pieces <0xNN>, so decode(encode(s)) == s for any UTF-8 text s (a
  // byte that is not UTF-8 is read as U+FFFD).
  static SubwordTokenizer train(const std::vector<std::string>& sentences, int vocab_size,
                                const std::string& model_type, bool exact_text = false);
  // Loads a serialized model (from model_bytes() of a trained one).
  static SubwordTokenizer from_bytes(const std::string& model_bytes);

  SubwordTokenizer(SubwordTokenizer&&) noexcept;
  SubwordTokenizer& operator=(SubwordTokenizer&&) noexcept;
  ~SubwordTokenizer();

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // special ids dropped
  int64_t vocab_size() const;
  const std::string& model_bytes() const { return bytes_; }
  std::string piece(int32_t id) const;  // the piece's text as SentencePiece stores it ("▁" for a space)

 private:
  SubwordTokenizer() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string bytes_;
};

}  // namespace hg::cli
