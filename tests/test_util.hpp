#pragma once
// Helpers shared by the Catch2 tests: finite differences, error norms, GPU skip.
#include <algorithm>
#include <cmath>
#include <functional>

#include "core/device.hpp"
#include "core/tensor.hpp"
#include "tests/catch.hpp"

namespace hg::test {

// Central finite differences d loss / d x for a float64 CPU tensor x.
// `loss` must read x's current values (it is perturbed in place and restored).
inline Tensor numerical_grad(const std::function<double()>& loss, Tensor& x, double h = 1e-6) {
  x.check_dtype(DType::F64, "numerical_grad");
  x.check_device(Device::CPU, "numerical_grad");
  Tensor grad = Tensor::zeros(x.shape(), DType::F64);
  double* xs = x.data<double>();
  double* gs = grad.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double orig = xs[i];
    xs[i] = orig + h;
    const double plus = loss();
    xs[i] = orig - h;
    const double minus = loss();
    xs[i] = orig;
    gs[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

// ||a - b|| / max(||a||, ||b||, tiny): the relative error used throughout the tests.
inline double rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double diff = 0, na = 0, nb = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    na += va[i] * va[i];
    nb += vb[i] * vb[i];
  }
  const double denom = std::max({std::sqrt(na), std::sqrt(nb), 1e-300});
  return std::sqrt(diff) / denom;
}

// LayerNorm's per-row mean is compared in units of the row's standard
// deviation: max_r |mean_r - want_mean_r| * want_rstd_r. A relative error
// would be ill-posed (a zero-centred row has mean ~ 1/sqrt(D), so float32
// summation noise of ~log2(D) * 2^-24 * mean|x| looks large next to it);
// this measure is the error the mean puts into x_hat, which is what matters.
inline double mean_error_in_stddevs(const Tensor& mean, const Tensor& want_mean, const Tensor& want_rstd) {
  REQUIRE(mean.shape() == want_mean.shape());
  const auto m = mean.to_vector(), w = want_mean.to_vector(), r = want_rstd.to_vector();
  double worst = 0;
  for (size_t i = 0; i < m.size(); ++i) worst = std::max(worst, std::abs(m[i] - w[i]) * r[i]);
  return worst;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

inline bool all_finite(const Tensor& t) {
  for (double v : t.to_vector())
    if (!std::isfinite(v)) return false;
  return true;
}

// sum(a * w) for a fixed random weight tensor w: a scalar loss whose gradient
// with respect to a is w, so backward(dy = w) can be checked by finite differences.
inline double weighted_sum(const Tensor& a, const Tensor& w) {
  const auto va = a.to_vector(), vw = w.to_vector();
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vw[i];
  return s;
}

}  // namespace hg::test

// Leaves the test case with a visible "skipped" message when no GPU is present.
#define HG_REQUIRE_GPU()                                                        \
  do {                                                                          \
    if (!::hg::cuda_available()) HG_SKIP("SKIPPED: no CUDA GPU present; this GPU test runs on the device machine"); \
  } while (0)
