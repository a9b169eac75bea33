#include "core/streaming_stores.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "core/whole_number.hpp"

namespace hg {
namespace {

constexpr long kMaxMiB = 1 << 20;  // 1 TiB

int64_t threshold_from_environment() {
  const char* text = std::getenv("HG_CPU_STREAM_MIB");
  if (text == nullptr || *text == '\0') return kDefaultStreamingStoreMiB << 20;
  if (std::strcmp(text, "off") == 0) return std::numeric_limits<int64_t>::max();
  const std::optional<long> mib = parse_whole_number(text, 0, kMaxMiB);
  HG_CHECK(mib.has_value(), "HG_CPU_STREAM_MIB", "'", text, "' is not allowed: a whole number of MiB 0..", kMaxMiB,
           " (outputs at least that large use streaming stores) or 'off'");
  return static_cast<int64_t>(*mib) << 20;
}

std::atomic<int64_t>& threshold() {
  static std::atomic<int64_t> bytes{threshold_from_environment()};
  return bytes;
}

}  // namespace

int64_t streaming_store_bytes() { return threshold().load(std::memory_order_relaxed); }

void set_streaming_store_bytes(int64_t bytes) {
  HG_CHECK(bytes >= 0, "set_streaming_store_bytes", "threshold ", bytes, " bytes is not allowed: >= 0");
  threshold().store(bytes, std::memory_order_relaxed);
}

}  // namespace hg
