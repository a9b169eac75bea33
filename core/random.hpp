#pragma once
#include <cstdint>

namespace hg {

// Explicit, seeded generator. Numbers are drawn on the host (Philox-style
// counter hash), so the same seed gives the same tensor on CPU and CUDA.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t next_u64();  // advances the counter
  double uniform();     // [0, 1)
  double normal();      // N(0, 1), Box-Muller: takes two numbers
  // What uniform() / normal() return when the counter is n, without
  // advancing it: a tensor's draws can be filled by several threads, each
  // the same numbers as one call after another would give.
  double uniform_at(uint64_t n) const;
  double normal_at(uint64_t n) const;
  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  void set_state(uint64_t seed, uint64_t counter) {
    seed_ = seed;
    counter_ = counter;
  }
  // Skips n numbers: what n calls of next_u64() or uniform() would leave
  // (used after a device kernel drew numbers counter .. counter + n - 1).
  void advance(uint64_t n) { counter_ += n; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace hg
