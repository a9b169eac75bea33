#include "examples/common/subword_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "core/error.hpp"

namespace hg::cli {

namespace {

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

}  // namespace

bool SubwordTokenizer::available() { return true; }

SubwordTokenizer SubwordTokenizer::train(const std::vector<std::string>& sentences, int vocab_size,
                                         const std::string& model_type, bool exact_text) {
  HG_CHECK(model_type == "bpe" || model_type == "unigram", "SubwordTokenizer", "model type '", model_type,
           "': must be bpe or unigram");
  HG_CHECK(!sentences.empty(), "SubwordTokenizer", "no sentences to train on");
  // A map, not an argument string: '\n' is one of the values.
  std::unordered_map<std::string, std::string> args{{"model_type", model_type},
                                                    {"vocab_size", std::to_string(vocab_size)},
                                                    {"hard_vocab_limit", "false"},
                                                    {"character_coverage", "1.0"},
                                                    {"pad_id", "0"},
                                                    {"unk_id", "1"},
                                                    {"bos_id", "2"},
                                                    {"eos_id", "3"},
                                                    {"user_defined_symbols", "<sep>"},
                                                    {"num_threads", "1"},
                                                    {"minloglevel", "2"},
                                                    {"max_sentence_length", "100000"}};
  if (exact_text) {
    args["normalization_rule_name"] = "identity";
    args["remove_extra_whitespaces"] = "false";
    args["add_dummy_prefix"] = "false";
    args["allow_whitespace_only_pieces"] = "true";
    args["byte_fallback"] = "true";             // a byte never seen in training is still encoded exactly
    args["character_coverage"] = "0.9995";      // rare characters are left to the byte pieces
    args["user_defined_symbols"] = "<sep>,\n";  // the training lines hold no '\n'; text does
  }
  VectorIterator it(sentences);
  std::string bytes;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &bytes);
  HG_CHECK(status.ok(), "SubwordTokenizer", "SentencePiece training (", model_type, ", vocab ", vocab_size, ", ",
           sentences.size(), " sentences) failed: ", status.ToString());
  return from_bytes(bytes);
}

SubwordTokenizer SubwordTokenizer::from_bytes(const std::string& model_bytes) {
  SubwordTokenizer t;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.sp_->LoadFromSerializedProto(model_bytes);
  HG_CHECK(status.ok(), "SubwordTokenizer", "not a SentencePiece model (", model_bytes.size(),
           " bytes): ", status.ToString());
  HG_CHECK(t.sp_->pad_id() == kPad && t.sp_->bos_id() == kBos && t.sp_->eos_id() == kEos &&
               t.sp_->PieceToId("<sep>") == kSep,
           "SubwordTokenizer", "the SentencePiece model's special ids differ from <pad> 0, <s> 2, </s> 3, <sep> 4");
  t.bytes_ = model_bytes;
  return t;
}

SubwordTokenizer::SubwordTokenizer(SubwordTokenizer&&) noexcept = default;
SubwordTokenizer& SubwordTokenizer::operator=(SubwordTokenizer&&) noexcept = default;
SubwordTokenizer::~SubwordTokenizer() = default;

std::vector<int32_t> SubwordTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  HG_CHECK(status.ok(), "SubwordTokenizer", "cannot encode: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SubwordTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> kept;
  for (int32_t id : ids)
    if (id > kSep && id < vocab_size()) kept.push_back(id);
  std::string text;
  const auto status = sp_->Decode(kept, &text);
  HG_CHECK(status.ok(), "SubwordTokenizer", "cannot decode: ", status.ToString());
  return text;
}

int64_t SubwordTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string SubwordTokenizer::piece(int32_t id) const {
  HG_CHECK(id >= 0 && id < vocab_size(), "SubwordTokenizer", "id ", id, " is not in 0..", vocab_size() - 1);
  return sp_->IdToPiece(id);
}

}  // namespace hg::cli
