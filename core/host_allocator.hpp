#pragma once
#include <cstddef>
#include <cstdint>

namespace hg::host {

// Host memory for CPU tensors. Blocks of 64 KiB and more are cached when
// freed and handed out again, like the CUDA caching allocator: a fresh
// multi-megabyte malloc is an mmap whose every page faults on first touch,
// and in a VM those faults cost more than the op that touches the memory
// (a 4096 x 256 float32 LayerNorm measured 16 ms instead of ~2 ms).
// Sanitizer builds bypass the cache so AddressSanitizer still sees every
// use after free.
void* allocate(size_t bytes);                  // 64-byte aligned; throws hg::Error when out of memory
void release(void* p, size_t bytes) noexcept;  // p and the bytes asked for, from allocate (p may be nullptr)

struct HostMemoryStats {
  size_t cached = 0;         // bytes held in the cache, free for reuse
  int64_t fresh_allocs = 0;  // large blocks that had to come from the system
};
HostMemoryStats memory_stats();
bool caching_enabled();  // false in AddressSanitizer builds
void empty_cache();      // returns every cached block to the system

}  // namespace hg::host
