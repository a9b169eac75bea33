#pragma once
// Warp- and block-level reductions shared by the fused kernels.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/exp_approx.cuh"

namespace hg::gpu {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide reduction through shared memory; every thread gets the result.
// `scratch` must hold blockDim.x / 32 floats. Contains __syncthreads(): call
// from all threads of the block.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch, Op warp_op, float identity) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  v = warp_op(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : identity;
  return warp_op(v);
}

struct WarpSum {
  __device__ float operator()(float v) const { return warp_sum(v); }
};
struct WarpMax {
  __device__ float operator()(float v) const { return warp_max(v); }
};

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, WarpSum{}, 0.0f);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, WarpMax{}, -INFINITY);
}

// The sum behind log sum_j exp(x_j - m) (m: the row max) for a thread that
// walks its own elements. The terms equal to the max are counted exactly and
// the rest summed apart, so log1p keeps the digits of a confident row, where
// the sum is 1 + tiny and a float sum would round the tiny part away (the
// target's gradient p - 1 is then that tiny part).
struct ShiftedExpSum {
  float m;
  float rest = 0.0f, at_max = 0.0f;
  __device__ __forceinline__ void add(float v) {
    if (v == m) {
      at_max += 1.0f;
    } else {
      rest += exp_approx(v - m);
    }
  }
  // Every thread of the block: log sum_j exp(x_j - m) over the block's terms.
  __device__ __forceinline__ float log_sum(float* scratch) {
    rest = block_sum(rest, scratch);
    at_max = block_sum(at_max, scratch);
    return log1pf((at_max - 1.0f) + rest);
  }
};

// g's factor for the logit at z = (x - m) - log s: p - 1 for the target, as
// expm1 (exact where p rounds to 1, a confident row), else p.
__device__ __forceinline__ float softmax_grad_term(float z, bool is_target) {
  return is_target ? expm1f(z) : exp_approx(z);
}

// A row's max m and log sum_j exp(x_j - m), m and log s kept apart.
struct RowStats {
  float m, log_s;
};

// log sum_j exp(x_j - m) over a row that the block walks (x(j) loads element
// j as float), thread t taking j = t, t + blockDim.x, ...
template <class Load>
__device__ float block_log_sum_exp_shifted(int64_t n, float m, Load x, float* scratch) {
  ShiftedExpSum sum{m};
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum.add(x(j));
  return sum.log_sum(scratch);
}

}  // namespace hg::gpu
