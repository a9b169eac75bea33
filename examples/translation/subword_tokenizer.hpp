#pragma once
// A SentencePiece subword vocabulary shared by source and target, trained on
// the training split. Fixed special ids, the same for every model:
//   0 <pad>, 1 <unk>, 2 <s>, 3 </s>, 4 <sep> (between source and target).
// The trained model is a byte string (SentencePiece's serialized proto), which
// the trainer stores next to the checkpoint (translation_checkpoint.hpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace hg::translation {

class SubwordTokenizer {
 public:
  static constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3, kSep = 4;

  // False in a build without SentencePiece, where every constructor throws.
  static bool available();

  // Trains a "bpe" or "unigram" model on `sentences`. vocab_size is an upper
  // bound: a small corpus may give fewer pieces (hard_vocab_limit off).
  static SubwordTokenizer train(const std::vector<std::string>& sentences, int vocab_size,
                                const std::string& model_type);
  // Loads a serialized model (from model_bytes() of a trained one).
  static SubwordTokenizer from_bytes(const std::string& model_bytes);

  SubwordTokenizer(SubwordTokenizer&&) noexcept;
  SubwordTokenizer& operator=(SubwordTokenizer&&) noexcept;
  ~SubwordTokenizer();

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // special ids dropped
  int64_t vocab_size() const;
  const std::string& model_bytes() const { return bytes_; }

 private:
  SubwordTokenizer() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string bytes_;
};

}  // namespace hg::translation
