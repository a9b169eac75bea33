#pragma once
// LayerNorm forward, then backward on the forward's own saved statistics:
// every output the LayerNorm tests compare, in the current kernel mode; and
// the comparison of all six with a float64 reference.
#include <cmath>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"
#include "tests/bf16_ulps.hpp"
#include "tests/test_util.hpp"

namespace hg::test {

struct LayerNormOutputs {
  Tensor y, mean, rstd, dx, dgamma, dbeta;
};

inline LayerNormOutputs layernorm_forward_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                   const Tensor& dy, double eps) {
  LayerNormSaved saved;
  LayerNormOutputs out;
  out.y = layernorm_forward(x, gamma, beta, eps, &saved);
  out.mean = saved.mean;
  out.rstd = saved.rstd;
  LayerNormGrads g = layernorm_backward(dy, x, gamma, saved);
  out.dx = g.dx;
  out.dgamma = g.dgamma;
  out.dbeta = g.dbeta;
  return out;
}

// LayerNorm forward in plain float64 loops, straight from the definition
// (two passes: mean, then the mean of squared deviations), sharing no code
// with the library: the independent reference for y, mean and rstd.
// x: (..., D), gamma and beta (D), any dtype and device.
inline LayerNormOutputs plain_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const int64_t D = x.size(-1), rows = x.numel() / D;
  const std::vector<double> xs = x.to_vector(), g = gamma.to_vector(), b = beta.to_vector();
  std::vector<double> y(xs.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = xs.data() + r * D;
    double sum = 0;
    for (int64_t j = 0; j < D; ++j) sum += row[j];
    const double mu = sum / static_cast<double>(D);
    double sq = 0;
    for (int64_t j = 0; j < D; ++j) sq += (row[j] - mu) * (row[j] - mu);
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(D) + eps);
    for (int64_t j = 0; j < D; ++j) y[r * D + j] = g[j] * ((row[j] - mu) * rs) + b[j];
    mean[r] = mu;
    rstd[r] = rs;
  }
  LayerNormOutputs out;  // statistics are (rows,), as the op saves them
  out.y = Tensor::from_vector(y, x.shape(), DType::F64);
  out.mean = Tensor::from_vector(mean, {rows}, DType::F64);
  out.rstd = Tensor::from_vector(rstd, {rows}, DType::F64);
  return out;
}

// The reference the LayerNorm tests compare every path with, on float64 CPU
// copies of the stored inputs: y, mean and rstd from the plain loops above;
// dx, dgamma and dbeta from the library's float64 CPU fused path (checked by
// finite differences in tests/test_layernorm.cpp).
inline LayerNormOutputs layernorm_reference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                                            double eps) {
  KernelModeScope fused(KernelMode::Fused);
  LayerNormOutputs out = layernorm_forward_backward(x, gamma, beta, dy, eps);
  const LayerNormOutputs plain = plain_layernorm_forward(x, gamma, beta, eps);
  REQUIRE(plain.mean.shape() == out.mean.shape());
  out.y = plain.y;
  out.mean = plain.mean;
  out.rstd = plain.rstd;
  return out;
}

// The float32 outputs (in every storage dtype) against the float64 `want`:
// mean in row standard deviations (test_util.hpp), rstd below tol_stats,
// dgamma and dbeta below tol_params, as relative norm errors.
inline void check_layernorm_stats_and_params(const LayerNormOutputs& got, const LayerNormOutputs& want,
                                             double tol_stats, double tol_params) {
  CHECK(mean_error_in_stddevs(f64(got.mean), want.mean, want.rstd) < tol_stats);
  CHECK(rel_error(f64(got.rstd), want.rstd) < tol_stats);
  CHECK(rel_error(f64(got.dgamma), want.dgamma) < tol_params);
  CHECK(rel_error(f64(got.dbeta), want.dbeta) < tol_params);
}

// Every output of `got` against the float64 `want`, as relative norm errors:
// y and dx below tol_out, rstd below tol_stats (the mean measured in row
// standard deviations, test_util.hpp), dgamma and dbeta below tol_params.
inline void check_layernorm_outputs(const LayerNormOutputs& got, const LayerNormOutputs& want, double tol_out,
                                    double tol_stats, double tol_params) {
  CHECK(rel_error(f64(got.y), want.y) < tol_out);
  CHECK(rel_error(f64(got.dx), want.dx) < tol_out);
  check_layernorm_stats_and_params(got, want, tol_stats, tol_params);
}

// The largest relative norm error of a row of got (rows of its last dim)
// against want: rows of very different magnitudes (a 1e30 row among O(1)
// rows) are each held to the bound, where the relative norm error of the
// whole tensor would see only the rows with the largest values (dx and rstd
// scale with 1 / row stddev).
inline double worst_row_rel_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const int64_t D = got.ndim() > 1 ? got.size(-1) : 1, rows = got.numel() / D;
  const std::vector<double> a = got.to_vector(), b = want.to_vector();
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double diff = 0, norm = 0;
    for (int64_t j = r * D; j < (r + 1) * D; ++j) diff += (a[j] - b[j]) * (a[j] - b[j]), norm += b[j] * b[j];
    // A zero row (y of D = 1 with beta 0, dx of D = 1) must be matched exactly.
    worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? INFINITY : 0.0));
  }
  return worst;
}

// check_layernorm_outputs row by row: y, dx and rstd of each row within its
// own bounds (worst_row_rel_error); the mean in row standard deviations,
// beyond the rounding of storing it (half an ulp, up to 2^-24 |mean| in
// float32: 3e-6 row standard deviations for 1e30 + N(0, 1e28^2)).
inline void check_layernorm_rows(const LayerNormOutputs& got, const LayerNormOutputs& want, double tol_out,
                                 double tol_stats, double tol_params) {
  CHECK(worst_row_rel_error(f64(got.y), want.y) < tol_out);
  CHECK(worst_row_rel_error(f64(got.dx), want.dx) < tol_out);
  CHECK(worst_row_rel_error(f64(got.rstd), want.rstd) < tol_stats);
  const double unit = std::ldexp(1.0, got.mean.dtype() == DType::F64 ? -53 : -24);
  const std::vector<double> m = got.mean.to_vector(), w = want.mean.to_vector(), r = want.rstd.to_vector();
  for (size_t i = 0; i < m.size(); ++i) {
    INFO("row " << i << " mean " << m[i] << " want " << w[i]);
    CHECK(std::abs(m[i] - w[i]) * r[i] < tol_stats + unit * std::abs(w[i]) * r[i]);
  }
  CHECK(rel_error(f64(got.dgamma), want.dgamma) < tol_params);
  CHECK(rel_error(f64(got.dbeta), want.dbeta) < tol_params);
}

// bf16 paths: y and dx against the reference rounded to bf16, in ulps
// (tests/bf16_ulps.hpp), from the stored inputs x, gamma, beta, dy (float64
// CPU). The float32 error slack of each element, with xhat_j = (x_j - mean)
// rstd and the saved statistics' own error (~2^-24 (1 + |mean| rstd) in xhat):
//   y_j  = g_j xhat_j + b_j:             (|g_j| (|xhat_j| + 1 + |mean| rstd) + |b_j|)
//   dx_j = rstd (g_j dy_j - A - xhat_j B): rstd (|g_j dy_j| + mean|g dy| + (|xhat_j| + 1 + |mean| rstd) mean|g dy
//   xhat|)
// times kF32Slack. Statistics and dgamma/dbeta are float32 outputs:
// relative error below tol_stats and tol_params, as in check_layernorm_outputs.
struct LayerNormSlack {
  std::vector<double> y, dx;
};

inline LayerNormSlack layernorm_bf16_slack(const LayerNormOutputs& want, const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, const Tensor& dy) {
  const int64_t D = x.size(-1), rows = x.numel() / D;
  const std::vector<double> xs = x.to_vector(), g = gamma.to_vector(), b = beta.to_vector(), dys = dy.to_vector();
  const std::vector<double> mean = want.mean.to_vector(), rstd = want.rstd.to_vector();
  LayerNormSlack slack{std::vector<double>(xs.size()), std::vector<double>(xs.size())};
  for (int64_t r = 0; r < rows; ++r) {
    const double shift = 1 + std::abs(mean[r]) * rstd[r];
    double a = 0, bsum = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double xhat = (xs[r * D + j] - mean[r]) * rstd[r];
      a += std::abs(g[j] * dys[r * D + j]) / D;
      bsum += std::abs(g[j] * dys[r * D + j] * xhat) / D;
    }
    for (int64_t j = 0; j < D; ++j) {
      const int64_t i = r * D + j;
      const double xhat = std::abs((xs[i] - mean[r]) * rstd[r]);
      slack.y[i] = kF32Slack * (std::abs(g[j]) * (xhat + shift) + std::abs(b[j]));
      slack.dx[i] = kF32Slack * rstd[r] * (std::abs(g[j] * dys[i]) + a + (xhat + shift) * bsum);
    }
  }
  return slack;
}

inline void check_layernorm_bf16(const LayerNormOutputs& got, const LayerNormOutputs& want, const Tensor& x,
                                 const Tensor& gamma, const Tensor& beta, const Tensor& dy, double tol_stats,
                                 double tol_params) {
  const LayerNormSlack slack = layernorm_bf16_slack(want, x, gamma, beta, dy);
  {
    INFO("y");
    HG_CHECK_BF16(f64(got.y).to_vector(), want.y.to_vector(), slack.y);
  }
  {
    INFO("dx");
    HG_CHECK_BF16(f64(got.dx).to_vector(), want.dx.to_vector(), slack.dx);
  }
  check_layernorm_stats_and_params(got, want, tol_stats, tol_params);
}

}  // namespace hg::test
