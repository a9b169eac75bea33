#pragma once
// The text of `train --data`: one file, split into a training part (the
// first 90%) and a held-out part (the last 10%, at least one window of
// seq_len + 1 bytes), each turned into token ids by the run's tokenizer. A
// bpe tokenizer is trained on the training part alone (train_tokenizer):
// the held-out text is never seen before it is evaluated.
#include <cstdint>
#include <string>
#include <vector>

#include "examples/common/text_tokenizer.hpp"

namespace hg::cli {

struct TextSplit {
  std::string train, held_out;
};

// Reads `path` whole and splits it; hg::Error naming the file when it cannot
// be read or is too short for two windows of seq_len + 1 bytes.
TextSplit split_text_file(const std::string& path, int64_t seq_len);

// "bytes", or "bpe" trained on split.train with at most vocab_size pieces.
TextTokenizer train_tokenizer(const std::string& kind, const TextSplit& split, int vocab_size);

struct TextCorpus {
  std::vector<int32_t> train, held_out;  // token ids
  std::string prompt;                    // the held-out part's first 32 bytes (whole UTF-8 characters)
};

// Encodes both parts; hg::Error naming the file when a part has fewer than
// seq_len + 1 tokens.
TextCorpus tokenize_split(const TextSplit& split, const TextTokenizer& tokenizer, int64_t seq_len,
                          const std::string& path);

// Bytes of `text` that are not part of a well-formed UTF-8 sequence.
int64_t invalid_utf8_bytes(const std::string& text);
// `text` for a terminal: UTF-8 characters, '\n' and '\t' kept; control
// characters and bytes outside UTF-8 shown as '?'.
std::string printable_text(const std::string& text);

}  // namespace hg::cli
