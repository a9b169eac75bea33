#pragma once
// Internal to ops/: the fused CPU LayerNorm (Eigen). Inputs are validated by
// ops/layernorm.cpp; every tensor here is a contiguous CPU tensor of one dtype
// (F32 or F64), x/y/dy/dx viewed as (rows, D).
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::cpu {

// Per row: mean, then the centred sum of squares (two sweeps, double
// accumulators), then y. Writes y, mean (rows,) and rstd (rows,).
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       int64_t rows, int64_t D, Tensor& y, Tensor& mean, Tensor& rstd);

// Per row: one sweep for the sums of g*dy and g*dy*xhat, one sweep for dx.
// dgamma and dbeta are summed over rows in row order (deterministic).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma,
                        Tensor& dbeta);

}  // namespace hg::cpu
