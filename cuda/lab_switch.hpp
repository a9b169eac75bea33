#pragma once
// A lab switch: an environment variable that forces one experimental variant
// of a kernel family (HG_LN_VARIANT, HG_SOFTMAX_VARIANT) or one production
// table (HG_LN_TABLE), so that one build can time every candidate. Unset or
// empty: each case runs the variant its production table names (or the
// table the device's memory picks). Read once per process; a value that is
// not one of 0 .. count-1 is an hg::Error naming the variable and the
// allowed values.
// Tests and benchmarks force a variant in-process with LabSwitchScope.
// Plain C++, header only: the no-CUDA build needs nothing from it.
#include <atomic>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/error.hpp"
#include "core/whole_number.hpp"

namespace hg::gpu {

class LabSwitch {
 public:
  static constexpr int kProduction = -1;  // no variant forced: the production table decides

  LabSwitch(const char* env, int count) : env_(env), count_(count) {}
  LabSwitch(const LabSwitch&) = delete;
  LabSwitch& operator=(const LabSwitch&) = delete;

  const char* env() const { return env_; }
  int count() const { return count_; }

  // The variant forced now (a scope's, else the environment's), or kProduction.
  int forced() const {
    const int scoped = scoped_.load(std::memory_order_relaxed);
    return scoped != kUnscoped ? scoped : from_env();
  }

  // The variant a case runs: the forced one, else `production`.
  int pick(int production) const {
    const int f = forced();
    return f == kProduction ? production : f;
  }

  // Throws unless v is kProduction or one of 0 .. count-1.
  void check(int v, const char* who) const {
    HG_CHECK(v == kProduction || (v >= 0 && v < count_), who, env_, " variant must be one of 0..", count_ - 1,
             " (or unset for the production table), got ", v);
  }

 private:
  friend class LabSwitchScope;
  static constexpr int kUnscoped = -2;  // no LabSwitchScope alive

  int from_env() const {
    int cached = env_value_.load(std::memory_order_acquire);
    if (cached != kUnread) return cached;
    const int parsed = parse(std::getenv(env_));
    env_value_.store(parsed, std::memory_order_release);
    return parsed;
  }

  int parse(const char* text) const {
    if (text == nullptr || *text == '\0') return kProduction;
    const std::optional<long> n = parse_whole_number(text, 0, count_ - 1);
    HG_CHECK(n.has_value(), env_, "must be one of 0..", count_ - 1,
             " (a lab switch; unset for the production table), got '", text, "'");
    return static_cast<int>(*n);
  }

  static constexpr int kUnread = -3;  // the environment not read yet
  const char* env_;
  int count_;
  mutable std::atomic<int> env_value_{kUnread};
  std::atomic<int> scoped_{kUnscoped};
};

// Forces variant v (LabSwitch::kProduction: the production table, whatever
// the environment says) for the scope's life; restores the previous state.
class LabSwitchScope {
 public:
  LabSwitchScope(LabSwitch& s, int v) : switch_(s), previous_(s.scoped_.load()) {
    s.check(v, "LabSwitchScope");
    s.scoped_.store(v);
  }
  ~LabSwitchScope() { switch_.scoped_.store(previous_); }
  LabSwitchScope(const LabSwitchScope&) = delete;
  LabSwitchScope& operator=(const LabSwitchScope&) = delete;

 private:
  LabSwitch& switch_;
  int previous_;
};

namespace lab_switch_detail {
template <class Fn, int... Vs>
void with_variant(int v, Fn& fn, std::integer_sequence<int, Vs...>) {
  (void)((v == Vs && (fn(std::integral_constant<int, Vs>{}), true)) || ...);
}
}  // namespace lab_switch_detail

// Calls fn(std::integral_constant<int, v>{}): a run-time variant 0 .. N-1 as
// a template argument (a value outside runs nothing; callers pick through
// LabSwitch, which allows none).
template <int N, class Fn>
void with_variant(int v, Fn&& fn) {
  lab_switch_detail::with_variant(v, fn, std::make_integer_sequence<int, N>{});
}

}  // namespace hg::gpu
