// Fused attention in F32 on the CUDA cores, register-tiled like an SGEMM
// (the BF16 kernels and the launch API: cuda/attention.cu). Derivation,
// tiling and budgets: docs/attention.md, "F32 kernels".
//
// A block of 16 * TY threads owns BR = TY * RM rows (queries in the forward
// and dq kernels, keys in the dk, dv kernel) and walks tiles of 64 columns
// (keys, or queries). Thread (ty, tx) owns an RM x 4 micro-tile of a score
// product (rows row_of(i), columns tx + 16 c) and an RM x DH/16 micro-tile of
// an output (dims Dims::at(e)), both in registers:
//   score products (q k^T, do v^T): both operands row-major in shared memory,
//     read along dh a float4 at a time (tile_dots);
//   output products (p v, ds k, p^T do, ds^T q): p or ds transposed in shared
//     memory, [column][row], written from the score micro-tiles (store_t) and
//     read a float4 of rows at a time, times a row of v, k, do or q (tile_axpy).
// A row's max and sum are spread over the 16 lanes of a half warp: shuffles.
// Tiles are staged with cp.async, zero-filled past Tq or Tk; every partial
// tile, causal cut and mask goes through logit2 (-inf) and prob (0).
//
// Forward: online softmax over the key tiles; saves lse and stats.
// Backward, three kernels: delta_kernel (delta_i = do_i . o_i in the fma
// chain of the score products); peaked_delta_kernel, which re-sums delta_i =
// sum_j p_ij dp_ij over the very p and dp the gradient uses for the query
// blocks with a near one-hot row (docs/attention.md says why); and one kernel
// per key tile for dk, dv and dq, adding dq in the fixed order of
// cuda/attention_dq_order.cuh (backward_dkdv_kernel; backward_split_kernel
// at dh 128). Each product sums over dh in one fixed fma chain in every
// kernel, so all see the same scores and the same dp. No float atomics:
// bitwise repeatable.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/error.hpp"
#include "cuda/attention_dq_order.cuh"
#include "cuda/attention_dq_workspace.hpp"
#include "cuda/attention_f32.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"

namespace hg::gpu::attn {
namespace {

constexpr int kCols = 64;  // columns (keys, or queries in the dk, dv kernel) of a score tile

// ---- thread geometry ---------------------------------------------------------

__device__ __forceinline__ int tx() { return threadIdx.x % 16; }
__device__ __forceinline__ int ty() { return threadIdx.x / 16; }

// Row i < RM of the thread's micro-tile among the block's TY * RM rows: runs
// of four rows, 4 TY apart. The two row groups of a warp read rows 4 apart,
// 16 banks apart in a tile of row stride DH + 4. kGroups > 1: the block is
// kGroups groups of 16 TY threads, each with this geometry (backward_split_kernel).
template <int TY, int kGroups = 1>
__device__ __forceinline__ int row_of(int i) {
  return (i / 4) * (4 * TY) + (kGroups == 1 ? ty() : ty() % TY) * 4 + i % 4;
}
// Column c < 4: the 16 lanes of a row group read 16 consecutive rows of the
// column operand (4 banks apart: no conflict).
__device__ __forceinline__ int col_of(int c) { return tx() + 16 * c; }

// The thread's DH / 16 dims of an output row, in runs of kVec contiguous floats.
template <int DH>
struct Dims {
  static constexpr int kN = DH / 16, kVec = kN < 4 ? kN : 4;
  __device__ static int at(int e) { return (e / kVec) * (16 * kVec) + tx() * kVec + e % kVec; }
  // kL2: from the L2 only (dq sums other blocks wrote, cuda/attention_dq_order.cuh).
  template <bool kL2 = false>
  __device__ static void load(float (&x)[kN], const float* row) {
#pragma unroll
    for (int e = 0; e < kN; e += kVec) {
      if constexpr (kVec == 4) {
        const float4* from = reinterpret_cast<const float4*>(row + at(e));
        const float4 f = kL2 ? __ldcg(from) : *from;
        x[e] = f.x, x[e + 1] = f.y, x[e + 2] = f.z, x[e + 3] = f.w;
      } else {
        const float2* from = reinterpret_cast<const float2*>(row + at(e));
        const float2 f = kL2 ? __ldcg(from) : *from;
        x[e] = f.x, x[e + 1] = f.y;
      }
    }
  }
  __device__ static void store(float* row, const float (&x)[kN], float w) {
#pragma unroll
    for (int e = 0; e < kN; e += kVec) {
      if constexpr (kVec == 4) {
        *reinterpret_cast<float4*>(row + at(e)) = make_float4(w * x[e], w * x[e + 1], w * x[e + 2], w * x[e + 3]);
      } else {
        *reinterpret_cast<float2*>(row + at(e)) = make_float2(w * x[e], w * x[e + 1]);
      }
    }
  }
};

// ---- staging (cp.async) ------------------------------------------------------

// Rows [r0, r0 + ROWS) of a (rows, DH) operand whose rows start `ld`
// elements apart, into a shared tile of row stride DH + 4; rows past `rows`
// are zeros. The caller commits the group and waits before reading.
template <int ROWS, int DH, int NT>
__device__ __forceinline__ void stage(float* tile, const float* src, int64_t ld, int r0, int rows) {
  constexpr int kVecs = DH / 4;
  for (int idx = threadIdx.x; idx < ROWS * kVecs; idx += NT) {
    const int r = idx / kVecs, c = (idx % kVecs) * 4;
    const bool in = r0 + r < rows;
    const float* from = src + (in ? int64_t(r0 + r) * ld + c : 0);
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(tile + r * (DH + 4) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(in ? 16 : 0) : "memory");
  }
}

// Query rows [m0, m0 + 64)'s forward stats and delta into shared memory;
// rows past Tq are zero-filled (logit2 gives them -inf, so prob never reads
// their stats, and ds = 0). Same group rules as stage.
template <int NT>
__device__ __forceinline__ void stage_row_stats(float2* stat_s, float* delta_s, const Args& a, int64_t bh, int m0) {
  for (int r = threadIdx.x; r < kCols; r += NT) {
    const bool in = m0 + r < a.tq;
    const int64_t at = bh * a.tq + (in ? m0 + r : 0);
    const unsigned to_stat = static_cast<unsigned>(__cvta_generic_to_shared(stat_s + r));
    const unsigned to_delta = static_cast<unsigned>(__cvta_generic_to_shared(delta_s + r));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to_stat), "l"(a.stats + at), "r"(in ? 8 : 0)
                 : "memory");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to_delta), "l"(a.delta + at), "r"(in ? 4 : 0)
                 : "memory");
  }
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- micro-kernels -----------------------------------------------------------

__device__ __forceinline__ float dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// acc[i][c] += A[row_of(i)] . B[col_of(c)], A and B row-major tiles of
// stride DH + 4. One fma chain over d = 0, 1, ..., DH - 1 from acc = 0, the
// same in every kernel (fmaf(a, b, c) = fmaf(b, a, c)): q . k and do . v come
// out bitwise alike wherever they are recomputed.
template <int DH, int TY, int RM, int kGroups = 1>
__device__ __forceinline__ void tile_dots(float (&acc)[RM][4], const float* a, const float* b) {
  constexpr int S = DH + 4;
#pragma unroll 4
  for (int d = 0; d < DH; d += 4) {
    float4 av[RM], bv[4];
#pragma unroll
    for (int i = 0; i < RM; ++i) av[i] = *reinterpret_cast<const float4*>(a + row_of<TY, kGroups>(i) * S + d);
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = *reinterpret_cast<const float4*>(b + col_of(c) * S + d);
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = dot4(acc[i][c], av[i], bv[c]);
  }
}

// x[i][c] -> pt[col_of(c)][row_of(i)], row stride ps: the transposed layout tile_axpy reads.
template <int TY, int RM, int kGroups = 1>
__device__ __forceinline__ void store_t(float* pt, int ps, const float (&x)[RM][4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int g = 0; g < RM / 4; ++g)
      *reinterpret_cast<float4*>(pt + col_of(c) * ps + row_of<TY, kGroups>(4 * g)) =
          make_float4(x[4 * g][c], x[4 * g + 1][c], x[4 * g + 2][c], x[4 * g + 3][c]);
}

// acc[i][e] += sum over the 64 columns j of pt[j][row_of(i)] * m[j][Dims::at(e)],
// pt of row stride ps, m row-major of stride DH + 4.
template <int DH, int TY, int RM, int kGroups = 1>
__device__ __forceinline__ void tile_axpy(float (&acc)[RM][DH / 16], const float* pt, int ps, const float* m) {
#pragma unroll 4
  for (int j = 0; j < kCols; ++j) {
    float p[RM], x[DH / 16];
#pragma unroll
    for (int g = 0; g < RM / 4; ++g) {
      const float4 f = *reinterpret_cast<const float4*>(pt + j * ps + row_of<TY, kGroups>(4 * g));
      p[4 * g] = f.x, p[4 * g + 1] = f.y, p[4 * g + 2] = f.z, p[4 * g + 3] = f.w;
    }
    Dims<DH>::load(x, m + j * (DH + 4));
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int e = 0; e < DH / 16; ++e) acc[i][e] = fmaf(p[i], x[e], acc[i][e]);
  }
}

// As tile_axpy with pt row-major, [row_of(i)][j] (row stride ps), read four
// columns j at a time: acc[i][e] += sum over j < 64 of pt[row_of(i)][j] * m[j][Dims::at(e)].
// The two row groups of a warp read rows 4 apart (16 banks apart for ps = 68).
template <int DH, int TY, int RM>
__device__ __forceinline__ void tile_axpy_rows(float (&acc)[RM][DH / 16], const float* pt, int ps, const float* m) {
#pragma unroll 2
  for (int j = 0; j < kCols; j += 4) {
    float4 p[RM];
#pragma unroll
    for (int i = 0; i < RM; ++i) p[i] = *reinterpret_cast<const float4*>(pt + row_of<TY>(i) * ps + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      float x[DH / 16];
      Dims<DH>::load(x, m + (j + jj) * (DH + 4));
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const float pj = jj == 0 ? p[i].x : jj == 1 ? p[i].y : jj == 2 ? p[i].z : p[i].w;
#pragma unroll
        for (int e = 0; e < DH / 16; ++e) acc[i][e] = fmaf(pj, x[e], acc[i][e]);
      }
    }
  }
}

// Over the 16 lanes that share a row; every lane ends with the same bits
// (each step adds the same two values, in either order).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// ---- logits and probabilities ------------------------------------------------

// What key j adds to a base-2 logit: -inf past Tk or where the mask is at or
// below the threshold, mask * log2(e) otherwise (a NaN mask value stays NaN).
__device__ __forceinline__ float key_bias(const Args& a, const float* mask_row, int j) {
  if (j >= a.tk) return -INFINITY;
  if (mask_row == nullptr) return 0.f;
  return mask_term(mask_row[j]);
}

// The base-2 logit of (query i, key j) from the raw score s and key j's bias;
// -inf for query rows past Tq and causally hidden keys.
__device__ __forceinline__ float logit2(const Args& a, float s, float bias, int i, int j) {
  return i >= a.tq || (a.causal && j > i + a.tk - a.tq) ? -INFINITY : fmaf(s, a.scale_log2, bias);
}

// p from a base-2 logit and the forward's row statistics {max, 1 / sum}: the
// forward's own last normalisation, so the backward's p is the forward's p.
__device__ __forceinline__ float prob(float x2, float2 stats) {
  return x2 == -INFINITY ? 0.f : exp2f(x2 - stats.x) * stats.y;
}

// ---- forward -----------------------------------------------------------------
// BR queries against 64-key tiles. k of tile t + 1 loads while tile t's
// softmax and p v run, v of tile t + 1 while tile t + 1's scores run.

template <int DH, int TY, int RM>
__global__ void __launch_bounds__(16 * TY) forward_kernel(Args a) {
  constexpr int BR = TY * RM, S = DH + 4, PS = BR + 4, NT = 16 * TY, N = DH / 16;
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;            // [BR][S]
  float* ks = qs + BR * S;     // [64][S]
  float* vs = ks + kCols * S;  // [64][S]
  float* pt = vs + kCols * S;  // [64][PS]: p transposed
  const int64_t bh = blockIdx.y;
  const int q_block = blockIdx.x * BR;
  const float* k = static_cast<const float*>(a.k) + a.kv_base(bh);
  const float* v = static_cast<const float*>(a.v) + a.kv_base(bh);
  const float* mask_row = a.mask_row(bh);
  const int key_end = a.key_end(min(q_block + BR, a.tq));
  const int tiles = key_end > 0 ? (key_end + kCols - 1) / kCols : 0;
  if (tiles > 0) {
    stage<BR, DH, NT>(qs, static_cast<const float*>(a.q) + a.q_base(bh), a.q_row, q_block, a.tq);
    stage<kCols, DH, NT>(ks, k, a.kv_row, 0, a.tk);
    async_commit();
    stage<kCols, DH, NT>(vs, v, a.kv_row, 0, a.tk);
    async_commit();
  }
  float m[RM], l[RM], o[RM][N] = {};  // l: this lane's share of the row sum
#pragma unroll
  for (int i = 0; i < RM; ++i) m[i] = -INFINITY, l[i] = 0.f;
  for (int tile = 0; tile < tiles; ++tile) {
    const int n0 = tile * kCols;
    const bool more = tile + 1 < tiles;
    async_wait<1>();  // q and this tile's k; its v may still be in flight
    __syncthreads();
    float s[RM][4] = {};
    tile_dots<DH, TY, RM>(s, qs, ks);
    __syncthreads();  // every thread is done with ks
    if (more) {
      stage<kCols, DH, NT>(ks, k, a.kv_row, n0 + kCols, a.tk);
      async_commit();
    }
    float bias[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) bias[c] = key_bias(a, mask_row, n0 + col_of(c));
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[i][c] = logit2(a, s[i][c], bias[c], q_block + row_of<TY>(i), n0 + col_of(c));
        mx = fmaxf(mx, s[i][c]);
      }
      const float m_new = fmaxf(m[i], row_max(mx));
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      const float alpha = exp2f(m[i] - base);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int e = 0; e < N; ++e) o[i][e] *= alpha;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[i][c] = exp2f(s[i][c] - base);
        l[i] += s[i][c];
      }
    }
    store_t<TY, RM>(pt, PS, s);
    if (more) {
      async_wait<1>();  // this tile's v; the next k may still be in flight
    } else {
      async_wait<0>();
    }
    __syncthreads();
    tile_axpy<DH, TY, RM>(o, pt, PS, vs);
    __syncthreads();  // every thread is done with vs and pt
    if (more) {
      stage<kCols, DH, NT>(vs, v, a.kv_row, n0 + kCols, a.tk);
      async_commit();
    }
  }
  float total[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) total[i] = row_sum(l[i]);
  float* out = static_cast<float*>(a.out) + a.o_base(bh);
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    if (row >= a.tq) continue;
    const float inv = total[i] == 0.f ? 0.f : 1.f / total[i];  // a row with every key removed is zeros
    Dims<DH>::store(out + int64_t(row) * a.o_row, o[i], inv);
    if (tx() == 0) {
      a.lse[bh * a.tq + row] = total[i] == 0.f ? -INFINITY : m[i] * kLn2 + logf(total[i]);
      a.stats[bh * a.tq + row] = make_float2(m[i], inv);
    }
  }
}

// ---- backward ----------------------------------------------------------------

// delta_i = do_i . o_i, one thread per query row (rows = B * H * Tq in
// (b, h, i) order), in tile_dots' fma chain: where o_i is exactly v_j (a
// one-hot row: p = 1 at key j, 0 elsewhere) delta_i is dp_ij bitwise and ds
// = p (dp - delta) is 0 exactly, as with the summed delta.
template <int DH>
__global__ void delta_kernel(Args a, int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t at = a.o_base(r / a.tq) + (r % a.tq) * a.o_row;
  const float4* d = reinterpret_cast<const float4*>(static_cast<const float*>(a.dout) + at);
  const float4* o = reinterpret_cast<const float4*>(static_cast<const float*>(a.o) + at);
  float acc = 0.f;
#pragma unroll 8
  for (int e = 0; e < DH / 4; ++e) acc = dot4(acc, d[e], o[e]);
  a.delta[r] = acc;
}

// delta for the BR queries of a block that has a row with a key of weight
// above 1/2 (1 / sum > 0.5: a near one-hot row, where do . o and sum p dp
// may differ by more than ds = p (dp - delta) can bear): delta_i = sum_j p_ij
// dp_ij over the 64-key tiles, written over delta_kernel's. Other blocks
// return at once.
template <int DH, int TY, int RM>
__global__ void __launch_bounds__(16 * TY) peaked_delta_kernel(Args a) {
  constexpr int BR = TY * RM, S = DH + 4, NT = 16 * TY;
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;            // [BR][S]
  float* dos = qs + BR * S;    // [BR][S]
  float* ks = dos + BR * S;    // [64][S]
  float* vs = ks + kCols * S;  // [64][S]
  const int64_t bh = blockIdx.y;
  const int q_block = blockIdx.x * BR;
  const int64_t qoff = a.q_base(bh);
  const float* k = static_cast<const float*>(a.k) + a.kv_base(bh);
  const float* v = static_cast<const float*>(a.v) + a.kv_base(bh);
  const float* mask_row = a.mask_row(bh);
  float2 stats[RM];
  float delta[RM];  // this lane's share
  bool peaked = false;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    stats[i] = row < a.tq ? a.stats[bh * a.tq + row] : make_float2(-INFINITY, 0.f);
    peaked |= stats[i].y > 0.5f;
  }
  if (!__syncthreads_or(peaked)) return;  // do . o (delta_kernel) stands
#pragma unroll
  for (int i = 0; i < RM; ++i) delta[i] = 0.f;
  const int key_end = a.key_end(min(q_block + BR, a.tq));
  const int tiles = key_end > 0 ? (key_end + kCols - 1) / kCols : 0;
  if (tiles > 0) {
    stage<BR, DH, NT>(qs, static_cast<const float*>(a.q) + qoff, a.q_row, q_block, a.tq);
    stage<BR, DH, NT>(dos, static_cast<const float*>(a.dout) + a.o_base(bh), a.o_row, q_block, a.tq);
    stage<kCols, DH, NT>(ks, k, a.kv_row, 0, a.tk);
    stage<kCols, DH, NT>(vs, v, a.kv_row, 0, a.tk);
    async_commit();
  }
  for (int step = 0; step < tiles; ++step) {
    const int n0 = step * kCols, next = n0 + kCols;
    const bool more = step + 1 < tiles;
    async_wait<0>();
    __syncthreads();
    float s[RM][4] = {}, dp[RM][4] = {};
    tile_dots<DH, TY, RM>(s, qs, ks);
    tile_dots<DH, TY, RM>(dp, dos, vs);
    __syncthreads();  // every thread is done with vs
    if (more) {
      stage<kCols, DH, NT>(vs, v, a.kv_row, next, a.tk);
      async_commit();
    }
    float bias[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) bias[c] = key_bias(a, mask_row, n0 + col_of(c));
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = prob(logit2(a, s[i][c], bias[c], q_block + row_of<TY>(i), n0 + col_of(c)), stats[i]);
        delta[i] += p * dp[i][c];
      }
    __syncthreads();  // every thread is done with ks
    if (more) {
      stage<kCols, DH, NT>(ks, k, a.kv_row, next, a.tk);
      async_commit();
    }
  }
#pragma unroll
  for (int i = 0; i < RM; ++i) delta[i] = row_sum(delta[i]);
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    if (row < a.tq && tx() == 0) a.delta[bh * a.tq + row] = delta[i];
  }
}

// Key tile kt's turn at query tile f (cuda/attention_dq_order.cuh): this
// warp's rows of the partial dq (rows m0 + row_of(i), dims Dims::at(e);
// without the scale) added in place to dq, which holds the sum of key tiles
// 0 .. kt - 1; the tile's last contributor scales the sum. Every load is
// issued before any store.
template <int DH, int TY, int RM>
__device__ void flush_dq_f32(const Args& a, const DqOrder& order, float (&dq)[RM][DH / 16], float* dq_head, int64_t bh,
                             int kt, int f, int m0) {
  const int last = order.last_contributor(a, f);
  order.wait_turn(bh, kt, f, last);
  if (kt > 0) {
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const int row = m0 + row_of<TY>(i);
      if (row >= a.tq) continue;
      float sum[DH / 16];
      Dims<DH>::template load<true>(sum, dq_head + int64_t(row) * a.q_row);
#pragma unroll
      for (int e = 0; e < DH / 16; ++e) dq[i][e] = sum[e] + dq[i][e];
    }
  }
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = m0 + row_of<TY>(i);
    if (row < a.tq) Dims<DH>::store(dq_head + int64_t(row) * a.q_row, dq[i], kt == last ? a.scale : 1.f);
  }
  order.arrive(bh, f);
}

// As flush_dq_f32 for a partial dq held in shared memory (dqs: [64][DH + 4],
// without the scale), flushed by the 4 warps of half 1 of backward_split_kernel
// (warp w: rows 16 w .. 16 w + 15, lane l rows 16 w + 2 i + l / 16): the same
// sums, so the same bits. A step's loads from dq are issued before its stores
// (rows of different steps are distinct).
template <int DH>
__device__ void flush_dq_shared_f32(const Args& a, const DqOrder& order, const float* dqs, float* dq_head, int64_t bh,
                                    int kt, int f, int m0) {
  // The lane's 8 rows in two steps of 4 (all 8 sums in flight at once spill: 255 registers).
  constexpr int N = DH / 16, kRowsPerStep = 4;
  const int warp = (threadIdx.x / 32) % 4, half = (threadIdx.x % 32) / 16;
  const int last = order.last_contributor(a, f);
  order.wait_turn(bh, kt, f, last);
#pragma unroll
  for (int r0 = 0; r0 < 8; r0 += kRowsPerStep) {
    float sum[kRowsPerStep][N];
    if (kt > 0) {
#pragma unroll
      for (int i = 0; i < kRowsPerStep; ++i) {
        const int row = 16 * warp + 2 * (r0 + i) + half;
        if (m0 + row < a.tq) Dims<DH>::template load<true>(sum[i], dq_head + int64_t(m0 + row) * a.q_row);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerStep; ++i) {
      const int row = 16 * warp + 2 * (r0 + i) + half;
      if (m0 + row >= a.tq) continue;
      float dq[N];
      Dims<DH>::load(dq, dqs + row * (DH + 4));
      if (kt > 0) {
#pragma unroll
        for (int e = 0; e < N; ++e) dq[e] = sum[i][e] + dq[e];
      }
      Dims<DH>::store(dq_head + int64_t(m0 + row) * a.q_row, dq, kt == last ? a.scale : 1.f);
    }
  }
  order.arrive(bh, f);
}

// The dk, dv kernels' shared memory (Tiles::kDkdvSmem): k, v of the
// block's BR keys and q, do of a 64-query tile (row stride DH + 4), p and ds
// query-major (row stride BR + 4), and the query tile's stats and delta.
struct DkdvTiles {
  float *ks, *vs, *qs, *dos, *ps, *dss;
  float2* stat_s;
  float* delta_s;
};
template <int DH, int BR>
__device__ __forceinline__ DkdvTiles dkdv_tiles(float* smem) {
  constexpr int S = DH + 4, PS = BR + 4;
  DkdvTiles t;
  t.ks = smem;
  t.vs = t.ks + BR * S;
  t.qs = t.vs + BR * S;
  t.dos = t.qs + kCols * S;
  t.ps = t.dos + kCols * S;
  t.dss = t.ps + kCols * PS;
  t.stat_s = reinterpret_cast<float2*>(t.dss + kCols * PS);
  t.delta_s = reinterpret_cast<float*>(t.stat_s + kCols);
  return t;
}

// One cp.async group each: the block's k, v rows [k_block, k_block + BR);
// query tile m0's q, do, stats and delta (q, dout: the head's).
template <int DH, int BR, int NT>
__device__ __forceinline__ void stage_keys(const DkdvTiles& t, const Args& a, int64_t koff, int k_block) {
  stage<BR, DH, NT>(t.ks, static_cast<const float*>(a.k) + koff, a.kv_row, k_block, a.tk);
  stage<BR, DH, NT>(t.vs, static_cast<const float*>(a.v) + koff, a.kv_row, k_block, a.tk);
  async_commit();
}
template <int DH, int NT>
__device__ __forceinline__ void stage_query_tile(const DkdvTiles& t, const Args& a, int64_t bh, const float* q,
                                                 const float* dout, int m0) {
  stage<kCols, DH, NT>(t.qs, q, a.q_row, m0, a.tq);
  stage<kCols, DH, NT>(t.dos, dout, a.o_row, m0, a.tq);
  stage_row_stats<NT>(t.stat_s, t.delta_s, a, bh, m0);
  async_commit();
}

// dk, dv and dq for BR = 64 keys, over the 64-query tiles from the last
// down to the first that sees them: s^T and dp^T (keys x queries) in
// registers, p and ds through shared memory (query-major) into dv += p^T do
// and dk += ds^T q; then dq = ds k over the block's keys (ds from shared
// memory, row-major), added into dq in the fixed order of `order`. Blocks
// take (head, key tile) from its ticket; key tile 0 sweeps from query 0
// (rows with no key get dq = 0). The next tile's q, do, stats and delta load
// during dq = ds k and the dq add, which read none of them.
template <int DH, int TY, int RM>
__global__ void __launch_bounds__(16 * TY) backward_dkdv_kernel(Args a, DqOrder order) {
  constexpr int BR = TY * RM, PS = BR + 4, NT = 16 * TY, N = DH / 16;
  static_assert(BR == kCols);
  extern __shared__ __align__(16) float smem[];
  const DkdvTiles tiles = dkdv_tiles<DH, BR>(smem);
  const auto& [ks, vs, qs, dos, ps, dss, stat_s, delta_s] = tiles;
  const int64_t item = order.take_ticket();
  const int64_t bh = item / order.key_tiles;
  const int kt = static_cast<int>(item % order.key_tiles);
  const int k_block = kt * BR;
  const int64_t koff = a.kv_base(bh);
  const float* q = static_cast<const float*>(a.q) + a.q_base(bh);
  const float* dout = static_cast<const float*>(a.dout) + a.o_base(bh);
  stage_keys<DH, BR, NT>(tiles, a, koff, k_block);
  const int m_first = order.first_flush(a, kt) * kCols;
  // Query tiles from the last: see "One kernel" in docs/attention.md.
  const int m_last = m_first + (a.tq - 1 - m_first) / kCols * kCols;
  if (m_first < a.tq) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m_last);
  const float* mask_row = a.mask_row(bh);
  float bias[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) bias[i] = key_bias(a, mask_row, k_block + row_of<TY>(i));
  float dk[RM][N] = {}, dv[RM][N] = {};
  for (int m_up = m_first; m_up < a.tq; m_up += kCols) {
    const int m0 = m_first + m_last - m_up;
    const bool more = m_up + kCols < a.tq;
    async_wait<0>();
    __syncthreads();
    float s[RM][4] = {}, dp[RM][4] = {};  // s^T and dp^T: keys x queries
    tile_dots<DH, TY, RM>(s, ks, qs);
    tile_dots<DH, TY, RM>(dp, vs, dos);
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = col_of(c);
        s[i][c] = prob(logit2(a, s[i][c], bias[i], m0 + r, k_block + row_of<TY>(i)), stat_s[r]);
        dp[i][c] = s[i][c] * (dp[i][c] - delta_s[r]);  // ds without the scale
      }
    store_t<TY, RM>(ps, PS, s);
    store_t<TY, RM>(dss, PS, dp);
    __syncthreads();
    tile_axpy<DH, TY, RM>(dk, dss, PS, qs);
    tile_axpy<DH, TY, RM>(dv, ps, PS, dos);
    __syncthreads();  // every thread is done with qs, dos, ps and the stats (dss stays, for dq)
    if (more) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m0 - kCols);
    // dq = ds k over the block's keys (BR = 64 = kCols), then this warp's turn
    float dq[RM][N] = {};
    tile_axpy_rows<DH, TY, RM>(dq, dss, PS, ks);
    float* dq_head = static_cast<float*>(a.dq) + (q - static_cast<const float*>(a.q));  // dq has q's strides
    flush_dq_f32<DH, TY, RM>(a, order, dq, dq_head, bh, kt, m0 / kCols, m0);
  }
  float* dk_out = static_cast<float*>(a.dk) + koff;
  float* dv_out = static_cast<float*>(a.dv) + koff;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int j = k_block + row_of<TY>(i);
    if (j >= a.tk) continue;
    Dims<DH>::store(dk_out + int64_t(j) * a.kv_row, dk[i], a.scale);
    Dims<DH>::store(dv_out + int64_t(j) * a.kv_row, dv[i], 1.f);
  }
}

// dh 128: backward_dkdv_kernel's work (64 keys, 256 threads) with the score
// and dk, dv products split between the block's two halves of 128 threads
// instead of shared: half 0 computes s^T, p and dv += p^T do, half 1 dp^T,
// ds (reading p back from shared memory) and dk += ds^T q, each as an 8 x 4
// score and an 8 x 8 output micro-tile (TY 8, RM 8 within the half: 12
// float4 loads per 128 fmas instead of 16 in the scores, 8 instead of 12 in
// the outputs). All 256 threads then compute dq = ds k (TY 16, RM 4) into
// shared memory (dqs, after the tiles), and half 1 adds it into dq at the
// start of the next tile, before its dp^T, while half 0 computes s^T and p:
// the add's waits and L2 round trips do not stall the whole block. Only half
// 1's 4 warps arrive on the counters. The next query tile's q, do, stats and
// delta load during dq. Every sum is backward_dkdv_kernel's, in the same
// order: the same bits.
template <int DH>
__global__ void __launch_bounds__(256) backward_split_kernel(Args a, DqOrder order) {
  constexpr int TY = 8, RM = 8, BR = TY * RM, PS = BR + 4, NT = 256, N = DH / 16;
  constexpr int kDqTy = 16, kDqRm = 4;  // dq: backward_dkdv_kernel's geometry over all 256 threads
  static_assert(BR == kCols && kDqTy * kDqRm == kCols);
  extern __shared__ __align__(16) float smem[];
  const DkdvTiles tiles = dkdv_tiles<DH, BR>(smem);
  const auto& [ks, vs, qs, dos, ps, dss, stat_s, delta_s] = tiles;
  const int64_t item = order.take_ticket();
  const int64_t bh = item / order.key_tiles;
  const int kt = static_cast<int>(item % order.key_tiles);
  const int k_block = kt * BR;
  const int64_t koff = a.kv_base(bh);
  const float* q = static_cast<const float*>(a.q) + a.q_base(bh);
  const float* dout = static_cast<const float*>(a.dout) + a.o_base(bh);
  stage_keys<DH, BR, NT>(tiles, a, koff, k_block);
  const int m_first = order.first_flush(a, kt) * kCols;
  const int m_last = m_first + (a.tq - 1 - m_first) / kCols * kCols;  // swept from the last
  if (m_first < a.tq) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m_last);
  const bool dk_half = threadIdx.x >= NT / 2;  // warp-uniform
  const float* mask_row = a.mask_row(bh);
  float bias[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) bias[i] = key_bias(a, mask_row, k_block + row_of<TY, 2>(i));
  float acc[RM][N] = {};                                      // dv (half 0) or dk (half 1)
  float* dq_head = static_cast<float*>(a.dq) + a.q_base(bh);  // dq has q's strides
  float* dqs = delta_s + kCols;                               // [64][DH + 4]: dq = ds k of the tile before
  for (int m_up = m_first; m_up < a.tq; m_up += kCols) {
    const int m0 = m_first + m_last - m_up;
    async_wait<0>();
    __syncthreads();      // this tile's loads are in; every thread is done with the previous dss
    float x[RM][4] = {};  // s^T, then p (half 0); dp^T, then ds (half 1): keys x queries
    if (!dk_half) {
      tile_dots<DH, TY, RM, 2>(x, ks, qs);
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          x[i][c] = prob(logit2(a, x[i][c], bias[i], m0 + col_of(c), k_block + row_of<TY, 2>(i)), stat_s[col_of(c)]);
      store_t<TY, RM, 2>(ps, PS, x);
    } else {
      if (m_up > m_first) flush_dq_shared_f32<DH>(a, order, dqs, dq_head, bh, kt, m0 / kCols + 1, m0 + kCols);
      tile_dots<DH, TY, RM, 2>(x, vs, dos);
    }
    __syncthreads();  // p is in ps
    if (!dk_half) {
      // Half 1's barrier, matched: every thread of the block passes the same
      // number of barriers per tile (racecheck, docs/testing.md).
      asm volatile("bar.sync 2, %0;\n" ::"n"(NT / 2) : "memory");
      tile_axpy<DH, TY, RM, 2>(acc, ps, PS, dos);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int g = 0; g < RM / 4; ++g) {  // p where half 0's twin thread stored it (store_t)
          const float4 p = *reinterpret_cast<const float4*>(ps + col_of(c) * PS + row_of<TY, 2>(4 * g));
          const float d = delta_s[col_of(c)];
          x[4 * g][c] = p.x * (x[4 * g][c] - d);  // ds without the scale
          x[4 * g + 1][c] = p.y * (x[4 * g + 1][c] - d);
          x[4 * g + 2][c] = p.z * (x[4 * g + 2][c] - d);
          x[4 * g + 3][c] = p.w * (x[4 * g + 3][c] - d);
        }
      store_t<TY, RM, 2>(dss, PS, x);
      asm volatile("bar.sync 1, %0;\n" ::"n"(NT / 2) : "memory");  // half 1's ds is in dss
      tile_axpy<DH, TY, RM, 2>(acc, dss, PS, qs);
    }
    __syncthreads();  // every thread is done with qs, dos, ps and the stats; dss is complete
    if (m_up + kCols < a.tq) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m0 - kCols);
    float dq[kDqRm][N] = {};
    tile_axpy_rows<DH, kDqTy, kDqRm>(dq, dss, PS, ks);
    // half 1 read the previous dqs before the last barrier
#pragma unroll
    for (int i = 0; i < kDqRm; ++i) Dims<DH>::store(dqs + row_of<kDqTy>(i) * (DH + 4), dq[i], 1.f);
  }
  if (m_first < a.tq) {  // the last tile swept is the first, m_first
    __syncthreads();     // dqs is complete
    if (dk_half) flush_dq_shared_f32<DH>(a, order, dqs, dq_head, bh, kt, m_first / kCols, m_first);
  }
  float* out = static_cast<float*>(dk_half ? a.dk : a.dv) + koff;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int j = k_block + row_of<TY, 2>(i);
    if (j < a.tk) Dims<DH>::store(out + int64_t(j) * a.kv_row, acc[i], dk_half ? a.scale : 1.f);
  }
}

// ---- launchers ---------------------------------------------------------------

// The F32 configuration per head dim. Threads per block 16 TY, rows per
// block TY RM. dh 128 runs 256 threads: twice the rows in the forward
// (shared memory, not registers, bounds it to one block per SM), half the
// rows per thread in the backward (registers), and dk, dv, dq in
// backward_split_kernel. Candidates are timed in bench/lab/attention_lab.cu.
template <int DH>
struct Tiles {
  static constexpr int kFwdTy = DH == 128 ? 16 : 8, kFwdRm = 8;
  static constexpr int kBwdTy = DH == 128 ? 16 : 8, kBwdRm = DH == 128 ? 4 : 8;
  static constexpr bool kBwdSplit = DH == 128;  // backward_split_kernel, else backward_dkdv_kernel
  static constexpr int kFwdRows = kFwdTy * kFwdRm, kBwdRows = kBwdTy * kBwdRm;
  // Shared memory in bytes: row-major tiles of stride DH + 4, transposed p / ds of stride rows + 4.
  static constexpr size_t kFwdSmem = 4 * ((kFwdRows + 2 * kCols) * (DH + 4) + kCols * (kFwdRows + 4));
  static constexpr size_t kDeltaSmem = 4 * ((2 * kBwdRows + 2 * kCols) * (DH + 4) + kCols * (kBwdRows + 4));
  static constexpr size_t kDkdvSmem =
      4 * ((2 * kBwdRows + 2 * kCols) * (DH + 4) + 2 * kCols * (kBwdRows + 4) + 3 * kCols);
  static constexpr size_t kSplitSmem() { return kDkdvSmem + 4 * kCols * (DH + 4); }  // + dqs
};

template <class Kernel, class... More>
void launch(Kernel kernel, int threads, int64_t rows, int rows_per_block, int64_t heads_total, size_t smem,
            const Args& a, const char* name, const More&... more) {
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(heads_total));
  kernel<<<grid, threads, smem, stream()>>>(a, more...);
  HG_CUDA_CHECK_LAUNCH(name);
}

}  // namespace

template <int DH>
void forward_f32(const Args& a, int64_t heads_total) {
  using T = Tiles<DH>;
  launch(forward_kernel<DH, T::kFwdTy, T::kFwdRm>, 16 * T::kFwdTy, a.tq, T::kFwdRows, heads_total, T::kFwdSmem, a,
         "attention_forward_f32");
}

// delta_kernel, peaked_delta_kernel where a block needs the exact delta,
// then dk, dv and dq in one kernel per key tile, adding into dq itself (each
// head has its own dq: no ring).
template <int DH>
void backward_f32(const Args& a, int64_t heads_total) {
  using T = Tiles<DH>;
  const int64_t rows = heads_total * a.tq;
  delta_kernel<DH><<<static_cast<unsigned>((rows + 127) / 128), 128, 0, stream()>>>(a, rows);
  HG_CUDA_CHECK_LAUNCH("attention_delta_f32");
  launch(peaked_delta_kernel<DH, T::kBwdTy, T::kBwdRm>, 16 * T::kBwdTy, a.tq, T::kBwdRows, heads_total, T::kDeltaSmem,
         a, "attention_peaked_delta_f32");
  // backward_split_kernel: half 1's 4 warps arrive on the counters, not all 8
  const DqWorkspace work = dq_workspace(a, heads_total, T::kBwdRows, kCols, T::kBwdSplit ? 4 : T::kBwdTy / 2, 0, DH);
  if constexpr (T::kBwdSplit) {  // the same tiles: 64 keys, 256 threads, dq in warps of 8 x 4 rows
    static_assert(T::kBwdRows == 64 && T::kBwdTy == 16);
    launch(backward_split_kernel<DH>, 256, a.tk, T::kBwdRows, heads_total, T::kSplitSmem(), a,
           "attention_backward_split_f32", work.order);
  } else {
    launch(backward_dkdv_kernel<DH, T::kBwdTy, T::kBwdRm>, 16 * T::kBwdTy, a.tk, T::kBwdRows, heads_total, T::kDkdvSmem,
           a, "attention_backward_fused_f32", work.order);
  }
}

template void forward_f32<32>(const Args&, int64_t);
template void forward_f32<64>(const Args&, int64_t);
template void forward_f32<128>(const Args&, int64_t);
template void backward_f32<32>(const Args&, int64_t);
template void backward_f32<64>(const Args&, int64_t);
template void backward_f32<128>(const Args&, int64_t);

}  // namespace hg::gpu::attn
