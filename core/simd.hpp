#pragma once
// 16-float vectors for the CPU kernels, written once with GCC/Clang vector
// extensions, and the vectorised exp / tanh they share (docs/cpu.md has the
// derivations and the measured accuracy).
//
// Portability: the vector type is plain C++ to the compiler, so every target
// compiles it (one zmm on AVX-512, two ymm on AVX2, four xmm on SSE2 or NEON).
// HG_SIMD_CLONES on a kernel makes GCC build it three times on x86-64
// (x86-64-v4, -v3, baseline) and pick one per machine at load time (ifunc):
// the binary runs on any x86-64. The lanes are combined in a fixed order and
// C++17 mode leaves floating-point contraction off, so every clone gives
// bitwise the same result.
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define HG_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HG_SIMD_CLONES
#endif
// Every function and lambda that takes or returns Floats must be inlined
// into its kernel: a call across clones would pass a 64-byte vector under
// two ABIs (zmm register vs memory). always_inline makes GCC refuse to build
// rather than call (hence -Wno-psabi on the targets, whose notes say so).
#define HG_SIMD_INLINE inline __attribute__((always_inline))
#define HG_SIMD_LAMBDA __attribute__((always_inline))

namespace hg::simd {

constexpr int64_t kLanes = 16;
typedef float Floats __attribute__((vector_size(64)));
typedef int32_t Ints __attribute__((vector_size(64)));

HG_SIMD_INLINE Floats splat(float s) { return Floats{} + s; }
HG_SIMD_INLINE Floats load(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
HG_SIMD_INLINE void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }
// Copies k (< kLanes) floats in at most four fixed-size moves: a memcpy of
// a variable size is a library call, which cost more than the arithmetic on
// short rows (a 22-key softmax row spent most of its time in them).
HG_SIMD_INLINE void copy_short(float* dst, const float* src, int64_t k) {
  int64_t i = 0;
  if (k & 8) std::memcpy(dst, src, 8 * sizeof(float)), i = 8;
  if (k & 4) std::memcpy(dst + i, src + i, 4 * sizeof(float)), i += 4;
  if (k & 2) std::memcpy(dst + i, src + i, 2 * sizeof(float)), i += 2;
  if (k & 1) dst[i] = src[i];
}
// The first k (< kLanes) elements of p, the other lanes `fill`.
// (Straight into the vector's bytes: a float[16] scratch array written by a
// 64-byte vector store crashed under ASan's detect_stack_use_after_return.)
HG_SIMD_INLINE Floats load_partial(const float* p, int64_t k, float fill) {
  Floats v = splat(fill);
  copy_short(reinterpret_cast<float*>(&v), p, k);
  return v;
}
HG_SIMD_INLINE void store_partial(float* p, Floats v, int64_t k) {
  copy_short(p, reinterpret_cast<const float*>(&v), k);
}
// Lanes >= k become `fill`.
HG_SIMD_INLINE Floats keep_first(Floats v, int64_t k, float fill = 0.f) {
  const Ints lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<int32_t>(k) ? v : splat(fill);
}
// True when any lane of a comparison result is set.
HG_SIMD_INLINE bool any(Ints mask) {
  int32_t r = 0;
  for (int i = 0; i < kLanes; ++i) r |= mask[i];
  return r != 0;
}
HG_SIMD_INLINE Floats abs(Floats v) { return (Floats)((Ints)v & 0x7fffffff); }

// Horizontal sum / max in a fixed tree order.
HG_SIMD_INLINE float sum_lanes(Floats v) {
  float a[kLanes];
  std::memcpy(a, &v, sizeof a);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}
HG_SIMD_INLINE float max_lanes(Floats v) {  // v holds no NaN
  float a[kLanes];
  std::memcpy(a, &v, sizeof a);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i + w] > a[i] ? a[i + w] : a[i];
  return a[0];
}

// Sum over i in [0, n) of term(i, k), the vector of elements [i, i + k)
// (lanes >= k are zeroed here). Float32 in two levels: blocks of 16 vectors,
// then the block sums, so a running sum never takes more than
// 16 + n / 256 rounding steps (float64-grade accuracy is not needed where the
// terms are centred; docs/cpu.md).
template <class Term>
HG_SIMD_INLINE float sum(int64_t n, const Term& term) {
  Floats total{}, block{};
  int64_t i = 0, in_block = 0;
  for (; i + kLanes <= n; i += kLanes) {
    block += term(i, kLanes);
    if (++in_block == 16) {
      total += block;
      block = Floats{};
      in_block = 0;
    }
  }
  if (i < n) block += keep_first(term(i, n - i), n - i);
  return sum_lanes(total + block);
}

// N sums over the same range in one sweep; terms(i, k, t) writes the N term
// vectors into t. Each is added exactly as sum() adds it (same blocks, same
// order), so the results are bitwise those of N separate sum() calls; one
// sweep gives the CPU N independent add chains at once instead of one.
template <int N, class Terms>
HG_SIMD_INLINE void sums(int64_t n, const Terms& terms, float (&out)[N]) {
  Floats total[N] = {}, block[N] = {}, t[N];
  int64_t i = 0, in_block = 0;
  for (; i + kLanes <= n; i += kLanes) {
    terms(i, kLanes, t);
    for (int j = 0; j < N; ++j) block[j] += t[j];
    if (++in_block == 16) {
      for (int j = 0; j < N; ++j) total[j] += block[j], block[j] = Floats{};
      in_block = 0;
    }
  }
  if (i < n) {
    terms(i, n - i, t);
    for (int j = 0; j < N; ++j) block[j] += keep_first(t[j], n - i);
  }
  for (int j = 0; j < N; ++j) out[j] = sum_lanes(total[j] + block[j]);
}

// Applies out = f(in) to n floats, 16 at a time; the tail goes through the
// same f on a padded vector, so every element sees the same arithmetic.
template <class F>
HG_SIMD_INLINE void transform(const float* in, float* out, int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(out + i, f(load(in + i)));
  if (i < n) store_partial(out + i, f(load_partial(in + i, n - i, 0.f)), n - i);
}

// exp(x), float32, max error 1.2 ulp (measured over the range in
// tests/test_cpu_math.cpp), exact 0 for x <= -104 and -inf, +inf above
// 88.73, subnormal results rounded once, NaN in -> NaN out.
// x = n ln2 + r, |r| <= ln2 / 2 (ln2 split in two for an exact n ln2), e^r
// by its degree-7 Taylor polynomial (truncation < 2^-27), 2^n applied as two
// exact halves so that results in the subnormal range round only once.
HG_SIMD_INLINE Floats exp(Floats x) {
  const Floats xc = x < -104.f ? splat(-104.f) : (x > 89.f ? splat(89.f) : x);
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const Floats t = xc * 1.44269504088896341f + magic;
  const Floats n = t - magic;
  const Floats r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  Floats p = splat(1.f / 5040.f);
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const Ints ni = (Ints)t - (Ints)splat(magic);
  const Ints n1 = ni >> 1, n2 = ni - n1;
  const Floats s1 = (Floats)((n1 + 127) << 23), s2 = (Floats)((n2 + 127) << 23);
  const Floats y = p * s1 * s2;
  return x != x ? x : y;
}

// tanh(x), float32, max error 2 ulp (measured in tests/test_cpu_math.cpp),
// odd, exactly +-1 beyond |x| ~ 9, NaN in -> NaN out. |x| < 0.5: the Taylor
// series to x^15 (no cancellation near 0); otherwise 1 - 2 / (e^{2|x|} + 1).
HG_SIMD_INLINE Floats tanh(Floats x) {
  const Floats a = abs(x);
  const Floats a2 = a * a;
  Floats q = splat(6404582.f / 10854718875.f);
  q = q * a2 + -929569.f / 638512875.f;
  q = q * a2 + 21844.f / 6081075.f;
  q = q * a2 + -1382.f / 155925.f;
  q = q * a2 + 62.f / 2835.f;
  q = q * a2 + -17.f / 315.f;
  q = q * a2 + 2.f / 15.f;
  q = q * a2 + -1.f / 3.f;
  const Floats small = a + a * a2 * q;
  const Floats large = 1.f - 2.f / (exp(a + a) + 1.f);
  const Floats t = a < 0.5f ? small : large;
  return (Floats)((Ints)t | ((Ints)x & static_cast<int32_t>(0x80000000u)));
}

}  // namespace hg::simd
