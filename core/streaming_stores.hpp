#pragma once
#include <cstdint>
#include <limits>

// When a CPU kernel writes its output with streaming (non-temporal) stores
// (core/simd.hpp store_streaming): only outputs of at least
// streaming_store_bytes(), which a consumer reading them next would not find
// in cache anyway. Smaller outputs keep normal stores, so the op after them
// reads them from cache (docs/cpu.md: why 16 MiB, and the measurements).
namespace hg {

constexpr int64_t kDefaultStreamingStoreMiB = 16;

// The threshold in bytes: HG_CPU_STREAM_MIB (a whole number of MiB, or "off")
// when set, else kDefaultStreamingStoreMiB. A bad value is an hg::Error.
int64_t streaming_store_bytes();
void set_streaming_store_bytes(int64_t bytes);  // >= 0, else hg::Error; for tests and benches
inline bool use_streaming_stores(int64_t output_bytes) { return output_bytes >= streaming_store_bytes(); }

}  // namespace hg
