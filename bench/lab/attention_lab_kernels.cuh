#pragma once
// The attention lab's kernels: every BF16 and F32 fused attention kernel with
// all of its template options, the production ones and the candidates that
// lost (bench/lab/attention.md). Copied from cuda/attention.cu and
// cuda/attention_f32.cu as they were before the library kept only the
// production kernels, so that a candidate can be timed against production
// in one program. Device code only; bench/lab/attention_lab.cu launches it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention_args.cuh"
#include "cuda/attention_dq_order.cuh"  // DqOrder: the one-kernel backward's dq order
#include "cuda/attention_row_math.cuh"

// ---- BF16 (tensor cores) ----------------------------------------------------------
namespace hg::gpu {
namespace lab_bf16 {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps per block in every kernel
using attn::Args;
using attn::kLn2;
using attn::kLog2e;
using attn::kMaskThreshold;
// The quad reductions, bf16 packing and exp2 of the production kernels
// (cuda/attention_row_math.cuh).
using attn::exp2_approx;
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
// loop over k stays rolled (kUnroll 1) or unrolled kUnroll times: fewer
// fragments in flight (dq dh 128 with 32-key tiles spills 12 to 40 bytes
// unrolled, the leaner variant 8 at 8 times but not at 4).
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
// strides SA, SB). A: MT m16 tiles, of a row-major [M][K] tile read with
// ldmatrix (`a_tile` = their address + lane_rc<SA>) or, kAT, of A^T stored
// [K][M] read with ldmatrix.trans (`a_tile` = address of (0, first row) +
// lane_nk<SA>). B: a row-major [K][N] tile read with ldmatrix.trans
// (`b_tile` = the address of its first column + lane_rc<SB>). The loop over
// K stays rolled (kUnroll 1) or unrolled kUnroll times.
template <int MT, int K, int N, int SA, int SB, bool kAT = false, int kUnroll = K / 16>
__device__ __forceinline__ void mma_smem_tile(float (&acc)[MT][N / 8][4], unsigned a_tile, unsigned b_tile) {
#pragma unroll kUnroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kAT) {
        ldsm_trans(af[mt], a_tile + at<SA>(16 * kk, 16 * mt));
      } else {
        ldsm(af[mt], a_tile + at<SA>(16 * mt, 16 * kk));
      }
    }
#pragma unroll
    for (int nb = 0; nb < N / 8; nb += 2) {
      uint32_t b[4];
      ldsm_trans(b, b_tile + at<SB>(16 * kk, 8 * nb));
      mma_x2(acc, af, b, nb);
    }
  }
}

// Rows [r0, r0 + ROWS) of a (rows, D) matrix whose rows start `ld` elements
// apart into a row-major shared tile with cp.async (global -> shared without
// registers; zero-fill past the end); the caller commits the group and waits
// before reading the tile.
template <int ROWS, int D>
__device__ void stage_rows_async(bf16* tile, int stride, const bf16* src, int64_t ld, int r0, int rows) {
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * D / 8; idx += kThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
    const bool in = r0 + r < rows;
    const bf16* from = src + (in ? int64_t(r0 + r) * ld + c : 0);
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(tile + r * stride + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(in ? 16 : 0));
  }
}

// stage_rows_async without its index arithmetic per copy: thread x copies
// the 16-byte chunk x % (D / 8) of rows x / (D / 8) + i kPass (a constant
// shared offset and one pointer step each), and a tile wholly inside the
// source skips the bounds tests. (stage_rows_async's loop starts at
// threadIdx.x, so nvcc cannot unroll it: ~25 instructions per cp.async
// against ~3 here; docs/attention.md.) `tile` is a shared byte address;
// NT threads per block.
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

// stage_tile_async (kLean) or stage_rows_async of a row-major shared tile of row stride S.
template <bool kLean, int ROWS, int D, int S>
__device__ __forceinline__ void stage_rows(bf16* tile, const bf16* src, int64_t ld, int r0, int rows) {
  if constexpr (kLean) {
    stage_tile_async<ROWS, D, S>(smem_addr(tile), src, ld, r0, rows);
  } else {
    stage_rows_async<ROWS, D>(tile, S, src, ld, r0, rows);
  }
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- BF16 forward ------------------------------------------------------------
// 128 query rows per block, 32 per warp (two m16 tiles: each K or V fragment
// read from shared memory feeds two mma). K and V tiles of KB keys are
// double-buffered with cp.async and one barrier per tile, and computed KS
// keys at a time (kRescale: see Rescale). Q sits in shared memory; with
// kQRegs its fragments move to registers once (DH <= 64; at 128 they would
// not fit beside the 128 accumulators). Tiles that no causal diagonal,
// key-padding mask or end of Tk crosses (and a positive scale) skip logit2:
// p = exp2(s * scale log2(e) - m) in one fma. kLean: tiles staged by
// stage_tile_async, unmasked edge tiles bounded per row rather than through
// logit2 (the same logits), and the fast tile's sub-tile compiled apart from
// the edge tiles' (docs/attention.md, "Forward instruction count").

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

// When the forward rescales its output accumulators (docs/attention.md,
// "Lab switch"): whenever a row max grows (Always), the same but skipped by a
// warp whose 32 maxima all stayed (SkipUnchanged, bitwise Always's results),
// or only when a tile's max passes the row's reference max by more than
// kLazyRescaleLog2 (Lazy: the same softmax with p up to 2^8 in between).
enum class Rescale { Always, SkipUnchanged, Lazy };
constexpr float kLazyRescaleLog2 = 8.f;

template <int DH, int KB, int KS, bool kQRegs, Rescale kRescale, bool kLean>
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
    if constexpr (kLean) {
      stage_tile_async<KB, DH, S>(smem_addr(ks), k, a.kv_row, tile * KB, a.tk);
      stage_tile_async<KB, DH, S>(smem_addr(ks + KB * S), v, a.kv_row, tile * KB, a.tk);
    } else {
      stage_rows_async<KB, DH>(ks, S, k, a.kv_row, tile * KB, a.tk);
      stage_rows_async<KB, DH>(ks + KB * S, S, v, a.kv_row, tile * KB, a.tk);
    }
    async_commit();
  };
  const unsigned q_at = smem_addr(qs) + at<S>(warp * 32, 0) + lane_rc<S>();
  const unsigned k_lane = lane_nk<S>(), v_lane = lane_rc<S>();

  const int key_end = a.key_end(min(q_block + kRowsBf16, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  uint32_t qa[2][kQRegs ? DH / 16 : 1][4];
  if (tiles > 0) {
    const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
    if constexpr (kLean) {
      stage_tile_async<kRowsBf16, DH, S>(smem_addr(qs), q, a.q_row, q_block, a.tq);
    } else {
      stage_rows_async<kRowsBf16, DH>(qs, S, q, a.q_row, q_block, a.tq);
    }
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
#pragma unroll 1
    for (int sub = 0; sub < KB / KS; ++sub) {  // KS keys at a time
      const int n0 = tile * KB + sub * KS;
      if (KS < KB && n0 >= key_end) break;
      const unsigned ks = smem_addr(buf + (tile % 2) * 2 * KB * S) + at<S>(sub * KS, 0), vs = ks + at<S>(KB, 0);
      // One sub-tile: s = q k^T, the online softmax, o += p v. `exact`: the
      // logits through logit2, or through one bound per row with `bounds`
      // (no mask: the causal diagonal and Tk).
      auto sub_tile = [&](bool exact, bool bounds) {
        float s[2][KS / 8][4] = {};
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
          for (int nb = 0; nb < KS / 8; nb += 2) ldsm_mma_x2(s, qf, ks + k_lane + at<S>(nb * 8, kc * 16), nb);
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
            for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                s[mt][nb][e] =
                    nb * 8 + (e & 1) < min(tail, diag + 8 * (e >> 1)) ? s[mt][nb][e] * a.scale_log2 : -INFINITY;
          } else if (exact) {
#pragma unroll
            for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                s[mt][nb][e] =
                    logit2(a, mask_row, q0 + 16 * mt + g + 8 * (e >> 1), n0 + nb * 8 + 2 * t + (e & 1), s[mt][nb][e]);
          }
#pragma unroll
          for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) tile_max[mt][e >> 1] = fmaxf(tile_max[mt][e >> 1], s[mt][nb][e]);
        }
        float neg_base[2][2];
        if constexpr (kRescale == Rescale::Lazy) {
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
        } else {
          float alpha[2][2];
          bool rescale = false;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float m_new = fmaxf(m[mt][h], quad_max(tile_max[mt][h]) * c);
              const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
              alpha[mt][h] = exp2_approx(m[mt][h] - base);
              rescale |= alpha[mt][h] != 1.f;
              neg_base[mt][h] = -base;
              m[mt][h] = m_new;
              if constexpr (kRescale == Rescale::Always) rescale_row(o[mt], l[mt], h, alpha[mt][h]);
            }
          // SkipUnchanged: a warp whose 32 row maxima all stayed skips the
          // multiplications by 1 (bitwise the same results).
          if (kRescale == Rescale::SkipUnchanged && __any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) rescale_row(o[mt], l[mt], h, alpha[mt][h]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s[mt][nb][e] = exp2_approx(fmaf(s[mt][nb][e], c, neg_base[mt][e >> 1]));
              l[mt][e >> 1] += s[mt][nb][e];
            }
        mma_acc_tile<2, KS, DH, S>(o, s, vs + v_lane);
      };
      const bool exact = exact_tile(a, mask_row, q_block, n0, KS);
      if (!kLean) {
        sub_tile(exact, false);
      } else if (!exact) {  // a copy of its own for the fast tile: no register moves where paths merge
        sub_tile(false, false);
      } else {
        sub_tile(true, mask_row == nullptr);
      }
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

// Calls a backward kernel's sub_tile(exact, bounds) for one tile. kLean: from
// one call site per tile kind, so that the fast tile compiles apart from the
// edge tiles (no merge of their registers), and unmasked edge tiles take the
// per-row bounds.
template <bool kLean, class SubTile>
__device__ __forceinline__ void run_sub_tile(SubTile& sub_tile, bool exact, bool no_mask) {
  if (!kLean) {
    sub_tile(exact, false);
  } else if (!exact) {
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

// The one-kernel backward's dq (kFusedDq, BF16 variants 6, 7): the NW warps
// split a QS x DH tile of dq = ds k into WR x WC parts of MQ m16 tiles x CW dims.
template <int DH, int QS, int NW>
struct FusedDqSplit {
  static constexpr int kWC = DH == 128 ? 4 : 2, kWR = NW / kWC, kCW = DH / kWC, kMQ = QS / 16 / kWR;
  static constexpr int kSD = QS + 8;  // row stride of ds^T in shared memory: rows 16 bytes apart mod 128
  static_assert(kMQ >= 1 && kWR * kWC == NW);
};

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

// Key tile kt's turn at query tile f (cuda/attention_dq_order.cuh): this
// warp's partial dq (rows row0 + 16 mq + g (+ 8), dims col0 + 8 nb + 2 t, +1;
// without the scale) added to the sum of key tiles 0 .. kt - 1 in the head's
// fp32 slot, or, from the tile's last contributor, written to its dq rows
// (`dq_head`, q's strides) in bf16. Every load is issued before any store.
template <int DH, int MQ, int NB>
__device__ void flush_dq_bf16(const Args& a, const attn::DqOrder& order, float (&dq)[MQ][NB][4], bf16* dq_head, int bh,
                              int kt, int f, int row0, int col0) {
  const int t = threadIdx.x % 4;
  const int last = order.last_contributor(a, f);
  order.wait_turn(bh, kt, f, last);
  float* slot = order.slots + int64_t(bh % order.ring) * a.tq * DH + col0 + 2 * t;
  auto each = [&](auto&& fn) {  // fn(x, y, row, col - col0) for this lane's pairs in rows below Tq
    each_acc_pair<MQ, NB>(
        row0, a.tq, [&](int mq, int nb, int h, int row) { fn(dq[mq][nb][2 * h], dq[mq][nb][2 * h + 1], row, 8 * nb); });
  };
  if (kt > 0) {
    each([&](float& x, float& y, int row, int col) {
      const float2 sum = __ldcg(reinterpret_cast<const float2*>(slot + int64_t(row) * DH + col));
      x = sum.x + x, y = sum.y + y;
    });
  }
  each([&](float& x, float& y, int row, int col) {
    if (kt == last) {
      bf16* to = dq_head + int64_t(row) * a.q_row + col0 + col + 2 * t;
      *reinterpret_cast<uint32_t*>(to) = pack(x * a.scale, y * a.scale);
    } else {
      __stcg(reinterpret_cast<float2*>(slot + int64_t(row) * DH + col), make_float2(x, y));
    }
  });
  order.arrive(bh, f);
}

// stage_rows_async for blocks of NT threads.
template <int NT, int ROWS, int D>
__device__ void stage_rows_by(bf16* tile, int stride, const bf16* src, int64_t ld, int r0, int rows) {
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * D / 8; idx += NT) {
    const int r = idx / (D / 8), c = idx % (D / 8) * 8;
    copy_async<16>(tile + r * stride + c, src + (r0 + r < rows ? int64_t(r0 + r) * ld + c : 0), r0 + r < rows);
  }
}

// Query rows [m0, m0 + QB) of one head into one stage of a dk/dv kernel
// (blocks of NT threads): q and do as [QB][DH + 8] tiles, then the rows'
// stats (QB float2) and delta (QB float); zeros past Tq. kLean: the tiles by
// stage_tile_async, the stats by one `if`. The caller commits the group.
template <bool kLean, int NT, int QB, int DH>
__device__ __forceinline__ void stage_queries(unsigned char* stage, const Args& a, const bf16* q, const bf16* dout,
                                              int bh, int m0) {
  constexpr int S = DH + 8;
  bf16* qs = reinterpret_cast<bf16*>(stage);
  if constexpr (kLean) {
    stage_tile_async<QB, DH, S, NT>(smem_addr(qs), q, a.q_row, m0, a.tq);
    stage_tile_async<QB, DH, S, NT>(smem_addr(qs + QB * S), dout, a.o_row, m0, a.tq);
  } else {
    stage_rows_by<NT, QB, DH>(qs, S, q, a.q_row, m0, a.tq);
    stage_rows_by<NT, QB, DH>(qs + QB * S, S, dout, a.o_row, m0, a.tq);
  }
  float2* stat_s = reinterpret_cast<float2*>(qs + 2 * QB * S);
  float* delta_s = reinterpret_cast<float*>(stat_s + QB);
  auto stage_row_stats = [&](int r) {
    const bool in = m0 + r < a.tq;
    const int64_t at_row = in ? int64_t(bh) * a.tq + m0 + r : 0;
    copy_async<8>(stat_s + r, a.stats + at_row, in);
    copy_async<4>(delta_s + r, a.delta + at_row, in);
  };
  if constexpr (kLean) {
    if (threadIdx.x < QB) stage_row_stats(threadIdx.x);
  } else {
    for (int r = threadIdx.x; r < QB; r += NT) stage_row_stats(r);
  }
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

// dk, dv for 16 * MT * NW keys: a warp owns 16 * MT keys (MT m16 tiles) and their
// dk, dv accumulators while it sweeps the query tiles of QB rows (q, do,
// stats, delta double-buffered with cp.async; computed QS rows at a time).
// K and V fragments stay in registers with kKVRegs, else are re-read from
// shared memory per tile.
// kFusedDq (variants 6, 7): the block also computes dq = ds k for each QS
// rows over its keys (ds^T through shared memory, DSB buffers) and adds it
// in the fixed order of `order`; blocks take (head, key tile) from its
// ticket, and key tile 0 sweeps from query 0 (rows with no key get their
// zero dq). NW warps (16 MT NW keys): 4, or 8 for variant 7 at dh 128.
// kLean (variant 8): tiles staged by stage_tile_async, unmasked edge tiles
// bounded per row, fast and edge tiles compiled apart (as the forward's kLean).
template <int DH, int QB, int QS, int MT, bool kKVRegs, bool kFusedDq = false, int DSB = 1, int NW = 4,
          bool kLean = false>
__global__ void __launch_bounds__(32 * NW) backward_dkdv_bf16_kernel(Args a, attn::DqOrder order) {
  constexpr int NT = 32 * NW, S = DH + 8, kKeys = 16 * MT * NW;
  static_assert(!kLean || (NT == kThreads && !kFusedDq && QB <= NT), "kLean: the two-kernel backward's blocks");
  constexpr int kStage = 2 * QB * S * 2 + QB * 12;  // bytes of one stage: q, do, stats, delta
  using Split = FusedDqSplit<DH, QS, NW>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                                  // [kKeys][S]
  bf16* vs = ks + kKeys * S;                                                 // [kKeys][S]
  unsigned char* stages = reinterpret_cast<unsigned char*>(vs + kKeys * S);  // [2][q, do [QB][S]; stats; delta]
  bf16* dst = reinterpret_cast<bf16*>(stages + 2 * kStage);                  // kFusedDq: [DSB][kKeys][SD], ds^T
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  int bh = blockIdx.y, kt = blockIdx.x;
  if constexpr (kFusedDq) {
    const int64_t item = order.take_ticket();
    bh = static_cast<int>(item / order.key_tiles), kt = static_cast<int>(item % order.key_tiles);
  }
  const int k_block = kt * kKeys, j0 = k_block + warp * 16 * MT;
  const int64_t koff = a.kv_base(bh);
  const bf16* q = static_cast<const bf16*>(a.q) + a.q_base(bh);
  const bf16* dout = static_cast<const bf16*>(a.dout) + a.o_base(bh);
  const float* mask_row = a.mask_row(bh);
  auto stage = [&](int m0, int which) {
    stage_queries<kLean, NT, QB, DH>(stages + which * kStage, a, q, dout, bh, m0);
    async_commit();
  };

  const int q_first = kFusedDq ? order.first_flush(a, kt) * QS : a.first_query(k_block), m_first = q_first / QB * QB;
  const int tiles = m_first < a.tq ? (a.tq - m_first + QB - 1) / QB : 0;
  // kFusedDq sweeps the query tiles from the last: see "One kernel" in docs/attention.md.
  auto m_of = [&](int tile) { return m_first + (kFusedDq ? tiles - 1 - tile : tile) * QB; };
  if constexpr (kLean) {
    stage_tile_async<kKeys, DH, S>(smem_addr(ks), static_cast<const bf16*>(a.k) + koff, a.kv_row, k_block, a.tk);
    stage_tile_async<kKeys, DH, S>(smem_addr(vs), static_cast<const bf16*>(a.v) + koff, a.kv_row, k_block, a.tk);
  } else {
    stage_rows_by<NT, kKeys, DH>(ks, S, static_cast<const bf16*>(a.k) + koff, a.kv_row, k_block, a.tk);
    stage_rows_by<NT, kKeys, DH>(vs, S, static_cast<const bf16*>(a.v) + koff, a.kv_row, k_block, a.tk);
  }
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
  [[maybe_unused]] int flushes = 0;  // kFusedDq: query tiles done, picks the ds^T buffer
  for (int tile = 0; tile < tiles; ++tile) {
    const int m_tile = m_of(tile);
    async_wait<0>();
    __syncthreads();  // stage visible to all; every warp is done with the one stage() refills next
    if (tile + 1 < tiles) stage(m_of(tile + 1), (tile + 1) % 2);
    const bf16* qs_ptr = reinterpret_cast<const bf16*>(stages + (tile % 2) * kStage);
#pragma unroll 1
    for (int sub = 0; sub < QB / QS; ++sub) {  // QS queries at a time
      const int m0 = m_tile + sub * QS;
      if (QS < QB && m0 + QS <= q_first) continue;  // all above the causal end: the default's tiles start after
      if (QS < QB && m0 >= a.tq) break;
      const unsigned qs = smem_addr(qs_ptr) + at<S>(sub * QS, 0), dos = qs + at<S>(QB, 0);
      const float2* stat_s = reinterpret_cast<const float2*>(qs_ptr + 2 * QB * S) + sub * QS;
      const float* delta_s = reinterpret_cast<const float*>(stat_s + (QB - sub * QS)) + sub * QS;
      // One query sub-tile. `exact`: p through logit2, or with `bounds` (no
      // mask) through one key bound per row: Tk and the causal diagonal.
      auto sub_tile = [&](bool exact, bool bounds) {
        float st[MT][QS / 8][4] = {}, dpt[MT][QS / 8][4];  // s^T and dp^T: 16 keys x QS queries per m tile
        // kLean: dp^T's accumulators start at -delta, so the products leave dp^T - delta
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nb = 0; nb < QS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) dpt[mt][nb][e] = kLean ? -delta_s[nb * 8 + 2 * t + (e & 1)] : 0.f;
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
            for (int e = 0; e < 4; ++e)
              st[mt][nb][e] *= kLean ? dpt[mt][nb][e] : dpt[mt][nb][e] - delta_s[nb * 8 + 2 * t + (e & 1)];
        if constexpr (!kFusedDq) {
          mma_acc_tile<MT, QS, DH, S>(dk, st, qs + rc_lane);  // dk += ds^T q
        } else {
          bf16* ds_buf = dst + (flushes++ % DSB) * kKeys * Split::kSD;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)  // ds^T to shared memory, this warp's keys
#pragma unroll
            for (int nb = 0; nb < QS / 8; ++nb)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint32_t*>(ds_buf + (warp * 16 * MT + 16 * mt + g + 8 * h) * Split::kSD + nb * 8 +
                                             2 * t) = pack(st[mt][nb][2 * h], st[mt][nb][2 * h + 1]);
          mma_acc_tile<MT, QS, DH, S>(dk, st, qs + rc_lane);  // dk += ds^T q
          // dq = ds k over the block's keys, this warp's part; then its turn
          __syncthreads();  // ds^T complete
          const int wr = warp / Split::kWC, wc = warp % Split::kWC;
          float dq[Split::kMQ][Split::kCW / 8][4] = {};
          mma_smem_tile<Split::kMQ, kKeys, Split::kCW, Split::kSD, S, true, 1>(
              dq, smem_addr(ds_buf) + lane_nk<Split::kSD>() + at<Split::kSD>(0, 16 * Split::kMQ * wr),
              smem_addr(ks) + rc_lane + at<S>(0, Split::kCW * wc));
          bf16* dq_head = static_cast<bf16*>(a.dq) + (q - static_cast<const bf16*>(a.q));  // dq has q's strides
          flush_dq_bf16<DH>(a, order, dq, dq_head, bh, kt, m0 / QS, m0 + 16 * Split::kMQ * wr, Split::kCW * wc);
          if constexpr (DSB == 1) __syncthreads();  // every warp is done with ds^T
        }
      };
      run_sub_tile<kLean>(sub_tile, exact_tile(a, mask_row, m0, k_block, kKeys), mask_row == nullptr);
    }
  }
  if (tiles == 0) async_wait<0>();  // no tile waited for the k, v copies
  write_dkdv(a, koff, dk, dv, j0, 0);
}

// dk, dv for 128 keys at dh 128 with 8 warps (backward variant 9): p^T and
// ds^T pass through shared memory so that each phase splits the work its own
// way (docs/attention.md, "Eight-warp dk/dv"). Per query tile of QB = 64
// (q, do, stats, delta double-buffered as in backward_dkdv_bf16_kernel):
// - phase 1, warps 4 (keys) x 2 (queries) of 32 x 32: s^T = k q^T, p^T,
//   dp^T - delta = v do^T - delta (kLean's p: the same values as variant 8),
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
    stage_queries<true, NT, QB, DH>(stages + tile % 2 * kStage, a, q, dout, bh, m_first + tile * QB);
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
    run_sub_tile<true>(phase1, exact_tile(a, mask_row, m0 + queries1, k_block + keys1, 32), mask_row == nullptr);
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
// kLean: as backward_dkdv_bf16_kernel's.
template <int DH, int KB, int KS, bool kSplit, bool kLean = false>
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
    stage_rows<kLean, KB, DH, S>(ks, k, a.kv_row, tile * KB, a.tk);
    stage_rows<kLean, KB, DH, S>(ks + KB * S, v, a.kv_row, tile * KB, a.tk);
    async_commit();
  };
  const int key_end = a.key_end(min(q_block + kRowsBf16, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  if (tiles > 0) {
    stage_rows<kLean, kRowsBf16, DH, S>(qs, static_cast<const bf16*>(a.q) + qoff, a.q_row, q_block, a.tq);
    stage_rows<kLean, kRowsBf16, DH, S>(dos, static_cast<const bf16*>(a.dout) + a.o_base(bh), a.o_row, q_block, a.tq);
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
      // mask) through one key bound per row, as the forward's kLean.
      auto sub_tile = [&](bool exact, bool bounds) {
        float s[2][KS / 8][4] = {}, dp[2][KS / 8][4];
        // kLean: dp's accumulators start at -delta, so the products leave dp - delta
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nb = 0; nb < KS / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[mt][nb][e] = kLean ? -delta[mt][e >> 1] : 0.f;
        if constexpr (kSplit) {  // s, then dp: the q or the do fragments live, not both
          // (kLean: unrolled by 4 in 248 registers, 0 spilled; by 8 it spills)
          mma_nk_tile<DH, KS, S, kLean ? 4 : 1>(s, q_at, ks + nk_lane);
          mma_nk_tile<DH, KS, S, kLean ? 4 : 1>(dp, q_at + do_off, vs + nk_lane);
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
            for (int e = 0; e < 4; ++e) s[mt][nb][e] *= kLean ? dp[mt][nb][e] : dp[mt][nb][e] - delta[mt][e >> 1];
        mma_acc_tile<2, KS, DH, S>(dq, s, ks + rc_lane);  // dq += ds k
      };
      run_sub_tile<kLean>(sub_tile, exact_tile(a, mask_row, q_block, n0, KS), mask_row == nullptr);
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

// delta as delta_kernel for BF16 with 16-byte loads: DH / 8 lanes per row
// (4, 8 or 16), 8 products each, summed by a shuffle tree within the lanes.
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
}  // namespace lab_bf16
}  // namespace hg::gpu

// ---- F32 (CUDA cores) -------------------------------------------------------------
namespace hg::gpu::attn {
namespace lab_f32 {

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
  const float m = mask_row[j];
  return m > kMaskThreshold ? m * kLog2e : m - INFINITY;
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

// dq for BR queries, two sweeps over the 64-key tiles: the first sums
// delta_i = sum_j p_ij dp_ij, the second accumulates dq_i = sum_j ds_ij k_j
// with ds_ij = p_ij (dp_ij - delta_i). Writes delta for the dk, dv kernel.
// v of the next tile loads while this tile's ds k runs. kOneSweep: delta
// comes from delta_kernel (do . o) and one sweep does, unless a row of the
// block has a key of weight above 1/2 (1 / sum > 0.5: a near one-hot row,
// where do . o and sum p dp may differ by more than ds = p (dp - delta) can
// bear); such a block sweeps twice and writes its delta as without.
// kDeltaOnly (with kOneSweep; the one-kernel backward, variant 3): only the
// blocks with such a row run, their first sweep only, and write delta.
template <int DH, int TY, int RM, bool kOneSweep, bool kDeltaOnly = false>
__global__ void __launch_bounds__(16 * TY) backward_dq_kernel(Args a) {
  constexpr int BR = TY * RM, S = DH + 4, PS = BR + 4, NT = 16 * TY, N = DH / 16;
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;             // [BR][S]
  float* dos = qs + BR * S;     // [BR][S]
  float* ks = dos + BR * S;     // [64][S]
  float* vs = ks + kCols * S;   // [64][S]
  float* dst = vs + kCols * S;  // [64][PS]: ds transposed
  const int64_t bh = blockIdx.y;
  const int q_block = blockIdx.x * BR;
  const int64_t qoff = a.q_base(bh);
  const float* k = static_cast<const float*>(a.k) + a.kv_base(bh);
  const float* v = static_cast<const float*>(a.v) + a.kv_base(bh);
  const float* mask_row = a.mask_row(bh);
  float2 stats[RM];
  float delta[RM];  // two sweeps: this lane's share during the first, the row's total after it
  bool peaked = false;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    stats[i] = row < a.tq ? a.stats[bh * a.tq + row] : make_float2(-INFINITY, 0.f);
    peaked |= stats[i].y > 0.5f;
  }
  const bool two = !kOneSweep || __syncthreads_or(peaked);
  if (kDeltaOnly && !two) return;  // do . o (delta_kernel) stands
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    delta[i] = !two && row < a.tq ? a.delta[bh * a.tq + row] : 0.f;
  }
  const int sweeps = two && !kDeltaOnly ? 2 : 1;
  const int key_end = a.key_end(min(q_block + BR, a.tq));
  const int tiles = key_end > 0 ? (key_end + kCols - 1) / kCols : 0;
  if (tiles > 0) {
    stage<BR, DH, NT>(qs, static_cast<const float*>(a.q) + qoff, a.q_row, q_block, a.tq);
    stage<BR, DH, NT>(dos, static_cast<const float*>(a.dout) + a.o_base(bh), a.o_row, q_block, a.tq);
    stage<kCols, DH, NT>(ks, k, a.kv_row, 0, a.tk);
    stage<kCols, DH, NT>(vs, v, a.kv_row, 0, a.tk);
    async_commit();
  }
  float dq[RM][N] = {};
  for (int step = 0; step < sweeps * tiles; ++step) {
    const int n0 = (step % tiles) * kCols, next = (step + 1) % tiles * kCols;
    const bool more = step + 1 < sweeps * tiles, second = !kDeltaOnly && (!two || step >= tiles);
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
    if (two && step == tiles) {  // the first sweep is over
#pragma unroll
      for (int i = 0; i < RM; ++i) delta[i] = row_sum(delta[i]);
    }
    float bias[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) bias[c] = key_bias(a, mask_row, n0 + col_of(c));
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = prob(logit2(a, s[i][c], bias[c], q_block + row_of<TY>(i), n0 + col_of(c)), stats[i]);
        if (second) {
          s[i][c] = p * (dp[i][c] - delta[i]);  // ds without the scale
        } else {
          delta[i] += p * dp[i][c];
        }
      }
    if (second) {
      store_t<TY, RM>(dst, PS, s);
      __syncthreads();
      tile_axpy<DH, TY, RM>(dq, dst, PS, ks);
    }
    __syncthreads();  // every thread is done with ks and dst
    if (more) {
      stage<kCols, DH, NT>(ks, k, a.kv_row, next, a.tk);
      async_commit();
    }
  }
  if (kDeltaOnly) {
#pragma unroll
    for (int i = 0; i < RM; ++i) delta[i] = row_sum(delta[i]);
  }
  float* dq_out = static_cast<float*>(a.dq) + qoff;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int row = q_block + row_of<TY>(i);
    if (row >= a.tq) continue;
    if (!kDeltaOnly) Dims<DH>::store(dq_out + int64_t(row) * a.q_row, dq[i], a.scale);
    if (two && tx() == 0) a.delta[bh * a.tq + row] = delta[i];
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

// dk, dv for BR keys, over the 64-query tiles from the first query that
// sees them: s^T and dp^T (keys x queries) in registers, p and ds through
// shared memory (query-major) into dv += p^T do and dk += ds^T q.
// kPrefetch: the next tile's q loads during dv += p^T do, its do during the
// next s^T (single buffers, two more barriers a tile).
// kFusedDq (variant 3): the block also computes dq = ds k for each query
// tile over its keys (ds from shared memory, row-major) and adds it into dq
// in the fixed order of `order`; blocks take (head, key tile) from its
// ticket, and key tile 0 sweeps from query 0 (rows with no key get dq = 0).
// Both (variant 5, and 4 at dh 32, 64): the next tile's q, do, stats and
// delta load during dq = ds k and the dq add, which read none of them (same
// sums as variant 3).
template <int DH, int TY, int RM, bool kPrefetch, bool kFusedDq = false>
__global__ void __launch_bounds__(16 * TY) backward_dkdv_kernel(Args a, DqOrder order) {
  constexpr int BR = TY * RM, PS = BR + 4, NT = 16 * TY, N = DH / 16;
  extern __shared__ __align__(16) float smem[];
  const DkdvTiles tiles = dkdv_tiles<DH, BR>(smem);
  const auto& [ks, vs, qs, dos, ps, dss, stat_s, delta_s] = tiles;
  int64_t bh = blockIdx.y;
  int kt = blockIdx.x;
  if constexpr (kFusedDq) {
    const int64_t item = order.take_ticket();
    bh = item / order.key_tiles, kt = static_cast<int>(item % order.key_tiles);
  }
  const int k_block = kt * BR;
  const int64_t koff = a.kv_base(bh);
  const float* q = static_cast<const float*>(a.q) + a.q_base(bh);
  const float* dout = static_cast<const float*>(a.dout) + a.o_base(bh);
  stage_keys<DH, BR, NT>(tiles, a, koff, k_block);
  const int m_first = kFusedDq ? order.first_flush(a, kt) * kCols : a.first_query(k_block) / kCols * kCols;
  // kFusedDq sweeps the query tiles from the last: see "One kernel" in docs/attention.md.
  [[maybe_unused]] const int m_last = m_first + (a.tq - 1 - m_first) / kCols * kCols;
  constexpr bool kLoadsDuringDq = kPrefetch && kFusedDq;
  if (kLoadsDuringDq && m_first < a.tq) {
    stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m_last);
  } else if (kPrefetch && m_first < a.tq) {
    stage<kCols, DH, NT>(qs, q, a.q_row, m_first, a.tq);
    async_commit();
    stage<kCols, DH, NT>(dos, dout, a.o_row, m_first, a.tq);
    async_commit();
  }
  const float* mask_row = a.mask_row(bh);
  float bias[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) bias[i] = key_bias(a, mask_row, k_block + row_of<TY>(i));
  float dk[RM][N] = {}, dv[RM][N] = {};
  for (int m_up = m_first; m_up < a.tq; m_up += kCols) {
    const int m0 = kFusedDq ? m_first + m_last - m_up : m_up;
    const bool more = m_up + kCols < a.tq;
    if (!kPrefetch) {
      __syncthreads();  // every thread is done with the previous query tile
      stage<kCols, DH, NT>(qs, q, a.q_row, m0, a.tq);
      stage<kCols, DH, NT>(dos, dout, a.o_row, m0, a.tq);
      async_commit();
    }
    if (!kLoadsDuringDq) {
      for (int r = threadIdx.x; r < kCols; r += NT) {
        const bool in = m0 + r < a.tq;
        stat_s[r] = in ? a.stats[bh * a.tq + m0 + r] : make_float2(-INFINITY, 0.f);
        delta_s[r] = in ? a.delta[bh * a.tq + m0 + r] : 0.f;
      }
    }
    if (kPrefetch && !kLoadsDuringDq) {
      async_wait<1>();  // k, v and this tile's q; its do may still be in flight
    } else {
      async_wait<0>();
    }
    __syncthreads();
    float s[RM][4] = {}, dp[RM][4] = {};  // s^T and dp^T: keys x queries
    tile_dots<DH, TY, RM>(s, ks, qs);
    if (kPrefetch && !kLoadsDuringDq) {
      async_wait<0>();  // this tile's do
      __syncthreads();
    }
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
    if (kPrefetch && !kLoadsDuringDq) {
      __syncthreads();  // every thread is done with qs
      if (more) {
        stage<kCols, DH, NT>(qs, q, a.q_row, m0 + kCols, a.tq);
        async_commit();
      }
    }
    tile_axpy<DH, TY, RM>(dv, ps, PS, dos);
    if (kLoadsDuringDq) {
      __syncthreads();  // every thread is done with qs, dos, ps and the stats (dss stays, for dq)
      if (more) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m0 - kCols);
    } else if (kPrefetch) {
      __syncthreads();  // every thread is done with dos, ps, dss and the stats
      if (more) {
        stage<kCols, DH, NT>(dos, dout, a.o_row, m0 + kCols, a.tq);
        async_commit();
      }
    }
    if constexpr (kFusedDq) {  // dq = ds k over the block's keys (BR = 64 = kCols), then this warp's turn
      static_assert(BR == kCols);
      float dq[RM][N] = {};
      tile_axpy_rows<DH, TY, RM>(dq, dss, PS, ks);
      float* dq_head = static_cast<float*>(a.dq) + (q - static_cast<const float*>(a.q));  // dq has q's strides
      flush_dq_f32<DH, TY, RM>(a, order, dq, dq_head, bh, kt, m0 / kCols, m0);
    }
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

// Variant 4 at dh 128: the one-kernel backward (dk, dv and dq as variant 3,
// 64 keys, 256 threads) with the work of the score and dk, dv products split
// between the block's two halves of 128 threads instead of shared: half 0
// computes s^T, p and dv += p^T do, half 1 dp^T, ds (reading p back from
// shared memory) and dk += ds^T q, each as an 8 x 4 score and an 8 x 8
// output micro-tile (TY 8, RM 8 within the half: 12 float4 loads per 128
// fmas instead of 16 in the scores, 8 instead of 12 in the outputs). All 256
// threads then compute dq = ds k and add it as variant 3 (TY 16, RM 4). The
// next query tile's q, do, stats and delta load during dq. Every sum is
// variant 3's, in the same order: the same bits.
// kSharedDq (variant 6): dq = ds k goes to shared memory (dqs, after the
// tiles) instead of straight into dq, and half 1 adds it into dq at the start
// of the next tile, before its dp^T, while half 0 computes s^T and p: the
// flush's waits and L2 round trips no longer stall the whole block. Only
// half 1's 4 warps arrive on the counters. The same sums: the same bits.
template <int DH, bool kSharedDq = false>
__global__ void __launch_bounds__(256) backward_split_kernel(Args a, DqOrder order) {
  constexpr int TY = 8, RM = 8, BR = TY * RM, PS = BR + 4, NT = 256, N = DH / 16;
  constexpr int kDqTy = 16, kDqRm = 4;  // dq: variant 3's geometry over all 256 threads
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
  const int m_last = m_first + (a.tq - 1 - m_first) / kCols * kCols;  // swept from the last, as variant 3
  if (m_first < a.tq) stage_query_tile<DH, NT>(tiles, a, bh, q, dout, m_last);
  const bool dk_half = threadIdx.x >= NT / 2;  // warp-uniform
  const float* mask_row = a.mask_row(bh);
  float bias[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) bias[i] = key_bias(a, mask_row, k_block + row_of<TY, 2>(i));
  float acc[RM][N] = {};                                      // dv (half 0) or dk (half 1)
  float* dq_head = static_cast<float*>(a.dq) + a.q_base(bh);  // dq has q's strides
  [[maybe_unused]] float* dqs = delta_s + kCols;              // kSharedDq: [64][DH + 4], dq = ds k of the tile before
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
      if (kSharedDq && m_up > m_first)
        flush_dq_shared_f32<DH>(a, order, dqs, dq_head, bh, kt, m0 / kCols + 1, m0 + kCols);
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
    if constexpr (kSharedDq) {  // half 1 read the previous dqs before the last barrier
#pragma unroll
      for (int i = 0; i < kDqRm; ++i) Dims<DH>::store(dqs + row_of<kDqTy>(i) * (DH + 4), dq[i], 1.f);
    } else {
      flush_dq_f32<DH, kDqTy, kDqRm>(a, order, dq, dq_head, bh, kt, m0 / kCols, m0);
    }
  }
  if (kSharedDq && m_first < a.tq) {  // the last tile swept is the first, m_first
    __syncthreads();                  // dqs is complete
    if (dk_half) flush_dq_shared_f32<DH>(a, order, dqs, dq_head, bh, kt, m_first / kCols, m_first);
  }
  float* out = static_cast<float*>(dk_half ? a.dk : a.dv) + koff;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int j = k_block + row_of<TY, 2>(i);
    if (j < a.tk) Dims<DH>::store(out + int64_t(j) * a.kv_row, acc[i], dk_half ? a.scale : 1.f);
  }
}
}  // namespace lab_f32
}  // namespace hg::gpu::attn
