#include "ops/cpu/layernorm_cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "core/simd.hpp"

namespace hg::cpu {
namespace {

// ---------------------------------------------------------------- float64
// Rows are Eigen maps over the flat buffers, statistics in double.
template <class T> using RowArray = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T> using ConstRow = Eigen::Map<const RowArray<T>>;
template <class T> using Row = Eigen::Map<RowArray<T>>;

void forward_rows_f64(const double* x, const double* g, const double* b, double eps, int64_t r0, int64_t r1,
                      int64_t D, double* y, double* mean, double* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const ConstRow<double> xr(x + r * D, D);
    // Two sweeps, mean then the centred sum of squares: never E[x^2] - E[x]^2,
    // which cancels catastrophically when |mean| >> std.
    const double mu = xr.sum() / static_cast<double>(D);
    const double var = (xr - mu).square().sum() / static_cast<double>(D);
    const double rs = 1.0 / std::sqrt(var + eps);
    Row<double>(y + r * D, D) = (xr - mu) * rs * ConstRow<double>(g, D) + ConstRow<double>(b, D);
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void backward_row_f64(const double* dy, const double* x, const double* g, double mean, double rs, int64_t D,
                      double* dx, double* acc_g, double* acc_b) {
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

HG_SIMD_INLINE Floats load_n(const float* p, int64_t k) {
  return k == kLanes ? simd::load(p) : simd::load_partial(p, k, 0.f);
}

HG_SIMD_CLONES void forward_rows_f32(const float* x, const float* g, const float* b, double eps, int64_t r0,
                                     int64_t r1, int64_t D, float* y, float* mean, float* rstd) {
  const double inv_d = 1.0 / static_cast<double>(D);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const float shift = static_cast<float>(simd::sum(D, [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return load_n(xr + i, k); }) * inv_d);
    float s12[2];
    simd::sums(D, [&](int64_t i, int64_t k, Floats(&t)[2]) HG_SIMD_LAMBDA {
      const Floats c = load_n(xr + i, k) - shift;
      t[0] = c, t[1] = c * c;
    }, s12);
    const double s1 = s12[0], s2 = s12[1];
    const double mu = shift + s1 * inv_d;
    const double var = std::max(0.0, s2 * inv_d - (s1 * inv_d) * (s1 * inv_d));
    const double rs = 1.0 / std::sqrt(var + eps);
    const float hi = static_cast<float>(mu), lo = static_cast<float>(mu - hi), rs_f = static_cast<float>(rs);
    float* yr = y + r * D;
    int64_t i = 0;
    for (; i + kLanes <= D; i += kLanes)
      simd::store(yr + i, ((simd::load(xr + i) - hi) - lo) * rs_f * simd::load(g + i) + simd::load(b + i));
    if (i < D) {
      const int64_t k = D - i;
      simd::store_partial(yr + i, ((load_n(xr + i, k) - hi) - lo) * rs_f * load_n(g + i, k) + load_n(b + i, k), k);
    }
    mean[r] = hi;
    rstd[r] = rs_f;
  }
}

HG_SIMD_CLONES void backward_row_f32(const float* dy, const float* x, const float* g, float mean, float rs,
                                     int64_t D, float* dx, float* acc_g, float* acc_b) {
  auto xhat = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return (load_n(x + i, k) - mean) * rs; };
  auto gdy = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA { return load_n(g + i, k) * load_n(dy + i, k); };
  const double inv_d = 1.0 / static_cast<double>(D);
  // The saved mean was rounded to float32; its error shifts every xhat by the
  // same amount. The true xhat has mean zero, so that shift is the mean c of
  // the xhat computed here; it is removed below.
  float s[3];
  simd::sums(D, [&](int64_t i, int64_t k, Floats(&t)[3]) HG_SIMD_LAMBDA {
    const Floats xh = xhat(i, k), gd = gdy(i, k);
    t[0] = xh, t[1] = gd, t[2] = gd * xh;
  }, s);
  const double c = s[0] * inv_d;
  const double mean_gdy = s[1] * inv_d;
  const double mean_gdy_xhat = s[2] * inv_d - c * mean_gdy;
  const float cf = static_cast<float>(c), mg = static_cast<float>(mean_gdy), mgx = static_cast<float>(mean_gdy_xhat);
  auto row = [&](int64_t i, int64_t k, auto store) HG_SIMD_LAMBDA {
    const Floats xc = xhat(i, k) - cf, d = load_n(dy + i, k);
    store(dx + i, rs * (gdy(i, k) - mg - xc * mgx));
    store(acc_g + i, load_n(acc_g + i, k) + d * xc);
    store(acc_b + i, load_n(acc_b + i, k) + d);
  };
  int64_t i = 0;
  for (; i + kLanes <= D; i += kLanes) row(i, kLanes, [](float* p, Floats v) HG_SIMD_LAMBDA { simd::store(p, v); });
  if (i < D) row(i, D - i, [k = D - i](float* p, Floats v) HG_SIMD_LAMBDA { simd::store_partial(p, v, k); });
}

// ---------------------------------------------------------------- threads
// Rows per forward task: about 16K elements, whole rows.
int64_t rows_per_task(int64_t D) { return std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, D)); }

template <class Kernel>
void forward_threaded(int64_t rows, int64_t D, const Kernel& kernel) {
  const int64_t per = rows_per_task(D);
  parallel_for(pieces(rows, per), rows * D, [&](int64_t t) { kernel(t * per, std::min(rows, (t + 1) * per)); });
}

// The backward's rows go in at most kRowBlocks blocks fixed by `rows` alone.
// Each block sums its rows' dgamma/dbeta terms in T, flushed into float64
// every kFlushRows rows (so a float32 running sum never spans more); the
// block sums are then added in block order in float64. Same bits at any
// thread count.
constexpr int64_t kRowBlocks = 32;
constexpr int64_t kFlushRows = 16;

template <class T, class RowKernel>
void backward_threaded(int64_t rows, int64_t D, T* dgamma, T* dbeta, const RowKernel& row_kernel) {
  const int64_t per = std::max<int64_t>(1, (rows + kRowBlocks - 1) / kRowBlocks);
  const int64_t blocks = pieces(rows, per);
  Tensor partial = Tensor::zeros({blocks, 2, D}, DType::F64);
  double* parts = partial.data<double>();
  parallel_for(blocks, rows * D, [&](int64_t blk) {
    std::vector<T> acc(static_cast<size_t>(2 * D), T(0));
    double* pg = parts + blk * 2 * D;
    const int64_t r1 = std::min(rows, (blk + 1) * per);
    for (int64_t r = blk * per; r < r1; ++r) {
      row_kernel(r, acc.data(), acc.data() + D);
      if ((r - blk * per) % kFlushRows == kFlushRows - 1 || r == r1 - 1) {
        for (int64_t j = 0; j < 2 * D; ++j) pg[j] += static_cast<double>(acc[static_cast<size_t>(j)]);
        std::fill(acc.begin(), acc.end(), T(0));
      }
    }
  });
  for (int64_t j = 0; j < D; ++j) {
    double sg = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sg += parts[(blk * 2) * D + j];
      sb += parts[(blk * 2 + 1) * D + j];
    }
    dgamma[j] = static_cast<T>(sg);
    dbeta[j] = static_cast<T>(sb);
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       int64_t rows, int64_t D, Tensor& y, Tensor& mean, Tensor& rstd) {
  switch (x.dtype()) {
    case DType::F32:
      return forward_threaded(rows, D, [&](int64_t r0, int64_t r1) {
        forward_rows_f32(x.data<float>(), gamma.data<float>(), beta.data<float>(), eps, r0, r1, D, y.data<float>(),
                         mean.data<float>(), rstd.data<float>());
      });
    case DType::F64:
      return forward_threaded(rows, D, [&](int64_t r0, int64_t r1) {
        forward_rows_f64(x.data<double>(), gamma.data<double>(), beta.data<double>(), eps, r0, r1, D,
                         y.data<double>(), mean.data<double>(), rstd.data<double>());
      });
    default:
      fail("layernorm_forward (cpu)", "dtype ", dtype_name(x.dtype()),
           " is not supported on the CPU (F32/F64)");
  }
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma,
                        Tensor& dbeta) {
  switch (x.dtype()) {
    case DType::F32: {
      const float *dys = dy.data<float>(), *xs = x.data<float>(), *g = gamma.data<float>();
      const float *means = mean.data<float>(), *rstds = rstd.data<float>();
      float* dxs = dx.data<float>();
      return backward_threaded<float>(rows, D, dgamma.data<float>(), dbeta.data<float>(),
                                      [&](int64_t r, float* acc_g, float* acc_b) {
                                        backward_row_f32(dys + r * D, xs + r * D, g, means[r], rstds[r], D,
                                                         dxs + r * D, acc_g, acc_b);
                                      });
    }
    case DType::F64: {
      const double *dys = dy.data<double>(), *xs = x.data<double>(), *g = gamma.data<double>();
      const double *means = mean.data<double>(), *rstds = rstd.data<double>();
      double* dxs = dx.data<double>();
      return backward_threaded<double>(rows, D, dgamma.data<double>(), dbeta.data<double>(),
                                       [&](int64_t r, double* acc_g, double* acc_b) {
                                         backward_row_f64(dys + r * D, xs + r * D, g, means[r], rstds[r], D,
                                                          dxs + r * D, acc_g, acc_b);
                                       });
    }
    default:
      fail("layernorm_backward (cpu)", "dtype ", dtype_name(x.dtype()),
           " is not supported on the CPU (F32/F64)");
  }
}

}  // namespace hg::cpu
