#include "ops/cpu/layernorm_cpu.hpp"

#include <Eigen/Core>
#include <cmath>

namespace hg::cpu {
namespace {

// Rows are Eigen maps over the flat buffers: no copies, vectorised sweeps.
template <class T> using RowArray = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T> using ConstRow = Eigen::Map<const RowArray<T>>;
template <class T> using Row = Eigen::Map<RowArray<T>>;

// Statistics and per-row sums accumulate in double for F32 and F64 alike: a
// float32 row read into double is exact, the sums then carry ~D * 2^-53
// relative error instead of ~D * 2^-24, and the row is swept from cache, so
// memory traffic (what bounds this op) is unchanged. See docs/layernorm.md.
template <class T>
void forward_rows(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                  int64_t rows, int64_t D, Tensor& y, Tensor& mean, Tensor& rstd) {
  const T* xs = x.data<T>();
  T* ys = y.data<T>();
  T* means = mean.data<T>();
  T* rstds = rstd.data<T>();
  ConstRow<T> g(gamma.data<T>(), D), b(beta.data<T>(), D);
  for (int64_t r = 0; r < rows; ++r) {
    const auto xr = ConstRow<T>(xs + r * D, D).template cast<double>();
    // Two sweeps, mean then the centred sum of squares: never E[x^2] - E[x]^2,
    // which cancels catastrophically when |mean| >> std.
    const double mu = xr.sum() / static_cast<double>(D);
    const double var = (xr - mu).square().sum() / static_cast<double>(D);
    const double rs = 1.0 / std::sqrt(var + eps);
    Row<T>(ys + r * D, D) = ((xr - mu) * rs).template cast<T>() * g + b;
    means[r] = static_cast<T>(mu);
    rstds[r] = static_cast<T>(rs);
  }
}

template <class T>
void backward_rows(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                   const Tensor& rstd, int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma,
                   Tensor& dbeta) {
  const T* dys = dy.data<T>();
  const T* xs = x.data<T>();
  T* dxs = dx.data<T>();
  const T* means = mean.data<T>();
  const T* rstds = rstd.data<T>();
  const Eigen::ArrayXd g = ConstRow<T>(gamma.data<T>(), D).template cast<double>();
  // One row of scratch, reused: each row is read from memory once into it.
  Eigen::ArrayXd xhat(D), gdy(D);
  // dgamma/dbeta summed over rows in row order, in double: deterministic.
  Eigen::ArrayXd dg = Eigen::ArrayXd::Zero(D), db = Eigen::ArrayXd::Zero(D);
  const double inv_d = 1.0 / static_cast<double>(D);
  for (int64_t r = 0; r < rows; ++r) {
    const auto dyr = ConstRow<T>(dys + r * D, D).template cast<double>();
    const double rs = static_cast<double>(rstds[r]);
    // Sweep 1: xhat and g*dy, and the row's sums.
    xhat = (ConstRow<T>(xs + r * D, D).template cast<double>() - static_cast<double>(means[r])) * rs;
    gdy = g * dyr;
    // The saved mean was rounded to T (float32 for F32 input). Its error d
    // shifts every xhat by d*rs, which for |mean| >> std is not small
    // (1e6 + N(0, 1e-2) in float32: d*rs ~ 1). The true xhat has mean zero,
    // so the shift is the mean c of the xhat just computed; remove it.
    const double c = xhat.sum() * inv_d;
    const double mean_gdy = gdy.sum() * inv_d;
    const double mean_gdy_xhat = (gdy * xhat).sum() * inv_d - c * mean_gdy;
    xhat -= c;
    // Sweep 2: dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)).
    Row<T>(dxs + r * D, D) = (rs * (gdy - mean_gdy - xhat * mean_gdy_xhat)).template cast<T>();
    dg += dyr * xhat;
    db += dyr;
  }
  Row<T>(dgamma.data<T>(), D) = dg.cast<T>();
  Row<T>(dbeta.data<T>(), D) = db.cast<T>();
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       int64_t rows, int64_t D, Tensor& y, Tensor& mean, Tensor& rstd) {
  switch (x.dtype()) {
    case DType::F32: return forward_rows<float>(x, gamma, beta, eps, rows, D, y, mean, rstd);
    case DType::F64: return forward_rows<double>(x, gamma, beta, eps, rows, D, y, mean, rstd);
    default:
      fail("layernorm_forward (cpu)", "dtype ", dtype_name(x.dtype()),
           " is not supported on the CPU (F32/F64)");
  }
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma,
                        Tensor& dbeta) {
  switch (x.dtype()) {
    case DType::F32:
      return backward_rows<float>(dy, x, gamma, mean, rstd, rows, D, dx, dgamma, dbeta);
    case DType::F64:
      return backward_rows<double>(dy, x, gamma, mean, rstd, rows, D, dx, dgamma, dbeta);
    default:
      fail("layernorm_backward (cpu)", "dtype ", dtype_name(x.dtype()),
           " is not supported on the CPU (F32/F64)");
  }
}

}  // namespace hg::cpu
