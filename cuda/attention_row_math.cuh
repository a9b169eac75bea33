#pragma once
// For the BF16 fused attention kernels (cuda/attention.cu, the mma.sync
// kernels; cuda/attention_wgmma_kernel.cuh, the sm_90a forward; the
// attention lab's candidates, bench/lab/attention_lab*.cuh): the
// register-level row arithmetic they share. A row of an m16 accumulator
// tile lives in the four threads of a quad (lanes 4 g .. 4 g + 3).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/exp_approx.cuh"

namespace hg::gpu::attn {

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Two floats as a bf16 pair, lo in the low half (an A fragment register).
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// 2^x by the SFU (cuda/exp_approx.cuh): results below 2^-126 flush to 0, far
// below what a bf16 probability can hold.
using hg::gpu::exp2_approx;

}  // namespace hg::gpu::attn
