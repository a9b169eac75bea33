#include "core/host_allocator.hpp"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/error.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define HG_HOST_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HG_HOST_CACHE 0
#endif
#endif
#ifndef HG_HOST_CACHE
#define HG_HOST_CACHE 1
#endif

namespace hg::host {
namespace {

constexpr size_t kAlignment = 64;  // a cache line; enough for any SIMD load Eigen issues
constexpr size_t kCacheFrom =
    size_t(64) << 10;  // below glibc's 128 KiB mmap threshold: malloc's free lists serve those
constexpr size_t kPage = 4096;
// The cache never holds more than half the machine's memory; beyond that the
// largest blocks go back. (A fixed 4 GiB was too little for the unfused
// LayerNorm at 4096 x 16384, whose 256 MiB temporaries then faulted afresh on
// every call and ran 15x slower than their memory traffic explains.)
size_t max_cached() {
  static const size_t cap = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 2 : size_t(4) << 30;
  }();
  return cap;
}

void* system_alloc(size_t bytes) {
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) fail("host::allocate", "out of host memory allocating ", bytes, " bytes");
  return p;
}

class Cache {
 public:
  void* allocate(size_t bytes) {
    if (!HG_HOST_CACHE || bytes < kCacheFrom) return system_alloc(round_to(bytes, kAlignment));
    const size_t size = round_to(bytes, kPage);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Smallest cached block that fits, if it wastes at most half of itself.
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= 2 * size) {
        void* p = it->second;
        live_.emplace(p, it->first);
        cached_ -= it->first;
        free_.erase(it);
        return p;
      }
      ++fresh_allocs_;
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) {  // give the cache back and try once more
      empty();
      p = system_alloc(size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(p, size);
    return p;
  }

  void release(void* p, size_t bytes) noexcept {
    if (p == nullptr) return;
    if (!HG_HOST_CACHE || bytes < kCacheFrom) {  // never cached: no lock, no lookup
      std::free(p);
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(p);  // the block's real size: a reused block may exceed `bytes`
    if (it == live_.end()) {  // not from this cache (a bug elsewhere): hand it back, do not crash
      lock.unlock();
      std::free(p);
      return;
    }
    const size_t size = it->second;
    live_.erase(it);
    free_.emplace(size, p);
    cached_ += size;
    while (cached_ > max_cached()) {  // trim from the largest
      auto last = std::prev(free_.end());
      cached_ -= last->first;
      std::free(last->second);
      free_.erase(last);
    }
  }

  HostMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {cached_, fresh_allocs_};
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_ = 0;
  }

 private:
  static size_t round_to(size_t bytes, size_t unit) {
    const size_t r = (bytes + unit - 1) / unit * unit;
    if (r < bytes) fail("host::allocate", "size ", bytes, " bytes overflows");
    return r == 0 ? unit : r;  // empty tensors still get a valid, distinct pointer
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> live_;
  size_t cached_ = 0;
  int64_t fresh_allocs_ = 0;
};

// Never destroyed: tensors with static storage duration may be freed after
// any function-local static would have been.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

}  // namespace

void* allocate(size_t bytes) { return cache().allocate(bytes); }
void release(void* p, size_t bytes) noexcept { cache().release(p, bytes); }
HostMemoryStats memory_stats() { return cache().stats(); }
void empty_cache() { cache().empty(); }
bool caching_enabled() { return HG_HOST_CACHE != 0; }

}  // namespace hg::host
