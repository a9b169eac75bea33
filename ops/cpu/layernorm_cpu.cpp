#include "ops/cpu/layernorm_cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "core/simd.hpp"
#include "core/streaming_stores.hpp"

namespace hg::cpu {
namespace {

// ---------------------------------------------------------------- range
// A row whose squared deviations overflow its type (|x - mean| past ~1e19 in
// float32, ~1e154 in float64) would get var = inf, rstd = 0 and y = beta:
// such rows (found by a non-finite sum or rstd not > 0, after the normal
// statistics) take their mean and rstd again here, in float64 on the row
// scaled by 2^-e, e the exponent of its largest |x| (exact: a power of
// two), where no square exceeds 4. Inf or NaN elements give NaN.
struct RowStats {
  double mean, rstd;
};

template <class T>
RowStats scaled_row_stats(const T* x, int64_t D, double eps) {
  double largest = 0.0;
  for (int64_t j = 0; j < D; ++j) largest = std::max(largest, std::abs(static_cast<double>(x[j])));
  int e = 0;
  if (std::isfinite(largest)) std::frexp(largest, &e);  // largest < 2^e
  double sum = 0.0;
  for (int64_t j = 0; j < D; ++j) sum += std::ldexp(static_cast<double>(x[j]), -e);
  const double mu = sum / static_cast<double>(D);
  double sq = 0.0;
  for (int64_t j = 0; j < D; ++j) {
    const double c = std::ldexp(static_cast<double>(x[j]), -e) - mu;
    sq += c * c;
  }
  // var + eps = 2^2e (sq / D + eps 2^-2e); eps 2^-2e may underflow to 0 only
  // where it is negligible next to the variance that overflowed.
  const double rs = 1.0 / std::sqrt(sq / static_cast<double>(D) + std::ldexp(eps, -2 * e));
  if (!std::isfinite(largest))
    return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
  return {std::ldexp(mu, e), std::ldexp(rs, -e)};
}

// ---------------------------------------------------------------- float64
// Rows are Eigen maps over the flat buffers, statistics in double.
template <class T>
using RowArray = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using ConstRow = Eigen::Map<const RowArray<T>>;
template <class T>
using Row = Eigen::Map<RowArray<T>>;

void forward_rows_f64(const double* x, const double* g, const double* b, double eps, int64_t r0, int64_t r1, int64_t D,
                      double* y, double* mean, double* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const ConstRow<double> xr(x + r * D, D);
    // Two sweeps, mean then the centred sum of squares: never E[x^2] - E[x]^2,
    // which cancels catastrophically when |mean| >> std.
    double mu = xr.sum() / static_cast<double>(D);
    const double var = (xr - mu).square().sum() / static_cast<double>(D);
    double rs = 1.0 / std::sqrt(var + eps);
    if (!(rs > 0.0)) {  // overflowed (or NaN)
      const RowStats s = scaled_row_stats(x + r * D, D, eps);
      mu = s.mean, rs = s.rstd;
    }
    Row<double>(y + r * D, D) = (xr - mu) * rs * ConstRow<double>(g, D) + ConstRow<double>(b, D);
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void backward_row_f64(const double* dy, const double* x, const double* g, double mean, double rs, int64_t D, double* dx,
                      double* acc_g, double* acc_b) {
  const ConstRow<double> dyr(dy, D), xr(x, D);
  const RowArray<double> gdy = ConstRow<double>(g, D) * dyr;
  const double inv_d = 1.0 / static_cast<double>(D);
  RowArray<double> xhat = (xr - mean) * rs;
  const double mean_gdy = gdy.sum() * inv_d;
  const double mean_gdy_xhat = (gdy * xhat).sum() * inv_d;
  // dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)).
  Row<double>(dx, D) = rs * (gdy - mean_gdy - xhat * mean_gdy_xhat);
  Row<double>(acc_g, D) += dyr * xhat;
  Row<double>(acc_b, D) += dyr;
}

// ---------------------------------------------------------------- float32
// Float32 arithmetic throughout, SIMD (core/simd.hpp), with the stability of
// the float64 scheme kept by centring (docs/cpu.md: measured errors):
// the mean is refined by the sum of the centred values (corrected two-pass),
// and carried as a float pair (hi + lo) so that x - mean stays exact for
// rows whose offset dwarfs their spread.
using simd::Floats;
using simd::kLanes;

using simd::load_n;
using simd::store_n;

// stream: y's full, 16-byte aligned vectors go out with streaming stores
// (core/streaming_stores.hpp); the same values either way.
HG_SIMD_CLONES void forward_rows_f32(const float* x, const float* g, const float* b, double eps, int64_t r0, int64_t r1,
                                     int64_t D, float* y, float* mean, float* rstd, bool stream) {
  const double inv_d = 1.0 / static_cast<double>(D);
  float sum = simd::sum(D, [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return load_n(x + r0 * D + i, k); });
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const float shift = static_cast<float>(sum * inv_d);
    float s12[2];
    simd::sums(
        D,
        [&](int64_t i, int64_t k, Floats(&t)[2]) HG_SIMD_LAMBDA {
          const Floats c = load_n(xr + i, k) - shift;
          t[0] = c, t[1] = c * c;
        },
        s12);
    const double s1 = s12[0], s2 = s12[1];
    double mu = shift + s1 * inv_d;
    const double var = std::max(0.0, s2 * inv_d - (s1 * inv_d) * (s1 * inv_d));
    double rs = 1.0 / std::sqrt(var + eps);
    if (!std::isfinite(s1 + s2) || !(rs > 0.0)) {  // overflowed (or NaN)
      const RowStats s = scaled_row_stats(xr, D, eps);
      mu = s.mean, rs = s.rstd;
    }
    const float hi = static_cast<float>(mu), lo = static_cast<float>(mu - hi), rs_f = static_cast<float>(rs);
    float* yr = y + r * D;
    const bool stream_row = stream && reinterpret_cast<uintptr_t>(yr) % 16 == 0;
    // One sweep writes this row's y from L1 and reads the next row from
    // memory for its first sum (added exactly as above), fetching the row
    // after it meanwhile (docs/cpu.md). The last row re-reads itself.
    const float* next = r + 1 < r1 ? xr + D : xr;
    const float* ahead = r + 2 < r1 ? xr + 2 * D : xr;
    float next_sum[1];
    simd::sums(
        D,
        [&](int64_t i, int64_t k, Floats(&t)[1]) HG_SIMD_LAMBDA {
          simd::prefetch(ahead + i);
          const Floats out = ((load_n(xr + i, k) - hi) - lo) * rs_f * load_n(g + i, k) + load_n(b + i, k);
          if (stream_row && k == kLanes) simd::store_streaming(yr + i, out);
          else store_n(yr + i, out, k);
          t[0] = load_n(next + i, k);
        },
        next_sum);
    sum = next_sum[0];
    mean[r] = hi;
    rstd[r] = rs_f;
  }
  if (stream) simd::store_fence();
}

// Adds the first k lanes of v to p[0, k) in float64.
typedef double Doubles __attribute__((vector_size(2 * sizeof(Floats))));
HG_SIMD_INLINE void add_to_f64(double* p, Floats v, int64_t k, bool first) {
  if (k == kLanes) {
    Doubles d = __builtin_convertvector(v, Doubles);
    if (!first) {
      Doubles old;
      std::memcpy(&old, p, sizeof old);
      d = old + d;
    }
    std::memcpy(p, &d, sizeof d);
  } else {
    for (int64_t j = 0; j < k; ++j) p[j] = (first ? 0.0 : p[j]) + static_cast<double>(v[j]);
  }
}

// The backward of rows [r0, r1), one row at a time: its three sums (one
// sweep), then dx, with the row's dgamma / dbeta terms added to acc (float32,
// 2 D). Every kFlushRows rows, and at r1, acc is added to part_g / part_b
// (float64; written, not added to, by the first flush) and cleared, within
// the last row's sweep. While a row is computed from L1, the next one is
// fetched.
constexpr int64_t kFlushRows = 16;

HG_SIMD_CLONES void backward_rows_f32(const float* dy, const float* x, const float* g, const float* mean,
                                      const float* rstd, int64_t r0, int64_t r1, int64_t D, float* dx, float* acc,
                                      double* part_g, double* part_b) {
  const double inv_d = 1.0 / static_cast<double>(D);
  float* acc_g = acc;
  float* acc_b = acc + D;
  std::fill(acc, acc + 2 * D, 0.f);
  for (int64_t r = r0; r < r1; ++r) {
    const float *xr = x + r * D, *dyr = dy + r * D;
    float* dxr = dx + r * D;
    const float mu = mean[r], rs = rstd[r];
    auto xhat = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return (load_n(xr + i, k) - mu) * rs; };
    auto gdy = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return load_n(g + i, k) * load_n(dyr + i, k); };
    // The saved mean was rounded to float32; its error shifts every xhat by
    // the same amount. The true xhat has mean zero, so that shift is the mean
    // c of the xhat computed here; it is removed below.
    float s[3];
    simd::sums(
        D,
        [&](int64_t i, int64_t k, Floats(&t)[3]) HG_SIMD_LAMBDA {
          const Floats xh = xhat(i, k), gd = gdy(i, k);
          t[0] = xh, t[1] = gd, t[2] = gd * xh;
        },
        s);
    const double c = s[0] * inv_d;
    const double mean_gdy = s[1] * inv_d;
    const double mean_gdy_xhat = s[2] * inv_d - c * mean_gdy;
    const float cf = static_cast<float>(c), mg = static_cast<float>(mean_gdy), mgx = static_cast<float>(mean_gdy_xhat);
    const int64_t next = r + 1 < r1 ? D : 0;
    const bool flush = (r - r0) % kFlushRows == kFlushRows - 1 || r == r1 - 1, first = r - r0 < kFlushRows;
    // dx = rstd * (g*dy - mean(g*dy) - xc * mean(g*dy*xc)), xc = xhat - c.
    auto row = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA {
      simd::prefetch(xr + next + i);
      simd::prefetch(dyr + next + i);
      simd::prefetch_for_write(dxr + next + i);
      const Floats xc = xhat(i, k) - cf, d = load_n(dyr + i, k);
      store_n(dxr + i, rs * (gdy(i, k) - mg - xc * mgx), k);
      const Floats sum_g = load_n(acc_g + i, k) + d * xc, sum_b = load_n(acc_b + i, k) + d;
      if (flush) {
        add_to_f64(part_g + i, sum_g, k, first);
        add_to_f64(part_b + i, sum_b, k, first);
        store_n(acc_g + i, Floats{}, k);
        store_n(acc_b + i, Floats{}, k);
      } else {
        store_n(acc_g + i, sum_g, k);
        store_n(acc_b + i, sum_b, k);
      }
    };
    int64_t i = 0;
    for (; i + kLanes <= D; i += kLanes) row(i, kLanes);
    if (i < D) row(i, D - i);
  }
}

// ---------------------------------------------------------------- threads
// Rows per forward task: about 16K elements, whole rows.
int64_t rows_per_task(int64_t D) { return std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, D)); }

template <class Kernel>
void forward_threaded(int64_t rows, int64_t D, const Kernel& kernel) {
  const int64_t per = rows_per_task(D);
  parallel_for(pieces(rows, per), rows * D, [&](int64_t t) { kernel(t * per, std::min(rows, (t + 1) * per)); });
}

// The float64 backward of rows [r0, r1): dgamma / dbeta terms summed per row
// into acc, flushed into part_g / part_b every kFlushRows rows (as the
// float32 kernel groups them).
void backward_rows_f64(const double* dy, const double* x, const double* g, const double* mean, const double* rstd,
                       int64_t r0, int64_t r1, int64_t D, double* dx, double* part_g, double* part_b) {
  std::vector<double> acc(static_cast<size_t>(2 * D), 0.0);
  std::fill(part_g, part_g + D, 0.0);
  std::fill(part_b, part_b + D, 0.0);
  for (int64_t r = r0; r < r1; ++r) {
    backward_row_f64(dy + r * D, x + r * D, g, mean[r], rstd[r], D, dx + r * D, acc.data(), acc.data() + D);
    if ((r - r0) % kFlushRows == kFlushRows - 1 || r == r1 - 1) {
      for (int64_t j = 0; j < D; ++j) part_g[j] += acc[static_cast<size_t>(j)];
      for (int64_t j = 0; j < D; ++j) part_b[j] += acc[static_cast<size_t>(D + j)];
      std::fill(acc.begin(), acc.end(), 0.0);
    }
  }
}

// The backward's rows go in at most kRowBlocks blocks fixed by `rows` alone.
// block_kernel(r0, r1, part_g, part_b) writes its block's dgamma / dbeta sums
// (float64); the blocks' sums are then added in block order, column pieces
// on the threads. Same bits at any thread count.
constexpr int64_t kRowBlocks = 32;

template <class T, class BlockKernel>
void backward_threaded(int64_t rows, int64_t D, T* dgamma, T* dbeta, const BlockKernel& block_kernel) {
  const int64_t per = std::max<int64_t>(1, (rows + kRowBlocks - 1) / kRowBlocks);
  const int64_t blocks = pieces(rows, per);
  Tensor partial = Tensor::empty({blocks, 2, D}, DType::F64);
  double* parts = partial.data<double>();
  parallel_for(blocks, rows * D, [&](int64_t blk) {
    double* pg = parts + blk * 2 * D;
    block_kernel(blk * per, std::min(rows, (blk + 1) * per), pg, pg + D);
  });
  constexpr int64_t kColumns = 1024;
  parallel_for(pieces(D, kColumns), blocks * 2 * D, [&](int64_t piece) {
    const int64_t j0 = piece * kColumns, j1 = std::min(D, j0 + kColumns);
    double* sg = parts + j0;  // block 0's sums accumulate the others, in block order
    double* sb = parts + D + j0;
    for (int64_t blk = 1; blk < blocks; ++blk) {
      const double* pg = parts + blk * 2 * D + j0;
      for (int64_t j = 0; j < j1 - j0; ++j) sg[j] += pg[j];
      for (int64_t j = 0; j < j1 - j0; ++j) sb[j] += pg[D + j];
    }
    // 0 + s: +0, not -0, where every term was -0 (as a sum started at 0 gives).
    for (int64_t j = 0; j < j1 - j0; ++j) {
      dgamma[j0 + j] = static_cast<T>(0.0 + sg[j]);
      dbeta[j0 + j] = static_cast<T>(0.0 + sb[j]);
    }
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, int64_t rows, int64_t D,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  switch (x.dtype()) {
    case DType::F32: {
      const bool stream = use_streaming_stores(rows * D * static_cast<int64_t>(sizeof(float)));
      return forward_threaded(rows, D, [&](int64_t r0, int64_t r1) {
        forward_rows_f32(x.data<float>(), gamma.data<float>(), beta.data<float>(), eps, r0, r1, D, y.data<float>(),
                         mean.data<float>(), rstd.data<float>(), stream);
      });
    }
    case DType::F64:
      return forward_threaded(rows, D, [&](int64_t r0, int64_t r1) {
        forward_rows_f64(x.data<double>(), gamma.data<double>(), beta.data<double>(), eps, r0, r1, D, y.data<double>(),
                         mean.data<double>(), rstd.data<double>());
      });
    default: fail("layernorm_forward (cpu)", "dtype ", dtype_name(x.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  switch (x.dtype()) {
    case DType::F32:
      return backward_threaded<float>(rows, D, dgamma.data<float>(), dbeta.data<float>(),
                                      [&](int64_t r0, int64_t r1, double* part_g, double* part_b) {
                                        std::vector<float> acc(static_cast<size_t>(2 * D));
                                        backward_rows_f32(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                                                          mean.data<float>(), rstd.data<float>(), r0, r1, D,
                                                          dx.data<float>(), acc.data(), part_g, part_b);
                                      });
    case DType::F64:
      return backward_threaded<double>(rows, D, dgamma.data<double>(), dbeta.data<double>(),
                                       [&](int64_t r0, int64_t r1, double* part_g, double* part_b) {
                                         backward_rows_f64(dy.data<double>(), x.data<double>(), gamma.data<double>(),
                                                           mean.data<double>(), rstd.data<double>(), r0, r1, D,
                                                           dx.data<double>(), part_g, part_b);
                                       });
    default:
      fail("layernorm_backward (cpu)", "dtype ", dtype_name(x.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

}  // namespace hg::cpu
