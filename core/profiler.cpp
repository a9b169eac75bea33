#include "core/profiler.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/cuda_runtime.hpp"

namespace hg::prof {
namespace {
bool g_enabled = false;
int g_depth = 0;  // open scopes; only depth 0 -> 1 starts a timed scope
std::vector<Entry> g_entries;

// HG_PROFILE_CLOCK=cpu: the process's CPU time instead of wall time, for a
// machine shared with other jobs, where wall time counts their share too.
bool cpu_clock() {
  static const bool on = [] {
    const char* v = std::getenv("HG_PROFILE_CLOCK");
    return v != nullptr && std::strcmp(v, "cpu") == 0;
  }();
  return on;
}

int64_t now_ns() {
  if (cpu_clock()) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void sync(Device device) {
  if (device == Device::CUDA) gpu::synchronize();
}
}  // namespace

void enable(bool on) { g_enabled = on; }
bool enabled() { return g_enabled; }
void reset() { g_entries.clear(); }
std::vector<Entry> entries() { return g_entries; }

void Scope::begin(const char* kind, Device device) {
  active_ = true;
  if (g_depth++ > 0) {  // nested: the enclosing scope already counts this time
    kind_ = nullptr;
    return;
  }
  kind_ = kind;
  device_ = device;
  sync(device_);  // so earlier queued work is not charged to this kind
  start_ns_ = now_ns();
}

void Scope::end() {
  --g_depth;
  if (kind_ == nullptr) return;
  sync(device_);
  const double ms = static_cast<double>(now_ns() - start_ns_) * 1e-6;
  for (Entry& e : g_entries) {
    if (e.kind == kind_) {
      e.total_ms += ms;
      ++e.calls;
      return;
    }
  }
  g_entries.push_back({kind_, ms, 1});
}

}  // namespace hg::prof
