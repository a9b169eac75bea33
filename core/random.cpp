#include "core/random.hpp"

#include <cmath>

namespace hg {

namespace {

// splitmix64's finaliser: a bijective avalanche mix of 64 bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr double kTwoPi = 6.283185307179586476925;  // M_PI is not standard C++

}  // namespace

uint64_t Generator::next_u64() {
  // Counter-based: the n-th number is a pure function of (seed, n), so the
  // stream is identical on every platform and can be resumed with set_state().
  const uint64_t n = counter_++;
  return mix64(mix64(seed_ ^ 0x6a09e667f3bcc909ull) + n * 0x9e3779b97f4a7c15ull);
}

double Generator::uniform() {
  // Top 53 bits -> exactly representable doubles in [0, 1).
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Generator::normal() {
  // Box-Muller; u1 in (0, 1] keeps log() finite. One of the pair is used so
  // that the generator's whole state stays (seed, counter).
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace hg
