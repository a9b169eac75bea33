#include "core/streaming_stores.hpp"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.hpp"

namespace hg {
namespace {

constexpr long kMaxMiB = 1 << 20;  // 1 TiB

int64_t threshold_from_environment() {
  const char* text = std::getenv("HG_CPU_STREAM_MIB");
  if (text == nullptr || *text == '\0') return kDefaultStreamingStoreMiB << 20;
  if (std::strcmp(text, "off") == 0) return std::numeric_limits<int64_t>::max();
  errno = 0;
  char* end = nullptr;
  const long mib = std::strtol(text, &end, 10);
  HG_CHECK(errno == 0 && end != text && *end == '\0' && mib >= 0 && mib <= kMaxMiB, "HG_CPU_STREAM_MIB", "'",
           text, "' is not allowed: a whole number of MiB 0..", kMaxMiB,
           " (outputs at least that large use streaming stores) or 'off'");
  return static_cast<int64_t>(mib) << 20;
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
