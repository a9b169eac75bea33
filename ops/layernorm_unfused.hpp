#pragma once
// Internal to ops/: LayerNorm composed from primitive backend passes
// (core/tensor_functions.hpp, miniTorch style), on any device. Inputs are
// validated by ops/layernorm.cpp. BF16 x (CUDA) is cast to F32, computed, and
// its outputs cast back to BF16; mean/rstd/dgamma/dbeta stay F32.
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"

namespace hg::unfused {

// Returns y like x; writes mean and rstd as (rows,) in the math dtype.
Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& mean,
                         Tensor& rstd);

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd);

}  // namespace hg::unfused
