#pragma once
// The staged LayerNorm backward (LnRows::Staged): resident 16-byte rows
// whose x and dy are brought into shared memory by sm_90 bulk copies, S rows
// in flight per group (cuda/bulk_stage.cuh), with dgamma/dbeta accumulated
// in registers. It shares the resident kernels' row terms
// (cuda/layernorm_dx_terms.cuh), so dx is bitwise that of the rows in
// registers with the same slot width (bf16 slots of 4 elements, VEC 4, sum
// in another order than slots of 8). SHARED_GAMMA: gamma read on warp rows
// from a copy in shared memory (dx still bitwise the same). Bytes in flight
// and shared-memory traffic: docs/layernorm.md, "Staged rows".
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/layernorm_dx_terms.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// The staged kernel's block for a width of for_width's table <EPT, G, R>:
// G and EPT are kept (the same per-thread columns and group reductions, so
// the same row sums as the rows in registers); R and the ring depth S are its own.
// Warp rows of 24 or 32 elements per lane hold 48 or 64 accumulators, so their blocks
// shrink to 4 warps (one SM then fits 4 blocks in registers); short warp rows
// (<= 512 elements, stages of <= 4 KB) keep three rows per group on chip,
// longer ones two (one consumed while the next one lands).
template <int EPT, int G, int R>
struct StagedShape {
  static constexpr int kGroups = (G == 32 && EPT >= 24) ? 4 : R;
  static constexpr int kDepth = (G == 32 && EPT <= 16) ? 3 : 2;
  static constexpr int kThreads = G * kGroups;
  // Registers: 1024-thread blocks get 64 per thread; 512-thread blocks are
  // capped so that two fit; smaller blocks so that four fit.
  static constexpr int kMinBlocks = kThreads >= 1024 ? 1 : kThreads >= 512 ? 2 : 4;
};

// Dynamic shared memory of one block: `groups` rings of `depth` stages, each
// stage a row of x then a row of dy. At the end the same bytes hold the
// groups' dgamma/dbeta (2 D floats a group), which fits when
// depth * sizeof(T) >= 4 (always: depth >= 2).
__host__ __device__ constexpr size_t staged_row_bytes(int D, int elt) { return size_t(D) * size_t(elt); }
__host__ __device__ constexpr size_t staged_smem_bytes(int D, int elt, int groups, int depth) {
  return size_t(groups) * size_t(depth) * 2 * staged_row_bytes(D, elt);
}

// Pass 1 of a staged row: the resident kernel's row terms (slot_row_terms, in the
// same slot order), one slot at a time, so that only one slot of x and dy
// sits in registers beside the accumulators.
template <class T, int VEC, int NV, int G, class Gamma>
__device__ __forceinline__ void row_terms_from_stage(const T* xs, const T* dys, const Gamma& gamma, int len, int t,
                                                     float m, float rs, float (&s)[3]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float xh[VEC], d[VEC], g[VEC];
      load_vec<VEC>(xs + i, xh);
      load_vec<VEC>(dys + i, d);
      gamma.get(j, i, g);
      slot_row_terms<VEC>(xh, d, g, m, rs, s);
    }
  }
}

// Pass 2 of a staged row: x and dy read again from the stage, dx stored,
// dy * xhat and dy added to this thread's register accumulators (its own
// columns, the same every row). xhat' is recomputed as pass 1 rounded it
// (__fmul_rn: a contracted fma(x - m, rs, -c) would change dx).
template <class T, int VEC, int NV, int G, class Gamma>
__device__ __forceinline__ void dx_from_stage(const T* xs, const T* dys, T* dxr, const Gamma& gamma, int len, int t,
                                              float m, float rs, const DxTerms& k, float (&acc_dgamma)[NV][VEC],
                                              float (&acc_dbeta)[NV][VEC]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float xv[VEC], d[VEC], g[VEC], out[VEC];
      load_vec<VEC>(xs + i, xv);
      load_vec<VEC>(dys + i, d);
      gamma.get(j, i, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xhat = __fmul_rn(xv[e] - m, rs) - k.c;
        out[e] = dx_element(g[e], d[e], xhat, rs, k);
        acc_dgamma[j][e] += d[e] * xhat;
        acc_dbeta[j][e] += d[e];
      }
      store_vec<VEC, Store::Streaming>(dxr + i, out);
    }
  }
}

// Writes this thread's accumulators into its group's 2 D floats (dgamma,
// then dbeta), the same columns it owned over the rows.
template <int VEC, int NV, int G>
__device__ __forceinline__ void spill_accumulators(float* acc, int D, int t, const float (&acc_dgamma)[NV][VEC],
                                                   const float (&acc_dbeta)[NV][VEC]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < D) {
      store_vec<VEC>(acc + i, acc_dgamma[j]);
      store_vec<VEC>(acc + D + i, acc_dbeta[j]);
    }
  }
}

// Kernel 1 of the staged backward (kernel 2, layernorm_reduce_partials_kernel,
// is shared). Group `group` of block b handles rows b R + group + k gridDim R,
// k = 0, 1, ...; its use k lands in stage k % S. Thread 0 of the group issues
// the copies: rows 0..S-1 up front, row k + S once every thread of the group
// has passed the barrier behind its last read of row k. Every group of the
// block makes the same number of trips (a group out of rows makes empty ones)
// so that all named barriers stay matched (see layernorm_backward_kernel).
// SHARED_GAMMA (warp rows): gamma read from a copy in shared memory.
template <class T, int VEC, int EPT, int G, int R, int S, int MIN_BLOCKS, bool SHARED_GAMMA = false>
__global__ void __launch_bounds__((G * R), MIN_BLOCKS)
    layernorm_backward_staged_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                                     float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta,
                                     int64_t rows, int D) {
  constexpr int NV = EPT / VEC;
  static_assert(VEC > 1 && EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15 && S >= 2,
                "bad staged LayerNorm config");
  extern __shared__ float4 stage_storage[];  // R rings of S stages of (x row, dy row); at the end, accumulators
  __shared__ GroupScratch<G, R> scratch;
  __shared__ uint64_t stage_bars[R][S];
  using GammaCopy = ParamCopy<VEC, NV, G>;
  __shared__ float4 gamma_copy[SHARED_GAMMA ? GammaCopy::kFloat4s : 1];

  const RowGroup<G> grp = row_group<G, R>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const uint32_t row_bytes = static_cast<uint32_t>(staged_row_bytes(D, sizeof(T)));  // <= 64 KB
  char* ring_bytes = reinterpret_cast<char*>(stage_storage) + size_t(grp.group) * S * 2 * row_bytes;
  const StageRing<S> ring{stage_bars[grp.group]};
  if (t == 0) ring.init();
  if constexpr (SHARED_GAMMA) GammaCopy::fill(gamma_copy, gamma, D);
  __syncthreads();  // the barriers' initialisation (and gamma's copy) is visible before any wait
  const ParamRow<VEC, NV, G, SHARED_GAMMA> gamma_of{gamma, gamma_copy, t};

  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R + grp.group;
  const auto x_stage = [&](int64_t k) { return reinterpret_cast<T*>(ring_bytes + ring.stage(k) * 2 * row_bytes); };
  const auto issue = [&](int64_t k, int64_t row) {  // thread 0 of the group, row < rows
    T* xs = x_stage(k);
    uint64_t* bar = ring.arm(k, 2 * row_bytes);
    stage_copy(xs, x + row * D, row_bytes, bar);
    stage_copy(xs + D, dy + row * D, row_bytes, bar);
  };
  if (t == 0)
    for (int k = 0; k < S && first + k * row_stride < rows; ++k) issue(k, first + k * row_stride);

  float acc_dgamma[NV][VEC], acc_dbeta[NV][VEC];
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc_dgamma[j][e] = 0.0f, acc_dbeta[j][e] = 0.0f;

  // Trip k: row first + k row_stride; group 0's rows set the trip count
  // (blockIdx.x R < rows: persistent_grid).
  int64_t k = 0;
  for (int64_t row = first; row - grp.group < rows; row += row_stride, ++k) {
    const bool live = row < rows;
    const int len = live ? D : 0;  // columns this group reads and writes this trip
    const T* xs = x_stage(k);
    const T* dys = xs + D;
    if (live) ring.wait(k);
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float s[3] = {0.0f, 0.0f, 0.0f};
    row_terms_from_stage<T, VEC, NV, G>(xs, dys, gamma_of, len, t, m, rs, s);
    grp.sums(s);
    const DxTerms terms = dx_terms(s, inv_d);
    if (live)
      dx_from_stage<T, VEC, NV, G>(xs, dys, dx + row * D, gamma_of, len, t, m, rs, terms, acc_dgamma, acc_dbeta);
    grp.sync();  // every read of stage k % S is done before it is refilled
    if (t == 0 && row + S * row_stride < rows) issue(k + S, row + S * row_stride);
  }

  // Every copy issued was waited for; the rings' bytes now hold the groups'
  // accumulators, added into the block's partial row in group order.
  __syncthreads();
  float* acc = reinterpret_cast<float*>(stage_storage);
  spill_accumulators<VEC, NV, G>(acc + size_t(grp.group) * 2 * D, D, t, acc_dgamma, acc_dbeta);
  __syncthreads();
  float* block_dgamma = partial_dgamma + static_cast<int64_t>(blockIdx.x) * D;
  float* block_dbeta = partial_dbeta + static_cast<int64_t>(blockIdx.x) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) sg += acc[size_t(r) * 2 * D + c], sb += acc[size_t(r) * 2 * D + D + c];
    block_dgamma[c] = sg;
    block_dbeta[c] = sb;
  }
}

}  // namespace
}  // namespace hg::gpu
