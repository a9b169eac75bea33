#pragma once
// LayerNorm forward, then backward on the forward's own saved statistics:
// every output the LayerNorm tests compare, in the current kernel mode.
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"

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

}  // namespace hg::test
