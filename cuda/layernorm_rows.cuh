#pragma once
// Who owns a LayerNorm row, for the kernels of cuda/layernorm.cu (its only
// includer): a group of G threads (a warp, or several warps with a named
// barrier of their own) and its reductions; the part of a row a thread
// holds; and, for the cluster backward (sm_90+), a row split into column
// slices over the blocks of a thread-block cluster, with the exchange of
// their row sums through distributed shared memory. Design:
// docs/layernorm.md, "Thread mapping", "Reductions", "Cluster rows".
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/reduce.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

namespace cg = cooperative_groups;

// ---- row groups ---------------------------------------------------------------

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

// Shared scratch for the row sums of R groups (up to three sums each).
template <int G, int R>
using GroupScratch = float[R][3 * (G / 32)];

// The calling thread's place in its row group: thread t of group `group`,
// with the group's scratch and named barrier.
template <int G>
struct RowGroup {
  int group, t;
  float* scratch;
  int bar;
  template <int N>
  __device__ __forceinline__ void sums(float (&v)[N]) const {
    group_sums<G, N>(v, scratch, bar);
  }
  __device__ __forceinline__ float sum(float a) const { return group_sum<G>(a, scratch, bar); }
  // Thread 0's a, in every thread of the group (the residual forward's
  // shift). G > 32: through the last scratch slot, which only a reduction of
  // three sums uses; the group's next reduction (its barriers) comes before
  // thread 0 writes the slot again.
  __device__ __forceinline__ float first(float a) const {
    if constexpr (G == 32) {
      return __shfl_sync(0xffffffffu, a, 0);
    } else {
      float* slot = scratch + 3 * (G / 32) - 1;
      if (t == 0) *slot = a;
      group_barrier(bar, G);
      return *slot;
    }
  }
  // Every thread of the group has reached this point (its earlier shared
  // reads are done): a warp sync, or the group's named barrier.
  __device__ __forceinline__ void sync() const {
    if constexpr (G == 32) __syncwarp();
    else group_barrier(bar, G);
  }
};

template <int G, int R>
__device__ __forceinline__ RowGroup<G> row_group(GroupScratch<G, R>& scratch) {
  const int group = threadIdx.x / G;
  const int t = threadIdx.x % G;
  return {group, t, scratch[group], 1 + group};
}

// ---- row access -------------------------------------------------------------------

// Loads the part of a row this thread owns among `len` elements starting at
// p, minus `shift`; slots past len become 0. In vector mode len is a multiple
// of VEC, so a vector is either wholly inside or wholly outside. LEAN (the
// one-pass forward): read-only loads, bf16 widened by masks (load_vec_lean).
template <class T, int VEC, int NV, int G, bool LEAN = false>
__device__ __forceinline__ void load_part(const T* p, int len, int t, float shift, float (&v)[NV][VEC]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      if constexpr (LEAN) load_vec_lean<VEC>(p + i, v[j]);
      else load_vec<VEC>(p + i, v[j]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] -= shift;
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] = 0.0f;
    }
  }
}

// The residual forward's load: this thread's slots (those of load_part) of
// h = x + r rounded to T, stored to h and kept in v; slots past len become 0.
// h may be x or r: a thread writes only slots it has just read itself.
template <class T, int VEC, int NV, int G>
__device__ __forceinline__ void add_rows_part(const T* x, const T* r, T* h, int len, int t, float (&v)[NV][VEC]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float b[VEC];
      load_vec<VEC>(x + i, v[j]);
      load_vec<VEC>(r + i, b);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] = round_to_storage<T>(v[j][k] + b[k]);
      store_vec<VEC>(h + i, v[j]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] = 0.0f;
    }
  }
}

// v -= shift on the slots inside the row (those past len stay 0), as load_part does.
template <int VEC, int NV, int G>
__device__ __forceinline__ void subtract_shift(float (&v)[NV][VEC], int len, int t, float shift) {
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if ((j * G + t) * VEC < len)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j][k] -= shift;
}

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

// A block's copy of one parameter row (gamma or beta, f32) in shared
// memory, laid out [slot j][float4 q of the slot][thread t] so that a
// group's 16-byte reads of one (j, q) are consecutive words (conflict-free)
// where the row's own layout puts a thread's VEC floats 32 bytes apart
// (bf16 rows, VEC 8). ParamCopy<VEC, NV, G>::kFloat4s float4s.
template <int VEC, int NV, int G>
struct ParamCopy {
  static_assert(VEC % 4 == 0, "parameter copies are of 16-byte slots");
  static constexpr int kQuads = VEC / 4;
  static constexpr int kFloat4s = NV * kQuads * G;
  // Every thread of the block, then a __syncthreads before any get: fills
  // dst from p (len columns; slots past len become 0).
  static __device__ __forceinline__ void fill(float4* dst, const float* p, int len) {
    for (int n = threadIdx.x; n < kFloat4s; n += blockDim.x) {
      const int lane = n % G, q = n / G % kQuads, j = n / (G * kQuads);
      const int i = (j * G + lane) * VEC + 4 * q;
      dst[n] = i < len ? __ldg(reinterpret_cast<const float4*>(p + i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  // Thread t's slot j.
  static __device__ __forceinline__ void get(const float4* src, int j, int t, float (&out)[VEC]) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const float4 f = src[(j * kQuads + q) * G + t];
      out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
    }
  }
};

// One parameter row (gamma or beta) as thread t reads its slot j (columns
// i .. i + VEC): from global memory with loads L, or (SHARED) from the
// block's ParamCopy of it.
template <int VEC, int NV, int G, bool SHARED, Load L = Load::Plain>
struct ParamRow {
  const float* p;      // the row in global memory
  const float4* copy;  // its ParamCopy, where SHARED
  int t;
  __device__ __forceinline__ void get(int j, int i, float (&out)[VEC]) const {
    if constexpr (SHARED) ParamCopy<VEC, NV, G>::get(copy, j, t, out);
    else load_vec<VEC, L>(p + i, out);
  }
};

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

// The part of a row a thread holds (the slots of load_part) for the one-pass
// forward: float32 x - shift, or, PACKED (bf16 x 8 only), the raw 16-byte
// words, widened and shifted again at each use: half the registers, so twice
// the elements per thread fit. get(j) gives slot j's x - shift; callers read
// only slots inside the row.
template <class T, int VEC, int NV, int G, bool PACKED>
struct HeldRow {
  float shift;
  float v[NV][VEC];
  __device__ __forceinline__ void load(const T* row, int len, int t) {
    shift = to_float(row[0]);
    load_part<T, VEC, NV, G, true>(row, len, t, shift, v);
  }
  __device__ __forceinline__ void get(int j, float (&out)[VEC]) const {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = v[j][k];
  }
};

template <int NV, int G>
struct HeldRow<__nv_bfloat16, 8, NV, G, true> {
  float shift;
  uint4 raw[NV];
  __device__ __forceinline__ void load(const __nv_bfloat16* row, int len, int t) {
    shift = to_float(row[0]);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = (j * G + t) * 8;
      raw[j] = i < len ? __ldg(reinterpret_cast<const uint4*>(row + i)) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void get(int j, float (&out)[8]) const {
    widen_bf16x8(raw[j], out);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] -= shift;
  }
};

// Calls fn(x - shift) for each element of the held row's slots inside the row.
template <int VEC, int NV, int G, class Row, class Fn>
__device__ __forceinline__ void for_each_held(const Row& h, int len, int t, Fn&& fn) {
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if ((j * G + t) * VEC < len) {
      float d[VEC];
      h.get(j, d);
#pragma unroll
      for (int k = 0; k < VEC; ++k) fn(d[k]);
    }
}

// Only a block alone on its SM (1024 threads) prefetches its next row:
// smaller blocks already have a second block's loads in flight, and have no
// registers to spare for the addresses.
constexpr bool prefetch_next_row(int threads) { return threads >= 1024; }

// Blocks of 1024 threads get the whole register file of an SM; smaller
// blocks are capped so that two fit on one SM (two rows in flight).
constexpr int min_blocks_for(int threads) { return threads >= 1024 ? 1 : 2; }

// ---- cluster rows (sm_90+, backward) --------------------------------------------
// A row split over the C blocks of a thread-block cluster: block `rank`
// holds the columns [rank * slice, rank * slice + len) in registers exactly
// as a resident block holds a whole row; the per-block row sums are then
// exchanged through distributed shared memory.

// Widest cluster launched without opting in to non-portable sizes.
constexpr int kMaxCluster = 8;
constexpr int kMaxRowSums = 3;  // the backward's three row sums

// ceil(D / C) rounded up to VEC, so every slice starts 16-byte aligned.
// The host picks C so that the slice fits the block's CAP.
__host__ __device__ constexpr int cluster_slice(int D, int C, int VEC) {
  return ((D + C - 1) / C + VEC - 1) / VEC * VEC;
}

// The part of the work one group does: columns [col0, col0 + len) of rows
// first_row, first_row + row_stride, ...; its dgamma/dbeta partial goes to
// partial row `partial`. Without clusters: whole rows, block-strided.
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

// A block's shared memory must outlive the other blocks' last reads of it.
template <bool CLUSTER>
__device__ __forceinline__ void cluster_exit_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLUSTER) cg::this_cluster().sync();
#endif
}

}  // namespace
}  // namespace hg::gpu
