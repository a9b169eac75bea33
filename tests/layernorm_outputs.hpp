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

// The six as float64 host values: what the comparisons read.
// D is dgamma's length, the rows mean's.
struct LayerNormValues {
  std::vector<double> y, mean, rstd, dx, dgamma, dbeta;
};

inline LayerNormValues values_of(const LayerNormOutputs& o) {
  return {o.y.to_vector(),  o.mean.to_vector(),   o.rstd.to_vector(),
          o.dx.to_vector(), o.dgamma.to_vector(), o.dbeta.to_vector()};
}

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

// body(r) for every row r of D elements, rows in pieces of about 2^16
// elements on the library's threads (hg::for_pieces, core/parallel.hpp).
template <class Body>
void for_rows(int64_t rows, int64_t D, const Body& body) {
  for_pieces(rows, std::max<int64_t>(1, kPiece / std::max<int64_t>(D, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) body(r);
  });
}

// LayerNorm forward in plain float64 loops, straight from the definition
// (two passes: mean, then the mean of squared deviations), sharing no code
// with the library: the independent reference for y, mean and rstd.
// xs: rows of D values, g and b: D values; fills y, mean and rstd of out.
inline void plain_layernorm_forward(const std::vector<double>& xs, const std::vector<double>& g,
                                    const std::vector<double>& b, double eps, LayerNormValues& out) {
  const int64_t D = static_cast<int64_t>(g.size()), rows = D == 0 ? 0 : static_cast<int64_t>(xs.size()) / D;
  out.y.assign(xs.size(), 0.0);
  out.mean.assign(static_cast<size_t>(rows), 0.0);
  out.rstd.assign(static_cast<size_t>(rows), 0.0);
  for_rows(rows, D, [&](int64_t r) {
    const double* row = xs.data() + r * D;
    double sum = 0;
    for (int64_t j = 0; j < D; ++j) sum += row[j];
    const double mu = sum / static_cast<double>(D);
    double sq = 0;
    for (int64_t j = 0; j < D; ++j) sq += (row[j] - mu) * (row[j] - mu);
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(D) + eps);
    for (int64_t j = 0; j < D; ++j) out.y[r * D + j] = g[j] * ((row[j] - mu) * rs) + b[j];
    out.mean[r] = mu;
    out.rstd[r] = rs;
  });
}

// The same on tensors: x (..., D), gamma and beta (D), any dtype and device.
inline LayerNormOutputs plain_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const int64_t D = x.size(-1), rows = x.numel() / D;
  LayerNormValues v;
  plain_layernorm_forward(x.to_vector(), gamma.to_vector(), beta.to_vector(), eps, v);
  LayerNormOutputs out;  // statistics are (rows,), as the op saves them
  out.y = Tensor::from_vector(v.y, x.shape(), DType::F64);
  out.mean = Tensor::from_vector(v.mean, {rows}, DType::F64);
  out.rstd = Tensor::from_vector(v.rstd, {rows}, DType::F64);
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
inline void check_layernorm_stats_and_params(const LayerNormValues& got, const LayerNormValues& want, double tol_stats,
                                             double tol_params) {
  CHECK(mean_error_in_stddevs(got.mean, want.mean, want.rstd) < tol_stats);
  CHECK(rel_error(got.rstd, want.rstd) < tol_stats);
  CHECK(rel_error(got.dgamma, want.dgamma) < tol_params);
  CHECK(rel_error(got.dbeta, want.dbeta) < tol_params);
}

// Every output of `got` against the float64 `want`, as relative norm errors:
// y and dx below tol_out, rstd below tol_stats (the mean measured in row
// standard deviations, test_util.hpp), dgamma and dbeta below tol_params.
inline void check_layernorm_outputs(const LayerNormValues& got, const LayerNormValues& want, double tol_out,
                                    double tol_stats, double tol_params) {
  CHECK(rel_error(got.y, want.y) < tol_out);
  CHECK(rel_error(got.dx, want.dx) < tol_out);
  check_layernorm_stats_and_params(got, want, tol_stats, tol_params);
}
inline void check_layernorm_outputs(const LayerNormOutputs& got, const LayerNormOutputs& want, double tol_out,
                                    double tol_stats, double tol_params) {
  check_layernorm_outputs(values_of(got), values_of(want), tol_out, tol_stats, tol_params);
}

// The largest relative norm error of a row of D values of got against want:
// rows of very different magnitudes (a 1e30 row among O(1) rows) are each
// held to the bound, where the relative norm error of the whole tensor would
// see only the rows with the largest values (dx and rstd scale with 1 / row
// stddev).
inline double worst_row_rel_error(const std::vector<double>& a, const std::vector<double>& b, int64_t D) {
  REQUIRE(a.size() == b.size());
  const int64_t rows = static_cast<int64_t>(a.size()) / D;
  std::vector<double> row_error(static_cast<size_t>(rows));
  for_rows(rows, D, [&](int64_t r) {
    double diff = 0, norm = 0;
    for (int64_t j = r * D; j < (r + 1) * D; ++j) diff += (a[j] - b[j]) * (a[j] - b[j]), norm += b[j] * b[j];
    // A zero row (y of D = 1 with beta 0, dx of D = 1) must be matched exactly.
    row_error[r] = norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? INFINITY : 0.0);
  });
  double worst = 0;
  for (const double e : row_error) worst = std::max(worst, e);
  return worst;
}
// The same for tensors, in rows of their last dim.
inline double worst_row_rel_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  return worst_row_rel_error(got.to_vector(), want.to_vector(), got.ndim() > 1 ? got.size(-1) : 1);
}

// check_layernorm_outputs row by row: y, dx and rstd of each row within its
// own bounds (worst_row_rel_error); the mean in row standard deviations,
// beyond the rounding of storing it (half an ulp, up to 2^-24 |mean| in
// float32: 3e-6 row standard deviations for 1e30 + N(0, 1e28^2)).
// mean_unit: 2^-24 for float32 statistics, 2^-53 for float64.
inline void check_layernorm_rows(const LayerNormValues& got, const LayerNormValues& want, double mean_unit,
                                 double tol_out, double tol_stats, double tol_params) {
  const int64_t D = static_cast<int64_t>(want.dgamma.size());
  CHECK(worst_row_rel_error(got.y, want.y, D) < tol_out);
  CHECK(worst_row_rel_error(got.dx, want.dx, D) < tol_out);
  CHECK(worst_row_rel_error(got.rstd, want.rstd, 1) < tol_stats);
  const std::vector<double>&m = got.mean, &w = want.mean, &r = want.rstd;
  for (size_t i = 0; i < m.size(); ++i) {
    INFO("row " << i << " mean " << m[i] << " want " << w[i]);
    CHECK(std::abs(m[i] - w[i]) * r[i] < tol_stats + mean_unit * std::abs(w[i]) * r[i]);
  }
  CHECK(rel_error(got.dgamma, want.dgamma) < tol_params);
  CHECK(rel_error(got.dbeta, want.dbeta) < tol_params);
}
inline void check_layernorm_rows(const LayerNormOutputs& got, const LayerNormOutputs& want, double tol_out,
                                 double tol_stats, double tol_params) {
  const double unit = std::ldexp(1.0, got.mean.dtype() == DType::F64 ? -53 : -24);
  check_layernorm_rows(values_of(got), values_of(want), unit, tol_out, tol_stats, tol_params);
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

// xs, dys: the stored x and dy (rows of D values); g, b: gamma and beta.
inline LayerNormSlack layernorm_bf16_slack(const LayerNormValues& want, const std::vector<double>& xs,
                                           const std::vector<double>& g, const std::vector<double>& b,
                                           const std::vector<double>& dys) {
  const int64_t D = static_cast<int64_t>(g.size()), rows = static_cast<int64_t>(xs.size()) / D;
  const std::vector<double>&mean = want.mean, &rstd = want.rstd;
  LayerNormSlack slack{std::vector<double>(xs.size()), std::vector<double>(xs.size())};
  for_rows(rows, D, [&](int64_t r) {
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
  });
  return slack;
}
inline LayerNormSlack layernorm_bf16_slack(const LayerNormOutputs& want, const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, const Tensor& dy) {
  LayerNormValues w;
  w.mean = want.mean.to_vector();
  w.rstd = want.rstd.to_vector();
  return layernorm_bf16_slack(w, x.to_vector(), gamma.to_vector(), beta.to_vector(), dy.to_vector());
}

inline void check_layernorm_bf16(const LayerNormValues& got, const LayerNormValues& want, const LayerNormSlack& slack,
                                 double tol_stats, double tol_params) {
  {
    INFO("y");
    HG_CHECK_BF16(got.y, want.y, slack.y);
  }
  {
    INFO("dx");
    HG_CHECK_BF16(got.dx, want.dx, slack.dx);
  }
  check_layernorm_stats_and_params(got, want, tol_stats, tol_params);
}
inline void check_layernorm_bf16(const LayerNormOutputs& got, const LayerNormOutputs& want, const Tensor& x,
                                 const Tensor& gamma, const Tensor& beta, const Tensor& dy, double tol_stats,
                                 double tol_params) {
  const LayerNormValues w = values_of(want);
  check_layernorm_bf16(values_of(got), w,
                       layernorm_bf16_slack(w, x.to_vector(), gamma.to_vector(), beta.to_vector(), dy.to_vector()),
                       tol_stats, tol_params);
}

}  // namespace hg::test
