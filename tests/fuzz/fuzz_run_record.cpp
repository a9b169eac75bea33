// libFuzzer target for the run record beside a checkpoint
// (hg::cli::load_run_record, what `train --resume` and `generate` read
// first). Any file must load or be refused with hg::Error; a record that
// loads is saved again and must load to the same record.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "examples/common/run_record.hpp"
#include "tests/test_files.hpp"

namespace {

bool same(const hg::cli::RunRecord& a, const hg::cli::RunRecord& b) {
  const hg::DecoderLMConfig &x = a.model, &y = b.model;
  return a.task == b.task && a.tokenizer == b.tokenizer && a.flags == b.flags && x.vocab_size == y.vocab_size &&
         x.max_seq_len == y.max_seq_len && x.d_model == y.d_model && x.n_heads == y.n_heads &&
         x.n_layers == y.n_layers && x.ffn_hidden == y.ffn_hidden && x.ln_eps == y.ln_eps && x.dropout == y.dropout;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string checkpoint = (hg::test::make_temp_dir("fuzz_run_record") / "lm").string();
  hg::test::write_bytes(hg::cli::run_record_path(checkpoint), std::string(reinterpret_cast<const char*>(data), size));
  hg::cli::RunRecord record;
  try {
    record = hg::cli::load_run_record(checkpoint);
  } catch (const hg::Error&) {
    return 0;
  }
  hg::cli::save_run_record(checkpoint, record);
  if (!same(hg::cli::load_run_record(checkpoint), record)) std::abort();
  return 0;
}
