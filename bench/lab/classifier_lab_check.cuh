#pragma once
// classifier_lab's check inputs and float64 reference. Rows come in kinds
// (the product test's hostile rows, tests/test_cross_entropy_lse.cpp): plain
// N(0, 3) logits, an ignored row, huge logits N(0, 5000) (a spread of 1e4:
// exp underflows for all but the top few), a target that is not a class, -inf
// elements, a flat row (every element the max), a NaN logit, a rising row
// (16 j / V plus N(0, 0.15) noise: the max comes late, so every thread's
// running max rises word after word and its sum is rescaled). The bounds are
// that test's: loss within 4e-5 + 1e-5 |loss|; g within
// rel |g| + (4e-5 p + 1e-6) / n, rel = 2^-8 (bf16: one rounding of g) or 1e-5
// (f32). Host code.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_util.cuh"

namespace lab {

constexpr int64_t kIgnoreIndex = -100;

enum RowKind { kPlain, kIgnored, kHuge, kBadTarget, kNegInf, kFlat, kNaN, kRising, kRowKinds };

// Row i's kind: every kind among the first rows, plain ones between.
inline int row_kind(int64_t i) { return i % 10 < kRowKinds ? int(i % 10) : kPlain; }

// Logits (already rounded to T, as float) and targets, rows x vocab.
struct Rows {
  int64_t rows, vocab;
  std::vector<float> x, targets;
};

template <class T>
Rows make_rows(int64_t rows, int64_t vocab, std::mt19937_64& rng, bool hostile) {
  Rows r{rows, vocab, std::vector<float>(size_t(rows * vocab)), std::vector<float>(size_t(rows))};
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int64_t> cls(0, vocab - 1);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < rows; ++i) {
    const int kind = hostile ? row_kind(i) : kPlain;
    const int64_t t = cls(rng);
    r.targets[i] = kind == kIgnored ? float(kIgnoreIndex) : kind == kBadTarget ? float(vocab) : float(t);
    float* x = &r.x[size_t(i * vocab)];
    for (int64_t j = 0; j < vocab; ++j) {
      float v = normal(rng) * (kind == kHuge ? 5000.f : 3.f);
      if (kind == kNegInf && j != t && j % 3 == 0) v = -inf;
      if (kind == kFlat) v = 2.5f;
      if (kind == kRising) v = 16.f * float(j) / float(vocab) + 0.05f * v;
      x[j] = to_float(from_float<T>(v));
    }
    if (kind == kNaN) x[(t + 1) % vocab] = std::numeric_limits<float>::quiet_NaN();
  }
  return r;
}

// 1 / (rows whose target counts): the scale every g carries.
inline double inv_count(const Rows& r) {
  int64_t n = 0;
  for (float t : r.targets) n += t != float(kIgnoreIndex);
  return n > 0 ? 1.0 / double(n) : 0.0;
}

// float64 loss and g of every row (NaN rows: NaN; ignored rows: 0).
struct Reference {
  std::vector<double> g, loss;
  std::vector<float> p;  // softmax, for the bound
};

inline Reference reference(const Rows& r) {
  const int64_t V = r.vocab;
  const double inv = inv_count(r);
  Reference ref{std::vector<double>(r.x.size()), std::vector<double>(r.rows), std::vector<float>(r.x.size())};
  for (int64_t i = 0; i < r.rows; ++i) {
    const float* x = &r.x[size_t(i * V)];
    const float t = r.targets[i];
    double* g = &ref.g[size_t(i * V)];
    float* p = &ref.p[size_t(i * V)];
    if (t == float(kIgnoreIndex)) {
      for (int64_t j = 0; j < V; ++j) g[j] = p[j] = 0.0f;
      ref.loss[i] = 0.0;
      continue;
    }
    double m = -std::numeric_limits<double>::infinity(), s = 0.0;
    bool nan = false;
    for (int64_t j = 0; j < V; ++j) nan |= std::isnan(x[j]), m = std::max(m, double(x[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(x[j]) - m);
    const bool is_class = t >= 0.f && t < float(V) && t == std::floor(t);
    const int64_t ti = is_class ? int64_t(t) : -1;
    for (int64_t j = 0; j < V; ++j) {
      const double pj = nan ? NAN : std::exp(double(x[j]) - m) / s;
      g[j] = (pj - (j == ti ? 1.0 : 0.0)) * inv;
      p[j] = float(pj);
    }
    ref.loss[i] = nan || !is_class ? NAN : std::log(s) - (double(x[ti]) - m);
  }
  return ref;
}

// One unit in the last place of the storage type at |y| (bf16: 8 bits,
// f32: 24), not below the type's smallest subnormal.
template <class T>
double ulp_of(double y) {
  constexpr int digits = std::is_same_v<T, float> ? 24 : 8;
  const double smallest = std::ldexp(1.0, -126 - (digits - 1));
  if (y == 0.0 || !std::isfinite(y)) return smallest;
  return std::max(std::ldexp(1.0, std::ilogb(y) - (digits - 1)), smallest);
}

struct CheckResult {
  double g_ratio = 0, loss_ratio = 0, g_ulps = 0;  // worst error / bound; worst g error in ulps of T
  int64_t g_row = -1, loss_row = -1;               // where the worst ratios are
  std::string failure;                             // empty: passed
};

// worst = max(worst, v) remembering row i; NaN counts as infinite.
inline void keep_worst(double& worst, int64_t& at, double v, int64_t i) {
  if (std::isnan(v)) v = INFINITY;
  if (at < 0 || v > worst) worst = v, at = i;
}

// got_g, got_loss: a variant's output on r's logits.
template <class T>
CheckResult compare(const Rows& r, const Reference& ref, const std::vector<T>& got_g,
                    const std::vector<float>& got_loss) {
  CheckResult c;
  const double inv = inv_count(r), rel = std::is_same_v<T, float> ? 1e-5 : std::ldexp(1.0, -8);
  const auto fail = [&](const std::string& why, int64_t i) {
    if (c.failure.empty()) c.failure = why + " (row " + std::to_string(i) + ")";
  };
  double worst_ulps = 0;
  int64_t ulps_row = -1;
  for (int64_t i = 0; i < r.rows; ++i) {
    const double want_loss = ref.loss[i], loss = got_loss[i];
    if (std::isnan(want_loss)) {
      if (!std::isnan(loss)) fail("loss is not NaN", i);
    } else if (r.targets[i] == float(kIgnoreIndex)) {
      if (loss != 0.0) fail("ignored row's loss is not 0", i);
    } else {
      keep_worst(c.loss_ratio, c.loss_row, std::abs(loss - want_loss) / (4e-5 + 1e-5 * std::abs(want_loss)), i);
    }
    const bool ignored = r.targets[i] == float(kIgnoreIndex);
    for (int64_t j = 0; j < r.vocab; ++j) {
      const size_t k = size_t(i * r.vocab + j);
      const double want = ref.g[k], got = to_float(got_g[k]);
      if (std::isnan(want)) {
        if (!std::isnan(got)) fail("g is not NaN in a row with a NaN logit", i);
        continue;
      }
      if (ignored && got != 0.0) fail("an ignored row's g is not 0", i);
      const double err = std::abs(got - want), bound = rel * std::abs(want) + (4e-5 * ref.p[k] + 1e-6) * inv;
      keep_worst(c.g_ratio, c.g_row, err / bound, i);
      keep_worst(worst_ulps, ulps_row, err / ulp_of<T>(want), i);
    }
  }
  c.g_ulps = worst_ulps;
  if (c.g_ratio > 1.0) fail("g over its bound", c.g_row);
  if (c.loss_ratio > 1.0) fail("loss over its bound", c.loss_row);
  return c;
}

}  // namespace lab
