// Fused attention, flash style: o = softmax(scale q k^T + mask) v without a
// Tq x Tk buffer. Derivation, tiling and byte counts: docs/attention.md,
// "Fused attention".
//
// BF16 runs on the tensor cores (mma.sync m16n8k16, fp32 accumulate): a warp
// owns 32 rows (docs/attention.md, "tiling"); the accumulator of one product is re-packed in registers as
// the A operand of the next (scores -> probabilities -> p v). F32 runs on the
// CUDA cores, register-tiled like an SGEMM: cuda/attention_f32.cu.
// Forward: online softmax over key tiles, saves the log-sum-exp per query.
// Backward: delta_i = sum_j p_ij dp_ij (BF16: do . o, as flash attention
// does; F32: summed over the recomputed p, see cuda/attention_f32.cu); then
// one kernel per key tile for dk, dv and one per query tile for dq, each
// recomputing p from the saved log-sum-exp: no float atomics, bitwise
// repeatable results. Which tiles each head dim runs: the configuration
// tables in the launcher section (kBf16Forward, kBf16Backward). On a
// compute capability 9.0 GPU the BF16 forward and the backward after delta
// are cuda/attention_wgmma.cu (wgmma + TMA) where
// cuda/attention_dispatch.hpp's rules allow them; the backward storing ds
// falls back to recomputing it where its scratch finds no memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <optional>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/attention_dispatch.hpp"
#include "cuda/attention_f32.cuh"
#include "cuda/attention_kernels.hpp"
#include "cuda/attention_row_math.cuh"
#include "cuda/attention_wgmma.cuh"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"
#include "cuda/side_stream.hpp"

namespace hg::gpu {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps per block in every kernel
using attn::Args;
using attn::exp2_approx;
using attn::kLn2;
using attn::mask_term;
using attn::pack;
using attn::quad_max;
using attn::quad_sum;

// ---- shared row functions ----------------------------------------------------

// The base-2 logit of (query i, key j) from the raw score s: scale*log2(e)*s
// plus the mask, or -inf where the key is removed (past Tk, causally hidden,
// mask at or below the threshold). Query rows past Tq read as removed too.
__device__ __forceinline__ float logit2(const Args& a, const float* mask_row, int i, int j, float s) {
  if (i >= a.tq || j >= a.tk || (a.causal && j > i + a.tk - a.tq)) return -INFINITY;
  float x = s * a.scale_log2;
  return mask_row == nullptr ? x : x + mask_term(mask_row[j]);
}

// p from a base-2 logit and the forward's row statistics {max, 1 / sum}: the
// same arithmetic as the forward's last normalisation, so the backward's p is
// the forward's p (rebuilding it from the float32 lse would not be at logits
// of 1e4, whose ulp is 1e-3: docs/attention.md). 0 for removed keys.
__device__ __forceinline__ float prob(float x2, float2 stats) {
  return x2 == -INFINITY ? 0.f : exp2f(x2 - stats.x) * stats.y;
}

// ---- tensor-core fragments (mma.sync m16n8k16, bf16 in, f32 accumulate) ------
// A 16x16 row-major: a0 (row g, cols 2t..2t+1), a1 (row g+8), a2 (cols +8), a3.
// B 16x8, B[k][n]: b0 (k 2t..2t+1, n g), b1 (k +8).
// C 16x8: c0 c1 (row g, cols 2t..2t+1), c2 c3 (row g+8).
// Operands come from shared memory by ldmatrix.x4 (four 8x8 matrices, lane
// l addresses row l % 8 of matrix l / 8 and receives row l / 4, elements
// 2 (l % 4) and + 1 of each; .trans: column l / 4, rows 2 (l % 4) and + 1).
// Tiles are row-major with rows DH + 8 elements apart: the 8 rows of one
// matrix start 16 bytes apart modulo 128, so no bank conflicts.

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc[mt][n] and acc[mt][n + 1] += a[mt] B for every m tile, B the two
// 8-column fragments of one ldmatrix.x4 (b0 b1, then b2 b3).
template <int MT, int NB>
__device__ __forceinline__ void mma_x2(float (&acc)[MT][NB][4], const uint32_t (&a)[MT][4], const uint32_t (&b)[4],
                                       int n) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    mma(acc[mt][n], a[mt], b[0], b[1]);
    mma(acc[mt][n + 1], a[mt], b[2], b[3]);
  }
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_trans(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// mma_x2 with the two B fragments of one ldmatrix.x4 at `addr` (of M[n][k]: lane_nk).
template <int MT, int NB>
__device__ __forceinline__ void ldsm_mma_x2(float (&acc)[MT][NB][4], const uint32_t (&a)[MT][4], unsigned addr, int n) {
  uint32_t b[4];
  ldsm(b, addr);
  mma_x2(acc, a, b, n);
}

// Byte offset of this lane's ldmatrix row in a tile of row stride S for the
// 16x16 block at the tile's origin (add the block's own offset):
// - lane_rc: rows l % 16, cols 8 (l / 16). ldsm gives the A fragment of
//   M[r][c]; ldsm_trans on M[k][n] gives b0, b1 of columns n..n+7, then of n+8..n+15.
// - lane_nk: rows l % 8 + 8 (l / 16), cols 8 (l / 8 % 2). ldsm on M[n][k]
//   (B[k][n] = M[n][k]) gives b0, b1 of columns n..n+7, then of n+8..n+15.
template <int S>
__device__ __forceinline__ unsigned lane_rc() {
  const int l = threadIdx.x % 32;
  return 2u * ((l % 16) * S + 8 * (l / 16));
}
template <int S>
__device__ __forceinline__ unsigned lane_nk() {
  const int l = threadIdx.x % 32;
  return 2u * ((l % 8 + 8 * (l / 16)) * S + 8 * (l / 8 % 2));
}
// Byte offset of element (r, c) in a tile of row stride S.
template <int S>
constexpr unsigned at(int r, int c) {
  return 2u * unsigned(r * S + c);
}

// The backward's two products over one 16-wide chunk kc of dh that share
// their B layout: acc_a += a B_a and acc_b += b B_b, B_x[k][n] = M_x[n][k]
// with M_x at tile_x (address + lane_nk, row stride S), every n block.
template <int S, int MT, int NB>
__device__ __forceinline__ void ldsm_mma_pair(float (&acc_a)[MT][NB][4], const uint32_t (&a)[MT][4], unsigned tile_a,
                                              float (&acc_b)[MT][NB][4], const uint32_t (&b)[MT][4], unsigned tile_b,
                                              int kc) {
#pragma unroll
  for (int nb = 0; nb < NB; nb += 2) {
    ldsm_mma_x2(acc_a, a, tile_a + at<S>(nb * 8, kc * 16), nb);
    ldsm_mma_x2(acc_b, b, tile_b + at<S>(nb * 8, kc * 16), nb);
  }
}

// The accumulators of two adjacent 8-column tiles as the A operand (16 x 16) of the next product.
__device__ __forceinline__ void acc_as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// acc[2][N / 8] += A B over DH: A the warp's two m16 tiles of a row-major
// shared tile (`a_tile` = their address + lane_rc), B[k][n] = M[n][k] with M
// a row-major [N][DH] shared tile (`m_tile` = its address + lane_nk). The
// loop over k is unrolled kUnroll times: fewer fragments in flight than a
// full unroll (dq dh 128 with 32-key tiles spills at 8, not at 4).
template <int DH, int N, int S, int kUnroll = 1>
__device__ __forceinline__ void mma_nk_tile(float (&acc)[2][N / 8][4], unsigned a_tile, unsigned m_tile) {
#pragma unroll kUnroll
  for (int kc = 0; kc < DH / 16; ++kc) {
    uint32_t af[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ldsm(af[mt], a_tile + at<S>(16 * mt, 16 * kc));
#pragma unroll
    for (int nb = 0; nb < N / 8; nb += 2) ldsm_mma_x2(acc, af, m_tile + at<S>(nb * 8, kc * 16), nb);
  }
}

// acc[MT][N / 8] += P M over K: P the accumulators p[MT][K / 8] re-packed as
// bf16 A operands, M a row-major [K][N] shared tile read with ldmatrix.trans
// (`tile` = its address + lane_rc).
template <int MT, int K, int N, int S>
__device__ __forceinline__ void mma_acc_tile(float (&acc)[MT][N / 8][4], const float (&p)[MT][K / 8][4],
                                             unsigned tile) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc_as_a(pa[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
    for (int db = 0; db < N / 8; db += 2) {
      uint32_t b[4];
      ldsm_trans(b, tile + at<S>(kk * 16, db * 8));
      mma_x2(acc, pa, b, db);
    }
  }
}

// acc[MT][N / 8] += A B over K with both operands in shared memory (row
// strides SA, SB). A: MT m16 tiles of a row-major [M][K] tile read with
// ldmatrix (`a_tile` = their address + lane_rc<SA>). B: a row-major [K][N]
// tile read with ldmatrix.trans (`b_tile` = the address of its first column
// + lane_rc<SB>).
template <int MT, int K, int N, int SA, int SB>
__device__ __forceinline__ void mma_smem_tile(float (&acc)[MT][N / 8][4], unsigned a_tile, unsigned b_tile) {
#pragma unroll K / 16
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldsm(af[mt], a_tile + at<SA>(16 * mt, 16 * kk));
#pragma unroll
    for (int nb = 0; nb < N / 8; nb += 2) {
      uint32_t b[4];
      ldsm_trans(b, b_tile + at<SB>(16 * kk, 8 * nb));
      mma_x2(acc, af, b, nb);
    }
  }
}

// Rows [r0, r0 + ROWS) of a (rows, D) matrix whose rows start `ld` elements
// apart into a row-major shared tile of row stride S with cp.async (global ->
// shared without registers; zero-fill past the end); the caller commits the
// group and waits before reading the tile.
// Thread x copies the 16-byte chunk x % (D / 8) of rows x / (D / 8) + i kPass
// (a constant shared offset and one pointer step each: ~3 instructions per
// cp.async, where a loop starting at threadIdx.x cannot be unrolled and takes
// ~25), and a tile wholly inside the source skips the bounds tests. `tile` is
// a shared byte address; NT threads per block.
template <int ROWS, int D, int S, int NT = kThreads>
__device__ __forceinline__ void stage_tile_async(unsigned tile, const bf16* src, int64_t ld, int r0, int rows) {
  constexpr int kChunks = D / 8, kPass = NT / kChunks;
  static_assert(NT % kChunks == 0 && ROWS % kPass == 0, "a tile is whole passes of rows");
  const int r = threadIdx.x / kChunks, c = threadIdx.x % kChunks * 8;
  const bf16* from = src + int64_t(r0 + r) * ld + c;
  const unsigned to = tile + at<S>(r, c);
  if (r0 + ROWS <= rows) {
#pragma unroll
    for (int i = 0; i < ROWS / kPass; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to + at<S>(i * kPass, 0)),
                   "l"(from + i * kPass * ld));
  } else {
#pragma unroll
    for (int i = 0; i < ROWS / kPass; ++i) {
      const bool in = r0 + r + i * kPass < rows;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to + at<S>(i * kPass, 0)),
                   "l"(in ? from + i * kPass * ld : src), "r"(in ? 16 : 0));
    }
  }
}

// stage_tile_async of a row-major shared tile of row stride S.
template <int ROWS, int D, int S>
__device__ __forceinline__ void stage_rows(bf16* tile, const bf16* src, int64_t ld, int r0, int rows) {
  stage_tile_async<ROWS, D, S>(smem_addr(tile), src, ld, r0, rows);
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- BF16 forward ------------------------------------------------------------
// 128 query rows per block, 32 per warp (two m16 tiles: each K or V fragment
// read from shared memory feeds two mma). K and V tiles of KB keys are
// double-buffered with cp.async and one barrier per tile. Q sits in shared
// memory; with kQRegs its fragments move to registers once (DH <= 64; at 128
// they would not fit beside the 128 accumulators). Tiles that no causal
// diagonal, key-padding mask or end of Tk crosses (and a positive scale) skip
// logit2: p = exp2(s * scale log2(e) - m) in one fma. Unmasked edge tiles are
// bounded per row rather than through logit2 (the same logits), and the fast
// tile compiles apart from the edge tiles (docs/attention.md, "Forward").

constexpr int kRowsBf16 = 128;  // query rows per forward / dq block

// The block's tile index along the query axis: causal blocks with the most
// keys (the last queries) start first, so the short ones fill the tail.
__device__ __forceinline__ int heavy_first(const Args& a) { return a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x; }

// Whether key tile [n0, n0 + KB) needs the per-element logit2 for queries
// [q0, q_end): the mask, the end of Tk, a causal diagonal or a scale <= 0.
__device__ __forceinline__ bool exact_tile(const Args& a, const float* mask_row, int q0, int n0, int kb) {
  return mask_row != nullptr || !(a.scale_log2 > 0.f) || n0 + kb > a.tk || (a.causal && n0 + kb - 1 > q0 + a.tk - a.tq);
}

// The online softmax's rescale of row g + 8 h of one m tile: its partial sum
// l[h] and output accumulators o times alpha.
template <int N>
__device__ __forceinline__ void rescale_row(float (&o)[N][4], float (&l)[2], int h, float alpha) {
  l[h] *= alpha;
#pragma unroll
  for (int db = 0; db < N; ++db) o[db][2 * h] *= alpha, o[db][2 * h + 1] *= alpha;
}

// The forward rescales its output accumulators only when a tile's max passes
// the row's reference max by more than kLazyRescaleLog2: the same softmax,
// with p up to 2^8 in between, and most tiles skip the rescale.
constexpr float kLazyRescaleLog2 = 8.f;

template <int DH, int KB, bool kQRegs>
__global__ void __launch_bounds__(kThreads) forward_bf16_kernel(Args a) {
  constexpr int S = DH + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // [kRowsBf16][S]
  bf16* buf = qs + kRowsBf16 * S;            // [2 stages][k, v][KB][S]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t bh = blockIdx.y;
  const int q_block = heavy_first(a) * kRowsBf16, q0 = q_block + warp * 32;
  const bf16* k = static_cast<const bf16*>(a.k) + a.kv_base(bh);
  const bf16* v = static_cast<const bf16*>(a.v) + a.kv_base(bh);
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int tile) {
    bf16* ks = buf + (tile % 2) * 2 * KB * S;
    stage_tile_async<KB, DH, S>(smem_addr(ks), k, a.kv_row, tile * KB, a.tk);
    stage_tile_async<KB, DH, S>(smem_addr(ks + KB * S), v, a.kv_row, tile * KB, a.tk);
    async_commit();
  };
  const unsigned q_at = smem_addr(qs) + at<S>(warp * 32, 0) + lane_rc<S>();
  const unsigned k_lane = lane_nk<S>(), v_lane = lane_rc<S>();

  const int key_end = a.key_end(min(q_block + kRowsBf16, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  uint32_t qa[2][kQRegs ? DH / 16 : 1][4];
  if (tiles > 0) {
    const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
    stage_tile_async<kRowsBf16, DH, S>(smem_addr(qs), q, a.q_row, q_block, a.tq);
    stage(0);
    if constexpr (kQRegs) {
      async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int kc = 0; kc < DH / 16; ++kc) ldsm(qa[mt][kc], q_at + at<S>(16 * mt, 16 * kc));
    }
  }
  float m[2][2], l[2][2] = {};  // [m tile][row g, g + 8]: running base-2 max and partial sum
  float o[2][DH / 8][4] = {};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) m[mt][0] = m[mt][1] = -INFINITY;
  for (int tile = 0; tile < tiles; ++tile) {
    async_wait<0>();
    __syncthreads();  // tile visible to all; every warp is done with the buffer stage() refills next
    if (tile + 1 < tiles) stage(tile + 1);
    const int n0 = tile * KB;
    const unsigned ks = smem_addr(buf + (tile % 2) * 2 * KB * S), vs = ks + at<S>(KB, 0);
    // s = q k^T, the online softmax, o += p v. `exact`: the logits through
    // logit2, or through one bound per row with `bounds` (no mask: the causal
    // diagonal and Tk).
    auto tile_step = [&](bool exact, bool bounds) {
      float s[2][KB / 8][4] = {};
#pragma unroll
      for (int kc = 0; kc < DH / 16; ++kc) {
        uint32_t qf[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if constexpr (kQRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qf[mt][e] = qa[mt][kc][e];
          } else {
            ldsm(qf[mt], q_at + at<S>(16 * mt, 16 * kc));
          }
        }
#pragma unroll
        for (int nb = 0; nb < KB / 8; nb += 2) ldsm_mma_x2(s, qf, ks + k_lane + at<S>(nb * 8, kc * 16), nb);
      }
      // Row maxima: of the base-2 logits (exact tiles) or of the raw scores,
      // scaled after (c > 0 keeps the order and the rounding is monotonic).
      const float c = exact ? 1.f : a.scale_log2;
      float tile_max[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        tile_max[mt][0] = tile_max[mt][1] = -INFINITY;
        if (bounds) {
          // logit2 without a mask: the causal diagonal and Tk bound each row's
          // keys (a row past Tq keeps its keys, as on fast tiles: never written).
          const int lane_col = n0 + 2 * t, tail = a.tk - lane_col;
          const int diag = a.causal ? q0 + 16 * mt + g + 1 + a.tk - a.tq - lane_col : tail;
#pragma unroll
          for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][nb][e] =
                  nb * 8 + (e & 1) < min(tail, diag + 8 * (e >> 1)) ? s[mt][nb][e] * a.scale_log2 : -INFINITY;
        } else if (exact) {
#pragma unroll
          for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][nb][e] =
                  logit2(a, mask_row, q0 + 16 * mt + g + 8 * (e >> 1), n0 + nb * 8 + 2 * t + (e & 1), s[mt][nb][e]);
        }
#pragma unroll
        for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) tile_max[mt][e >> 1] = fmaxf(tile_max[mt][e >> 1], s[mt][nb][e]);
      }
      float neg_base[2][2];
      // m is the reference max p is taken against, not the running max: it
      // moves (and o, l with it) only when some row's tile max passes it by
      // more than kLazyRescaleLog2. The test needs no shuffle (m is the same
      // in the row's four lanes), and a warp decides once for its 32 rows.
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) grow |= tile_max[mt][h] * c > m[mt][h] + kLazyRescaleLog2;
      if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float m_new = fmaxf(m[mt][h], quad_max(tile_max[mt][h]) * c);
            rescale_row(o[mt], l[mt], h, exp2_approx(m[mt][h] - (m_new == -INFINITY ? 0.f : m_new)));
            m[mt][h] = m_new;
          }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) neg_base[mt][h] = m[mt][h] == -INFINITY ? 0.f : -m[mt][h];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nb = 0; nb < KB / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nb][e] = exp2_approx(fmaf(s[mt][nb][e], c, neg_base[mt][e >> 1]));
            l[mt][e >> 1] += s[mt][nb][e];
          }
      mma_acc_tile<2, KB, DH, S>(o, s, vs + v_lane);
    };
    if (!exact_tile(a, mask_row, q_block, n0,
                    KB)) {  // a copy of its own for the fast tile: no register moves where paths merge
      tile_step(false, false);
    } else {
      tile_step(true, mask_row == nullptr);
    }
  }
  bf16* out = static_cast<bf16*>(a.out) + a.o_base(bh);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float total = quad_sum(l[mt][h]);
      const int row = q0 + 16 * mt + g + 8 * h;
      if (row >= a.tq) continue;
      const float inv = total == 0.f ? 0.f : 1.f / total;  // a row with every key removed is zeros
#pragma unroll
      for (int db = 0; db < DH / 8; ++db)
        *reinterpret_cast<uint32_t*>(out + int64_t(row) * a.o_row + db * 8 + 2 * t) =
            pack(o[mt][db][2 * h] * inv, o[mt][db][2 * h + 1] * inv);
      if (t == 0) {
        a.lse[bh * a.tq + row] = total == 0.f ? -INFINITY : m[mt][h] * kLn2 + logf(total);
        a.stats[bh * a.tq + row] = make_float2(m[mt][h], inv);
      }
    }
}

// ---- BF16 backward -----------------------------------------------------------
// p is rebuilt from the forward's stats {m, 1 / l}: exact tiles through
// logit2 and prob(), the others as exp2(s * scale log2(e) - m) / l in one fma.
// Rows past Tq read stats {0, 0} and zero q, do: their p and ds are 0.

__device__ __forceinline__ float prob_fast(float s, float c, float2 stats) {
  return exp2_approx(fmaf(s, c, -stats.x)) * stats.y;
}

// Calls a backward kernel's sub_tile(exact, bounds) for one tile, from one
// call site per tile kind, so that the fast tile compiles apart from the
// edge tiles (no merge of their registers); unmasked edge tiles take the
// per-row bounds.
template <class SubTile>
__device__ __forceinline__ void run_sub_tile(SubTile& sub_tile, bool exact, bool no_mask) {
  if (!exact) {
    sub_tile(false, false);
  } else {
    sub_tile(true, no_mask);
  }
}

// cp.async of `bytes` (4, 8 or 16) bytes, zero-filled where `in` is false.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* to, const void* from, bool in) {
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(to)), "l"(from), "r"(in ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(to)), "l"(from), "n"(kBytes),
                 "r"(in ? kBytes : 0));
  }
}

// fn(i, n, h, row) for this lane's accumulator pairs [i][n][2 h], [2 h + 1]
// of MT x NB m16n8 tiles whose row, row0 + 16 i + g + 8 h, is below `rows`.
template <int MT, int NB, class Fn>
__device__ __forceinline__ void each_acc_pair(int row0, int rows, Fn&& fn) {
  const int g = (threadIdx.x % 32) / 4;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * i + g + 8 * h;
      if (row >= rows) continue;
#pragma unroll
      for (int n = 0; n < NB; ++n) fn(i, n, h, row);
    }
}

// Query rows [m0, m0 + QB) of one head into one stage of a dk/dv kernel
// (blocks of NT threads, NT >= QB): q and do as [QB][DH + 8] tiles, then the
// rows' stats (QB float2) and delta (QB float); zeros past Tq. The caller
// commits the group.
template <int NT, int QB, int DH>
__device__ __forceinline__ void stage_queries(unsigned char* stage, const Args& a, const bf16* q, const bf16* dout,
                                              int bh, int m0) {
  constexpr int S = DH + 8;
  bf16* qs = reinterpret_cast<bf16*>(stage);
  stage_tile_async<QB, DH, S, NT>(smem_addr(qs), q, a.q_row, m0, a.tq);
  stage_tile_async<QB, DH, S, NT>(smem_addr(qs + QB * S), dout, a.o_row, m0, a.tq);
  float2* stat_s = reinterpret_cast<float2*>(qs + 2 * QB * S);
  float* delta_s = reinterpret_cast<float*>(stat_s + QB);
  auto stage_row_stats = [&](int r) {
    const bool in = m0 + r < a.tq;
    const int64_t at_row = in ? int64_t(bh) * a.tq + m0 + r : 0;
    copy_async<8>(stat_s + r, a.stats + at_row, in);
    copy_async<4>(delta_s + r, a.delta + at_row, in);
  };
  if (threadIdx.x < QB) stage_row_stats(threadIdx.x);
}

// p^T from s^T in place: rows are keys j0 + 16 mt + g (+ 8), columns queries
// m0 + 8 nb + 2 t (+ 1) (`stat_s`: the stats of query m0 on). `exact`: p
// through logit2, or with `bounds` (no mask) through one key bound per row:
// Tk and the causal diagonal; else prob_fast.
template <int MT, int QS>
__device__ __forceinline__ void probs_t(float (&st)[MT][QS / 8][4], const Args& a, const float* mask_row, int j0,
                                        int m0, const float2* stat_s, bool exact, bool bounds) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  auto each = [&](auto&& p_of) {  // st[mt][nb][e] = p_of(st[mt][nb][e], mt, nb, e)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nb = 0; nb < QS / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][nb][e] = p_of(st[mt][nb][e], mt, nb, e);
  };
  if (bounds) {
    // Key j = j0 + 16 mt + g + 8 h (the row), query i = m0 + 8 nb + 2 t + (e & 1):
    // kept while j < Tk and j <= i + Tk - Tq. Rows of queries past Tq
    // have zero q and stats: p = 0 as on fast tiles.
    const int tail = a.tk - j0 - g;
    const int diag = a.causal ? m0 + 2 * t + 1 + a.tk - a.tq - j0 - g : tail;
    each([&](float s, int mt, int nb, int e) {
      return 16 * mt + 8 * (e >> 1) < min(tail, diag + 8 * nb + (e & 1))
                 ? prob_fast(s, a.scale_log2, stat_s[nb * 8 + 2 * t + (e & 1)])
                 : 0.f;
    });
  } else if (exact) {
    each([&](float s, int mt, int nb, int e) {
      const int il = nb * 8 + 2 * t + (e & 1), j = j0 + 16 * mt + g + 8 * (e >> 1);
      return prob(logit2(a, mask_row, m0 + il, j, s), stat_s[il]);
    });
  } else {
    each([&](float s, int, int nb, int e) { return prob_fast(s, a.scale_log2, stat_s[nb * 8 + 2 * t + (e & 1)]); });
  }
}

// A warp's dk (times the scale) and dv accumulators to bf16: keys j0 + 16 mt
// + g (+ 8) below Tk, dims col0 + 8 nb + 2 t (+ 1), with k's strides.
template <int MT, int NB>
__device__ __forceinline__ void write_dkdv(const Args& a, int64_t koff, const float (&dk)[MT][NB][4],
                                           const float (&dv)[MT][NB][4], int j0, int col0) {
  const int t = threadIdx.x % 4;
  bf16* dk_out = static_cast<bf16*>(a.dk) + koff;
  bf16* dv_out = static_cast<bf16*>(a.dv) + koff;
  each_acc_pair<MT, NB>(j0, a.tk, [&](int mt, int nb, int h, int j) {
    const int64_t at_j = int64_t(j) * a.kv_row + col0 + nb * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(dk_out + at_j) = pack(dk[mt][nb][2 * h] * a.scale, dk[mt][nb][2 * h + 1] * a.scale);
    *reinterpret_cast<uint32_t*>(dv_out + at_j) = pack(dv[mt][nb][2 * h], dv[mt][nb][2 * h + 1]);
  });
}

// dk, dv for 16 * MT * 4 keys: a warp owns 16 * MT keys (MT m16 tiles) and their
// dk, dv accumulators while it sweeps the query tiles of QB rows (q, do,
// stats, delta double-buffered with cp.async; computed QS rows at a time).
// K and V fragments stay in registers with kKVRegs, else are re-read from
// shared memory per tile. Unmasked edge tiles are bounded per row, and fast
// and edge tiles compile apart (as in the forward).
template <int DH, int QB, int QS, int MT, bool kKVRegs>
__global__ void __launch_bounds__(kThreads) backward_dkdv_bf16_kernel(Args a) {
  constexpr int NT = kThreads, S = DH + 8, kKeys = 16 * MT * 4;
  static_assert(QB <= NT, "stage_queries: a thread per query row's stats");
  constexpr int kStage = 2 * QB * S * 2 + QB * 12;  // bytes of one stage: q, do, stats, delta
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                                  // [kKeys][S]
  bf16* vs = ks + kKeys * S;                                                 // [kKeys][S]
  unsigned char* stages = reinterpret_cast<unsigned char*>(vs + kKeys * S);  // [2][q, do [QB][S]; stats; delta]
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
  const int bh = blockIdx.y, kt = blockIdx.x;
  const int k_block = kt * kKeys, j0 = k_block + warp * 16 * MT;
  const int64_t koff = a.kv_base(bh);
  const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
  const bf16* dout = static_cast<const bf16*>(a.dout) + a.o_base(bh);
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int m0, int which) {
    stage_queries<NT, QB, DH>(stages + which * kStage, a, q, dout, bh, m0);
    async_commit();
  };

  const int q_first = a.first_query(k_block), m_first = q_first / QB * QB;
  const int tiles = m_first < a.tq ? (a.tq - m_first + QB - 1) / QB : 0;
  auto m_of = [&](int tile) { return m_first + tile * QB; };
  stage_tile_async<kKeys, DH, S>(smem_addr(ks), static_cast<const bf16*>(a.k) + koff, a.kv_row, k_block, a.tk);
  stage_tile_async<kKeys, DH, S>(smem_addr(vs), static_cast<const bf16*>(a.v) + koff, a.kv_row, k_block, a.tk);
  if (tiles > 0) stage(m_of(0), 0);
  else async_commit();
  const unsigned kv_at = smem_addr(ks) + at<S>(warp * 16 * MT, 0) + lane_rc<S>(), v_off = at<S>(kKeys, 0);
  const unsigned nk_lane = lane_nk<S>(), rc_lane = lane_rc<S>();
  uint32_t ka[MT][kKVRegs ? DH / 16 : 1][4], va[MT][kKVRegs ? DH / 16 : 1][4];
  if constexpr (kKVRegs) {
    async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kc = 0; kc < DH / 16; ++kc) {
        ldsm(ka[mt][kc], kv_at + at<S>(16 * mt, 16 * kc));
        ldsm(va[mt][kc], kv_at + v_off + at<S>(16 * mt, 16 * kc));
      }
  }
  float dk[MT][DH / 8][4] = {}, dv[MT][DH / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    const int m_tile = m_of(tile);
    async_wait<0>();
    __syncthreads();  // stage visible to all; every warp is done with the one stage() refills next
    if (tile + 1 < tiles) stage(m_of(tile + 1), (tile + 1) % 2);
    const bf16* qs_ptr = reinterpret_cast<const bf16*>(stages + (tile % 2) * kStage);
#pragma unroll 1
    for (int sub = 0; sub < QB / QS; ++sub) {  // QS queries at a time
      const int m0 = m_tile + sub * QS;
      if (QS < QB && m0 + QS <= q_first) continue;  // all above the causal end
      if (QS < QB && m0 >= a.tq) break;
      const unsigned qs = smem_addr(qs_ptr) + at<S>(sub * QS, 0), dos = qs + at<S>(QB, 0);
      const float2* stat_s = reinterpret_cast<const float2*>(qs_ptr + 2 * QB * S) + sub * QS;
      const float* delta_s = reinterpret_cast<const float*>(stat_s + (QB - sub * QS)) + sub * QS;
      // One query sub-tile. `exact`: p through logit2, or with `bounds` (no
      // mask) through one key bound per row: Tk and the causal diagonal.
      auto sub_tile = [&](bool exact, bool bounds) {
        float st[MT][QS / 8][4] = {}, dpt[MT][QS / 8][4];  // s^T and dp^T: 16 keys x QS queries per m tile
        // dp^T's accumulators start at -delta, so the products leave dp^T - delta
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nb = 0; nb < QS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) dpt[mt][nb][e] = -delta_s[nb * 8 + 2 * t + (e & 1)];
#pragma unroll
        for (int kc = 0; kc < DH / 16; ++kc) {
          uint32_t kf[MT][4], vf[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if constexpr (kKVRegs) {
#pragma unroll
              for (int e = 0; e < 4; ++e) kf[mt][e] = ka[mt][kc][e], vf[mt][e] = va[mt][kc][e];
            } else {
              ldsm(kf[mt], kv_at + at<S>(16 * mt, 16 * kc));
              ldsm(vf[mt], kv_at + v_off + at<S>(16 * mt, 16 * kc));
            }
          }
          ldsm_mma_pair<S>(st, kf, qs + nk_lane, dpt, vf, dos + nk_lane, kc);
        }
        probs_t<MT, QS>(st, a, mask_row, j0, m0, stat_s, exact, bounds);
        mma_acc_tile<MT, QS, DH, S>(dv, st, dos + rc_lane);  // dv += p^T do
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)  // ds^T = p^T (dp^T - delta), without the scale
#pragma unroll
          for (int nb = 0; nb < QS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[mt][nb][e] *= dpt[mt][nb][e];
        mma_acc_tile<MT, QS, DH, S>(dk, st, qs + rc_lane);  // dk += ds^T q
      };
      run_sub_tile(sub_tile, exact_tile(a, mask_row, m0, k_block, kKeys), mask_row == nullptr);
    }
  }
  if (tiles == 0) async_wait<0>();  // no tile waited for the k, v copies
  write_dkdv(a, koff, dk, dv, j0, 0);
}

// dk, dv for 128 keys at dh 128 with 8 warps: p^T and ds^T pass through
// shared memory so that each phase splits the work its own way
// (docs/attention.md, "Eight-warp dk/dv"). Per query tile of QB = 64
// (q, do, stats, delta double-buffered as in backward_dkdv_bf16_kernel):
// - phase 1, warps 4 (keys) x 2 (queries) of 32 x 32: s^T = k q^T, p^T,
//   dp^T - delta = v do^T - delta (p as backward_dkdv_bf16_kernel's),
//   ds^T = p^T (dp^T - delta); p^T and ds^T to shared memory in bf16;
// - phase 2, warps 2 (keys) x 4 (dims) of 64 x 32: dv += p^T do, dk += ds^T q.
// Warps 4 h .. 4 h + 3 own keys 64 h .. 64 h + 63 in both phases.
// Barriers: the tile's first (stage visible, phase 2 of the last tile done
// with p^T, ds^T and the stage refilled next) and, between the phases, one
// per half of the keys (its 4 warps).
template <int DH, int QB>
__global__ void __launch_bounds__(256) backward_dkdv_phased_bf16_kernel(Args a) {
  constexpr int NT = 256, S = DH + 8, SP = QB + 8, kKeys = 128;
  constexpr int kStage = 2 * QB * S * 2 + QB * 12;  // bytes of one stage: q, do, stats, delta
  constexpr int kMT2 = 4, kDims2 = 32;              // phase 2: m16 tiles of keys, dims per warp
  static_assert(DH == 4 * kDims2 && kKeys == 2 * 16 * kMT2 && QB == 64, "the warp grids of the two phases");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                                  // [kKeys][S]
  bf16* vs = ks + kKeys * S;                                                 // [kKeys][S]
  unsigned char* stages = reinterpret_cast<unsigned char*>(vs + kKeys * S);  // [2][q, do [QB][S]; stats; delta]
  bf16* pt = reinterpret_cast<bf16*>(stages + 2 * kStage);                   // p^T [kKeys][SP]
  bf16* dst = pt + kKeys * SP;                                               // ds^T [kKeys][SP]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int bh = blockIdx.y, k_block = blockIdx.x * kKeys;
  const int half = warp / 4;  // keys 64 half .. 64 half + 63, in both phases
  // phase 1: this warp's 32 keys x 32 queries; phase 2: its 64 keys x 32 dims
  const int keys1 = 64 * half + 32 * (warp % 2), queries1 = 32 * (warp / 2 % 2);
  const int keys2 = 64 * half, dims2 = kDims2 * (warp % 4);
  const int64_t koff = a.kv_base(bh);
  const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
  const bf16* dout = static_cast<const bf16*>(a.dout) + a.o_base(bh);
  const float* mask_row = a.mask_row(bh);
  const int m_first = a.first_query(k_block) / QB * QB;
  const int tiles = m_first < a.tq ? (a.tq - m_first + QB - 1) / QB : 0;
  auto stage = [&](int tile) {
    stage_queries<NT, QB, DH>(stages + tile % 2 * kStage, a, q, dout, bh, m_first + tile * QB);
    async_commit();
  };
  stage_tile_async<kKeys, DH, S, NT>(smem_addr(ks), static_cast<const bf16*>(a.k) + koff, a.kv_row, k_block, a.tk);
  stage_tile_async<kKeys, DH, S, NT>(smem_addr(vs), static_cast<const bf16*>(a.v) + koff, a.kv_row, k_block, a.tk);
  if (tiles > 0) stage(0);
  else async_commit();
  const unsigned rc_lane = lane_rc<S>(), nk_lane = lane_nk<S>();
  const unsigned k_at = smem_addr(ks) + at<S>(keys1, 0) + rc_lane, v_at = k_at + at<S>(kKeys, 0);
  const unsigned pt_at = smem_addr(pt) + at<SP>(keys2, 0) + lane_rc<SP>(), dst_at = pt_at + at<SP>(kKeys, 0);
  float dk[kMT2][kDims2 / 8][4] = {}, dv[kMT2][kDims2 / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    const int m0 = m_first + tile * QB;
    async_wait<0>();
    __syncthreads();  // stage visible to all; every warp is done with p^T, ds^T and the stage refilled next
    if (tile + 1 < tiles) stage(tile + 1);
    const unsigned char* stage_at = stages + tile % 2 * kStage;
    const unsigned qs = smem_addr(stage_at), dos = qs + at<S>(QB, 0);
    const float2* stat_s = reinterpret_cast<const float2*>(stage_at + 2 * QB * S * 2) + queries1;
    const float* delta_s = reinterpret_cast<const float*>(stage_at + 2 * QB * S * 2 + QB * 8) + queries1;
    // Phase 1. `exact`: p through logit2, or with `bounds` (no mask) through
    // one key bound per row (probs_t).
    auto phase1 = [&](bool exact, bool bounds) {
      float st[2][4][4] = {}, dpt[2][4][4];  // s^T, dp^T: 2 m16 tiles of keys x 32 queries
      mma_nk_tile<DH, 32, S, 4>(st, k_at, qs + at<S>(queries1, 0) + nk_lane);
      probs_t<2, 32>(st, a, mask_row, k_block + keys1, m0 + queries1, stat_s, exact, bounds);
      // dp^T's accumulators start at -delta, so the products leave dp^T - delta
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nb = 0; nb < 4; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) dpt[mt][nb][e] = -delta_s[nb * 8 + 2 * t + (e & 1)];
      mma_nk_tile<DH, 32, S, 4>(dpt, v_at, dos + at<S>(queries1, 0) + nk_lane);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nb = 0; nb < 4; ++nb)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int at_pair = (keys1 + 16 * mt + g + 8 * h) * SP + queries1 + 8 * nb + 2 * t;
            const float p0 = st[mt][nb][2 * h], p1 = st[mt][nb][2 * h + 1];
            *reinterpret_cast<uint32_t*>(pt + at_pair) = pack(p0, p1);
            // ds^T = p^T (dp^T - delta), without the scale
            *reinterpret_cast<uint32_t*>(dst + at_pair) = pack(p0 * dpt[mt][nb][2 * h], p1 * dpt[mt][nb][2 * h + 1]);
          }
    };
    run_sub_tile(phase1, exact_tile(a, mask_row, m0 + queries1, k_block + keys1, 32), mask_row == nullptr);
    // p^T, ds^T of this half's keys complete (named barrier 1 + half: its 4 warps)
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + half) : "memory");
    mma_smem_tile<kMT2, QB, kDims2, SP, S>(dv, pt_at, dos + at<S>(0, dims2) + rc_lane);  // dv += p^T do
    mma_smem_tile<kMT2, QB, kDims2, SP, S>(dk, dst_at, qs + at<S>(0, dims2) + rc_lane);  // dk += ds^T q
  }
  if (tiles == 0) async_wait<0>();  // no tile waited for the k, v copies
  write_dkdv(a, koff, dk, dv, k_block + keys2, dims2);
}

// dq for 128 queries (32 per warp, two m16 tiles), sweeping double-buffered
// key tiles of KB, computed KS keys at a time; q and do stay in shared memory.
// kSplit: s, then dp (the q or the do fragments live, not both). Edge and
// fast tiles as in backward_dkdv_bf16_kernel.
template <int DH, int KB, int KS, bool kSplit>
__global__ void __launch_bounds__(kThreads) backward_dq_bf16_kernel(Args a) {
  constexpr int S = DH + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // [kRowsBf16][S]
  bf16* dos = qs + kRowsBf16 * S;            // [kRowsBf16][S]
  bf16* buf = dos + kRowsBf16 * S;           // [2 stages][k, v][KB][S]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t bh = blockIdx.y;
  const int q_block = heavy_first(a) * kRowsBf16, q0 = q_block + warp * 32;
  const int64_t qoff = a.q_base(bh), koff = a.kv_base(bh);
  const bf16* k = static_cast<const bf16*>(a.k) + koff;
  const bf16* v = static_cast<const bf16*>(a.v) + koff;
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int tile) {
    bf16* ks = buf + (tile % 2) * 2 * KB * S;
    stage_rows<KB, DH, S>(ks, k, a.kv_row, tile * KB, a.tk);
    stage_rows<KB, DH, S>(ks + KB * S, v, a.kv_row, tile * KB, a.tk);
    async_commit();
  };
  const int key_end = a.key_end(min(q_block + kRowsBf16, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  if (tiles > 0) {
    stage_rows<kRowsBf16, DH, S>(qs, static_cast<const bf16*>(a.q) + qoff, a.q_row, q_block, a.tq);
    stage_rows<kRowsBf16, DH, S>(dos, static_cast<const bf16*>(a.dout) + a.o_base(bh), a.o_row, q_block, a.tq);
    stage(0);
  }
  const unsigned q_at = smem_addr(qs) + at<S>(warp * 32, 0) + lane_rc<S>(), do_off = at<S>(kRowsBf16, 0);
  const unsigned nk_lane = lane_nk<S>(), rc_lane = lane_rc<S>();
  float2 stats[2][2];
  float delta[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + 16 * mt + g + 8 * h;
      stats[mt][h] = row < a.tq ? a.stats[bh * a.tq + row] : make_float2(0.f, 0.f);
      delta[mt][h] = row < a.tq ? a.delta[bh * a.tq + row] : 0.f;
    }
  float dq[2][DH / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    async_wait<0>();
    __syncthreads();  // tile visible to all; every warp is done with the buffer stage() refills next
    if (tile + 1 < tiles) stage(tile + 1);
#pragma unroll 1
    for (int sub = 0; sub < KB / KS; ++sub) {  // KS keys at a time
      const int n0 = tile * KB + sub * KS;
      if (KS < KB && n0 >= key_end) break;
      const unsigned ks = smem_addr(buf + (tile % 2) * 2 * KB * S) + at<S>(sub * KS, 0), vs = ks + at<S>(KB, 0);
      // One key sub-tile. `exact`: p through logit2, or with `bounds` (no
      // mask) through one key bound per row, as in the forward.
      auto sub_tile = [&](bool exact, bool bounds) {
        float s[2][KS / 8][4] = {}, dp[2][KS / 8][4];
        // dp's accumulators start at -delta, so the products leave dp - delta
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[mt][nb][e] = -delta[mt][e >> 1];
        if constexpr (kSplit) {  // s, then dp: the q or the do fragments live, not both
          // (unrolled by 4: 248 registers, none spilled; by 8 it spills)
          mma_nk_tile<DH, KS, S, 4>(s, q_at, ks + nk_lane);
          mma_nk_tile<DH, KS, S, 4>(dp, q_at + do_off, vs + nk_lane);
        } else {
#pragma unroll
          for (int kc = 0; kc < DH / 16; ++kc) {
            uint32_t qf[2][4], df[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              ldsm(qf[mt], q_at + at<S>(16 * mt, 16 * kc));
              ldsm(df[mt], q_at + do_off + at<S>(16 * mt, 16 * kc));
            }
            ldsm_mma_pair<S>(s, qf, ks + nk_lane, dp, df, vs + nk_lane, kc);
          }
        }
        if (bounds) {
          // Query i = q0 + 16 mt + g + 8 h (the row) keeps key j = n0 + 8 nb +
          // 2 t + (e & 1) while j < Tk and j <= i + Tk - Tq (rows past Tq: p = 0
          // from their zero q and stats, as on fast tiles).
          const int lane_col = n0 + 2 * t, tail = a.tk - lane_col;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const int diag = a.causal ? q0 + 16 * mt + g + 1 + a.tk - a.tq - lane_col : tail;
#pragma unroll
            for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                s[mt][nb][e] = nb * 8 + (e & 1) < min(tail, diag + 8 * (e >> 1))
                                   ? prob_fast(s[mt][nb][e], a.scale_log2, stats[mt][e >> 1])
                                   : 0.f;
          }
        } else if (exact) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int h = e >> 1, i = q0 + 16 * mt + g + 8 * h, j = n0 + nb * 8 + 2 * t + (e & 1);
                s[mt][nb][e] = prob(logit2(a, mask_row, i, j, s[mt][nb][e]), stats[mt][h]);
              }
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e) s[mt][nb][e] = prob_fast(s[mt][nb][e], a.scale_log2, stats[mt][e >> 1]);
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)  // ds without the scale
#pragma unroll
          for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nb][e] *= dp[mt][nb][e];
        mma_acc_tile<2, KS, DH, S>(dq, s, ks + rc_lane);  // dq += ds k
      };
      run_sub_tile(sub_tile, exact_tile(a, mask_row, q_block, n0, KS), mask_row == nullptr);
    }
  }
  bf16* dq_out = static_cast<bf16*>(a.dq) + qoff;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + 16 * mt + g + 8 * h;
      if (row >= a.tq) continue;
#pragma unroll
      for (int db = 0; db < DH / 8; ++db)
        *reinterpret_cast<uint32_t*>(dq_out + int64_t(row) * a.q_row + db * 8 + 2 * t) =
            pack(dq[mt][db][2 * h] * a.scale, dq[mt][db][2 * h + 1] * a.scale);
    }
}

// delta_i = sum_c do[i, c] * o[i, c] in F32 for each query row (rows =
// B * H * Tq, in (b, h, i) order; do and o share o's strides): DH / 8 lanes
// per row (4, 8 or 16), 16-byte loads of 8 products each, summed by a
// shuffle tree within the lanes.
template <int DH>
__global__ void delta_bf16_kernel(Args a, int64_t rows) {
  constexpr int kLanes = DH / 8;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  float acc = 0.f;
  if (row < rows) {
    const int64_t at = a.o_base(row / a.tq) + (row % a.tq) * a.o_row + (threadIdx.x % kLanes) * 8;
    const uint4 d = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.dout) + at);
    const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.o) + at);
    const bf16* d8 = reinterpret_cast<const bf16*>(&d);
    const bf16* o8 = reinterpret_cast<const bf16*>(&o);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += __bfloat162float(d8[e]) * __bfloat162float(o8[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < rows && threadIdx.x % kLanes == 0) a.delta[row] = acc;
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

// `kernel` on NT threads per block, on stream `on`.
template <int NT = kThreads, class Kernel, class... More>
void launch_on(cudaStream_t on, Kernel kernel, dim3 blocks, size_t smem, const Args& a, const char* name,
               const More&... more) {
  allow_dynamic_smem(kernel, smem);
  kernel<<<blocks, NT, smem, on>>>(a, more...);
  HG_CUDA_CHECK_LAUNCH(name);
}
template <int NT = kThreads, class Kernel, class... More>
void launch(Kernel kernel, dim3 blocks, size_t smem, const Args& a, const char* name, const More&... more) {
  launch_on<NT>(stream(), kernel, blocks, smem, a, name, more...);
}

// Shared memory of each BF16 kernel, in bytes.
constexpr size_t forward_smem(int dh, int kb) {
  return 2 * (kRowsBf16 + 2 * 2 * kb) * (dh + 8);
}  // q, 2 stages of k, v
constexpr size_t dkdv_smem(int dh, int qb, int mt, int warps = 4) {  // k, v; 2 stages of q, do, stats, delta
  return 2 * 2 * 16 * warps * mt * (dh + 8) + 2 * (2 * 2 * qb * (dh + 8) + 12 * qb);
}
// backward_dkdv_phased_bf16_kernel: dkdv_smem's for 128 keys, then p^T and ds^T ([128][qb + 8] each).
constexpr size_t dkdv_phased_smem(int dh, int qb) { return dkdv_smem(dh, qb, 1, 8) + 2 * 2 * 128 * (qb + 8); }
constexpr size_t dq_smem(int dh, int kb) {
  return 2 * (2 * kRowsBf16 + 2 * 2 * kb) * (dh + 8);
}  // q, do, 2 stages of k, v

// ---- BF16 configuration --------------------------------------------------------
// Tile sizes per head dim: the largest whose accumulators fit the registers
// without spills (ptxas figures in docs/attention.md). Candidates are timed in
// bench/lab/attention_lab.cu; promoting one is an edit of these tables
// (docs/attention.md, "Configuration").

// forward_bf16_kernel at one head dim.
struct Bf16ForwardConfig {
  int keys;             // keys per staged tile (one barrier, one online-softmax step)
  bool q_in_registers;  // q's fragments held in registers (at dh 128 they do not fit beside the accumulators)
};

// The backward's kernels at one head dim: delta_bf16_kernel, a dk, dv kernel
// per key tile and backward_dq_bf16_kernel per query tile.
struct Bf16BackwardConfig {
  bool dkdv_phased;    // dk, dv by backward_dkdv_phased_bf16_kernel (8 warps, 128 keys), else backward_dkdv_bf16_kernel
  int dkdv_queries;    // query rows per staged tile of the dk, dv kernel
  int dkdv_sub;        // backward_dkdv_bf16_kernel: query rows computed at a time
  int dkdv_key_tiles;  // backward_dkdv_bf16_kernel: m16 key tiles per warp
  int dq_keys;         // dq kernel: keys per staged tile
  int dq_sub;          // dq kernel: keys computed at a time
  bool dq_split;       // dq kernel: s, then dp (fewer live registers)
  bool dq_beside;      // dq kernel on a side stream beside the dk, dv kernel (each fills the other's last wave)
};

// {dh 32, 64, 128}.
constexpr Bf16ForwardConfig kBf16Forward[3] = {{64, true}, {64, true}, {64, false}};
constexpr Bf16BackwardConfig kBf16Backward[3] = {
    {false, 32, 32, 2, 64, 64, false, true},  // dh 32
    {false, 64, 32, 2, 64, 32, false, true},  // dh 64
    {true, 64, 0, 0, 32, 32, true, true},     // dh 128 (the phased kernel has its own warp grid)
};
constexpr int head_dim_index(int dh) { return dh == 32 ? 0 : dh == 64 ? 1 : 2; }

template <int DH>
void forward_bf16(const Args& a, int64_t bh) {
  constexpr Bf16ForwardConfig C = kBf16Forward[head_dim_index(DH)];
  launch(forward_bf16_kernel<DH, C.keys, C.q_in_registers>, grid(a.tq, kRowsBf16, bh), forward_smem(DH, C.keys), a,
         "attention_forward_bf16");
}

// The stored-ds backward's scratch (attention_backward allocates it).
struct DsScratch {
  void* at = nullptr;
  int64_t heads_per_chunk = 0;
};

// kernel: MmaSync, or the sm_90a kernels after delta (cuda/attention_wgmma.cu).
template <int DH>
void backward_bf16(const Args& a, int64_t bh, AttentionKernel kernel, const DsScratch& ds) {
  constexpr Bf16BackwardConfig C = kBf16Backward[head_dim_index(DH)];
  static_assert(C.dq_keys % C.dq_sub == 0);
  const int64_t rows = bh * a.tq;
  const auto blocks = static_cast<unsigned>((rows * (DH / 8) + kThreads - 1) / kThreads);
  delta_bf16_kernel<DH><<<blocks, kThreads, 0, stream()>>>(a, rows);
  HG_CUDA_CHECK_LAUNCH("attention_delta");
  if (kernel != AttentionKernel::MmaSync) {
    SideStream side;
    if (kernel == AttentionKernel::WgmmaStoredDs)  // chunks on two streams (cuda/attention_wgmma.cuh)
      attn::backward_wgmma_stored_ds(a, bh / a.heads, DH, ds.at, ds.heads_per_chunk, side.get());
    else  // dq beside dk/dv as well: 1.5-4% at T 1024 (bench/lab/attention.md)
      attn::backward_wgmma(a, bh / a.heads, DH, side.get());
    side.join();
    return;
  }
  std::optional<SideStream> side;
  if (C.dq_beside) side.emplace();
  if constexpr (C.dkdv_phased) {
    launch<256>(backward_dkdv_phased_bf16_kernel<DH, C.dkdv_queries>, grid(a.tk, 128, bh),
                dkdv_phased_smem(DH, C.dkdv_queries), a, "attention_backward_dkdv_phased_bf16");
  } else {
    constexpr int kMT = C.dkdv_key_tiles;
    launch(backward_dkdv_bf16_kernel<DH, C.dkdv_queries, C.dkdv_sub, kMT, DH * kMT <= 64>, grid(a.tk, 64 * kMT, bh),
           dkdv_smem(DH, C.dkdv_queries, kMT), a, "attention_backward_dkdv_bf16");
  }
  launch_on(side ? side->get() : stream(), backward_dq_bf16_kernel<DH, C.dq_keys, C.dq_sub, C.dq_split>,
            grid(a.tq, kRowsBf16, bh), dq_smem(DH, C.dq_keys), a, "attention_backward_dq_bf16");
  if (side) side->join();
}

template <int DH>
void forward_for(const Args& a, int64_t bh, bool bf16_inputs) {
  if (!bf16_inputs) return attn::forward_f32<DH>(a, bh);
  forward_bf16<DH>(a, bh);
}

template <int DH>
void backward_for(const Args& a, int64_t bh, AttentionKernel kernel, const DsScratch& ds) {
  if (kernel == AttentionKernel::F32) return attn::backward_f32<DH>(a, bh);  // its dq kernel writes delta
  backward_bf16<DH>(a, bh, kernel, ds);
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

std::atomic<bool> wgmma_allowed{true};      // allow_wgmma_attention
std::atomic<bool> stored_ds_allowed{true};  // allow_stored_ds_attention

}  // namespace

void allow_wgmma_attention(bool allowed) { wgmma_allowed.store(allowed); }
bool wgmma_attention_allowed() { return wgmma_allowed.load(); }
void allow_stored_ds_attention(bool allowed) { stored_ds_allowed.store(allowed); }

AttentionKernel attention_forward_kernel(DType dtype, const void* q, const void* k, const void* v,
                                         const AttentionLayout& layout) {
  if (dtype != DType::BF16) return AttentionKernel::F32;
  // The device is asked last: the rules alone decide most calls.
  return wgmma_attention_allowed() && wgmma_forward_applies(layout, q, k, v, true) && attn::wgmma_available()
             ? AttentionKernel::Wgmma
             : AttentionKernel::MmaSync;
}

AttentionKernel attention_backward_kernel(DType dtype, const void* dout, const void* q, const void* k, const void* v,
                                          const AttentionLayout& layout) {
  if (dtype != DType::BF16) return AttentionKernel::F32;
  if (!(wgmma_attention_allowed() && wgmma_backward_applies(layout, q, k, v, dout, true) && attn::wgmma_available()))
    return AttentionKernel::MmaSync;
  return stored_ds_allowed.load() && wgmma_backward_stores_ds(layout) ? AttentionKernel::WgmmaStoredDs
                                                                      : AttentionKernel::Wgmma;
}

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
  if (attention_forward_kernel(dtype, q, k, v, layout) == AttentionKernel::Wgmma)
    return attn::forward_wgmma(a, layout.batch, static_cast<int>(layout.head_dim));
  const bool bf16_inputs = dtype == DType::BF16;
  by_head_dim(layout.head_dim,
              [&](auto dh) { forward_for<decltype(dh)::value>(a, layout.heads_total(), bf16_inputs); });
}

bool attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v, const void* o,
                        const Tensor& stats, const AttentionLayout& layout, void* dq, void* dk, void* dv,
                        const Tensor* qkv_sums) {
  const char* op = "attention_backward";
  check_sizes(layout, dtype, op);
  for (const auto& [p, name] : {std::pair<const void*, const char*>{dout, "dout"},
                                {q, "q"},
                                {k, "k"},
                                {v, "v"},
                                {o, "o"},
                                {dq, "dq"},
                                {dk, "dk"},
                                {dv, "dv"}})
    check_aligned(p, name, op);
  Tensor delta = Tensor::empty({layout.heads_total() * layout.tq}, DType::F32, Device::CUDA);
  AttentionKernel kernel = attention_backward_kernel(dtype, dout, q, k, v, layout);
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
  DsScratch ds;
  Tensor scratch;
  if (kernel == AttentionKernel::WgmmaStoredDs) {
    try {
      scratch = Tensor::empty({stored_ds_scratch_bytes(layout) / 2}, DType::BF16, Device::CUDA);
      ds.heads_per_chunk = stored_ds_heads_per_chunk(layout);
      ds.at = scratch.raw_data();
    } catch (const OutOfMemory& e) {  // the recomputing pair needs no scratch: the same gradients, slower
      kernel = AttentionKernel::Wgmma;
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("attention_backward: no memory for the stored ds; recomputing it instead (shown once): {}",
                     e.what());
      });
    }
  }
  // The wgmma kernels' column sums: a row of 3 H dh floats per batch and
  // block of 128 rows (cuda/attention_column_sums.cuh), then their columns.
  const int64_t width = layout.heads * layout.head_dim, sum_rows = layout.batch * ((layout.tq + 127) / 128);
  const bool sums = qkv_sums != nullptr && layout.tq == layout.tk &&
                    (kernel == AttentionKernel::Wgmma || kernel == AttentionKernel::WgmmaStoredDs);
  Tensor block_sums;
  if (sums) {
    HG_CHECK(qkv_sums->dtype() == DType::F32 && qkv_sums->is_cuda() && qkv_sums->numel() == 3 * width, op,
             "the column sums go into an F32 CUDA tensor of 3 H dh = ", 3 * width, " elements, got ",
             dtype_name(qkv_sums->dtype()), " ", qkv_sums->shape());
    block_sums = Tensor::empty({sum_rows, 3 * width}, DType::F32, Device::CUDA);
    a.dq_sums = block_sums.data<float>();
    a.dk_sums = a.dq_sums + width;
    a.dv_sums = a.dq_sums + 2 * width;
    a.sums_ld = 3 * width;
  }
  by_head_dim(layout.head_dim,
              [&](auto dh) { backward_for<decltype(dh)::value>(a, layout.heads_total(), kernel, ds); });
  if (sums) column_sum(block_sums, sum_rows, 3 * width, 3 * width, *qkv_sums, /*accumulate=*/true);
  return sums;
}

}  // namespace hg::gpu
