// Fused LayerNorm kernels (API: cuda/layernorm_kernels.hpp; design and the
// thread mapping per D: docs/layernorm.md, section "Fused GPU kernels").
//
// Vocabulary used below:
//   group  G threads that own one row at a time (G = 32: a warp per row; G > 32:
//          several warps, synchronised by a named barrier of their own).
//   R      groups per thread block (block = G * R threads).
//   VEC    elements per memory access: 16 bytes (float4 / 8 x bf16) when every
//          row start is 16-byte aligned, else 1 (scalar path, any D).
//   EPT    elements of a row each thread keeps in registers; a group holds
//          CAP = G * EPT elements. Rows longer than CAP are walked in chunks
//          of CAP (the CHUNKED kernels), re-reading the row (from L2) once,
//          unless a CLUSTER of C = 2..8 blocks (sm_90+) splits the row into
//          column slices of at most CAP, one per block, each in registers.
// Thread t of a group owns the row elements (j * G + t) * VEC + k, for
// j < EPT / VEC and k < VEC: every j is one coalesced sweep of the group.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "cuda/reduce.cuh"

namespace hg::gpu {
namespace {

namespace cg = cooperative_groups;

// ---------------------------------------------------------------------------
// VEC-wide loads and stores, converting to / from float32.

template <int VEC>
__device__ __forceinline__ void load_vec(const float* p, float (&out)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(p)[q];
      out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = p[k];
  }
}

// bf16 -> f32 is exact: the 16 bits are the top half of a float32.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <int VEC>
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float (&out)[VEC]) {
  if constexpr (VEC == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) out[2 * q] = bf16_lo(w[q]), out[2 * q + 1] = bf16_hi(w[q]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = __bfloat162float(p[k]);
  }
}

// Outputs are written once and not read again by this kernel: streaming
// stores (evict-first) keep L2 for the inputs and the partial sums.
template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q)
      __stcs(reinterpret_cast<float4*>(p) + q, make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]));
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = v[k];
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

template <int VEC>
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&v)[VEC]) {
  if constexpr (VEC == 8) {
    const uint4 raw = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                                 pack_bf16x2(v[6], v[7]));
    __stcs(reinterpret_cast<uint4*>(p), raw);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = __float2bfloat16_rn(v[k]);
  }
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Shared-memory accumulate p[k] += v[k] (p 16-byte aligned when VEC % 4 == 0).
template <int VEC>
__device__ __forceinline__ void add_vec(float* p, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      float4 a = reinterpret_cast<float4*>(p)[q];
      a.x += v[4 * q], a.y += v[4 * q + 1], a.z += v[4 * q + 2], a.w += v[4 * q + 3];
      reinterpret_cast<float4*>(p)[q] = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] += v[k];
  }
}

// Loads the part of a row this thread owns among `len` elements starting at
// p, minus `shift`; slots past len become 0. In vector mode len is a multiple
// of VEC, so a vector is either wholly inside or wholly outside.
template <class T, int VEC, int NV, int G>
__device__ __forceinline__ void load_part(const T* p, int len, int t, float shift, float (&v)[NV][VEC]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      load_vec<VEC>(p + i, v[j]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] -= shift;
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] = 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------
// Reductions over one row group. G == 32: shuffles only. G > 32: shuffles,
// then one float per warp through shared memory, synchronised by the group's
// own named barrier (id 1 + group; 0 is __syncthreads) so that groups of one
// block never wait for each other. Every thread sums the warp results in the
// same order, so all threads of the group get bitwise the same value.

__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Sums each of v[0..N) over the group, in place. scratch: this group's
// N * G / 32 floats.
template <int G, int N>
__device__ __forceinline__ void group_sums(float (&v)[N], float* scratch, int barrier_id) {
#pragma unroll
  for (int n = 0; n < N; ++n) v[n] = warp_sum(v[n]);
  if constexpr (G > 32) {
    constexpr int kWarps = G / 32;
    const int warp = (threadIdx.x % G) >> 5;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int n = 0; n < N; ++n) scratch[n * kWarps + warp] = v[n];
    group_barrier(barrier_id, G);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += scratch[n * kWarps + w];
      v[n] = s;
    }
    group_barrier(barrier_id, G);  // all have read before the next reduction writes
  }
}

template <int G>
__device__ __forceinline__ float group_sum(float a, float* scratch, int barrier_id) {
  a = warp_sum(a);
  if constexpr (G == 32) {
    return a;
  } else {
    constexpr int kWarps = G / 32;
    if ((threadIdx.x & 31) == 0) scratch[(threadIdx.x % G) >> 5] = a;
    group_barrier(barrier_id, G);
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += scratch[w];
    group_barrier(barrier_id, G);
    return s;
  }
}

// Asks L2 to start fetching a row this group reads next (one prefetch per
// 128-byte line, spread over the group), so its DRAM latency overlaps the
// current row's reduction and stores without holding any registers. Every
// address lies inside the row; a resident row (at most G * EPT elements)
// needs at most kLines lines per thread.
template <class T, int G, int EPT>
__device__ __forceinline__ void prefetch_row_l2(const T* row, int D, int t) {
  constexpr int kLines = (EPT * int(sizeof(T)) + 127) / 128;
  const char* p = reinterpret_cast<const char*>(row);
  const int bytes = D * int(sizeof(T));  // <= G * EPT * sizeof(T): fits an int
#pragma unroll
  for (int l = 0; l < kLines; ++l) {
    const int off = (l * G + t) * 128;
    if (off < bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
  }
}

// Only a block that is alone on its SM (1024 threads) prefetches its next
// row: smaller blocks already have a second block's loads in flight, and
// the prefetch addresses cost registers they do not have (64 at two blocks
// per SM; the compiler spilled with it).
constexpr bool prefetch_next_row(int threads) { return threads >= 1024; }

// Blocks of 1024 threads get the whole register file of an SM; smaller
// blocks are capped so that two fit on one SM (two rows in flight).
constexpr int min_blocks_for(int threads) { return threads >= 1024 ? 1 : 2; }

// ---------------------------------------------------------------------------
// Cluster rows (sm_90+): a row split over the C blocks of a thread-block
// cluster. Block `rank` holds the columns [rank * slice, rank * slice + len)
// in registers exactly as a resident block holds a whole row; the per-block
// row sums are then exchanged through distributed shared memory.

// Widest cluster launched without opting in to non-portable sizes.
constexpr int kMaxCluster = 8;
constexpr int kMaxRowSums = 3;  // the backward's three row sums

// ceil(D / C) rounded up to VEC, so every slice starts 16-byte aligned.
// The host picks C so that the slice fits the block's CAP.
__host__ __device__ constexpr int cluster_slice(int D, int C, int VEC) {
  return ((D + C - 1) / C + VEC - 1) / VEC * VEC;
}

// The part of the work one block (one group, when R > 1) does: columns
// [col0, col0 + len) of rows first_row, first_row + row_stride, ...; its
// dgamma/dbeta partial goes to partial row `partial`.
struct RowSplit {
  int col0, len;
  int64_t first_row, row_stride, partial;
};

template <bool CLUSTER, int R, int VEC>
__device__ __forceinline__ RowSplit split_rows(int D, int group) {
  if constexpr (!CLUSTER) {
    return {0, D, static_cast<int64_t>(blockIdx.x) * R + group, static_cast<int64_t>(gridDim.x) * R, blockIdx.x};
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const cg::cluster_group cluster = cg::this_cluster();
    const cg::grid_group grid = cg::this_grid();
    const int slice = cluster_slice(D, static_cast<int>(cluster.num_blocks()), VEC);
    const int col0 = min(D, static_cast<int>(cluster.block_rank()) * slice);
    const auto id = static_cast<int64_t>(grid.cluster_rank());
    return {col0, min(slice, D - col0), id, static_cast<int64_t>(grid.num_clusters()), id};
#else
    __trap();  // never launched: the host runs clusters only from sm_90+ code
    return {};
#endif
  }
}

// Sums each of v[0..N) (a block total, the same in every thread) over the
// blocks of the cluster. Every block adds the C values in rank order 0..C-1
// (lane r fetches rank r's, then shuffles in order), so all blocks get
// bitwise the same sums, run after run. Slots are double-buffered:
// reduction k uses slots[k % 2], which is written again at reduction k + 2
// only after the barrier of k + 1, which no block passes before every block
// has read reduction k's values; so one cluster barrier per reduction.
template <int N>
__device__ __forceinline__ void cluster_sums(float (&v)[N], float (&slots)[2][kMaxRowSums], int& parity) {
  static_assert(N <= kMaxRowSums, "exchange slot too small");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  float* slot = slots[parity];
  parity ^= 1;
  if (threadIdx.x == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) slot[n] = v[n];
  cluster.sync();  // arrive.release / wait.acquire: the slots above are visible cluster-wide
  const int C = static_cast<int>(cluster.num_blocks());
  const int lane = threadIdx.x & 31;
  float mine[N];
  if (lane < C) {
    const float* remote = cluster.map_shared_rank(slot, lane);
#pragma unroll
    for (int n = 0; n < N; ++n) mine[n] = remote[n];
  } else {
#pragma unroll
    for (int n = 0; n < N; ++n) mine[n] = 0.0f;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float s = 0.0f;
    for (int r = 0; r < C; ++r) s += __shfl_sync(0xffffffffu, mine[n], r);
    v[n] = s;
  }
#endif
}

// Row sums over the group, then (CLUSTER) over the cluster.
template <int G, bool CLUSTER, int N>
__device__ __forceinline__ void row_sums(float (&v)[N], float* scratch, int barrier_id,
                                         float (&slots)[2][kMaxRowSums], int& parity) {
  group_sums<G, N>(v, scratch, barrier_id);
  if constexpr (CLUSTER) cluster_sums<N>(v, slots, parity);
}

// A block's shared memory must outlive the other blocks' last reads of it.
template <bool CLUSTER>
__device__ __forceinline__ void cluster_exit_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLUSTER) cg::this_cluster().sync();
#endif
}

// ---------------------------------------------------------------------------
// Forward: one kernel. Each group normalises one row at a time (CLUSTER:
// each block of a cluster its slice of the cluster's row).
//
// Stability: statistics are taken of x - shift with shift = x[row, 0], so a
// large common offset (1e6 + noise) cancels exactly before any sum is
// formed; then the variance is a second pass over registers,
// sum((x - shift - m)^2) / D: never E[x^2] - E[x]^2. Rows longer than CAP
// merge per-chunk (count, mean, M2) with Chan et al.'s pairwise formula.

template <class T, int VEC, int EPT, int G, int R, bool CHUNKED, bool CLUSTER = false>
__global__ void __launch_bounds__(G * R, min_blocks_for(G * R))
    layernorm_forward_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                             const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                             float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  static_assert(!CLUSTER || (R == 1 && !CHUNKED), "a cluster block holds one row slice");
  __shared__ float scratch[R][3 * (G / 32)];
  __shared__ float slots[2][kMaxRowSums];  // CLUSTER: exchange of block sums
  int parity = 0;

  const int group = threadIdx.x / G;
  const int t = threadIdx.x % G;
  float* scr = scratch[group];
  const int bar = 1 + group;
  const float inv_d = 1.0f / static_cast<float>(D);
  const RowSplit part = split_rows<CLUSTER, R, VEC>(D, group);
  const int len = part.len;  // D unless CLUSTER
  const float* gamma_p = gamma + part.col0;
  const float* beta_p = beta + part.col0;

  // Rows are uniform across a group (and a cluster), so a group runs its
  // loop (and its barriers) together; groups of one block are independent.
  for (int64_t row = part.first_row; row < rows; row += part.row_stride) {
    const float shift = to_float(x[row * D]);  // every block of a cluster reads the row's first element
    const T* xr = x + row * D + part.col0;
    T* yr = y + row * D + part.col0;

    float v[NV][VEC];
    float mean_s, rstd;  // mean of x - shift, 1 / sqrt(var + eps)
    if constexpr (!CHUNKED) {
      load_part<T, VEC, NV, G>(xr, len, t, shift, v);
      if (prefetch_next_row(G * R) && row + part.row_stride < rows)
        prefetch_row_l2<T, G, EPT>(xr + part.row_stride * D, len, t);
      float s[1] = {0.0f};
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) s[0] += v[j][k];
      row_sums<G, CLUSTER>(s, scr, bar, slots, parity);
      mean_s = s[0] * inv_d;
      float q[1] = {0.0f};
#pragma unroll
      for (int j = 0; j < NV; ++j)
        if ((j * G + t) * VEC < len)
#pragma unroll
          for (int k = 0; k < VEC; ++k) q[0] += (v[j][k] - mean_s) * (v[j][k] - mean_s);
      row_sums<G, CLUSTER>(q, scr, bar, slots, parity);
      rstd = rsqrtf(q[0] * inv_d + eps);
    } else {
      float n_a = 0.0f, mean_a = 0.0f, m2_a = 0.0f;  // statistics of the chunks seen so far
      for (int off = 0; off < D; off += CAP) {
        const int chunk = min(CAP, D - off);
        load_part<T, VEC, NV, G>(xr + off, chunk, t, shift, v);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; ++j)
#pragma unroll
          for (int k = 0; k < VEC; ++k) s += v[j][k];
        const float mean_b = group_sum<G>(s, scr, bar) / static_cast<float>(chunk);
        float q = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; ++j)
          if ((j * G + t) * VEC < chunk)
#pragma unroll
            for (int k = 0; k < VEC; ++k) q += (v[j][k] - mean_b) * (v[j][k] - mean_b);
        const float m2_b = group_sum<G>(q, scr, bar);
        const float n_b = static_cast<float>(chunk);
        const float n = n_a + n_b;
        const float delta = mean_b - mean_a;
        mean_a += delta * (n_b / n);
        m2_a += m2_b + delta * delta * (n_a * n_b / n);
        n_a = n;
      }
      mean_s = mean_a;
      rstd = rsqrtf(m2_a * inv_d + eps);
    }

    // Write y chunk by chunk (a single chunk, already in registers, when !CHUNKED).
    for (int off = 0; off < len; off += CAP) {
      const int chunk = min(CAP, len - off);
      if constexpr (CHUNKED) load_part<T, VEC, NV, G>(xr + off, chunk, t, shift, v);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < chunk) {
          float g[VEC], b[VEC], out[VEC];
          load_vec<VEC>(gamma_p + off + i, g);
          load_vec<VEC>(beta_p + off + i, b);
#pragma unroll
          for (int k = 0; k < VEC; ++k) out[k] = (v[j][k] - mean_s) * rstd * g[k] + b[k];
          store_vec<VEC>(yr + off + i, out);
        }
      }
    }
    if (t == 0 && part.col0 == 0) {  // CLUSTER: rank 0 writes the statistics
      mean_out[row] = shift + mean_s;
      rstd_out[row] = rstd;
    }
  }
  cluster_exit_barrier<CLUSTER>();
}

// ---------------------------------------------------------------------------
// Backward, kernel 1: dx for every row, and this block's partial
// dgamma = sum dy * xhat, dbeta = sum dy over the rows it handled, written to
// partial_dgamma[blockIdx.x][D], partial_dbeta[blockIdx.x][D]. The grid is
// two to four blocks per SM; each group walks rows with a grid-sized stride.
// CLUSTER: the blocks of cluster k walk rows k, k + clusters, ... each on
// its column slice, and write partial row k (one per cluster).
//
// Resident kernels keep each group's running partials in shared memory
// (per group: CAP floats of dgamma then CAP of dbeta; a thread only touches
// its own columns, so no barrier until the end), then sum the R groups in a
// fixed order. Chunked kernels (R == 1) accumulate straight into the block's
// own partial rows in global memory, each thread again on its own columns.

template <class T, int VEC, int EPT, int G, int R, bool CHUNKED, bool CLUSTER = false>
__global__ void __launch_bounds__(G * R, min_blocks_for(G * R))
    layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                              float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta, int64_t rows,
                              int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  static_assert(!CHUNKED || R == 1, "chunked kernels accumulate into one partial row per block");
  static_assert(!CLUSTER || (R == 1 && !CHUNKED), "a cluster block holds one row slice");
  extern __shared__ float4 acc_storage[];  // resident: R * 2 * CAP floats
  __shared__ float scratch[R][3 * (G / 32)];
  __shared__ float slots[2][kMaxRowSums];  // CLUSTER: exchange of block sums
  int parity = 0;

  const int group = threadIdx.x / G;
  const int t = threadIdx.x % G;
  float* scr = scratch[group];
  const int bar = 1 + group;
  const float inv_d = 1.0f / static_cast<float>(D);
  const RowSplit part = split_rows<CLUSTER, R, VEC>(D, group);
  const int len = part.len;  // D unless CLUSTER
  float* block_dgamma = partial_dgamma + part.partial * D + part.col0;
  float* block_dbeta = partial_dbeta + part.partial * D + part.col0;
  const float* gamma_p = gamma + part.col0;
  const int64_t row_stride = part.row_stride;

  float xh[NV][VEC], g_dy[NV][VEC];  // x, then xhat; dy

  if constexpr (!CHUNKED) {
    float* acc_dgamma = reinterpret_cast<float*>(acc_storage) + group * 2 * CAP;
    float* acc_dbeta = acc_dgamma + CAP;
#pragma unroll
    for (int j = 0; j < NV; ++j)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        acc_dgamma[(j * G + t) * VEC + k] = 0.0f;
        acc_dbeta[(j * G + t) * VEC + k] = 0.0f;
      }

    // Every group of the block runs the same sequence of barriers: a group
    // past the last row still makes the trip, on an empty row (no loads, no
    // stores), and joins its named barriers. When groups of one block ran
    // different row counts, compute-sanitizer racecheck reported hazards
    // between the partials below and the final cross-group sum, although a
    // __syncthreads separates them and the results were right and bitwise
    // reproducible; with equal barrier sequences it reports none
    // (docs/reliability.md, "GPU sanitizers").
    for (int64_t base = part.first_row - group; base < rows; base += row_stride) {
      const int64_t row = base + group;
      const bool live = row < rows;
      const int row_len = live ? len : 0;  // columns this group reads and writes this trip
      const int64_t start = (live ? row : 0) * D + part.col0;
      load_part<T, VEC, NV, G>(x + start, row_len, t, 0.0f, xh);
      load_part<T, VEC, NV, G>(dy + start, row_len, t, 0.0f, g_dy);
      if (prefetch_next_row(G * R) && row + row_stride < rows) {
        prefetch_row_l2<T, G, EPT>(x + start + row_stride * D, len, t);
        prefetch_row_l2<T, G, EPT>(dy + start + row_stride * D, len, t);
      }
      const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
      // Over this thread's elements: sum g*dy, sum g*dy*xhat', sum xhat',
      // where xhat' = (x - m) * rs uses the saved, float32-rounded mean.
      float sums[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < row_len) {
          float g[VEC];
          load_vec<VEC>(gamma_p + i, g);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            xh[j][k] = (xh[j][k] - m) * rs;
            const float gd = __fmul_rn(g[k], g_dy[j][k]);  // rounded, not fused: see gd - c1 below
            sums[0] += gd;
            sums[1] += gd * xh[j][k];
            sums[2] += xh[j][k];
          }
        }
      }
      row_sums<G, CLUSTER>(sums, scr, bar, slots, parity);
      // The true xhat has mean 0; c = mean(xhat') is the rounding of the saved
      // mean times rs (~1 for 1e6 + N(0, 1e-2)), removed here:
      // xhat = xhat' - c, mean(g*dy*xhat) = mean(g*dy*xhat') - c * mean(g*dy).
      const float c = sums[2] * inv_d;
      const float c1 = sums[0] * inv_d;
      const float c2 = sums[1] * inv_d - c * c1;
      T* dxr = dx + start;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < row_len) {
          float g[VEC], out[VEC], dg[VEC];
          load_vec<VEC>(gamma_p + i, g);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float xhat = xh[j][k] - c;
            // __fmul_rn: the same rounded g*dy that went into c1. If the
            // compiler contracted g*dy - c1 into one FMA, D = 1 (exact answer
            // 0) would give the product's rounding error times rstd (~316).
            out[k] = rs * (__fmul_rn(g[k], g_dy[j][k]) - c1 - xhat * c2);
            dg[k] = g_dy[j][k] * xhat;
          }
          store_vec<VEC>(dxr + i, out);
          add_vec<VEC>(acc_dgamma + i, dg);
          add_vec<VEC>(acc_dbeta + i, g_dy[j]);
        }
      }
    }

    __syncthreads();
    const float* acc = reinterpret_cast<const float*>(acc_storage);
    for (int c = threadIdx.x; c < len; c += blockDim.x) {
      float sg = 0.0f, sb = 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) sg += acc[r * 2 * CAP + c], sb += acc[r * 2 * CAP + CAP + c];
      block_dgamma[c] = sg;
      block_dbeta[c] = sb;
    }
  } else {
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
    for (int64_t row = part.first_row; row < rows; row += row_stride) {
      const T* xr = x + row * D;
      const T* dyr = dy + row * D;
      T* dxr = dx + row * D;
      const float m = mean[row], rs = rstd[row];
      float sums[3] = {0.0f, 0.0f, 0.0f};  // as in the resident kernel
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
              const float gd = __fmul_rn(g[k], g_dy[j][k]);  // as in the resident kernel
              const float xhat_saved = (xh[j][k] - m) * rs;
              sums[0] += gd;
              sums[1] += gd * xhat_saved;
              sums[2] += xhat_saved;
            }
          }
        }
      }
      group_sums<G, 3>(sums, scr, bar);
      const float c = sums[2] * inv_d;
      const float c1 = sums[0] * inv_d;
      const float c2 = sums[1] * inv_d - c * c1;
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
            for (int k = 0; k < VEC; ++k) {
              const float xhat = (xh[j][k] - m) * rs - c;
              out[k] = rs * (__fmul_rn(g[k], g_dy[j][k]) - c1 - xhat * c2);  // no FMA: see resident kernel
              block_dgamma[off + i + k] += g_dy[j][k] * xhat;
              block_dbeta[off + i + k] += g_dy[j][k];
            }
            store_vec<VEC>(dxr + off + i, out);
          }
        }
      }
    }
  }
  cluster_exit_barrier<CLUSTER>();
}

// Backward, kernel 2: dgamma[c] = sum over blocks b of partial_dgamma[b][c]
// (same for dbeta), in a fixed order: thread (tx, ty) sums b = ty, ty + 32,
// ... ascending, then one thread adds the 32 results in ty order. Nothing
// depends on timing, so the result is bitwise the same on every run.
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

// ---------------------------------------------------------------------------
// Host side: pick the configuration for D, launch, check.

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

// Persistent grid: as many blocks as fit on the GPU at once, each walking
// rows with a grid-sized stride (and prefetching its next row into L2).
template <class T, int VEC, int EPT, int G, int R, bool CHUNKED = false>
void launch_forward(const ForwardArgs& a) {
  auto kernel = layernorm_forward_kernel<T, VEC, EPT, G, R, CHUNKED>;
  static const int blocks_per_sm = [&] {  // once per instantiation
    int n = 0;
    HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, G * R, 0));
    HG_CHECK(n >= 1, "layernorm_forward_fused", "kernel does not fit on an SM");
    return n;
  }();
  const int64_t wanted = (a.rows + R - 1) / R;
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, int64_t(blocks_per_sm) * sm_count()));
  kernel<<<blocks, G * R, 0, stream()>>>(static_cast<const T*>(a.x), a.gamma, a.beta, static_cast<T*>(a.y), a.mean,
                                         a.rstd, a.rows, a.D, a.eps);
  HG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
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
    cudaLaunchAttribute cluster_dim{};
    cluster_dim.id = cudaLaunchAttributeClusterDimension;
    cluster_dim.val.clusterDim.x = C, cluster_dim.val.clusterDim.y = 1, cluster_dim.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(C);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream();
    config.attrs = &cluster_dim;
    config.numAttrs = 1;
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

// Launches `clusters` clusters of C blocks (a persistent grid; blocks of a
// cluster are co-scheduled, as distributed shared memory requires).
template <class... Params, class... Args>
void launch_clusters(void (*kernel)(Params...), int C, int clusters, int threads, size_t smem, const char* name,
                     Args... args) {
  cudaLaunchAttribute cluster_dim{};
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim.x = C, cluster_dim.val.clusterDim.y = 1, cluster_dim.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(C * clusters);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  HG_CUDA_CHECK_LAUNCH(name);
}

// Rows of 16385 .. kMaxCluster * 16384 elements: a cluster per row, each
// block 1024 threads x 16 elements, alone on its SM and prefetching its
// next slice into L2 (which overlaps the two cluster barriers per row). 512
// x 32 at two blocks per SM spilled 36-44 bytes (f32) at its 64 registers.
// Returns false where clusters cannot run (the caller takes the chunked kernel).
template <class T, int VEC>
bool forward_clusters(const ForwardArgs& a) {
  constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT;
  auto kernel = layernorm_forward_kernel<T, VEC, kEPT, kThreads, 1, false, true>;
  static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, 0);
  const int C = cluster_size_for(a.D, VEC, kCap, fit);
  if (C == 0) return false;
  const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
  launch_clusters(kernel, C, clusters, kThreads, 0, "layernorm_forward_kernel (clusters)", static_cast<const T*>(a.x),
                  a.gamma, a.beta, static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps);
  return true;
}

// Rows of up to 1024 elements go a warp per row; longer rows several warps
// (up to 512 threads) per row, held in registers up to 16384 elements; up
// to kMaxCluster * 16384, a cluster of blocks per row (sm_90+); beyond
// that, chunks of 8192 read twice.
template <class T, int VEC>
void forward_for_width(const ForwardArgs& a) {
  const int D = a.D;
  if (D <= 32 * 8) launch_forward<T, VEC, 8, 32, 8>(a);
  else if (D <= 32 * 16) launch_forward<T, VEC, 16, 32, 8>(a);
  else if (D <= 32 * 32) launch_forward<T, VEC, 32, 32, 8>(a);
  else if (D <= 128 * 16) launch_forward<T, VEC, 16, 128, 4>(a);
  else if (D <= 256 * 16) launch_forward<T, VEC, 16, 256, 2>(a);
  else if (D <= 512 * 16) launch_forward<T, VEC, 16, 512, 1>(a);
  else if (D <= 512 * 32) launch_forward<T, VEC, 32, 512, 1>(a);
  else if (forward_clusters<T, VEC>(a)) return;
  else launch_forward<T, VEC, 16, 512, 1, true>(a);
}

// Kernel 1 through launch(partial_dgamma, partial_dbeta) into n_partials
// partial rows, then kernel 2. Partial sums, [2][n_partials][D]; the caching
// allocator makes this cheap, and everything runs on the one stream, so
// freeing it at scope exit is safe.
template <class LaunchKernel1>
void backward_with_partials(const BackwardArgs& a, int n_partials, LaunchKernel1 launch) {
  Tensor partials;
  float* partial_dgamma = nullptr;
  float* partial_dbeta = nullptr;
  if (n_partials > 0) {
    partials = Tensor::empty({2, n_partials, a.D}, DType::F32, Device::CUDA);
    partial_dgamma = partials.data<float>();
    partial_dbeta = partial_dgamma + int64_t(n_partials) * a.D;
    launch(partial_dgamma, partial_dbeta);
  }
  const dim3 reduce_block(kReduceCols, kReduceLanes);
  const int reduce_grid = (a.D + kReduceCols - 1) / kReduceCols;
  layernorm_reduce_partials_kernel<<<reduce_grid, reduce_block, 0, stream()>>>(partial_dgamma, partial_dbeta,
                                                                             n_partials, a.D, a.dgamma, a.dbeta);
  HG_CUDA_CHECK_LAUNCH("layernorm_reduce_partials_kernel");
}

template <class T, int VEC, int EPT, int G, int R, bool CHUNKED = false>
void launch_backward(const BackwardArgs& a) {
  auto kernel = layernorm_backward_kernel<T, VEC, EPT, G, R, CHUNKED>;
  constexpr int kThreads = G * R;
  constexpr size_t kSmem = CHUNKED ? 0 : sizeof(float) * R * 2 * G * EPT;
  static const int blocks_per_sm = [&] {  // once per instantiation
    if (kSmem > 48 * 1024)
      HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    int n = 0;
    HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, kSmem));
    HG_CHECK(n >= 1, "layernorm_backward_fused", "kernel does not fit on an SM");
    // Enough threads per SM to keep loads in flight, few enough blocks that
    // the partial buffer stays small next to the main traffic.
    return std::min(n, std::max(2, 1024 / kThreads));
  }();
  const int64_t wanted = (a.rows + R - 1) / R;
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, int64_t(blocks_per_sm) * sm_count()));
  backward_with_partials(a, blocks, [&](float* partial_dgamma, float* partial_dbeta) {
    kernel<<<blocks, kThreads, kSmem, stream()>>>(static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.gamma,
                                                  a.mean, a.rstd, static_cast<T*>(a.dx), partial_dgamma,
                                                  partial_dbeta, a.rows, a.D);
    HG_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  });
}

// Rows of 16385 .. kMaxCluster * 16384 elements: a cluster per row, each
// block 1024 threads x 16 elements (x and dy in registers, one block per
// SM, as the resident 8193-16384 kernel); one partial row per cluster.
// Returns false where clusters cannot run (the caller takes the chunked kernel).
template <class T, int VEC>
bool backward_clusters(const BackwardArgs& a) {
  constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT;
  constexpr size_t kSmem = sizeof(float) * 2 * kCap;
  auto kernel = layernorm_backward_kernel<T, VEC, kEPT, kThreads, 1, false, true>;
  static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, kSmem);
  const int C = cluster_size_for(a.D, VEC, kCap, fit);
  if (C == 0) return false;
  const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
  backward_with_partials(a, clusters, [&](float* partial_dgamma, float* partial_dbeta) {
    launch_clusters(kernel, C, clusters, kThreads, kSmem, "layernorm_backward_kernel (clusters)",
                    static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.gamma, a.mean, a.rstd,
                    static_cast<T*>(a.dx), partial_dgamma, partial_dbeta, a.rows, a.D);
  });
  return true;
}

// Like the forward, except that x and dy both live in registers: 8193-16384
// elements take a 1024-thread block (16 per thread) rather than 32 per thread,
// and so does each block of a cluster.
template <class T, int VEC>
void backward_for_width(const BackwardArgs& a) {
  const int D = a.D;
  if (D <= 32 * 8) launch_backward<T, VEC, 8, 32, 8>(a);
  else if (D <= 32 * 16) launch_backward<T, VEC, 16, 32, 8>(a);
  else if (D <= 32 * 32) launch_backward<T, VEC, 32, 32, 8>(a);
  else if (D <= 128 * 16) launch_backward<T, VEC, 16, 128, 4>(a);
  else if (D <= 256 * 16) launch_backward<T, VEC, 16, 256, 2>(a);
  else if (D <= 512 * 16) launch_backward<T, VEC, 16, 512, 1>(a);
  else if (D <= 1024 * 16) launch_backward<T, VEC, 16, 1024, 1>(a);
  else if (backward_clusters<T, VEC>(a)) return;
  else launch_backward<T, VEC, 16, 512, 1, true>(a);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 16-byte accesses need every row start aligned: the base pointers and D * elt.
template <class T>
bool can_vectorize(int D, std::initializer_list<const void*> ptrs) {
  if ((static_cast<size_t>(D) * sizeof(T)) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

void check_rows_d(const char* op, const Tensor& x) {
  HG_CHECK(x.ndim() == 2, op, "expects (rows, D), got x ", x.shape());
  HG_CHECK(x.size(1) <= INT_MAX, op, "D too large: x ", x.shape());
}

}  // namespace

void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  constexpr const char* kOp = "layernorm_forward_fused";
  check_rows_d(kOp, x);
  HG_CHECK(y.dtype() == x.dtype() && gamma.dtype() == DType::F32 && beta.dtype() == DType::F32, kOp,
           "dtypes: x ", dtype_name(x.dtype()), " y ", dtype_name(y.dtype()), " gamma/beta must be f32");
  ForwardArgs a{x.raw_data(),        gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                rstd.data<float>(), x.size(0),           int(x.size(1)),     eps};
  if (a.rows == 0 || a.D == 0) return;
  const std::initializer_list<const void*> ptrs = {a.x, a.y, a.gamma, a.beta};
  switch (x.dtype()) {
    case DType::F32:
      if (can_vectorize<float>(a.D, ptrs)) forward_for_width<float, 4>(a);
      else forward_for_width<float, 1>(a);
      break;
    case DType::BF16:
      if (can_vectorize<__nv_bfloat16>(a.D, ptrs)) forward_for_width<__nv_bfloat16, 8>(a);
      else forward_for_width<__nv_bfloat16, 1>(a);
      break;
    default:
      fail(kOp, "x ", x.shape(), " has dtype ", dtype_name(x.dtype()), "; fused kernels take f32 or bf16");
  }
}

void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  constexpr const char* kOp = "layernorm_backward_fused";
  check_rows_d(kOp, x);
  HG_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && gamma.dtype() == DType::F32 &&
               dgamma.dtype() == DType::F32 && dbeta.dtype() == DType::F32,
           kOp, "dtypes: x ", dtype_name(x.dtype()), " dy ", dtype_name(dy.dtype()), " dx ", dtype_name(dx.dtype()),
           "; gamma, dgamma, dbeta must be f32");
  BackwardArgs a{dy.raw_data(),       x.raw_data(),         gamma.data<float>(), mean.data<float>(),
                 rstd.data<float>(), dx.raw_data(),        dgamma.data<float>(), dbeta.data<float>(),
                 x.size(0),          int(x.size(1))};
  if (a.D == 0) return;
  const std::initializer_list<const void*> ptrs = {a.dy, a.x, a.dx, a.gamma};
  switch (x.dtype()) {
    case DType::F32:
      if (can_vectorize<float>(a.D, ptrs)) backward_for_width<float, 4>(a);
      else backward_for_width<float, 1>(a);
      break;
    case DType::BF16:
      if (can_vectorize<__nv_bfloat16>(a.D, ptrs)) backward_for_width<__nv_bfloat16, 8>(a);
      else backward_for_width<__nv_bfloat16, 1>(a);
      break;
    default:
      fail(kOp, "x ", x.shape(), " has dtype ", dtype_name(x.dtype()), "; fused kernels take f32 or bf16");
  }
}

}  // namespace hg::gpu
