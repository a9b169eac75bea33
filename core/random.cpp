#include "core/random.hpp"

#include <cmath>

#include "core/random_stream.hpp"

namespace hg {

namespace {

constexpr double kTwoPi = 6.283185307179586476925;  // M_PI is not standard C++

}  // namespace

uint64_t Generator::next_u64() {
  // Counter-based: the n-th number is a pure function of (seed, n), so the
  // stream is identical on every platform and can be resumed with set_state().
  // (core/random_stream.hpp: the same functions the device kernels call.)
  return random_stream::at(random_stream::key(seed_), counter_++);
}

double Generator::uniform() { return uniform_at(counter_++); }

double Generator::normal() {
  const double v = normal_at(counter_);
  counter_ += 2;
  return v;
}

double Generator::uniform_at(uint64_t n) const { return random_stream::uniform_at(random_stream::key(seed_), n); }

double Generator::normal_at(uint64_t n) const {
  // Box-Muller; u1 in (0, 1] keeps log() finite. One of the pair is used so
  // that the generator's whole state stays (seed, counter).
  const double u1 = 1.0 - uniform_at(n);
  const double u2 = uniform_at(n + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace hg
