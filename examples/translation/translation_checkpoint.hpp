#pragma once
// What a translation model needs besides its weights: the subword vocabulary
// and the model's shape. Stored in a sidecar file CHECKPOINT.vocab, in the
// checkpoint format (core/checkpoint.hpp: checksummed, written to a temp file,
// fsynced and renamed), so `translate --checkpoint CK` rebuilds the model and
// a resumed run keeps the vocabulary it started with.
#include <string>

#include "examples/common/subword_tokenizer.hpp"
#include "models/decoder_lm.hpp"

namespace hg::translation {

struct TranslationModelInfo {
  std::string tokenizer_bytes;  // SubwordTokenizer::model_bytes()
  DecoderLMConfig config;       // vocab, max_seq_len, d_model, heads, layers, ffn_hidden
};

std::string vocab_path(const std::string& checkpoint);  // checkpoint + ".vocab"
void save_translation_info(const std::string& checkpoint, const TranslationModelInfo& info);
// Throws hg::Error naming the file when it is missing, damaged or not a vocab file.
TranslationModelInfo load_translation_info(const std::string& checkpoint);

}  // namespace hg::translation
