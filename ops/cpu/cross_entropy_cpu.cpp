#include "ops/cpu/cross_entropy_cpu.hpp"

#include <algorithm>
#include <cmath>

#include "core/parallel.hpp"
#include "core/simd.hpp"

namespace hg::cpu {
namespace {

// ---------------------------------------------------------------- float32
// SIMD exp (core/simd.hpp, 1.2 ulp), sums in double. The target's gradient
// p_t - 1 = -(sum of the other weights) / s, formed without cancellation.
using simd::Floats;
using simd::kLanes;

// Eight interleaved double lanes in a fixed order (vectorised, same bits on every ISA).
HG_SIMD_INLINE double sum_to_double(const float* x, int64_t n) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(x[i + j]);
  for (; i < n; ++i) lane[0] += static_cast<double>(x[i]);
  double s = 0;
  for (double v : lane) s += v;
  return s;
}

// One row: writes (p - onehot) * inv_count into dx, returns log s - (x_t - m).
// dx may be x itself: x_t is read before the row is overwritten.
HG_SIMD_CLONES double row_f32(const float* x, float* dx, int64_t vocab, int64_t target, double inv_count) {
  constexpr float inf = __builtin_inff();
  const float x_t = x[target];
  Floats vmax = simd::splat(-inf);
  int64_t i = 0;
  for (; i + kLanes <= vocab; i += kLanes) {
    const Floats v = simd::load(x + i);
    vmax = v > vmax ? v : vmax;
  }
  if (i < vocab) {
    const Floats v = simd::load_partial(x + i, vocab - i, -inf);
    vmax = v > vmax ? v : vmax;
  }
  const float m = simd::max_lanes(vmax);
  // The weights e_j = exp(x_j - m) in (0, 1] (NaN and inf logits give NaN, as x - m does).
  simd::transform(x, dx, vocab, [m](Floats v) HG_SIMD_LAMBDA { return simd::exp(v - m); });
  const float e_target = dx[target];
  dx[target] = 0;
  const double others = sum_to_double(dx, vocab), s = others + e_target;
  const float scale = static_cast<float>(inv_count / s);
  simd::transform(dx, dx, vocab, [scale](Floats e) HG_SIMD_LAMBDA { return e * scale; });
  dx[target] = static_cast<float>(0.0 - others / s * inv_count);  // 0.0 -: +0 for a single class
  return std::log(s) - static_cast<double>(x_t - m);
}

// ---------------------------------------------------------------- float64
// Relative to the max, so large offsets keep their digits (docs/cross_entropy.md).
double row_f64(const double* x, double* dx, int64_t vocab, int64_t target, double inv_count) {
  const double x_t = x[target];  // dx may be x
  double m = x[0];
  for (int64_t j = 1; j < vocab; ++j) m = x[j] > m ? x[j] : m;
  double s = 0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(x[j] - m);
  const double log_s = std::log(s);
  for (int64_t j = 0; j < vocab; ++j) {
    const double z = (x[j] - m) - log_s;  // the target's p - 1 as expm1 (no cancellation)
    dx[j] = (j == target ? std::expm1(z) : std::exp(z)) * inv_count;
  }
  return log_s - (x_t - m);
}

// Rows in tasks of about 16K elements; each row's loss lands in its own
// slot, so a caller that adds them in row order gets the same bits at any
// thread count.
template <class T, class Row>
void fused_rows(const Tensor& logits, const double* targets, int64_t ignore_index, double inv_count, Tensor& dlogits,
                double* row_loss, const Row& row) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const T* x = logits.data<T>();
  T* dx = dlogits.data<T>();
  const int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / vocab);
  parallel_for(pieces(rows, per), rows * vocab, [&](int64_t t) {
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) {
      const double target = targets[r];
      if (target == static_cast<double>(ignore_index)) {
        std::fill(dx + r * vocab, dx + (r + 1) * vocab, T(0));
        row_loss[r] = 0;
        continue;
      }
      row_loss[r] = row(x + r * vocab, dx + r * vocab, vocab, static_cast<int64_t>(target), inv_count);
    }
  });
}

}  // namespace

void cross_entropy_rows(const Tensor& logits, const double* targets, int64_t ignore_index, double inv_count,
                        Tensor& dlogits, double* row_loss) {
  if (logits.dtype() == DType::F32)
    fused_rows<float>(logits, targets, ignore_index, inv_count, dlogits, row_loss, row_f32);
  else fused_rows<double>(logits, targets, ignore_index, inv_count, dlogits, row_loss, row_f64);
}

double cross_entropy_forward(const Tensor& logits, const std::vector<double>& targets, int64_t vocab,
                             int64_t ignore_index, double inv_count, Tensor& dlogits) {
  std::vector<double> loss(targets.size(), 0.0);
  cross_entropy_rows(logits.reshape({static_cast<int64_t>(targets.size()), vocab}), targets.data(), ignore_index,
                     inv_count, dlogits, loss.data());
  double total = 0;
  for (double l : loss) total += l;
  return total * inv_count;
}

}  // namespace hg::cpu
