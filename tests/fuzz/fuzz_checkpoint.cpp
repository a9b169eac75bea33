// libFuzzer target for the checkpoint loader (hg::parse_checkpoint, the
// parser behind Module::load). A random mutation almost never keeps the
// FNV-1a trailer valid, so every input is tried twice: as is (exercises the
// magic/checksum gate) and with a correct checksum appended (exercises every
// length, rank, dtype and shape check behind the gate). Either attempt must
// parse or throw hg::Error, never hold more tensor bytes than the input, and
// a successful parse must round-trip through serialize_checkpoint.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/checkpoint.hpp"

namespace {

void check_one(const std::string& bytes) {
  std::vector<hg::CheckpointRecord> records;
  try {
    records = hg::parse_checkpoint(bytes, "<fuzz>");
  } catch (const hg::Error&) {
    return;
  }
  size_t total = 0;
  for (const auto& r : records) total += r.value.nbytes();
  if (total > bytes.size()) std::abort();                        // allocation not bounded by the input
  if (hg::serialize_checkpoint(records) != bytes) std::abort();  // the format is canonical
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  check_one(body);
  std::string sealed = body;
  const uint64_t sum = hg::checkpoint_checksum(body.data(), body.size());
  for (int i = 0; i < 8; ++i) sealed += static_cast<char>((sum >> (8 * i)) & 0xff);
  check_one(sealed);
  return 0;
}
