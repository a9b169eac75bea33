// Fused LayerNorm kernels (API: cuda/layernorm_kernels.hpp). Design, thread
// mapping and numerics: docs/layernorm.md, "Fused GPU kernels"; compiler
// report and measurements: docs/layernorm_kernels_notes.md.
//
// A group of G threads owns one row at a time, R groups per block. Thread t
// of a group holds EPT elements of the row in registers, the elements
// (j * G + t) * VEC + k for j < EPT / VEC, k < VEC (VEC: 16 bytes, or 1 where
// the rows are not 16-byte aligned; lab variants 6 and 7 take 8 bytes of bf16,
// VEC 4, on 16-byte aligned rows): every j is one coalesced sweep of the
// group. A group holds CAP = G * EPT elements. Longer rows are walked in
// chunks of CAP, read twice (the chunked kernels), or, on sm_90+, split over
// a cluster of C = 2..8 blocks, one column slice each (the backward; the
// forward for 16-byte-aligned f32 rows of 65536+ elements).
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "cuda/residual_layernorm_kernels.hpp"
#include "cuda/layernorm_dx_terms.cuh"
#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_residual.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/layernorm_staged_backward.cuh"
#include "cuda/layernorm_staged_forward.cuh"
#include "cuda/layernorm_staged_pair_forward.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// ---- forward ------------------------------------------------------------------------
// Statistics and normalisation of a held row (and why they are stable):
// cuda/layernorm_moments.cuh.

// Chan et al.'s pairwise merge of per-chunk (count, mean, M2) statistics.
struct ChunkMoments {
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;  // of the chunks seen so far
  __device__ __forceinline__ void add(float n_b, float mean_b, float m2_b) {
    const float n_ab = n + n_b;
    const float delta = mean_b - mean;
    mean += delta * (n_b / n_ab);
    m2 += m2_b + delta * delta * (n * n_b / n_ab);
    n = n_ab;
  }
};

// The next chunk of a long row (chunk elements at xr, read into v): its
// mean and M2, merged into acc.
template <class T, int VEC, int NV, int G>
__device__ __forceinline__ void add_chunk(const T* xr, int chunk, float shift, const RowGroup<G>& grp,
                                          float (&v)[NV][VEC], ChunkMoments& acc) {
  load_part<T, VEC, NV, G>(xr, chunk, grp.t, shift, v);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += v[j][k];
  const float mean_b = grp.sum(s) / static_cast<float>(chunk);
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if ((j * G + grp.t) * VEC < chunk)
#pragma unroll
      for (int k = 0; k < VEC; ++k) q += (v[j][k] - mean_b) * (v[j][k] - mean_b);
  const float m2_b = grp.sum(q);
  acc.add(static_cast<float>(chunk), mean_b, m2_b);
}

// Rows of up to CAP = G * EPT elements, held in registers, read once.
template <class T, int VEC, int EPT, int G, int R>
__global__ void __launch_bounds__(G * R, min_blocks_for(G * R))
    layernorm_forward_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                             const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                             float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  // Rows are uniform across a group, so a group runs its loop (and its
  // barriers) together; groups of one block are independent.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + grp.group; row < rows; row += row_stride) {
    const float shift = to_float(x[row * D]);
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float v[NV][VEC];
    load_part<T, VEC, NV, G>(xr, D, grp.t, shift, v);
    if (prefetch_next_row(G * R) && row + row_stride < rows) prefetch_row_l2<T, G, EPT>(xr + row_stride * D, D, grp.t);
    const Moments m = moments_in_registers<VEC, NV, G>(v, D, grp.t, GroupSums<G>{grp}, inv_d, eps);
    for (int off = 0; off < D; off += CAP) {  // one trip: D <= CAP
      const int chunk = min(CAP, D - off);
      const float* gamma_c = gamma + off;
      const float* beta_c = beta + off;
      T* y_c = yr + off;
      normalise_chunk<T, VEC, NV, G>(v, chunk, m, gamma_c, beta_c, y_c, grp.t);
    }
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, shift, m);
  }
}

// Rows of D <= C * CAP on sm_90+: a cluster of C blocks per row, block
// `rank` on its column slice, the row sums added across the cluster; rank 0
// writes the statistics. The resident kernel's steps over a slice.
template <class T, int VEC, int EPT, int G>
__global__ void __launch_bounds__(G, 1)
    layernorm_forward_cluster_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                     float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && G <= 1024, "bad LayerNorm config");
  __shared__ GroupScratch<G, 1> scratch;
  __shared__ float slots[2][kMaxRowSums];  // exchange of block sums
  int parity = 0;
  const RowGroup<G> grp = row_group<G, 1>(scratch);
  const auto row_sums = [&](float(&v)[1]) {
    grp.sums(v);
    cluster_sums<1>(v, slots, parity);
  };
  const float inv_d = 1.0f / static_cast<float>(D);
  const RowSplit part = split_rows<true, 1, VEC>(D, grp.group);
  for (int64_t row = part.first_row; row < rows; row += part.row_stride) {  // the same rows in every block
    const float shift = to_float(x[row * D]);
    const T* xr = x + row * D + part.col0;
    float v[NV][VEC];
    load_part<T, VEC, NV, G>(xr, part.len, grp.t, shift, v);
    if (row + part.row_stride < rows) prefetch_row_l2<T, G, EPT>(xr + part.row_stride * D, part.len, grp.t);
    const Moments m = moments_in_registers<VEC, NV, G>(v, part.len, grp.t, row_sums, inv_d, eps);
    normalise_chunk<T, VEC, NV, G>(v, part.len, m, gamma + part.col0, beta + part.col0, y + row * D + part.col0,
                                   grp.t);
    if (grp.t == 0 && part.col0 == 0) save_stats(mean_out, rstd_out, row, shift, m);
  }
  cluster_exit_barrier<true>();
}

// Rows of any length, one block of G threads per row, in chunks of G * EPT:
// read once for the statistics and again (mostly from L2) for y.
template <class T, int VEC, int EPT, int G>
__global__ void __launch_bounds__(G, min_blocks_for(G))
    layernorm_forward_chunked_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                     float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && G <= 1024, "bad LayerNorm config");
  __shared__ GroupScratch<G, 1> scratch;
  const RowGroup<G> grp = row_group<G, 1>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) + grp.group; row < rows; row += row_stride) {
    const float shift = to_float(x[row * D]);
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float v[NV][VEC];
    ChunkMoments acc;
    for (int off = 0; off < D; off += CAP) {
      const int chunk = min(CAP, D - off);
      add_chunk<T, VEC, NV, G>(xr + off, chunk, shift, grp, v, acc);
    }
    const Moments m = {acc.mean, rsqrtf(acc.m2 * inv_d + eps)};
    for (int off = 0; off < D; off += CAP) {
      const int chunk = min(CAP, D - off);
      load_part<T, VEC, NV, G>(xr + off, chunk, grp.t, shift, v);
      const float* gamma_c = gamma + off;
      const float* beta_c = beta + off;
      T* y_c = yr + off;
      normalise_chunk<T, VEC, NV, G>(v, chunk, m, gamma_c, beta_c, y_c, grp.t);
    }
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, shift, m);
  }
}

// ---- lab variants (HG_LN_VARIANT) ----------------------------------------------------
// Candidates for the resident kernels on 16-byte aligned rows of D <= 16384,
// picked per case by the production table (host section below) or forced by
// HG_LN_VARIANT; each is a set of the changes below. What each changes and
// why: docs/layernorm_kernels_notes.md, "Lab variants". Variant 0 is the
// kernels above, untouched.
struct LnVariant {
  bool lean;      // forward: one-pass statistics, FFMA normalisation; both: bf16 widened by masks
  bool prefetch;  // the group's next row(s) asked of L2 by bulk prefetches, at every block size
  bool wide;      // forward bf16: rows held packed, twice the elements per thread;
                  // backward: 1024-thread blocks where 512 ran (half the partial rows)
  bool staged;    // rows staged in shared memory by bulk copies, several in flight per group
  int narrows = -1;  // >= 0: variant `narrows`'s kernels with bf16 rows accessed 4 elements
                     // (8 bytes) at a time, so each thread's float4 gamma/beta loads are
                     // lane-contiguous; f32 rows run variant `narrows` itself
  bool pairs = false;  // forward: the staged kernel taking two rows a step (one group reduction
                       // per statistic and one gamma/beta load per slot for both); backward: staged
  bool shared_params = false;  // on warp rows, gamma/beta read from a copy the block makes in
                               // shared memory. Forward: with lean, 1 with bf16 rows packed;
                               // with staged, 5. Backward: 5 with gamma from the copy
};
constexpr LnVariant kLnVariants[kLayerNormVariants] = {
    {false, false, false, false},     // 0: the kernels of 2026-11-26
    {true, false, false, false},      // 1: lean
    {true, true, false, false},       // 2: lean + next-row bulk prefetch
    {true, false, true, false},       // 3: lean + wide
    {true, true, true, false},        // 4: lean + prefetch + wide
    {false, false, false, true},      // 5: staged (cuda/bulk_stage.cuh)
    {false, false, false, true, 5},   // 6: 5 with 8-byte bf16 accesses
    {false, false, false, false, 0},  // 7: 0 with 8-byte bf16 accesses
    {false, false, false, true, -1, true},  // 8: 5 with two rows a step (the backward is 5's)
    {true, false, false, false, -1, false, true},  // 9: 1 (backward: 5) with the parameters in shared memory
    {false, false, false, true, -1, false, true},  // 10: 5 with the parameters in shared memory (backward: 9's)
};

// The variant whose kernels variant V launches (its template argument V in
// Forward and Backward): V itself, or the one it narrows.
constexpr int kernels_of(int V) { return kLnVariants[V].narrows < 0 ? V : kLnVariants[V].narrows; }

// Whether variant V's kernels on rows of G threads read gamma/beta from the
// block's shared-memory copy: only warp rows (G == 32) take one.
constexpr bool reads_param_copy(int V, int G) { return kLnVariants[V].shared_params && G == 32; }

// One-pass statistics of a held row: one group reduction of (sum d, sum d^2)
// over d = x - shift, var = E[d^2] - E[d]^2. That difference loses about
// log2(1 + E[d]^2 / var) bits; where E[d]^2 > kOnePassRatio var (the shift,
// x[row, 0], far from the mean in row standard deviations) the row takes
// the second pass of moments_in_registers instead. The branch is uniform
// over the group (every thread holds bitwise the same sums), so its
// barriers stay matched.
constexpr float kOnePassRatio = 3.0f;

template <int VEC, int NV, int G, class Row, class RowSums>
__device__ __forceinline__ Moments one_pass_moments(const Row& h, int len, int t, const RowSums& row_sums,
                                                    float inv_d, float eps) {
  float s[2] = {0.0f, 0.0f};
  for_each_held<VEC, NV, G>(h, len, t, [&](float d) { s[0] += d, s[1] = fmaf(d, d, s[1]); });
  row_sums(s);
  const float mean = s[0] * inv_d;
  float var = fmaf(-mean, mean, s[1] * inv_d);
  if (!(mean * mean <= kOnePassRatio * var)) {  // also a negative var, and NaN
    float q[1] = {0.0f};
    for_each_held<VEC, NV, G>(h, len, t, [&](float d) { q[0] += (d - mean) * (d - mean); });
    row_sums(q);
    var = q[0] * inv_d;
  }
  return {mean, rsqrtf(var + eps)};
}

// y = ((x - shift) rstd - mean rstd) gamma + beta: two FFMAs per element.
template <class T, int VEC, int NV, int G, class Row, class Param>
__device__ __forceinline__ void normalise_ffma(const Row& h, int len, const Moments& m, const Param& gamma,
                                               const Param& beta, T* yr, int t) {
  const float neg_mean_rstd = -m.mean * m.rstd;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float d[VEC], g[VEC], b[VEC], out[VEC];
      h.get(j, d);
      gamma.get(j, i, g);
      beta.get(j, i, b);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = fmaf(fmaf(d[k], m.rstd, neg_mean_rstd), g[k], b[k]);
      store_vec<VEC, Store::Streaming>(yr + i, out);
    }
  }
}

// The resident forward (rows of D <= G * EPT, 16-byte access) as variant V.
template <class T, int VEC, int EPT, int G, int R, int V>
__global__ void __launch_bounds__(G * R, min_blocks_for(G * R))
    layernorm_forward_lab_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                 float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr LnVariant kV = kLnVariants[V];
  constexpr int NV = EPT / VEC;
  constexpr bool kPacked = (kV.wide || kV.shared_params) && std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kSharedParams = reads_param_copy(V, G);
  static_assert(V >= 1 && kV.lean && VEC > 1 && EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15,
                "bad LayerNorm lab config");
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  // Variant 9 on warp rows: the block's copies of gamma and beta (ParamCopy).
  using Copy = ParamCopy<VEC, NV, G>;
  __shared__ float4 param_copy[2][kSharedParams ? Copy::kFloat4s : 1];
  if constexpr (kSharedParams) {
    Copy::fill(param_copy[0], gamma, D);
    Copy::fill(param_copy[1], beta, D);
    __syncthreads();
  }
  using Param = ParamRow<VEC, NV, G, kSharedParams, Load::ReadOnly>;
  const Param gamma_of{gamma, param_copy[0], grp.t}, beta_of{beta, param_copy[1], grp.t};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + grp.group; row < rows; row += row_stride) {
    const T* xr = x + row * D;
    HeldRow<T, VEC, NV, G, kPacked> h;
    h.load(xr, D, grp.t);
    if constexpr (kV.prefetch)
      if (row + row_stride < rows)
        bulk_prefetch_l2<G, G * EPT * int(sizeof(T))>(xr + row_stride * D, D * int(sizeof(T)), grp.t);
    const Moments m = one_pass_moments<VEC, NV, G>(h, D, grp.t, GroupSums<G>{grp}, inv_d, eps);
    normalise_ffma<T, VEC, NV, G>(h, D, m, gamma_of, beta_of, y + row * D, grp.t);
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, h.shift, m);
  }
}

// ---- backward -----------------------------------------------------------------------
// Kernel 1 writes dx for every row and, per block (per cluster), partial
// dgamma = sum dy * xhat and dbeta = sum dy over the rows it handled to its
// partial row; kernel 2 sums the partial rows in a fixed order. The row
// terms and dx: cuda/layernorm_dx_terms.cuh.

// Rows (CLUSTER: row slices) of up to CAP = G * EPT elements: x and dy held
// in registers, read once. Each group keeps its running partials in shared
// memory (CAP floats of dgamma, then CAP of dbeta); at the end the block adds
// its R groups in group order into its partial row. V: the lab variant
// (kLnVariants; 0 for the cluster and scalar kernels).
template <class T, int VEC, int EPT, int G, int R, bool CLUSTER, int V = 0>
__global__ void __launch_bounds__(G * R, min_blocks_for(G * R))
    layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                              float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta, int64_t rows,
                              int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  static_assert(!CLUSTER || R == 1, "a cluster block holds one row slice");
  static_assert(V == 0 || (!CLUSTER && VEC > 1), "lab variants: resident 16-byte rows only");
  constexpr LnVariant kV = kLnVariants[V];
  extern __shared__ float4 acc_storage[];  // R * 2 * CAP floats
  __shared__ GroupScratch<G, R> scratch;
  __shared__ float slots[2][kMaxRowSums];  // CLUSTER: exchange of block sums
  int parity = 0;

  const RowGroup<G> grp = row_group<G, R>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const RowSplit part = split_rows<CLUSTER, R, VEC>(D, grp.group);
  const int len = part.len;  // D unless CLUSTER
  float* block_dgamma = partial_dgamma + part.partial * D + part.col0;
  float* block_dbeta = partial_dbeta + part.partial * D + part.col0;
  const float* gamma_p = gamma + part.col0;
  const int64_t row_stride = part.row_stride;

  float* acc_dgamma = reinterpret_cast<float*>(acc_storage) + grp.group * 2 * CAP;
  float* acc_dbeta = acc_dgamma + CAP;
  zero_group_partials<VEC, NV, G>(acc_dgamma, acc_dbeta, t);

  // Every group of the block runs the same sequence of barriers: a group
  // past the last row still makes the trip, on an empty row (no loads, no
  // stores), and joins its named barriers (compute-sanitizer racecheck
  // reported hazards when groups ran different row counts:
  // docs/reliability.md, "GPU sanitizers").
  for (int64_t base = part.first_row - grp.group; base < rows; base += row_stride) {
    const int64_t row = base + grp.group;
    const bool live = row < rows;
    const int row_len = live ? len : 0;  // columns this group reads and writes this trip
    const int64_t start = (live ? row : 0) * D + part.col0;
    float xh[NV][VEC], g_dy[NV][VEC];  // x, then xhat'; dy
    load_part<T, VEC, NV, G, kV.lean>(x + start, row_len, t, 0.0f, xh);
    load_part<T, VEC, NV, G, kV.lean>(dy + start, row_len, t, 0.0f, g_dy);
    if constexpr (kV.prefetch) {
      if (row + row_stride < rows) {
        bulk_prefetch_l2<G, CAP * int(sizeof(T))>(x + start + row_stride * D, len * int(sizeof(T)), t);
        bulk_prefetch_l2<G, CAP * int(sizeof(T))>(dy + start + row_stride * D, len * int(sizeof(T)), t);
      }
    } else if (prefetch_next_row(G * R) && row + row_stride < rows) {
      prefetch_row_l2<T, G, EPT>(x + start + row_stride * D, len, t);
      prefetch_row_l2<T, G, EPT>(dy + start + row_stride * D, len, t);
    }
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float s[3] = {0.0f, 0.0f, 0.0f};
    row_terms_in_registers<VEC, NV, G>(xh, g_dy, gamma_p, row_len, t, m, rs, s);
    grp.sums(s);
    if constexpr (CLUSTER) cluster_sums<3>(s, slots, parity);
    const DxTerms k = dx_terms(s, inv_d);
    dx_in_registers<T, VEC, NV, G>(dx + start, gamma_p, xh, g_dy, row_len, t, rs, k, acc_dgamma, acc_dbeta);
  }

  write_block_partials<R, CAP>(reinterpret_cast<const float*>(acc_storage), len, block_dgamma, block_dbeta);
  cluster_exit_barrier<CLUSTER>();
}

// Rows of any length, one block of G threads per row, in chunks of G * EPT,
// read twice (sums, then dx); the partials are added straight into the
// block's partial row in global memory, each thread on its own columns.
template <class T, int VEC, int EPT, int G>
__global__ void __launch_bounds__(G, min_blocks_for(G))
    layernorm_backward_chunked_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ gamma, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, T* __restrict__ dx,
                                      float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta,
                                      int64_t rows, int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && G <= 1024, "bad LayerNorm config");
  __shared__ GroupScratch<G, 1> scratch;
  const RowGroup<G> grp = row_group<G, 1>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) + grp.group;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x);
  float* block_dgamma = partial_dgamma + static_cast<int64_t>(blockIdx.x) * D;
  float* block_dbeta = partial_dbeta + static_cast<int64_t>(blockIdx.x) * D;

  // Zero this block's partial rows: exactly the columns this thread adds to later.
  for (int off = 0; off < D; off += CAP) {
    const int len = min(CAP, D - off);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = (j * G + t) * VEC;
      if (i < len)
#pragma unroll
        for (int k = 0; k < VEC; ++k) block_dgamma[off + i + k] = 0.0f, block_dbeta[off + i + k] = 0.0f;
    }
  }
  float xh[NV][VEC], g_dy[NV][VEC];  // x; dy
  for (int64_t row = first_row; row < rows; row += row_stride) {
    const T* xr = x + row * D;
    const T* dyr = dy + row * D;
    T* dxr = dx + row * D;
    const float m = mean[row], rs = rstd[row];
    float s[3] = {0.0f, 0.0f, 0.0f};
    for (int off = 0; off < D; off += CAP) {
      const int len = min(CAP, D - off);
      load_part<T, VEC, NV, G>(xr + off, len, t, 0.0f, xh);
      load_part<T, VEC, NV, G>(dyr + off, len, t, 0.0f, g_dy);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < len) {
          float g[VEC];
          load_vec<VEC>(gamma + off + i, g);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float gd = __fmul_rn(g[k], g_dy[j][k]);
            const float xhat_saved = (xh[j][k] - m) * rs;
            s[0] += gd;
            s[1] += gd * xhat_saved;
            s[2] += xhat_saved;
          }
        }
      }
    }
    grp.sums(s);
    const DxTerms k = dx_terms(s, inv_d);
    for (int off = 0; off < D; off += CAP) {
      const int len = min(CAP, D - off);
      load_part<T, VEC, NV, G>(xr + off, len, t, 0.0f, xh);
      load_part<T, VEC, NV, G>(dyr + off, len, t, 0.0f, g_dy);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < len) {
          float g[VEC], out[VEC];
          load_vec<VEC>(gamma + off + i, g);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float xhat = (xh[j][e] - m) * rs - k.c;
            out[e] = dx_element(g[e], g_dy[j][e], xhat, rs, k);
            block_dgamma[off + i + e] += g_dy[j][e] * xhat;
            block_dbeta[off + i + e] += g_dy[j][e];
          }
          store_vec<VEC, Store::Streaming>(dxr + off + i, out);
        }
      }
    }
  }
}

// Backward, kernel 2: dgamma[c] = sum over partial rows p of
// partial_dgamma[p][c] (same for dbeta), in a fixed order: thread (tx, ty)
// sums p = ty, ty + 32, ... ascending, then one thread adds the 32 results in
// ty order. Nothing depends on timing: bitwise the same on every run.
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 32;

__global__ void __launch_bounds__(kReduceCols* kReduceLanes)
    layernorm_reduce_partials_kernel(const float* __restrict__ partial_dgamma,
                                     const float* __restrict__ partial_dbeta, int n_partials, int D,
                                     float* __restrict__ dgamma, float* __restrict__ dbeta) {
  __shared__ float sum_g[kReduceLanes][kReduceCols + 1];
  __shared__ float sum_b[kReduceLanes][kReduceCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kReduceCols + tx;
  float a = 0.0f, b = 0.0f;
  if (c < D) {
#pragma unroll 4
    for (int p = ty; p < n_partials; p += kReduceLanes) {
      a += partial_dgamma[static_cast<int64_t>(p) * D + c];
      b += partial_dbeta[static_cast<int64_t>(p) * D + c];
    }
  }
  sum_g[ty][tx] = a;
  sum_b[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < D) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int l = 0; l < kReduceLanes; ++l) sg += sum_g[l][tx], sb += sum_b[l][tx];
    dgamma[c] = sg;
    dbeta[c] = sb;
  }
}

// ---- host: which layout for which width --------------------------------------------

// The one table for both passes. Rows of up to 16384 elements are held in
// registers by groups of G threads, EPT elements each, R groups per block:
// a warp per row up to 1024, then several warps. 513-768 (GPT-2's 768) has
// its own 24 elements a lane: with 32, a quarter of each lane's registers
// held nothing there (docs/layernorm_kernels_notes.md, "Session 30"). At
// 8193-16384 the passes differ only in how they spread the row:
// Pass::kWideEPT elements per thread (the forward 32: 512 threads, two
// blocks per SM; the backward, which holds x and dy, 16: one 1024-thread
// block). False, launching nothing, for longer rows.
template <class Pass>
bool for_resident_width(int D, const Pass& pass) {
  if (D > 16384) return false;
  if (D <= 32 * 8) pass.template resident<8, 32, 8>();
  else if (D <= 32 * 16) pass.template resident<16, 32, 8>();
  else if (D <= 32 * 24) pass.template resident<24, 32, 8>();
  else if (D <= 32 * 32) pass.template resident<32, 32, 8>();
  else if (D <= 128 * 16) pass.template resident<16, 128, 4>();
  else if (D <= 256 * 16) pass.template resident<16, 256, 2>();
  else if (D <= 512 * 16) pass.template resident<16, 512, 1>();
  else pass.template resident<Pass::kWideEPT, 16384 / Pass::kWideEPT, 1>();
  return true;
}

// Any width: the table above; longer rows the pass's cluster kernel where it
// has one and the device runs it, else chunks of 512 x 16.
template <class Pass>
void for_width(int D, const Pass& pass) {
  if (for_resident_width(D, pass)) return;
  if (pass.clusters()) return;
  pass.template chunked<16, 512>();
}

// Blocks of `kernel` resident per SM (callers ask once per kernel).
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem, const char* op) {
  if (smem > 48 * 1024)
    HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int n = 0;
  HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  HG_CHECK(n >= 1, op, "kernel does not fit on an SM");
  return n;
}

// A persistent grid: `per_sm` blocks per SM, or fewer if the rows need fewer;
// each block walks rows with a grid-sized stride.
int persistent_grid(int64_t rows, int rows_per_block, int per_sm) {
  const int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<int>(std::min<int64_t>(wanted, int64_t(per_sm) * sm_count()));
}

// A cluster of C blocks along x.
cudaLaunchAttribute cluster_attribute(int C) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = C, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
  return a;
}

// A launch on the handgrad stream, with a cluster shape or (null) none.
cudaLaunchConfig_t launch_config(dim3 grid, int threads, size_t smem, cudaLaunchAttribute* cluster_dim) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  config.attrs = cluster_dim;
  config.numAttrs = cluster_dim != nullptr ? 1 : 0;
  return config;
}

// Cluster support of one kernel: how many clusters of C = 2..kMaxCluster
// blocks are resident at once (all 0 where the device or the kernel's
// compiled code cannot run clusters: the cluster code exists only in code
// built for sm_90 or newer, which ptxVersion reports).
template <class Kernel>
std::array<int, kMaxCluster + 1> clusters_that_fit(Kernel kernel, int threads, size_t smem) {
  std::array<int, kMaxCluster + 1> fit{};
  int device = 0, major = 0;
  HG_CUDA_CHECK(cudaGetDevice(&device));
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaFuncAttributes attr{};
  HG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (major < 9 || attr.ptxVersion < 90 || attr.binaryVersion < 90) return fit;
  if (smem > 48 * 1024)
    HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  for (int C = 2; C <= kMaxCluster; ++C) {
    cudaLaunchAttribute cluster_dim = cluster_attribute(C);
    const cudaLaunchConfig_t config = launch_config(dim3(C), threads, smem, &cluster_dim);
    HG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit[C], kernel, &config));
  }
  return fit;
}

// The cluster size for rows of D: among the sizes whose blocks hold a
// slice of at most CAP, the one that keeps the most blocks resident, the
// smallest on a tie; 0 if none can run. (A cluster lives in one GPC: 18 SMs
// hold 14 blocks in clusters of 7, but 16 in clusters of 8.)
int cluster_size_for(int D, int VEC, int CAP, const std::array<int, kMaxCluster + 1>& fit) {
  if (D > kMaxCluster * CAP) return 0;  // (and D + C - 1 cannot overflow below)
  int best = 0;
  for (int C = 2; C <= kMaxCluster; ++C)
    if (cluster_slice(D, C, VEC) <= CAP && fit[C] * C > fit[best] * best) best = C;
  return best;
}

// The room a staged kernel has for its rings on this device, or nothing where
// it cannot run: the device or the kernel's compiled code below sm_90 (the
// bulk copies exist only there). Allows it the most dynamic shared memory.
template <class Kernel>
std::optional<StagedRoom> staged_room(Kernel kernel, int threads) {
  cudaFuncAttributes attr{};
  HG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (compute_capability() < 90 || attr.ptxVersion < 90 || attr.binaryVersion < 90) return std::nullopt;
  int device = 0;
  StagedRoom room{};
  HG_CUDA_CHECK(cudaGetDevice(&device));
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&room.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&room.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&room.reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
  room.static_smem = static_cast<int>(attr.sharedSizeBytes);
  HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     room.smem_per_block - room.static_smem));
  room.blocks_per_sm = blocks_per_sm(kernel, threads, 0, "layernorm_forward_fused");
  return room;
}

struct ForwardArgs {
  const void* x;
  const float* gamma;
  const float* beta;
  void* y;
  float* mean;
  float* rstd;
  int64_t rows;
  int D;
  float eps;
};

template <class T, int VEC, int V>
struct Forward {
  static constexpr const char* kOp = "layernorm_forward_fused";
  static constexpr int kWideEPT = 32;
  const ForwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    if constexpr (V == 0) {
      resident_v0<EPT, G, R>();
    } else if constexpr (kLnVariants[V].pairs) {
      if (!resident_staged_pairs<EPT, G, R>()) resident_v0<EPT, G, R>();  // below sm_90: variant 0
    } else if constexpr (kLnVariants[V].staged) {
      if (!resident_staged<EPT, G, R>()) resident_v0<EPT, G, R>();  // below sm_90: variant 0
    } else if constexpr (kLnVariants[V].wide && std::is_same_v<T, __nv_bfloat16> && G >= 64) {
      // Packed bf16 rows: twice the elements per thread, the same block size.
      resident_lab<2 * EPT, G / 2, 2 * R>();
    } else {
      resident_lab<EPT, G, R>();
    }
  }
  template <int EPT, int G, int R>
  void resident_v0() const {
    auto kernel = layernorm_forward_kernel<T, VEC, EPT, G, R>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    launch(kernel, G * R, persistent_grid(a.rows, R, per_sm));
  }
  // Rows staged in shared memory by bulk copies (cuda/layernorm_staged_forward.cuh);
  // false where the device or the compiled code is below sm_90.
  template <int EPT, int G, int R>
  bool resident_staged() const {
    static_assert(VEC > 1, "staged rows are 16-byte rows");
    auto kernel = layernorm_forward_staged_kernel<T, VEC, EPT, G, R, reads_param_copy(V, G)>;
    static const std::optional<StagedRoom> room = staged_room(kernel, G * R);
    const int target = staged_target_bytes(kLnVariants[V].shared_params ? 0 : kStagedKB * 1024);
    return room && launch_staged(kernel, G, R, plan_staged(*room, R, a.D * int(sizeof(T)), target), 1,
                                 "layernorm_forward_staged_kernel");
  }
  // Variant 8: two rows a step (cuda/layernorm_staged_pair_forward.cuh); as resident_staged.
  template <int EPT, int G, int R>
  bool resident_staged_pairs() const {
    static_assert(VEC > 1, "staged rows are 16-byte rows");
    auto kernel = layernorm_forward_staged_pair_kernel<T, VEC, EPT, G, R>;
    static const std::optional<StagedRoom> room = staged_room(kernel, G * R);
    return room && launch_staged(kernel, G, R,
                                 plan_staged_pairs(*room, R, a.D * int(sizeof(T)), staged_target_bytes(kStagedKB * 1024)), 2,
                                 "layernorm_forward_staged_pair_kernel");
  }
  // Launches a staged forward kernel (R groups of G threads a block) on
  // `plan`, which must give each group at least `least` stages.
  template <class Kernel>
  bool launch_staged(Kernel kernel, int G, int R, const StagedPlan& plan, int least, const char* name) const {
    HG_CHECK(plan.stages >= least, kOp, least, " staged row(s) of ", a.D, " elements do not fit in shared memory");
    kernel<<<persistent_grid(a.rows, R, plan.blocks_per_sm), G * R, plan.smem, stream()>>>(
        static_cast<const T*>(a.x), a.gamma, a.beta, static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps,
        plan.stages);
    HG_CUDA_CHECK_LAUNCH(name);
    return true;
  }
  template <int EPT, int G, int R>
  void resident_lab() const {
    auto kernel = layernorm_forward_lab_kernel<T, VEC, EPT, G, R, V>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    launch(kernel, G * R, persistent_grid(a.rows, R, per_sm));
  }
  template <int EPT, int G>
  void chunked() const {
    auto kernel = layernorm_forward_chunked_kernel<T, VEC, EPT, G>;
    static const int per_sm = blocks_per_sm(kernel, G, 0, kOp);
    launch(kernel, G, persistent_grid(a.rows, 1, per_sm));
  }
  // f32 rows of 65536+ elements (16-byte aligned) on sm_90+: a cluster per
  // row, each block 1024 threads x 16 elements, reads the row once where the
  // chunked forward reads it twice. It wins only there; bf16 and shorter or
  // unaligned rows are faster chunked (docs/layernorm_kernels_notes.md).
  bool clusters() const {
    if constexpr (!std::is_same_v<T, float> || VEC == 1) {
      return false;
    } else {
      constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT, kMinD = 65536;
      if (a.D < kMinD) return false;
      auto kernel = layernorm_forward_cluster_kernel<T, VEC, kEPT, kThreads>;
      static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, 0);
      const int C = cluster_size_for(a.D, VEC, kCap, fit);
      if (C == 0) return false;
      const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
      cudaLaunchAttribute cluster_dim = cluster_attribute(C);
      const cudaLaunchConfig_t config = launch_config(dim3(C * clusters), kThreads, 0, &cluster_dim);
      HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(a.x), a.gamma, a.beta,
                                       static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps));
      HG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel (clusters)");
      return true;
    }
  }

  template <class Kernel>
  void launch(Kernel kernel, int threads, int blocks) const {
    kernel<<<blocks, threads, 0, stream()>>>(static_cast<const T*>(a.x), a.gamma, a.beta, static_cast<T*>(a.y),
                                             a.mean, a.rstd, a.rows, a.D, a.eps);
    HG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  }
};

struct BackwardArgs {
  const void* dy;
  const void* x;
  const float* gamma;
  const float* mean;
  const float* rstd;
  void* dx;
  float* dgamma;
  float* dbeta;
  int64_t rows;
  int D;
};

template <class T, int VEC, int V>
struct Backward {
  static constexpr const char* kOp = "layernorm_backward_fused";
  static constexpr int kWideEPT = 16;
  const BackwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    if constexpr (kLnVariants[V].staged || kLnVariants[V].shared_params) {
      if (!staged<EPT, G, R>()) resident_as<EPT, G, R, 0>();  // below sm_90, or rows too wide for two stages
    } else {
      // wide: 1024-thread blocks, one per SM, where 512-thread blocks ran two.
      constexpr bool kWiden = kLnVariants[V].wide && G * R == 512 && G >= 128;
      resident_as<EPT, G, kWiden ? 2 * R : R, V>();
    }
  }
  template <int EPT, int G, int R, int KV>
  void resident_as() const {
    auto kernel = layernorm_backward_kernel<T, VEC, EPT, G, R, false, KV>;
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    static const int per_sm = capped(blocks_per_sm(kernel, G * R, kSmem, kOp), G * R);
    const int blocks = persistent_grid(a.rows, R, per_sm);
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), G * R, kSmem, nullptr, partial_dgamma, partial_dbeta);
    });
  }
  // Variant 5 (cuda/layernorm_staged_backward.cuh): x and dy of S rows per
  // group staged in shared memory by bulk copies. False (nothing launched)
  // where it cannot run: a device or a build below sm_90, or 2 D sizeof(T)
  // bytes times the block's groups and stages past what a block may have.
  template <int EPT, int G, int R>
  bool staged() const {
    using Staged = StagedShape<EPT, G, R>;
    constexpr bool kSharedGamma = reads_param_copy(V, G);
    auto kernel = layernorm_backward_staged_kernel<T, VEC, EPT, G, Staged::kGroups, Staged::kDepth, Staged::kMinBlocks,
                                                   kSharedGamma>;
    static const size_t max_smem = staged_backward_smem_limit(kernel);
    const size_t smem = staged_smem_bytes(a.D, sizeof(T), Staged::kGroups, Staged::kDepth);
    if (smem > max_smem) return false;
    // Blocks per SM depend on D through the stages; asked again only when the smem changes.
    thread_local size_t asked_smem = 0;
    thread_local int asked_per_sm = 0;
    if (smem != asked_smem) {
      int n = 0;
      HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Staged::kThreads, smem));
      asked_smem = smem, asked_per_sm = n;
    }
    if (asked_per_sm < 1) return false;
    const int blocks = persistent_grid(a.rows, Staged::kGroups, capped(asked_per_sm, Staged::kThreads));
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), Staged::kThreads, smem, nullptr, partial_dgamma, partial_dbeta);
    });
    return true;
  }
  template <int EPT, int G>
  void chunked() const {
    auto kernel = layernorm_backward_chunked_kernel<T, VEC, EPT, G>;
    static const int per_sm = capped(blocks_per_sm(kernel, G, 0, kOp), G);
    const int blocks = persistent_grid(a.rows, 1, per_sm);
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), G, 0, nullptr, partial_dgamma, partial_dbeta);
    });
  }
  // Rows of 16385 .. kMaxCluster * 16384 on sm_90+: a cluster per row, each
  // block 1024 threads x 16 elements (as the resident 8193-16384 kernel);
  // one partial row per cluster. False where no cluster can run.
  bool clusters() const {
    constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT;
    constexpr size_t kSmem = sizeof(float) * 2 * kCap;
    auto kernel = layernorm_backward_kernel<T, VEC, kEPT, kThreads, 1, true>;
    static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, kSmem);
    const int C = cluster_size_for(a.D, VEC, kCap, fit);
    if (C == 0) return false;
    const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
    with_partials(clusters, [&](float* partial_dgamma, float* partial_dbeta) {
      cudaLaunchAttribute cluster_dim = cluster_attribute(C);
      launch(kernel, dim3(C * clusters), kThreads, kSmem, &cluster_dim, partial_dgamma, partial_dbeta);
    });
    return true;
  }

  // Enough threads per SM to keep loads in flight, few enough blocks that
  // the partial buffer stays small next to the main traffic.
  static int capped(int per_sm, int threads) { return std::min(per_sm, std::max(2, 1024 / threads)); }

  // Kernel 1 through launch(partial_dgamma, partial_dbeta) into n_partials
  // partial rows, then kernel 2. Partial sums, [2][n_partials][D]; the
  // caching allocator makes this cheap, and everything runs on the one
  // stream, so freeing it at scope exit is safe.
  template <class LaunchKernel1>
  void with_partials(int n_partials, LaunchKernel1 launch_kernel1) const {
    Tensor partials;
    float* partial_dgamma = nullptr;
    float* partial_dbeta = nullptr;
    if (n_partials > 0) {
      partials = Tensor::empty({2, n_partials, a.D}, DType::F32, Device::CUDA);
      partial_dgamma = partials.data<float>();
      partial_dbeta = partial_dgamma + int64_t(n_partials) * a.D;
      launch_kernel1(partial_dgamma, partial_dbeta);
    }
    const dim3 reduce_block(kReduceCols, kReduceLanes);
    const int reduce_grid = (a.D + kReduceCols - 1) / kReduceCols;
    layernorm_reduce_partials_kernel<<<reduce_grid, reduce_block, 0, stream()>>>(partial_dgamma, partial_dbeta,
                                                                               n_partials, a.D, a.dgamma, a.dbeta);
    HG_CUDA_CHECK_LAUNCH("layernorm_reduce_partials_kernel");
  }

  // Launches kernel 1 (`cluster_dim`: the cluster shape, or null for none).
  template <class... Params>
  void launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, cudaLaunchAttribute* cluster_dim,
              float* partial_dgamma, float* partial_dbeta) const {
    const cudaLaunchConfig_t config = launch_config(grid, threads, smem, cluster_dim);
    HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(a.dy), static_cast<const T*>(a.x),
                                     a.gamma, a.mean, a.rstd, static_cast<T*>(a.dx), partial_dgamma, partial_dbeta,
                                     a.rows, a.D));
    HG_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  }
};

// ---- host: residual + LayerNorm, variants 1 and 2 (cuda/layernorm_residual.cuh) -----
// The resident layouts of for_resident_width, one kernel per pass; the
// backward's partial rows and kernel 2 are the LayerNorm backward's.

// The LayerNorm forward's arguments plus the residual and the stored sum.
struct ResidualForwardArgs : ForwardArgs {
  const void* r;
  void* h;
};

template <class T, int VEC>
struct ResidualForward {
  static constexpr const char* kOp = "residual_layernorm_forward_fused";
  static constexpr int kWideEPT = Forward<T, VEC, 0>::kWideEPT;
  const ResidualForwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    auto kernel = residual_layernorm_forward_kernel<T, VEC, EPT, G, R>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    kernel<<<persistent_grid(a.rows, R, per_sm), G * R, 0, stream()>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.r), a.gamma, a.beta, static_cast<T*>(a.h),
        static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps);
    HG_CUDA_CHECK_LAUNCH("residual_layernorm_forward_kernel");
  }
};

template <class T, int VEC, template <class, int, int, int> class AddIn>
struct ResidualBackward {
  static constexpr const char* kOp = "residual_layernorm_backward_fused";
  using Ln = Backward<T, VEC, 0>;
  static constexpr int kWideEPT = Ln::kWideEPT;
  const BackwardArgs& a;  // x: h, dx: dh
  const void* dh_in;

  template <int EPT, int G, int R>
  void resident() const {
    auto kernel = residual_layernorm_backward_kernel<T, VEC, EPT, G, R, AddIn>;
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    static const int per_sm = Ln::capped(blocks_per_sm(kernel, G * R, kSmem, kOp), G * R);
    const int blocks = persistent_grid(a.rows, R, per_sm);
    Ln{a}.with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      kernel<<<blocks, G * R, kSmem, stream()>>>(static_cast<const T*>(a.dy), static_cast<const T*>(dh_in),
                                                 static_cast<const T*>(a.x), a.gamma, a.mean, a.rstd,
                                                 static_cast<T*>(a.dx), partial_dgamma, partial_dbeta, a.rows, a.D);
      HG_CUDA_CHECK_LAUNCH("residual_layernorm_backward_kernel");
    });
  }
};

// 16-byte accesses need every row start aligned: the base pointers and D * elt.
template <class T>
bool can_vectorize(int D, std::initializer_list<const void*> ptrs) {
  if ((static_cast<size_t>(D) * sizeof(T)) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// The variant each case runs when HG_LN_VARIANT is unset, by [table: HBM3,
// HBM3e (layernorm_table_switch)][pass: forward, backward][dtype: f32,
// bf16][D <= 256, 512, 1024, 2048, 3072, 4096, 8192, > 8192]. Each entry is
// the variant that won at those widths on that memory (table 0: H100 runs of
// sessions 27-32; table 1: H200, session 33); the measurements and the
// reasons are in docs/layernorm_kernels_notes.md (the session sections;
// "Session 33" sums up both tables). Making a measured winner the default
// is one edit here.
// Variants reach only the resident kernels on 16-byte rows (D <= 16384);
// every other case runs variant 0.
constexpr int kLnWidthClasses = 8;
constexpr int kLnProduction[kLayerNormTables][2][2][kLnWidthClasses] = {
    {{{0, 10, 10, 5, 8, 8, 5, 5}, {9, 10, 9, 3, 3, 8, 5, 5}},    // HBM3 forward: f32, bf16
     {{0, 0, 9, 0, 0, 0, 0, 0}, {0, 0, 9, 7, 7, 7, 6, 6}}},      // HBM3 backward
    {{{10, 10, 10, 3, 3, 3, 3, 3}, {9, 9, 9, 3, 3, 8, 3, 3}},   // HBM3e forward
     {{0, 0, 9, 0, 0, 0, 0, 0}, {7, 7, 9, 7, 7, 7, 7, 6}}}};    // HBM3e backward

int ln_width_class(int D) {
  constexpr int kUpTo[kLnWidthClasses - 1] = {256, 512, 1024, 2048, 3072, 4096, 8192};
  int c = 0;
  while (c < kLnWidthClasses - 1 && D > kUpTo[c]) ++c;
  return c;
}

// Runs Pass<T, VEC, V> over the width table for x's dtype and alignment: V
// the variant of the case (forced by HG_LN_VARIANT, else the production
// table) on 16-byte rows, 0 on the scalar path. A narrowing variant (6, 7)
// runs the kernels of the one it narrows, with VEC 4 for bf16 rows of
// D <= 16384 (longer bf16 rows: variant 0).
template <template <class, int, int> class Pass, class Args>
void dispatch(const Tensor& x, const Args& a, std::initializer_list<const void*> ptrs, bool backward) {
  const bool bf16 = x.dtype() == DType::BF16;
  const int variant =
      layernorm_lab_switch().pick(kLnProduction[layernorm_production_table()][backward][bf16][ln_width_class(a.D)]);
  switch (x.dtype()) {
    case DType::F32:
      if (can_vectorize<float>(a.D, ptrs))
        return with_variant<kLayerNormVariants>(variant, [&](auto v) {
          for_width(a.D, Pass<float, VecWidth<float>::value, kernels_of(decltype(v)::value)>{a});
        });
      return for_width(a.D, Pass<float, 1, 0>{a});
    case DType::BF16:
      if (can_vectorize<__nv_bfloat16>(a.D, ptrs))
        return with_variant<kLayerNormVariants>(variant, [&](auto v) {
          constexpr int V = decltype(v)::value;
          if constexpr (kLnVariants[V].narrows < 0) {
            for_width(a.D, Pass<__nv_bfloat16, VecWidth<__nv_bfloat16>::value, V>{a});
          } else if (!for_resident_width(a.D, Pass<__nv_bfloat16, 4, kernels_of(V)>{a})) {
            for_width(a.D, Pass<__nv_bfloat16, VecWidth<__nv_bfloat16>::value, 0>{a});
          }
        });
      return for_width(a.D, Pass<__nv_bfloat16, 1, 0>{a});
    default:
      fail(Pass<float, 1, 0>::kOp, "x ", x.shape(), " has dtype ", dtype_name(x.dtype()),
           "; fused kernels take f32 or bf16");
  }
}

void check_rows_d(const char* op, const Tensor& x) {
  HG_DCHECK(x.ndim() == 2, op, "expects (rows, D), got x ", x.shape());
  HG_CHECK(x.size(1) <= INT_MAX, op, "D too large for the kernels' 32-bit widths: x ", x.shape());
}

}  // namespace

int layernorm_production_table() {
  static const int by_device = dram_peak_gbps() >= kLnHbm3eGbps ? 1 : 0;
  return layernorm_table_switch().pick(by_device);
}

void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  constexpr const char* kOp = "layernorm_forward_fused";
  check_rows_d(kOp, x);
  HG_DCHECK(y.dtype() == x.dtype() && gamma.dtype() == DType::F32 && beta.dtype() == DType::F32, kOp,
            "dtypes: x ", dtype_name(x.dtype()), " y ", dtype_name(y.dtype()), " gamma/beta must be f32");
  const ForwardArgs a{x.raw_data(),        gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                      rstd.data<float>(), x.size(0),           int(x.size(1)),     eps};
  if (a.rows == 0 || a.D == 0) return;
  dispatch<Forward>(x, a, {a.x, a.y, a.gamma, a.beta}, false);
}

void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  constexpr const char* kOp = "layernorm_backward_fused";
  check_rows_d(kOp, x);
  HG_DCHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && gamma.dtype() == DType::F32 &&
                dgamma.dtype() == DType::F32 && dbeta.dtype() == DType::F32,
            kOp, "dtypes: x ", dtype_name(x.dtype()), " dy ", dtype_name(dy.dtype()), " dx ", dtype_name(dx.dtype()),
            "; gamma, dgamma, dbeta must be f32");
  const BackwardArgs a{dy.raw_data(),       x.raw_data(),         gamma.data<float>(), mean.data<float>(),
                       rstd.data<float>(), dx.raw_data(),        dgamma.data<float>(), dbeta.data<float>(),
                       x.size(0),          int(x.size(1))};
  if (a.D == 0) return;
  dispatch<Backward>(x, a, {a.dy, a.x, a.dx, a.gamma}, true);
}

// Variants 1 and 2 run where every row is resident and 16-byte aligned.
template <class T>
bool residual_rows_fit(int64_t D, std::initializer_list<const void*> ptrs) {
  return D >= 1 && D <= 16384 && can_vectorize<T>(static_cast<int>(D), ptrs);
}

// The backward with dh_in held in registers (variant 1) or read at the store (2).
template <class T>
bool residual_backward_rows(const BackwardArgs& a, const void* dh_in, bool stream_dh_in) {
  constexpr int VEC = VecWidth<T>::value;
  if (stream_dh_in) return for_resident_width(a.D, ResidualBackward<T, VEC, StreamedAddIn>{a, dh_in});
  return for_resident_width(a.D, ResidualBackward<T, VEC, HeldAddIn>{a, dh_in});
}

bool residual_layernorm_forward_resident(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                         float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd) {
  const ResidualForwardArgs a{{x.raw_data(), gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                                rstd.data<float>(), x.size(0), int(std::min<int64_t>(x.size(1), INT_MAX)), eps},
                               r.raw_data(),
                               h.raw_data()};
  const std::initializer_list<const void*> ptrs = {a.x, a.r, a.h, a.y, a.gamma, a.beta};
  if (x.dtype() == DType::F32 && residual_rows_fit<float>(x.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<float, VecWidth<float>::value>{a});
  if (x.dtype() == DType::BF16 && residual_rows_fit<__nv_bfloat16>(x.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<__nv_bfloat16, VecWidth<__nv_bfloat16>::value>{a});
  return false;
}

bool residual_layernorm_backward_resident(const Tensor& dy, const Tensor* dh_in, const Tensor& h,
                                          const Tensor& gamma, const Tensor& mean, const Tensor& rstd, Tensor& dh,
                                          Tensor& dgamma, Tensor& dbeta, bool stream_dh_in) {
  const BackwardArgs a{dy.raw_data(),      h.raw_data(),        gamma.data<float>(),  mean.data<float>(),
                       rstd.data<float>(), dh.raw_data(),       dgamma.data<float>(), dbeta.data<float>(),
                       h.size(0),          int(std::min<int64_t>(h.size(1), INT_MAX))};
  const void* in = dh_in != nullptr ? dh_in->raw_data() : nullptr;
  const std::initializer_list<const void*> ptrs = {a.dy, a.x, a.dx, a.gamma, in != nullptr ? in : a.dy};
  const bool f32 = h.dtype() == DType::F32;
  if (!(f32 ? residual_rows_fit<float>(h.size(1), ptrs) : residual_rows_fit<__nv_bfloat16>(h.size(1), ptrs)))
    return false;
  if (in == nullptr) {  // dh is LayerNorm's dx alone: the LayerNorm backward, its own production variant
    layernorm_backward_fused(dy, h, gamma, mean, rstd, dh, dgamma, dbeta);
    return true;
  }
  if (f32) return residual_backward_rows<float>(a, in, stream_dh_in);
  return residual_backward_rows<__nv_bfloat16>(a, in, stream_dh_in);
}

}  // namespace hg::gpu
