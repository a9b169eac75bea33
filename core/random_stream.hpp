#pragma once
// The counter-based stream behind hg::Generator as inline functions that host
// code and CUDA kernels share (cuda/ may include core/): a number drawn on the
// GPU from (seed, n) is the one the host draws, bit for bit, so a dropout
// mask made by a kernel equals the mask the CPU makes from the same seed.
#include <cstdint>

#if defined(__CUDACC__)
#define HG_HOST_DEVICE __host__ __device__
#else
#define HG_HOST_DEVICE
#endif

namespace hg::random_stream {

// splitmix64's finaliser: a bijective avalanche mix of 64 bits.
HG_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A seed's key, computed once per stream.
HG_HOST_DEVICE inline uint64_t key(uint64_t seed) { return mix64(seed ^ 0x6a09e667f3bcc909ull); }

// The n-th number of the stream with this key: a pure function of (seed, n).
HG_HOST_DEVICE inline uint64_t at(uint64_t stream_key, uint64_t n) {
  return mix64(stream_key + n * 0x9e3779b97f4a7c15ull);
}

// Top 53 bits -> exactly representable doubles in [0, 1).
HG_HOST_DEVICE inline double uniform_at(uint64_t stream_key, uint64_t n) {
  return static_cast<double>(at(stream_key, n) >> 11) * 0x1.0p-53;
}

}  // namespace hg::random_stream
