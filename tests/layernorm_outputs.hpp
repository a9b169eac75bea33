#pragma once
// LayerNorm forward, then backward on the forward's own saved statistics:
// every output the LayerNorm tests compare, in the current kernel mode; and
// the comparison of all six with a float64 reference.
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"
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

// Every output of `got` against the float64 `want`, as relative norm errors:
// y and dx below tol_out, rstd below tol_stats (the mean measured in row
// standard deviations, test_util.hpp), dgamma and dbeta below tol_params.
inline void check_layernorm_outputs(const LayerNormOutputs& got, const LayerNormOutputs& want, double tol_out,
                                    double tol_stats, double tol_params) {
  CHECK(rel_error(f64(got.y), want.y) < tol_out);
  CHECK(rel_error(f64(got.dx), want.dx) < tol_out);
  CHECK(mean_error_in_stddevs(f64(got.mean), want.mean, want.rstd) < tol_stats);
  CHECK(rel_error(f64(got.rstd), want.rstd) < tol_stats);
  CHECK(rel_error(f64(got.dgamma), want.dgamma) < tol_params);
  CHECK(rel_error(f64(got.dbeta), want.dbeta) < tol_params);
}

}  // namespace hg::test
