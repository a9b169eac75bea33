#pragma once
// LayerNorm backward, kernel 2 with 16-byte loads: the partial rows of
// kernel 1 (one per block, [n_partials][D] for dgamma and for dbeta) summed
// per column into dgamma / dbeta. D / 8 blocks (96 at 768 columns, where
// the 4-byte layernorm_reduce_partials_kernel runs 24), each with 256
// threads over 8 columns, so more of the GPU sums and each load moves 16
// bytes (bench/lab/layernorm.md, "wide reduce"). Rows of D % 4 == 0 floats.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/param_grad_write.cuh"

namespace hg::gpu {
namespace {

// The sums of column slot `slot`, 16 bytes a load: the block's 2 * LANES threads
// sum 8 columns (two float4 quads, from column 8 slot) over LANES row lanes,
// lane l taking partial rows l, l + LANES, ... ascending; the lanes are then
// added by a fixed shuffle tree inside each warp and the warps in warp
// order. Nothing depends on timing: bitwise the same on every run (UNROLL,
// the rows of a lane in flight at once, only groups the loads). D % 4 == 0.
constexpr int kWideQuads = 2;
template <int LANES, int UNROLL>
__device__ __forceinline__ void sum_partial_columns(const float* __restrict__ partial_dgamma,
                                                    const float* __restrict__ partial_dbeta, int n_partials, int D,
                                                    int slot, float* __restrict__ dgamma, float* __restrict__ dbeta,
                                                    bool accumulate) {
  constexpr int kWarps = kWideQuads * LANES / 32;
  static_assert(kWideQuads * LANES % 32 == 0 && kWarps <= 32, "bad wide reduce shape");
  __shared__ float4 warp_sums[2][kWarps][kWideQuads];
  const int q = threadIdx.x % kWideQuads, lane = threadIdx.x / kWideQuads;
  const int col = (slot * kWideQuads + q) * 4;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
  if (col < D) {
#pragma unroll UNROLL
    for (int p = lane; p < n_partials; p += LANES) {
      const float4 g = __ldcg(reinterpret_cast<const float4*>(partial_dgamma + int64_t(p) * D + col));
      const float4 e = __ldcg(reinterpret_cast<const float4*>(partial_dbeta + int64_t(p) * D + col));
      a.x += g.x, a.y += g.y, a.z += g.z, a.w += g.w;
      b.x += e.x, b.y += e.y, b.z += e.z, b.w += e.w;
    }
  }
  // The lanes of one quad inside a warp: thread bits above log2(kWideQuads).
#pragma unroll
  for (int off = 16; off >= kWideQuads; off /= 2) {
    a.x += __shfl_xor_sync(~0u, a.x, off), a.y += __shfl_xor_sync(~0u, a.y, off);
    a.z += __shfl_xor_sync(~0u, a.z, off), a.w += __shfl_xor_sync(~0u, a.w, off);
    b.x += __shfl_xor_sync(~0u, b.x, off), b.y += __shfl_xor_sync(~0u, b.y, off);
    b.z += __shfl_xor_sync(~0u, b.z, off), b.w += __shfl_xor_sync(~0u, b.w, off);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < kWideQuads) warp_sums[0][warp][q] = a, warp_sums[1][warp][q] = b;
  __syncthreads();
  if (threadIdx.x < kWideQuads && col < D) {
    float sg[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 g = warp_sums[0][w][q], e = warp_sums[1][w][q];
      sg[0] += g.x, sg[1] += g.y, sg[2] += g.z, sg[3] += g.w;
      sb[0] += e.x, sb[1] += e.y, sb[2] += e.z, sb[3] += e.w;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      write_param_grad(dgamma + col + k, sg[k], accumulate);
      write_param_grad(dbeta + col + k, sb[k], accumulate);
    }
  }
  __syncthreads();  // warp_sums is free for the next slot
}

constexpr int kWideReduceLanes = 128;
constexpr int kWideReduceThreads = kWideQuads * kWideReduceLanes;
constexpr int kWideReduceCols = 4 * kWideQuads;

// Block s sums column slot s, eight partial rows of a lane in flight.
// `accumulate`: each sum is added to what dgamma / dbeta hold.
__global__ void __launch_bounds__(kWideReduceThreads)
    layernorm_reduce_partials_wide_kernel(const float* __restrict__ partial_dgamma,
                                          const float* __restrict__ partial_dbeta, int n_partials, int D,
                                          float* __restrict__ dgamma, float* __restrict__ dbeta, bool accumulate) {
  sum_partial_columns<kWideReduceLanes, 8>(partial_dgamma, partial_dbeta, n_partials, D, blockIdx.x, dgamma, dbeta,
                                           accumulate);
}

}  // namespace
}  // namespace hg::gpu
