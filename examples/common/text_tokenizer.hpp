#pragma once
// The tokenizer of `train --data`: text <-> token ids.
//   bytes  256 ids, one per byte value: needs no training and no file.
//   bpe    a SentencePiece BPE vocabulary (subword_tokenizer.hpp) trained on
//          the training text, exact on any UTF-8 text (identity normalization,
//          spaces kept, byte pieces for what the vocabulary lacks; a byte that
//          is not UTF-8 comes back as U+FFFD). Stored
//          beside the checkpoint as CHECKPOINT.tokenizer, a SentencePiece
//          model file (spm_encode --model=CHECKPOINT.tokenizer reads it).
// A build without SentencePiece has bytes only: bpe throws, saying how to
// enable it. Copies share the trained model.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/common/subword_tokenizer.hpp"

namespace hg::cli {

class TextTokenizer {
 public:
  static TextTokenizer bytes();
  // Trains on `training_text` split into lines; vocab_size is an upper bound
  // (at least kMinBpeVocab: the special ids, '\n' and the 256 byte pieces).
  static TextTokenizer train_bpe(const std::string& training_text, int vocab_size);
  static constexpr int kMinBpeVocab = 6 + 256 + 1;
  static bool bpe_available() { return SubwordTokenizer::available(); }

  // bpe: writes CHECKPOINT.tokenizer (temporary file, fsync, rename); bytes: nothing to write.
  void save(const std::string& checkpoint) const;
  // kind "bytes" or "bpe" (the run record's "tokenizer"); bpe reads
  // CHECKPOINT.tokenizer. Throws hg::Error naming the file when it is missing
  // or not a SentencePiece model of this kind, or the kind is unknown.
  static TextTokenizer load(const std::string& checkpoint, const std::string& kind);

  std::vector<int32_t> encode(const std::string& text) const;
  // bpe drops the special ids (<pad>, <unk>, <s>, </s>, <sep>); bytes refuses ids outside 0..255.
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;
  const char* kind() const { return bpe_ ? "bpe" : "bytes"; }

 private:
  std::shared_ptr<const SubwordTokenizer> bpe_;  // null: bytes
};

std::string tokenizer_path(const std::string& checkpoint);  // checkpoint + ".tokenizer"

}  // namespace hg::cli
