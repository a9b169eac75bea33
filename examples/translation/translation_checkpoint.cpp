#include "examples/translation/translation_checkpoint.hpp"

#include "core/checkpoint.hpp"
#include "core/error.hpp"

namespace hg::translation {

namespace {
constexpr const char* kTokenizer = "tokenizer.sentencepiece";  // one byte per element (F32 holds 0..255 exactly)
constexpr const char* kConfig = "model.config";
}  // namespace

std::string vocab_path(const std::string& checkpoint) { return checkpoint + ".vocab"; }

void save_translation_info(const std::string& checkpoint, const TranslationModelInfo& info) {
  std::vector<double> bytes_u(info.tokenizer_bytes.size());
  for (size_t i = 0; i < bytes_u.size(); ++i) bytes_u[i] = static_cast<unsigned char>(info.tokenizer_bytes[i]);
  const DecoderLMConfig& c = info.config;
  const std::vector<double> config{double(c.vocab_size), double(c.max_seq_len), double(c.d_model),
                                   double(c.n_heads),    double(c.n_layers),    double(c.ffn_hidden)};
  write_checkpoint_file(vocab_path(checkpoint),
                        {{kTokenizer, Tensor::from_vector(bytes_u, {int64_t(bytes_u.size())})},
                         {kConfig, Tensor::from_vector(config, {int64_t(config.size())})}},
                        "translation vocab");
}

TranslationModelInfo load_translation_info(const std::string& checkpoint) {
  const std::string path = vocab_path(checkpoint);
  const auto records = read_checkpoint_file(path, "translation vocab");
  const auto tok = records.find(kTokenizer), cfg = records.find(kConfig);
  HG_CHECK(tok != records.end() && cfg != records.end() && cfg->second.numel() == 6, "translation vocab", path,
           ": not a translation vocab file (needs '", kTokenizer, "' and a 6-value '", kConfig, "')");
  TranslationModelInfo info;
  for (double b : tok->second.to_vector()) {
    HG_CHECK(b >= 0 && b <= 255 && b == static_cast<int>(b), "translation vocab", path, ": tokenizer byte ", b,
             " is not in 0..255");
    info.tokenizer_bytes.push_back(static_cast<char>(static_cast<unsigned char>(b)));
  }
  const std::vector<double> c = cfg->second.to_vector();
  info.config.vocab_size = static_cast<int64_t>(c[0]);
  info.config.max_seq_len = static_cast<int64_t>(c[1]);
  info.config.d_model = static_cast<int64_t>(c[2]);
  info.config.n_heads = static_cast<int64_t>(c[3]);
  info.config.n_layers = static_cast<int64_t>(c[4]);
  info.config.ffn_hidden = static_cast<int64_t>(c[5]);
  return info;
}

}  // namespace hg::translation
