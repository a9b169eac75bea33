// libFuzzer target for the .npy reader (hg::parse_npy). Any input must either
// parse or throw hg::Error; a parse must never hold more data than the input,
// and what it parses must survive a serialize/parse round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  hg::Tensor t;
  try {
    t = hg::parse_npy(bytes, "<fuzz>");
  } catch (const hg::Error&) {
    return 0;  // refused cleanly: the expected outcome for almost every input
  }
  if (t.nbytes() > size) std::abort();  // allocation not bounded by the input
  const hg::Tensor again = hg::parse_npy(hg::serialize_npy(t), "<round trip>");
  if (again.shape() != t.shape() || again.dtype() != t.dtype() ||
      (t.nbytes() > 0 && std::memcmp(again.raw_data(), t.raw_data(), t.nbytes()) != 0))
    std::abort();
  return 0;
}
