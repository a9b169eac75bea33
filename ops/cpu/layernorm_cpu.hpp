#pragma once
// Internal to ops/: the fused CPU LayerNorm (float32: SIMD, float64: Eigen),
// on hg::num_threads() threads. Inputs are validated by
// ops/layernorm.cpp; every tensor here is a contiguous CPU tensor of one dtype
// (F32 or F64), x/y/dy/dx viewed as (rows, D).
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::cpu {

// Per row: mean, then the centred sums (float32: corrected two-pass in
// float32, docs/cpu.md; float64: two sweeps), then y. Writes y, mean (rows,)
// and rstd (rows,).
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, int64_t rows, int64_t D,
                       Tensor& y, Tensor& mean, Tensor& rstd);

// Per row: one sweep for the sums of g*dy and g*dy*xhat, one sweep for dx.
// dgamma and dbeta are summed in fixed row blocks, then the blocks in order:
// the same bits at any thread count.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        int64_t rows, int64_t D, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace hg::cpu
