#pragma once
// Finite-difference gradient checking: the tools the tests and
// examples/layernorm_gradcheck use to hold a hand-written backward against
// float64 central differences. Derivation of the step size: docs/layernorm.md.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// (loss(x + h e_i) - loss(x - h e_i)) / 2h, with xs[i] restored afterwards.
inline double central_difference(const std::function<double()>& loss, double* xs, int64_t i, double h) {
  const double orig = xs[i];
  xs[i] = orig + h;
  const double plus = loss();
  xs[i] = orig - h;
  const double minus = loss();
  xs[i] = orig;
  return (plus - minus) / (2 * h);
}

// Central finite differences d loss / d x for a float64 CPU tensor x.
// `loss` must read x's current values (it is perturbed in place and restored).
inline Tensor numerical_grad(const std::function<double()>& loss, Tensor& x, double h = 1e-6) {
  x.check_dtype(DType::F64, "numerical_grad");
  x.check_device(Device::CPU, "numerical_grad");
  Tensor grad = Tensor::zeros(x.shape(), DType::F64);
  double* xs = x.data<double>();
  double* gs = grad.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) gs[i] = central_difference(loss, xs, i, h);
  return grad;
}

// ||a - b|| / max(||a||, ||b||, 1e-300): 0 when both are exactly zero.
inline double rel_error(const Tensor& a, const Tensor& b) {
  check_same_shape("rel_error", a, b);
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double diff = 0, na = 0, nb = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    na += va[i] * va[i];
    nb += vb[i] * vb[i];
  }
  return std::sqrt(diff) / std::max({std::sqrt(na), std::sqrt(nb), 1e-300});
}

// sum(a * w) for a fixed weight tensor w: a scalar loss whose gradient with
// respect to a is w, so backward(dy = w) can be checked by finite differences.
inline double weighted_sum(const Tensor& a, const Tensor& w) {
  const std::vector<double> va = a.to_vector(), vw = w.to_vector();
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vw[i];
  return s;
}

}  // namespace hg
