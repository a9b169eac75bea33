// SubwordTokenizer in a build without SentencePiece: every way to get one
// fails with a message that says how to enable it (available() is false, so
// `train --task translate` and `train --tokenizer bpe` refuse up front).
#include "examples/common/subword_tokenizer.hpp"

#include "core/error.hpp"

namespace sentencepiece {
class SentencePieceProcessor {};  // never created in this build
}  // namespace sentencepiece

namespace hg::cli {

namespace {
[[noreturn]] void unavailable() {
  fail("SubwordTokenizer", "handgrad was built without SentencePiece: apt-get install libsentencepiece-dev "
                           "(scripts/install_deps.sh), then reconfigure");
}
}  // namespace

bool SubwordTokenizer::available() { return false; }
SubwordTokenizer SubwordTokenizer::train(const std::vector<std::string>&, int, const std::string&, bool) {
  unavailable();
}
SubwordTokenizer SubwordTokenizer::from_bytes(const std::string&) { unavailable(); }
SubwordTokenizer::SubwordTokenizer(SubwordTokenizer&&) noexcept = default;
SubwordTokenizer& SubwordTokenizer::operator=(SubwordTokenizer&&) noexcept = default;
SubwordTokenizer::~SubwordTokenizer() = default;
std::vector<int32_t> SubwordTokenizer::encode(const std::string&) const { unavailable(); }
std::string SubwordTokenizer::decode(const std::vector<int32_t>&) const { unavailable(); }
int64_t SubwordTokenizer::vocab_size() const { unavailable(); }
std::string SubwordTokenizer::piece(int32_t) const { unavailable(); }

}  // namespace hg::cli
