// Fused attention, flash style: o = softmax(scale q k^T + mask) v without a
// Tq x Tk buffer. Derivation, tiling and byte counts: docs/attention.md,
// "Fused attention".
//
// BF16 runs on the tensor cores (mma.sync m16n8k16, fp32 accumulate): a warp
// owns 16 rows; the accumulator of one product is re-packed in registers as
// the A operand of the next (scores -> probabilities -> p v). F32 runs on the
// CUDA cores, register-tiled like an SGEMM: cuda/attention_f32.cu.
// Forward: online softmax over key tiles, saves the log-sum-exp per query.
// Backward: delta_i = sum_j p_ij dp_ij (BF16: do . o, as flash attention
// does; F32: summed over the recomputed p, see cuda/attention_f32.cu); then
// one kernel per key tile for dk, dv and one per query tile for dq, each
// recomputing p from the saved log-sum-exp: no float atomics, bitwise
// repeatable results.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/error.hpp"
#include "cuda/attention_f32.cuh"
#include "cuda/attention_kernels.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::gpu {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps per block in every kernel
using attn::Args;
using attn::kLn2;
using attn::kLog2e;
using attn::kMaskThreshold;

// ---- shared row helpers ------------------------------------------------------

// The base-2 logit of (query i, key j) from the raw score s: scale*log2(e)*s
// plus the mask, or -inf where the key is removed (past Tk, causally hidden,
// mask at or below the threshold). Query rows past Tq read as removed too.
__device__ __forceinline__ float logit2(const Args& a, const float* mask_row, int i, int j, float s) {
  if (i >= a.tq || j >= a.tk || (a.causal && j > i + a.tk - a.tq)) return -INFINITY;
  float x = s * a.scale_log2;
  if (mask_row != nullptr) {
    const float m = mask_row[j];
    x += m > kMaskThreshold ? m * kLog2e : m - INFINITY;  // a NaN mask value stays NaN
  }
  return x;
}

// p from a base-2 logit and the forward's row statistics {max, 1 / sum}: the
// same arithmetic as the forward's last normalisation, so the backward's p is
// the forward's p (rebuilding it from the float32 lse would not be at logits
// of 1e4, whose ulp is 1e-3: docs/attention.md). 0 for removed keys.
__device__ __forceinline__ float prob(float x2, float2 stats) {
  return x2 == -INFINITY ? 0.f : exp2f(x2 - stats.x) * stats.y;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---- tensor-core fragments (mma.sync m16n8k16, bf16 in, f32 accumulate) ------
// A 16x16 row-major: a0 (row g, cols 2t..2t+1), a1 (row g+8), a2 (cols +8), a3.
// B 16x8, B[k][n] read from a row-major matrix M[n][k]: b0 (k 2t..2t+1, n g), b1 (k +8).
// C 16x8: c0 c1 (row g, cols 2t..2t+1), c2 c3 (row g+8).

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int stride, int r0, int c0) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const bf16* p = tile + (r0 + g) * stride + c0 + 2 * t;
  a[0] = word(p);
  a[1] = word(p + 8 * stride);
  a[2] = word(p + 8);
  a[3] = word(p + 8 * stride + 8);
}

__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* m, int stride, int n0, int k0) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const bf16* p = m + (n0 + g) * stride + k0 + 2 * t;
  b0 = word(p);
  b1 = word(p + 8);
}

// The accumulators of two adjacent 8-column tiles as the A operand (16 x 16) of the next product.
__device__ __forceinline__ void acc_as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// A fragments of 16 rows x DH straight from global memory, rows `ld`
// elements apart (rows past `rows` are zeros).
template <int DH>
__device__ void load_a_rows(uint32_t (&a)[DH / 16][4], const bf16* src, int64_t ld, int r0, int rows) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int kc = 0; kc < DH / 16; ++kc)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + g + 8 * (e & 1), c = kc * 16 + 2 * t + 8 * (e >> 1);
      a[kc][e] = r < rows ? word(src + int64_t(r) * ld + c) : 0u;
    }
}

// B[k][n] read from a row-major matrix M[k][n] (k rows): ldmatrix with
// .trans hands each lane the two k-consecutive elements of its column.
__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const bf16* m, int stride, int k0, int n0) {
  const unsigned addr =
      static_cast<unsigned>(__cvta_generic_to_shared(m + (k0 + threadIdx.x % 16) * stride + n0));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

// Rows [r0, r0 + ROWS) of a (rows, D) matrix whose rows start `ld` elements
// apart into a row-major shared tile with cp.async (global -> shared without
// registers; zero-fill past the end); the caller commits the group and waits
// before reading the tile.
template <int ROWS, int D>
__device__ void stage_rows_async(bf16* tile, int stride, const bf16* src, int64_t ld, int r0, int rows) {
  for (int idx = threadIdx.x; idx < ROWS * D / 8; idx += kThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
    const bool in = r0 + r < rows;
    const bf16* from = src + (in ? int64_t(r0 + r) * ld + c : 0);
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(tile + r * stride + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- BF16 forward ------------------------------------------------------------
// K and V tiles row-major, double-buffered: tile t + 1 loads while t computes.

template <int DH, int KB>
__global__ void __launch_bounds__(kThreads) forward_bf16_kernel(Args a) {
  constexpr int S = DH + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* buf = reinterpret_cast<bf16*>(smem);  // [2 stages][k, v][KB][S]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t bh = blockIdx.y;
  const int q_block = blockIdx.x * 64, q0 = q_block + warp * 16;
  const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
  const bf16* k = static_cast<const bf16*>(a.k) + a.kv_base(bh);
  const bf16* v = static_cast<const bf16*>(a.v) + a.kv_base(bh);
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int tile) {
    bf16* ks = buf + (tile % 2) * 2 * KB * S;
    stage_rows_async<KB, DH>(ks, S, k, a.kv_row, tile * KB, a.tk);
    stage_rows_async<KB, DH>(ks + KB * S, S, v, a.kv_row, tile * KB, a.tk);
    async_commit();
  };

  const int key_end = a.key_end(min(q_block + 64, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  if (tiles > 0) stage(0);
  uint32_t qa[DH / 16][4];
  load_a_rows<DH>(qa, q, a.q_row, q0, a.tq);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[DH / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      stage(tile + 1);
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const bf16* ks = buf + (tile % 2) * 2 * KB * S;
    const bf16* vs = ks + KB * S;
    const int n0 = tile * KB;
    float s[KB / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc)
#pragma unroll
      for (int nb = 0; nb < KB / 8; ++nb) {
        uint32_t b0, b1;
        load_b(b0, b1, ks, S, nb * 8, kc * 16);
        mma(s[nb], qa[kc], b0, b1);
      }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = logit2(a, mask_row, q0 + g + 8 * (e >> 1), n0 + nb * 8 + 2 * t + (e & 1), s[nb][e]);
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nb][e]);
      }
    float base[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], quad_max(tile_max[h]));
      base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      alpha[h] = exp2f(m[h] - base[h]);
      m[h] = m_new;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = exp2f(s[nb][e] - base[e >> 1]);
        l[e >> 1] += s[nb][e];
      }
#pragma unroll
    for (int db = 0; db < DH / 8; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[db][e] *= alpha[e >> 1];
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk) {
      uint32_t pa[4];
      acc_as_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int db = 0; db < DH / 8; ++db) {
        uint32_t b0, b1;
        load_b_trans(b0, b1, vs, S, kk * 16, db * 8);
        mma(o[db], pa, b0, b1);
      }
    }
    __syncthreads();  // the next iteration's stage() overwrites this buffer
  }
  bf16* out = static_cast<bf16*>(a.out) + a.o_base(bh);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = quad_sum(l[h]);
    const int row = q0 + g + 8 * h;
    if (row >= a.tq) continue;
    const float inv = total == 0.f ? 0.f : 1.f / total;  // a row with every key removed is zeros
#pragma unroll
    for (int db = 0; db < DH / 8; ++db)
      *reinterpret_cast<uint32_t*>(out + int64_t(row) * a.o_row + db * 8 + 2 * t) =
          pack(o[db][2 * h] * inv, o[db][2 * h + 1] * inv);
    if (t == 0) {
      a.lse[bh * a.tq + row] = total == 0.f ? -INFINITY : m[h] * kLn2 + logf(total);
      a.stats[bh * a.tq + row] = make_float2(m[h], inv);
    }
  }
}

// ---- BF16 backward -----------------------------------------------------------

// dk, dv for 64 keys (16 per warp), looping over query tiles of QB.
template <int DH, int QB>
__global__ void __launch_bounds__(kThreads) backward_dkdv_bf16_kernel(Args a) {
  constexpr int S = DH + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);  // [64][S]
  bf16* vs = ks + 64 * S;                    // [64][S]
  bf16* qs = vs + 64 * S;                    // [QB][S]
  bf16* dos = qs + QB * S;                   // [QB][S]
  float2* stat_s = reinterpret_cast<float2*>(dos + QB * S);
  float* delta_s = reinterpret_cast<float*>(stat_s + QB);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t bh = blockIdx.y;
  const int k_block = blockIdx.x * 64;
  const int64_t koff = a.kv_base(bh);
  const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
  const bf16* dout = static_cast<const bf16*>(a.dout) + a.o_base(bh);
  const float* mask_row = a.mask_row(bh);

  stage_rows_async<64, DH>(ks, S, static_cast<const bf16*>(a.k) + koff, a.kv_row, k_block, a.tk);
  stage_rows_async<64, DH>(vs, S, static_cast<const bf16*>(a.v) + koff, a.kv_row, k_block, a.tk);
  async_commit();
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  for (int m0 = a.first_query(k_block) / QB * QB; m0 < a.tq; m0 += QB) {
    __syncthreads();
    stage_rows_async<QB, DH>(qs, S, q, a.q_row, m0, a.tq);
    stage_rows_async<QB, DH>(dos, S, dout, a.o_row, m0, a.tq);
    async_commit();
    for (int r = threadIdx.x; r < QB; r += kThreads) {
      const bool in = m0 + r < a.tq;
      stat_s[r] = in ? a.stats[bh * a.tq + m0 + r] : make_float2(-INFINITY, 0.f);
      delta_s[r] = in ? a.delta[bh * a.tq + m0 + r] : 0.f;
    }
    async_wait<0>();
    __syncthreads();
    float st[QB / 8][4] = {}, dpt[QB / 8][4] = {};  // s^T and dp^T: 16 keys x QB queries
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc) {
      uint32_t ka[4], va[4];
      load_a(ka, ks, S, warp * 16, kc * 16);
      load_a(va, vs, S, warp * 16, kc * 16);
#pragma unroll
      for (int nb = 0; nb < QB / 8; ++nb) {
        uint32_t b0, b1;
        load_b(b0, b1, qs, S, nb * 8, kc * 16);
        mma(st[nb], ka, b0, b1);
        load_b(b0, b1, dos, S, nb * 8, kc * 16);
        mma(dpt[nb], va, b0, b1);
      }
    }
#pragma unroll
    for (int nb = 0; nb < QB / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int il = nb * 8 + 2 * t + (e & 1), j = k_block + warp * 16 + g + 8 * (e >> 1);
        st[nb][e] = prob(logit2(a, mask_row, m0 + il, j, st[nb][e]), stat_s[il]);
      }
#pragma unroll
    for (int kk = 0; kk < QB / 16; ++kk) {  // dv += p^T do
      uint32_t pa[4];
      acc_as_a(pa, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
      for (int db = 0; db < DH / 8; ++db) {
        uint32_t b0, b1;
        load_b_trans(b0, b1, dos, S, kk * 16, db * 8);
        mma(dv[db], pa, b0, b1);
      }
    }
#pragma unroll
    for (int nb = 0; nb < QB / 8; ++nb)  // ds^T = p^T (dp^T - delta), without the scale
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nb][e] *= dpt[nb][e] - delta_s[nb * 8 + 2 * t + (e & 1)];
#pragma unroll
    for (int kk = 0; kk < QB / 16; ++kk) {  // dk += ds^T q
      uint32_t pa[4];
      acc_as_a(pa, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
      for (int db = 0; db < DH / 8; ++db) {
        uint32_t b0, b1;
        load_b_trans(b0, b1, qs, S, kk * 16, db * 8);
        mma(dk[db], pa, b0, b1);
      }
    }
  }
  bf16* dk_out = static_cast<bf16*>(a.dk) + koff;
  bf16* dv_out = static_cast<bf16*>(a.dv) + koff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = k_block + warp * 16 + g + 8 * h;
    if (j >= a.tk) continue;
#pragma unroll
    for (int db = 0; db < DH / 8; ++db) {
      const int64_t at = int64_t(j) * a.kv_row + db * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_out + at) = pack(dk[db][2 * h] * a.scale, dk[db][2 * h + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dv_out + at) = pack(dv[db][2 * h], dv[db][2 * h + 1]);
    }
  }
}

// dq for 64 queries (16 per warp), looping over double-buffered key tiles of KB.
template <int DH, int KB>
__global__ void __launch_bounds__(kThreads) backward_dq_bf16_kernel(Args a) {
  constexpr int S = DH + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* buf = reinterpret_cast<bf16*>(smem);  // [2 stages][k, v][KB][S]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t bh = blockIdx.y;
  const int q_block = blockIdx.x * 64, q0 = q_block + warp * 16;
  const int64_t qoff = a.q_base(bh), koff = a.kv_base(bh);
  const bf16* k = static_cast<const bf16*>(a.k) + koff;
  const bf16* v = static_cast<const bf16*>(a.v) + koff;
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int tile) {
    bf16* ks = buf + (tile % 2) * 2 * KB * S;
    stage_rows_async<KB, DH>(ks, S, k, a.kv_row, tile * KB, a.tk);
    stage_rows_async<KB, DH>(ks + KB * S, S, v, a.kv_row, tile * KB, a.tk);
    async_commit();
  };
  const int key_end = a.key_end(min(q_block + 64, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  if (tiles > 0) stage(0);

  uint32_t qa[DH / 16][4], doa[DH / 16][4];
  load_a_rows<DH>(qa, static_cast<const bf16*>(a.q) + qoff, a.q_row, q0, a.tq);
  load_a_rows<DH>(doa, static_cast<const bf16*>(a.dout) + a.o_base(bh), a.o_row, q0, a.tq);
  float2 stats[2];
  float delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + g + 8 * h;
    stats[h] = row < a.tq ? a.stats[bh * a.tq + row] : make_float2(-INFINITY, 0.f);
    delta[h] = row < a.tq ? a.delta[bh * a.tq + row] : 0.f;
  }
  float dq[DH / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      stage(tile + 1);
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const bf16* ks = buf + (tile % 2) * 2 * KB * S;
    const bf16* vs = ks + KB * S;
    const int n0 = tile * KB;
    float s[KB / 8][4] = {}, dp[KB / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc)
#pragma unroll
      for (int nb = 0; nb < KB / 8; ++nb) {
        uint32_t b0, b1;
        load_b(b0, b1, ks, S, nb * 8, kc * 16);
        mma(s[nb], qa[kc], b0, b1);
        load_b(b0, b1, vs, S, nb * 8, kc * 16);
        mma(dp[nb], doa[kc], b0, b1);
      }
#pragma unroll
    for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float p = prob(logit2(a, mask_row, q0 + g + 8 * h, n0 + nb * 8 + 2 * t + (e & 1), s[nb][e]), stats[h]);
        s[nb][e] = p * (dp[nb][e] - delta[h]);  // ds without the scale
      }
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk) {
      uint32_t da[4];
      acc_as_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int db = 0; db < DH / 8; ++db) {
        uint32_t b0, b1;
        load_b_trans(b0, b1, ks, S, kk * 16, db * 8);
        mma(dq[db], da, b0, b1);
      }
    }
    __syncthreads();
  }
  bf16* dq_out = static_cast<bf16*>(a.dq) + qoff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + g + 8 * h;
    if (row >= a.tq) continue;
#pragma unroll
    for (int db = 0; db < DH / 8; ++db)
      *reinterpret_cast<uint32_t*>(dq_out + int64_t(row) * a.q_row + db * 8 + 2 * t) =
          pack(dq[db][2 * h] * a.scale, dq[db][2 * h + 1] * a.scale);
  }
}

// delta_i = sum_c do[i, c] * o[i, c], one warp per query row (rows =
// B * H * Tq, in (b, h, i) order), in F32 (BF16 path). do and o share o's strides.
template <class T>
__global__ void delta_kernel(Args a, int64_t rows, int dh) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t at = a.o_base(row / a.tq) + (row % a.tq) * a.o_row;
  const T* dout = static_cast<const T*>(a.dout) + at;
  const T* o = static_cast<const T*>(a.o) + at;
  float acc = 0.f;
  for (int c = threadIdx.x % 32; c < dh; c += 32) acc += static_cast<float>(dout[c]) * static_cast<float>(o[c]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) a.delta[row] = acc;
}

// ---- launchers ---------------------------------------------------------------

Args args_of(const AttentionLayout& l) {
  Args a{};
  a.mask = static_cast<const float*>(l.mask);
  a.mask_batch_stride = l.mask_batch_stride;
  a.heads = static_cast<int>(l.heads);
  a.tq = static_cast<int>(l.tq);
  a.tk = static_cast<int>(l.tk);
  a.causal = l.causal;
  a.scale = static_cast<float>(l.scale);
  a.scale_log2 = static_cast<float>(l.scale * 1.4426950408889634);
  a.q_batch = l.q.batch, a.q_head = l.q.head, a.q_row = l.q.row;
  a.kv_batch = l.kv.batch, a.kv_head = l.kv.head, a.kv_row = l.kv.row;
  a.o_batch = l.o.batch, a.o_head = l.o.head, a.o_row = l.o.row;
  return a;
}

dim3 grid(int64_t rows, int rows_per_block, int64_t heads_total) {
  return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(heads_total));
}

template <class Kernel>
void launch(Kernel kernel, dim3 blocks, size_t smem, const Args& a, const char* name) {
  if (smem > 48 * 1024)
    HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<blocks, kThreads, smem, stream()>>>(a);
  HG_CUDA_CHECK_LAUNCH(name);
}

// Shared memory of each BF16 kernel, in bytes.
constexpr size_t forward_smem(int dh, int kb) { return 2 * (2 * 2 * kb * (dh + 8)); }  // 2 stages of k, v
constexpr size_t dkdv_smem(int dh, int qb) { return 2 * (2 * 64 * (dh + 8) + 2 * qb * (dh + 8)) + 12 * qb; }
constexpr size_t dq_smem(int dh, int kb) { return 2 * (2 * 2 * kb * (dh + 8)); }

// Tile sizes per head dim: dh 128 halves the inner tile of the backward to
// keep its accumulators in registers.
template <int DH>
void forward_for(const Args& a, int64_t bh, bool bf16_inputs) {
  if (bf16_inputs) {
    launch(forward_bf16_kernel<DH, 64>, grid(a.tq, 64, bh), forward_smem(DH, 64), a, "attention_forward_bf16");
  } else {
    attn::forward_f32<DH>(a, bh);
  }
}

template <int DH>
void backward_for(const Args& a, int64_t bh, bool bf16_inputs) {
  constexpr int kInner = DH == 128 ? 32 : 64;
  if (bf16_inputs) {
    launch(backward_dkdv_bf16_kernel<DH, kInner>, grid(a.tk, 64, bh), dkdv_smem(DH, kInner), a,
           "attention_backward_dkdv_bf16");
    launch(backward_dq_bf16_kernel<DH, kInner>, grid(a.tq, 64, bh), dq_smem(DH, kInner), a,
           "attention_backward_dq_bf16");
  } else {
    attn::backward_f32<DH>(a, bh);  // its dq kernel writes delta
  }
}

template <class Fn>
void by_head_dim(int64_t dh, Fn&& fn) {
  switch (dh) {
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
  }
  fail("attention", "head dim ", dh, " has no fused CUDA kernel: allowed 32, 64, 128");
}

// Every 16-byte load of the kernels starts at a base pointer plus whole
// strides plus a multiple of 16 bytes: base and strides must keep that.
void check_aligned(const void* p, const char* name, const char* op) {
  HG_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, op, name,
           " does not start on a 16-byte boundary; the fused kernel reads 16 bytes at a time (pass a contiguous copy)");
}

void check_strides(const HeadStrides& s, const char* name, DType dtype, const char* op) {
  const int64_t elt = dtype == DType::BF16 ? 2 : 4;
  for (const int64_t v : {s.batch, s.head, s.row})
    HG_CHECK(v * elt % 16 == 0, op, name, " strides (batch ", s.batch, ", head ", s.head, ", row ", s.row,
             " elements) are not all multiples of 16 bytes; the fused kernel reads 16 bytes at a time");
}

void check_sizes(const AttentionLayout& l, DType dtype, const char* op) {
  constexpr int64_t kMax = int64_t(1) << 30;
  HG_CHECK(l.tq < kMax && l.tk < kMax && l.heads_total() < 65536, op, "Tq ", l.tq, ", Tk ", l.tk, ", B*H ",
           l.heads_total(), " exceed the fused kernel's grid (T < 2^30, B*H < 65536)");
  HG_CHECK(dtype == DType::F32 || dtype == DType::BF16, op, "dtype ", dtype_name(dtype),
           " has no fused CUDA kernel (F32, BF16)");
  check_strides(l.q, "q", dtype, op);
  check_strides(l.kv, "k/v", dtype, op);
  check_strides(l.o, "o", dtype, op);
}

}  // namespace

void attention_forward(DType dtype, const void* q, const void* k, const void* v, const AttentionLayout& layout,
                       void* out, Tensor& lse, Tensor& stats) {
  const char* op = "attention_forward";
  check_sizes(layout, dtype, op);
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {out, "o"}})
    check_aligned(p, name, op);
  Args a = args_of(layout);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse.data<float>();
  a.stats = reinterpret_cast<float2*>(stats.data<float>());
  const bool bf16_inputs = dtype == DType::BF16;
  by_head_dim(layout.head_dim, [&](auto dh) { forward_for<decltype(dh)::value>(a, layout.heads_total(), bf16_inputs); });
}

void attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v, const void* o,
                        const Tensor& stats, const AttentionLayout& layout, void* dq, void* dk, void* dv) {
  const char* op = "attention_backward";
  check_sizes(layout, dtype, op);
  for (const auto& [p, name] : {std::pair<const void*, const char*>{dout, "dout"}, {q, "q"}, {k, "k"}, {v, "v"},
                                {o, "o"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}})
    check_aligned(p, name, op);
  Tensor delta = Tensor::empty({layout.heads_total() * layout.tq}, DType::F32, Device::CUDA);
  const int64_t rows = layout.heads_total() * layout.tq;
  const bool bf16_inputs = dtype == DType::BF16;
  Args a = args_of(layout);
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.dout = dout;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.stats = reinterpret_cast<float2*>(stats.data<float>());
  a.delta = delta.data<float>();
  if (bf16_inputs) {  // F32 sums delta inside its dq kernel
    delta_kernel<bf16><<<static_cast<unsigned>((rows + 3) / 4), kThreads, 0, stream()>>>(
        a, rows, static_cast<int>(layout.head_dim));
    HG_CUDA_CHECK_LAUNCH("attention_delta");
  }
  by_head_dim(layout.head_dim,
              [&](auto dh) { backward_for<decltype(dh)::value>(a, layout.heads_total(), bf16_inputs); });
}

}  // namespace hg::gpu
