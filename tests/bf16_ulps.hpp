#pragma once
// bf16 outputs against the float64 reference rounded to bf16, in ulps.
//
// Every bf16 path (fused and unfused, LayerNorm and softmax) computes in
// float32 and rounds once to bf16 when it stores. With r the exact result on
// the stored inputs (the float64 reference), f the path's float32 result and
// g = round_bf16(f) what it stores, rounding to nearest is monotone, so g and
// round_bf16(r) are separated by at most one rounding midpoint per bf16 ulp u
// between f and r:
//     |g - round_bf16(r)| <= u + |f - r|.
// The float32 error |f - r| is a few hundred 2^-24 at most relative to the
// magnitudes that enter the element (`slack`, below), far below u = 2^-8..2^-7
// relative, so where nothing cancels the bound is exactly 1 ulp. And g differs
// from round_bf16(r) only where a midpoint lies between f and r: a fraction
// ~2|f - r| / u ~ 1e-3 of the elements. We allow 1% + 3. A packer that
// truncates instead of rounding misses round_bf16(r) on ~half the elements
// (whenever the dropped 16 bits are >= half), so it fails that count even
// though each of its errors is within one ulp. docs/testing.md has the bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/parallel.hpp"

namespace hg::test {

// Round to nearest even of a double to bfloat16 (8 significant bits, the
// float32 exponent range), straight from the double: independent of the
// library's float -> bf16 conversion and free of double rounding. From 2^-126
// up, on the bits: the 52-bit significand rounded to 7 bits, ties to even (a
// carry steps the exponent). Below, bf16 is subnormal: a fixed spacing of
// 2^-133. The same numbers as ldexp(nearbyint(ldexp(v, 7 - e)), e - 7) with
// e = max(ilogb(v), -126), several times faster (the kernel tests compare
// millions of elements).
inline double round_to_bf16(double v) {
  if (!std::isfinite(v) || v == 0.0) return v;
  if (std::abs(v) < 0x1p-126) return std::nearbyint(v * 0x1p133) * 0x1p-133;  // default rounding: ties to even
  constexpr int kDropped = 52 - 7;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  bits += ((uint64_t{1} << (kDropped - 1)) - 1) + ((bits >> kDropped) & 1);
  bits &= ~((uint64_t{1} << kDropped) - 1);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Spacing of bf16 numbers at |v|: 2^(e - 7) in the binade [2^e, 2^(e + 1)),
// e at least -126; e read from the double's exponent field (0 for double
// subnormals, which are far below 2^-126).
inline double bf16_ulp(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  const int field = static_cast<int>((bits >> 52) & 0x7ff);
  const int e = (v == 0.0 || field == 0x7ff) ? -126 : std::max(field - 1023, -126);
  const uint64_t ulp = static_cast<uint64_t>(e - 7 + 1023) << 52;
  double out = 0;
  std::memcpy(&out, &ulp, sizeof out);
  return out;
}

// Relative allowance for float32 arithmetic error in the slack terms: 2^-14,
// i.e. 1024 float32 ulps (the estimates for these ops are <= ~100, growing
// like sqrt(D) for the longest rows) and 1/64 of a bf16 ulp, so it widens
// the 1-ulp bound only where the element is small next to its terms.
constexpr double kF32Slack = 1.0 / 16384;

struct Bf16Comparison {
  int64_t n = 0;            // elements compared
  int64_t beyond = 0;       // |got - round(ref)| > ulp + slack (or a NaN mismatch)
  int64_t not_nearest = 0;  // got != round(ref)
  double worst_ulps = 0;    // max over elements of (|got - round(ref)| - slack) / ulp
  bool ok() const { return beyond == 0 && not_nearest <= 3 + n / 100; }
};

// got: the path's bf16 values (widened exactly); ref: the float64 reference
// on the same stored inputs; slack: per element, a bound on the float32
// arithmetic error |f - r| where terms cancel (0 where nothing does).
// Counted in pieces of 2^16 elements on the library's threads
// (core/parallel.hpp); counts and the worst are the same in any order.
inline Bf16Comparison compare_bf16(const std::vector<double>& got, const std::vector<double>& ref,
                                   const std::vector<double>& slack) {
  const int64_t n = static_cast<int64_t>(got.size()), piece = int64_t(1) << 16;
  std::vector<Bf16Comparison> part(static_cast<size_t>(pieces(n, piece)));
  parallel_for(pieces(n, piece), n, [&](int64_t p) {
    Bf16Comparison& c = part[static_cast<size_t>(p)];
    for (int64_t i = p * piece; i < std::min(n, (p + 1) * piece); ++i) {
      if (std::isnan(ref[i]) || std::isnan(got[i])) {
        c.beyond += std::isnan(ref[i]) != std::isnan(got[i]);
        c.not_nearest += std::isnan(ref[i]) != std::isnan(got[i]);
        continue;
      }
      const double want = round_to_bf16(ref[i]);
      const double err = std::abs(got[i] - want);
      // The larger spacing of the two binades, where got and want straddle a power of two.
      const double u = std::max(bf16_ulp(got[i]), bf16_ulp(want));
      c.not_nearest += got[i] != want;
      c.beyond += !(err <= u + slack[i]);
      c.worst_ulps = std::max(c.worst_ulps, (err - slack[i]) / u);
    }
  });
  Bf16Comparison all;
  all.n = n;
  for (const Bf16Comparison& c : part) {
    all.beyond += c.beyond;
    all.not_nearest += c.not_nearest;
    all.worst_ulps = std::max(all.worst_ulps, c.worst_ulps);
  }
  return all;
}

// float32 -> bf16 by dropping the low 16 bits (truncation toward zero): the
// packing bug the bound must catch; the CPU tests show it does.
inline std::vector<double> truncate_to_bf16(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    bits &= 0xffff0000u;
    float t = 0;
    std::memcpy(&t, &bits, sizeof t);
    out[i] = t;
  }
  return out;
}

// Slack of softmax (ops/softmax.hpp), per element of rows of tk: y_i =
// exp(z_i - max) / sum cancels nothing (relative slack); dx_i = scale y_i
// (dy_i - dot) with dot = sum_k dy_k y_k can cancel, so its float32 error is
// bounded by ulps of |dy_i| + sum_k |dy_k y_k|, times scale y_i.
inline std::vector<double> softmax_y_slack(const std::vector<double>& y) {
  std::vector<double> s(y.size());
  for (size_t i = 0; i < y.size(); ++i) s[i] = kF32Slack * std::abs(y[i]);
  return s;
}

inline std::vector<double> softmax_dx_slack(const std::vector<double>& dy, const std::vector<double>& y, int64_t tk,
                                            double scale) {
  std::vector<double> s(y.size());
  for (size_t r = 0; r < y.size() / static_cast<size_t>(tk); ++r) {
    double terms = 0;
    for (int64_t k = 0; k < tk; ++k) terms += std::abs(dy[r * tk + k] * y[r * tk + k]);
    for (int64_t k = 0; k < tk; ++k) {
      const size_t i = r * tk + k;
      s[i] = kF32Slack * std::abs(scale * y[i]) * (std::abs(dy[i]) + terms);
    }
  }
  return s;
}

// The same as a Catch2 check, with the counts shown on failure.
#define HG_CHECK_BF16(got, ref, slack)                                                                          \
  do {                                                                                                          \
    const ::hg::test::Bf16Comparison hg_bf16_ = ::hg::test::compare_bf16((got), (ref), (slack));                \
    INFO("bf16: " << hg_bf16_.n << " elements, " << hg_bf16_.beyond << " beyond 1 ulp + slack, "                \
                  << hg_bf16_.not_nearest << " not round(ref) (allowed " << 3 + hg_bf16_.n / 100 << "), worst " \
                  << hg_bf16_.worst_ulps << " ulps beyond slack");                                              \
    CHECK(hg_bf16_.ok());                                                                                       \
  } while (0)

}  // namespace hg::test
