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
#include <algorithm>
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
// The k (<= kLanes) elements at p, the other lanes `fill`; and the store
// of the first k lanes: one full-vector move when k == kLanes.
HG_SIMD_INLINE Floats load_n(const float* p, int64_t k, float fill = 0.f) {
  return k == kLanes ? load(p) : load_partial(p, k, fill);
}
HG_SIMD_INLINE void store_n(float* p, Floats v, int64_t k) {
  if (k == kLanes) store(p, v);
  else store_partial(p, v, k);
}
// Lanes >= k become `fill`.
HG_SIMD_INLINE Floats keep_first(Floats v, int64_t k, float fill = 0.f) {
  const Ints lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<int32_t>(k) ? v : splat(fill);
}
// True when any lane of a comparison result is set.
HG_SIMD_INLINE bool any(Ints mask) {
  mask |= __builtin_shufflevector(mask, mask, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  mask |= __builtin_shufflevector(mask, mask, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  mask |= __builtin_shufflevector(mask, mask, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  mask |= __builtin_shufflevector(mask, mask, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  return mask[0] != 0;
}
// Cache hints for the line holding p, which is about to be read / written:
// a row-wise kernel fetches its next rows while it computes on the current
// one, whose data is already in cache (the hardware prefetchers stop at
// 4 KiB pages, a row of 1024 floats). Never faults, whatever p is.
HG_SIMD_INLINE void prefetch(const float* p) { __builtin_prefetch(p, 0, 3); }
HG_SIMD_INLINE void prefetch_for_write(float* p) { __builtin_prefetch(p, 1, 3); }

// A full-vector store that bypasses the caches (non-temporal): the core
// does not read the line first (read-for-ownership), so a kernel writing an
// output too large to stay in cache moves 2/3 of the bytes (docs/cpu.md).
// p must be 16-byte aligned. SSE's movntps is in every x86-64 clone (four
// per vector); elsewhere a plain store. Only the store kind differs: the
// bits written are the same. Call store_fence() before other threads read.
HG_SIMD_INLINE void store_streaming(float* p, Floats v) {
#if defined(__x86_64__) && defined(__clang__)
  // In 16-byte pieces: a 64-byte one would demand 64-byte alignment.
  typedef float Quarter __attribute__((vector_size(16)));
  __builtin_nontemporal_store(__builtin_shufflevector(v, v, 0, 1, 2, 3), reinterpret_cast<Quarter*>(p));
  __builtin_nontemporal_store(__builtin_shufflevector(v, v, 4, 5, 6, 7), reinterpret_cast<Quarter*>(p + 4));
  __builtin_nontemporal_store(__builtin_shufflevector(v, v, 8, 9, 10, 11), reinterpret_cast<Quarter*>(p + 8));
  __builtin_nontemporal_store(__builtin_shufflevector(v, v, 12, 13, 14, 15), reinterpret_cast<Quarter*>(p + 12));
#elif defined(__x86_64__) && defined(__GNUC__)
  __builtin_ia32_movntps(p, __builtin_shufflevector(v, v, 0, 1, 2, 3));
  __builtin_ia32_movntps(p + 4, __builtin_shufflevector(v, v, 4, 5, 6, 7));
  __builtin_ia32_movntps(p + 8, __builtin_shufflevector(v, v, 8, 9, 10, 11));
  __builtin_ia32_movntps(p + 12, __builtin_shufflevector(v, v, 12, 13, 14, 15));
#else
  store(p, v);
#endif
}
// Orders this thread's streaming stores before its later stores (the
// thread pool's completion flag): x86's non-temporal stores are weakly ordered.
HG_SIMD_INLINE void store_fence() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_ia32_sfence();
#endif
}

HG_SIMD_INLINE Floats abs(Floats v) { return (Floats)((Ints)v & 0x7fffffff); }

// Horizontal sum / max in a fixed tree order: lane i meets lane i + w for
// w = 8, 4, 2, 1. Written as shuffles, so they stay in registers (through a
// float[16] GCC moved every lane out one by one).
template <class Combine>
HG_SIMD_INLINE float reduce_lanes(Floats v, const Combine& combine) {
  v = combine(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  v = combine(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7));
  v = combine(v, __builtin_shufflevector(v, v, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
  v = combine(v, __builtin_shufflevector(v, v, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
  return v[0];
}
HG_SIMD_INLINE float sum_lanes(Floats v) {
  return reduce_lanes(v, [](Floats a, Floats b) HG_SIMD_LAMBDA { return a + b; });
}
HG_SIMD_INLINE float max_lanes(Floats v) {  // v holds no NaN
  return reduce_lanes(v, [](Floats a, Floats b) HG_SIMD_LAMBDA { return b > a ? b : a; });
}

// N sums over i in [0, n) in one sweep: terms(i, k, t) writes into t the N
// term vectors of elements [i, i + k) (lanes >= k are zeroed here). Float32,
// each sum split over kChains accumulators (vector v of the range goes to
// chain v % kChains), so the CPU has N * kChains independent add chains
// rather than N latency-bound ones. Every 16 rounds the chains are added
// pairwise into one running total, so an element meets at most
// 16 + 2 + n / 1024 + 4 roundings (float64-grade accuracy is not needed where
// the terms are centred; docs/cpu.md). The order depends on n alone.
constexpr int kChains = 4;

template <int N, class Terms>
HG_SIMD_INLINE void sums(int64_t n, const Terms& terms, float (&out)[N]) {
  Floats total[N] = {}, chain[N][kChains] = {}, t[N];
  auto pairwise = [&](int j) HG_SIMD_LAMBDA { return (chain[j][0] + chain[j][1]) + (chain[j][2] + chain[j][3]); };
  int64_t i = 0;
  int rounds = 0;
  for (; i + kChains * kLanes <= n; i += kChains * kLanes) {
    for (int c = 0; c < kChains; ++c) {
      terms(i + c * kLanes, kLanes, t);
      for (int j = 0; j < N; ++j) chain[j][c] += t[j];
    }
    if (++rounds == 16) {
      for (int j = 0; j < N; ++j) {
        total[j] += pairwise(j);
        for (int c = 0; c < kChains; ++c) chain[j][c] = Floats{};
      }
      rounds = 0;
    }
  }
  // Fewer than kChains full vectors are left, then maybe a partial one; c
  // is a constant in each unrolled step, so the chains stay in registers.
#pragma GCC unroll 4
  for (int c = 0; c < kChains && i < n; ++c, i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    terms(i, k, t);
    for (int j = 0; j < N; ++j) chain[j][c] += k == kLanes ? t[j] : keep_first(t[j], k);
  }
  for (int j = 0; j < N; ++j) out[j] = sum_lanes(total[j] + pairwise(j));
}

// The sum over i in [0, n) of term(i, k), as sums<1> adds it.
template <class Term>
HG_SIMD_INLINE float sum(int64_t n, const Term& term) {
  float out[1];
  sums<1>(
      n, [&](int64_t i, int64_t k, Floats(&t)[1]) HG_SIMD_LAMBDA { t[0] = term(i, k); }, out);
  return out[0];
}

// Applies out = f(in) to n floats, 16 at a time; the tail goes through the
// same f on a padded vector, so every element sees the same arithmetic.
template <class F>
HG_SIMD_INLINE void transform(const float* in, float* out, int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(out + i, f(load(in + i)));
  if (i < n) store_partial(out + i, f(load_partial(in + i, n - i, 0.f)), n - i);
}

// e^x = 2^n e^r with n = round(x / ln2) (the 1.5 * 2^23 rounding trick) and
// |r| <= ln2 / 2 (ln2 split in two for an exact n ln2); returns e^r by its
// degree-7 Taylor polynomial (truncation < 2^-27) and n as integers.
HG_SIMD_INLINE Floats exp_reduced(Floats x, Ints& n_out) {
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const Floats t = x * 1.44269504088896341f + magic;
  const Floats n = t - magic;
  const Floats r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  Floats p = splat(1.f / 5040.f);
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  n_out = (Ints)t - (Ints)splat(magic);
  return p;
}

// exp(x), float32, max error 1.2 ulp (measured over the range in
// tests/test_cpu_math.cpp), exact 0 for x <= -104 and -inf, +inf above
// 88.73, subnormal results rounded once, NaN in -> NaN out.
// 2^n is applied as two exact halves so that results in the subnormal range
// round only once.
HG_SIMD_INLINE Floats exp(Floats x) {
  const Floats xc = x < -104.f ? splat(-104.f) : (x > 89.f ? splat(89.f) : x);
  Ints ni;
  const Floats p = exp_reduced(xc, ni);
  const Ints n1 = ni >> 1, n2 = ni - n1;
  const Floats s1 = (Floats)((n1 + 127) << 23), s2 = (Floats)((n2 + 127) << 23);
  const Floats y = p * s1 * s2;
  return x != x ? x : y;
}

// exp(x) for x in [-86, 88] (results normal floats) or NaN, bitwise equal to
// exp() there: no clamps and 2^n as one factor, for callers whose inputs are
// already bounded (the softmax's floored exponents). NaN in -> NaN out.
HG_SIMD_INLINE Floats exp_normal_range(Floats x) {
  Ints ni;
  const Floats p = exp_reduced(x, ni);
  return p * (Floats)((ni + 127) << 23);
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
