// The CPU backend's vectorised float32 exp / tanh / sigmoid / GELU
// (core/cpu_math.hpp) against double-precision libm: the maximum error in
// float ulps over a dense sweep of their whole range, and the hostile
// inputs: +-inf, NaN, masked scores (-inf), large negatives, subnormal results.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_math.hpp"
#include "core/simd.hpp"
#include "tests/test_util.hpp"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Distance from got to want in units of the float spacing at want (the
// subnormal spacing 2^-149 below FLT_MIN).
double ulp_error(float got, double want) {
  if (std::isinf(want)) return got == static_cast<float>(want) ? 0 : kInf;
  const double a = std::abs(want);
  const int e = a < std::numeric_limits<float>::min() ? -126 : std::ilogb(a);
  return std::abs(static_cast<double>(got) - want) / std::ldexp(1.0, e - 23);
}

// Every 61st float of [lo, hi] (by bit pattern, both signs), plus the ends.
std::vector<float> sweep(float lo, float hi) {
  std::vector<float> xs = {lo, hi};
  const float top = std::max(-lo, hi);
  uint32_t end;
  std::memcpy(&end, &top, 4);
  for (uint32_t bits = 0; bits <= end; bits += 61) {
    float v;
    std::memcpy(&v, &bits, 4);
    if (v <= hi) xs.push_back(v);
    if (-v >= lo) xs.push_back(-v);
  }
  return xs;
}

using Kernel = void (*)(const float*, float*, int64_t);

double max_ulp(Kernel k, double (*ref)(double), const std::vector<float>& xs) {
  std::vector<float> ys(xs.size());
  k(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, ulp_error(ys[i], ref(xs[i])));
  return worst;
}

std::vector<float> apply(Kernel k, std::vector<float> xs) {
  k(xs.data(), xs.data(), static_cast<int64_t>(xs.size()));
  return xs;
}

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

// Measured maxima (docs/cpu.md): exp 1.17 ulp, tanh 1.96, sigmoid 2.32.
TEST_CASE("vector exp is within 1.5 ulp of exp over the float range", "[cpu_math]") {
  const double err = max_ulp(
      hg::cpu_math::exp, [](double x) { return std::exp(x); }, sweep(-104.f, 88.7f));
  CAPTURE(err);
  CHECK(err <= 1.5);
}

TEST_CASE("exp_normal_range gives exp's bits on [-86, 88] and NaN for NaN", "[cpu_math]") {
  std::vector<float> xs = sweep(-86.f, 88.f);
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.resize((xs.size() + hg::simd::kLanes - 1) / hg::simd::kLanes * hg::simd::kLanes, 0.f);
  const std::vector<float> want = apply(hg::cpu_math::exp, xs);
  size_t differ = 0;
  for (size_t i = 0; i < xs.size(); i += hg::simd::kLanes) {
    const hg::simd::Floats got = hg::simd::exp_normal_range(hg::simd::load(xs.data() + i));
    for (int j = 0; j < hg::simd::kLanes; ++j) {
      const size_t at = i + static_cast<size_t>(j);
      const float g = got[j];
      if (std::isnan(xs[at])) CHECK(std::isnan(g));
      else differ += std::memcmp(&g, &want[at], sizeof(float)) != 0;
    }
  }
  CHECK(differ == 0);
}

TEST_CASE("vector tanh is within 3 ulp of tanh", "[cpu_math]") {
  const double err = max_ulp(
      hg::cpu_math::tanh, [](double x) { return std::tanh(x); }, sweep(-20.f, 20.f));
  CAPTURE(err);
  CHECK(err <= 3.0);
}

TEST_CASE("vector sigmoid is within 3 ulp over its non-vanishing range", "[cpu_math]") {
  const double err = max_ulp(hg::cpu_math::sigmoid, sigmoid_ref, sweep(-80.f, 30.f));
  CAPTURE(err);
  CHECK(err <= 3.0);
}

TEST_CASE("vector exp / tanh on hostile inputs", "[cpu_math][hostile]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Masked scores (-inf), large negatives, overflow, NaN, subnormal results.
  const std::vector<float> e =
      apply(hg::cpu_math::exp, {-kInf, -1e30f, -104.f, -88.f, -100.f, 89.f, 1e30f, kInf, nan, 0.f, -0.f});
  CHECK(e[0] == 0.f);
  CHECK(e[1] == 0.f);
  CHECK(e[2] == 0.f);                               // exp(-104) < 2^-150: rounds to 0
  CHECK(ulp_error(e[3], std::exp(-88.0)) <= 1.5);   // subnormal result, rounded once
  CHECK(ulp_error(e[4], std::exp(-100.0)) <= 1.5);  // deep subnormal
  CHECK(e[5] == kInf);
  CHECK(e[6] == kInf);
  CHECK(e[7] == kInf);
  CHECK(std::isnan(e[8]));
  CHECK(e[9] == 1.f);
  CHECK(e[10] == 1.f);
  const std::vector<float> t = apply(hg::cpu_math::tanh, {-kInf, kInf, -1e30f, 1e30f, nan, 0.f, -0.f, 1e-30f, -1e-40f});
  CHECK(t[0] == -1.f);
  CHECK(t[1] == 1.f);
  CHECK(t[2] == -1.f);
  CHECK(t[3] == 1.f);
  CHECK(std::isnan(t[4]));
  CHECK(t[5] == 0.f);
  CHECK(std::signbit(t[6]));
  CHECK(t[7] == 1e-30f);
  CHECK(t[8] == -1e-40f);
  const std::vector<float> s = apply(hg::cpu_math::sigmoid, {-kInf, kInf, -1e30f, nan});
  CHECK(s[0] == 0.f);
  CHECK(s[1] == 1.f);
  CHECK(s[2] == 0.f);
  CHECK(std::isnan(s[3]));
}

TEST_CASE("vector GELU and its derivative match the double formula", "[cpu_math]") {
  // Absolute error, GELU measured against |x| + 1, the scale of the result.
  // Measured (sigmoid form, core/cpu_math.cpp): 9.4e-8 and 2.0e-7 (the
  // derivative, ~1 in size, sums two rounded terms); the tanh form before
  // it: 8.1e-8 and 5.6e-7.
  const double c = 0.7978845608028654, a = 0.044715;
  std::vector<float> xs;
  for (int i = -200000; i <= 200000; ++i) xs.push_back(static_cast<float>(i) * 1e-4f);
  for (float v : {-1e30f, -1e5f, 1e5f, 1e30f}) xs.push_back(v);
  const std::vector<float> g = apply(hg::cpu_math::gelu, xs), d = apply(hg::cpu_math::gelu_grad, xs);
  double worst_g = 0, worst_d = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], t = std::tanh(c * (x + a * x * x * x)), s = 1 - t * t;
    const double want_g = 0.5 * x * (1 + t);
    const double want_d = s == 0 ? 0.5 * (1 + t) : 0.5 * (1 + t) + 0.5 * x * s * c * (1 + 3 * a * x * x);
    REQUIRE(std::isfinite(g[i]));
    REQUIRE(std::isfinite(d[i]));
    worst_g = std::max(worst_g, std::abs(g[i] - want_g) / (1 + std::abs(x)));
    worst_d = std::max(worst_d, std::abs(d[i] - want_d));
  }
  CAPTURE(worst_g, worst_d);
  CHECK(worst_g < 5e-7);
  CHECK(worst_d < 8e-7);
  // The limits: gelu(-inf) = 0, gelu(inf) = inf, slopes 0 and 1; NaN stays NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> gi = apply(hg::cpu_math::gelu, {-kInf, kInf, nan});
  const std::vector<float> di = apply(hg::cpu_math::gelu_grad, {-kInf, kInf, nan});
  CHECK(gi[0] == 0.f);
  CHECK(gi[1] == kInf);
  CHECK(std::isnan(gi[2]));
  CHECK(di[0] == 0.f);
  CHECK(di[1] == 1.f);
  CHECK(std::isnan(di[2]));
}
