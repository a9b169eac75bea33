#pragma once
// The fused LayerNorm forward kernels (launched by cuda/layernorm.cu; the
// staged ones are in cuda/layernorm_staged_forward.cuh and
// cuda/layernorm_staged_pair_forward.cuh). Header-only device code, so that
// the lab program (bench/lab/layernorm_lab.cu) times these very kernels.
//
// A group of G threads owns one row at a time, R groups per block. Thread t
// of a group holds EPT elements of the row in registers, the elements
// (j * G + t) * VEC + k for j < EPT / VEC, k < VEC (VEC: 16 bytes, or 1 where
// the rows are not 16-byte aligned): every j is one coalesced sweep of the
// group. A group holds CAP = G * EPT elements. Longer rows are walked in
// chunks of CAP, read twice (the chunked kernel), or, on sm_90+, split over
// a cluster of C = 2..8 blocks, one column slice each (16-byte-aligned f32
// rows of 65536+ elements).
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

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
// mean and M2, merged into acc. SCALED: of (x - shift) 2^-96, for a row
// whose statistics overflowed (cuda/layernorm_moments.cuh).
template <class T, int VEC, int NV, int G, bool SCALED = false>
__device__ __forceinline__ void add_chunk(const T* xr, int chunk, float shift, const RowGroup<G>& grp,
                                          float (&v)[NV][VEC], ChunkMoments& acc) {
  load_part<T, VEC, NV, G>(xr, chunk, grp.t, shift, v);
  if constexpr (SCALED)
#pragma unroll
    for (int j = 0; j < NV; ++j)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] *= kOverflowScale;
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
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    layernorm_forward_kernel(const T* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                             T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                             int64_t rows, int D, float eps) {
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
    normalise_chunk<T, VEC, NV, G>(v, part.len, m, gamma + part.col0, beta + part.col0, y + row * D + part.col0, grp.t);
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
    Moments m = {acc.mean, rsqrtf(acc.m2 * inv_d + eps)};
    if (statistics_overflowed(m.rstd)) {  // uniform over the block
      ChunkMoments scaled;
      for (int off = 0; off < D; off += CAP)
        add_chunk<T, VEC, NV, G, true>(xr + off, min(CAP, D - off), shift, grp, v, scaled);
      m = unscale_moments(scaled.mean, scaled.m2, inv_d, eps);
    }
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

// One-pass statistics of a held row: one group reduction of (sum d, sum d^2)
// over d = x - shift, var = E[d^2] - E[d]^2. That difference loses about
// log2(1 + E[d]^2 / var) bits; where E[d]^2 > kOnePassRatio var (the shift,
// x[row, 0], far from the mean in row standard deviations) the row takes
// the second pass of moments_in_registers instead. The branch is uniform
// over the group (every thread holds bitwise the same sums), so its
// barriers stay matched.
constexpr float kOnePassRatio = 3.0f;

template <int VEC, int NV, int G, class Row, class RowSums>
__device__ __forceinline__ Moments one_pass_moments(const Row& h, int len, int t, const RowSums& row_sums, float inv_d,
                                                    float eps) {
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
  const float rstd = rsqrtf(var + eps);
  if (statistics_overflowed(rstd)) return scaled_moments<VEC, NV, G>(h, len, t, row_sums, inv_d, eps);
  return {mean, rstd};
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

// The resident forward on 16-byte rows of D <= G * EPT with one-pass
// statistics and FFMA normalisation (LnKernel::one_pass_stats): the row held
// as floats, or, PACKED (bf16 only), as its raw 16-byte words;
// SHARED_PARAMS (warp rows): gamma and beta read from the block's
// ParamCopy of each.
template <class T, int VEC, int EPT, int G, int R, bool PACKED, bool SHARED_PARAMS>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    layernorm_forward_one_pass_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                      const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                      float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  static_assert(VEC > 1 && EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  static_assert(!PACKED || std::is_same_v<T, __nv_bfloat16>, "packed rows are bf16 rows");
  static_assert(!SHARED_PARAMS || G == 32, "parameter copies are for warp rows");
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  using Copy = ParamCopy<VEC, NV, G>;
  __shared__ float4 param_copy[2][SHARED_PARAMS ? Copy::kFloat4s : 1];
  if constexpr (SHARED_PARAMS) {
    Copy::fill(param_copy[0], gamma, D);
    Copy::fill(param_copy[1], beta, D);
    __syncthreads();
  }
  using Param = ParamRow<VEC, NV, G, SHARED_PARAMS, Load::ReadOnly>;
  const Param gamma_of{gamma, param_copy[0], grp.t}, beta_of{beta, param_copy[1], grp.t};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + grp.group; row < rows; row += row_stride) {
    const T* xr = x + row * D;
    HeldRow<T, VEC, NV, G, PACKED> h;
    h.load(xr, D, grp.t);
    const Moments m = one_pass_moments<VEC, NV, G>(h, D, grp.t, GroupSums<G>{grp}, inv_d, eps);
    normalise_ffma<T, VEC, NV, G>(h, D, m, gamma_of, beta_of, y + row * D, grp.t);
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, h.shift, m);
  }
}

}  // namespace
}  // namespace hg::gpu
