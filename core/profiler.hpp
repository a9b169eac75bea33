#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.hpp"

// A lightweight, optional op-kind profiler for the end-to-end benchmark.
// Each op and leaf module opens one HG_PROFILE("softmax", device) at its
// entry (the kinds: docs/architecture.md); model code has no scopes of its
// own. When profiling is off (the default) a scope costs one branch. When on,
// a scope synchronizes the device at entry and exit and adds the steady_clock
// time to its kind, so the breakdown explains where a training step goes.
// Nested scopes count only the outermost one, so no time is counted twice.
namespace hg::prof {

void enable(bool on);
bool enabled();
void reset();

struct Entry {
  std::string kind;
  double total_ms = 0;
  int64_t calls = 0;
};
// Kinds in first-seen order.
std::vector<Entry> entries();

class Scope {
 public:
  Scope(const char* kind, Device device) {
    if (enabled()) begin(kind, device);
  }
  ~Scope() {
    if (active_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(const char* kind, Device device);
  void end();
  const char* kind_ = nullptr;
  Device device_ = Device::CPU;
  bool active_ = false;
  int64_t start_ns_ = 0;
};

}  // namespace hg::prof

#define HG_PROFILE_CAT2(a, b) a##b
#define HG_PROFILE_CAT(a, b) HG_PROFILE_CAT2(a, b)
#define HG_PROFILE(kind, device) ::hg::prof::Scope HG_PROFILE_CAT(hg_prof_scope_, __LINE__)(kind, device)
