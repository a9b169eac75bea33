#pragma once
// BF16 flash attention forward on Hopper's own instructions (sm_90a): the
// lab candidates beside the mma.sync kernels of attention_lab_kernels.cuh.
// FlashAttention-3's plan:
//   - a block of 64 NC queries: NC consumer warpgroups of 64 queries each
//     (wgmma's M) and a producer warpgroup (one thread issues TMA copies);
//   - q (once) and k, v tiles of KB keys land by TMA (cp.async.bulk.tensor,
//     128-byte swizzle, zeros past the ends of the tensor) in a ring of ST
//     stages; each stage has a "full" mbarrier (the bytes arrived) and an
//     "empty" one (all consumer threads are done with it);
//   - s = q k^T by wgmma with both operands in shared memory, the online
//     softmax in registers (exp2 with scale * log2(e) folded into one fma),
//     then o += p v by wgmma with p from registers and v from shared memory
//     through its transposed (MN-major) descriptor; kOverlap runs the next
//     tile's q k^T beside this tile's p v (FlashAttention-3's overlap
//     inside a warpgroup; its ping-pong between warpgroups is left to the
//     scheduler).
// Outputs as forward_bf16_kernel writes them: o, the row log-sum-exp and the
// row stats {base-2 max, 1 / sum} the production backward rebuilds p from.
// No key-padding mask, scale > 0 (the launcher refuses the rest).
// Only an sm_90a compile holds the device code; elsewhere the kernels trap.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/attention_args.cuh"
#include "cuda/attention_row_math.cuh"
#include "cuda/attention_tensor_map.cuh"
#include "cuda/attention_wgmma_kernel.cuh"
#include "cuda/bulk_stage.cuh"
#include "cuda/wgmma.cuh"

#define HG_LAB_WGMMA HG_SM90A_DEVICE  // cuda/wgmma.cuh: an sm_90a device compile

namespace hg::gpu::lab_wgmma {

using attn::Args;
using attn::kBoxCols;
using attn::kSwizzleBytes;
using bf16 = __nv_bfloat16;

// A block: NC consumer warpgroups of 64 queries each (wgmma's M), then one
// producer warp (the rest of FlashAttention-3's producer warpgroup would
// idle). Registers: at most 168 a thread at NC 2 (each of an SM's four
// sub-partitions holds 16384, three of the block's nine warps), 128 at NC 3.
// FlashAttention-3 gives its consumers 240 by setmaxnreg; ptxas of CUDA
// 13.0 still allocated this code within the launch bound with it (the
// overlap at 128-key tiles, dh 128, needs 211 and spills), so it is not used.
constexpr int rows_of(int nc) { return 64 * nc; }
constexpr int threads_of(int nc) { return 128 * nc + 32; }

// Shared memory of one block (byte offsets from a 1024-byte aligned base:
// the 128-byte swizzle repeats every 8 rows of 128 bytes, and both TMA and
// wgmma apply it to address bits 4-6 xor 7-9, so every box starts on a
// 1024-byte boundary). A [rows][DH] tile is DH / 64 boxes of [rows][64],
// one after the other.
template <int DH, int KB, int ST, int NC>
struct Plan {
  static constexpr int kRows = rows_of(NC);
  static constexpr int kQBytes = kRows * DH * 2;
  static constexpr int kTileBytes = KB * DH * 2;  // k or v of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kBarOffset = kQBytes + ST * kStageBytes;
  static constexpr size_t kSmem = size_t(kBarOffset) + (1 + 2 * ST) * 8 + 1024;  // + the base's alignment
};

#if HG_LAB_WGMMA
// ---- the instructions --------------------------------------------------------------

using namespace sm90;  // cuda/wgmma.cuh

// The first 1024-byte boundary in the dynamic shared memory `raw` (a
// shared-space address), and a pointer to shared address `at` (>= raw's).
__device__ __forceinline__ uint32_t aligned_base(const unsigned char* raw) {
  return (shared_address(raw) + 1023u) & ~1023u;
}
__device__ __forceinline__ uint64_t* barriers_of(unsigned char* raw, uint32_t at) {
  return reinterpret_cast<uint64_t*>(raw + (at - shared_address(raw)));
}

// The block's barriers: bars[0] for the copy staged once (one arrival: the
// producer's expect_tx), then st "full" ones (the same) and st "empty" ones
// (every consumer thread arrives). The whole block calls it.
__device__ __forceinline__ void init_barriers(uint64_t* bars, int st, int consumers) {
  if (threadIdx.x == 0) {
    barrier_init(bars, 1);
    for (int s = 0; s < st; ++s) barrier_init(bars + 1 + s, 1), barrier_init(bars + 1 + st + s, 128 * consumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// acc (+)= a b for k16 step kk of a tile of KB rows whose MN-major b (v, or
// a streamed tile in the backward) is DH / 64 boxes of [KB][64] from b_at:
// one n = DH wgmma (the second 64 columns a leading offset of one box on),
// or with kSplitN one n64 wgmma per box, on the halves of acc (the n128
// accumulator's i < 32 are its columns 0-63, the rest 64-127: the same
// layout as two n64 ones), which needs no leading offset.
template <int DH, int KB, bool kSplitN>
__device__ __forceinline__ void mma_mn(float (&acc)[DH / 2], const uint32_t (&a)[4], uint32_t b_at, int kk,
                                       int accumulate) {
  const uint32_t at = b_at + kk * 16 * kSwizzleBytes;
  if constexpr (DH == 128 && kSplitN) {
    wgmma_rs(*reinterpret_cast<float(*)[32]>(&acc[0]), a, desc_mn_major(at, KB * kSwizzleBytes), accumulate);
    wgmma_rs(*reinterpret_cast<float(*)[32]>(&acc[32]), a, desc_mn_major(at + KB * kSwizzleBytes, KB * kSwizzleBytes),
             accumulate);
  } else {
    wgmma_rs(acc, a, desc_mn_major(at, KB * kSwizzleBytes), accumulate);
  }
}

#endif  // HG_LAB_WGMMA

// ---- the forward kernel ----------------------------------------------------------------

// kOverlap: the next tile's q k^T runs beside this tile's p v. kSplitN:
// p v in two n64 halves at dh 128 (mma_mn).
template <int DH, int KB, int ST, bool kOverlap, int NC, bool kSplitN>
__global__ void __launch_bounds__(threads_of(NC), 1)
    forward_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                   const __grid_constant__ CUtensorMap vmap, Args a) {
  static_assert(DH % 64 == 0 && KB % 16 == 0 && (KB == 64 || KB == 128) && (DH == 64 || DH == 128) && ST >= 2);
#if HG_LAB_WGMMA
  using P = Plan<DH, KB, ST, NC>;
  constexpr int kRows = P::kRows;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = aligned_base(raw);
  uint64_t* bars = barriers_of(raw, base + P::kBarOffset);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + ST;
  const uint32_t kv_at = base + P::kQBytes;  // stage s: k at kv_at + s * kStageBytes, v kTileBytes on

  const int64_t bh = blockIdx.y;
  const int q_block = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;  // long causal blocks first
  const int key_end = a.key_end(min(q_block + kRows, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  init_barriers(bars, ST, NC);

  if (threadIdx.x >= 128 * NC) {  // the producer warp; one thread issues every copy
    if (threadIdx.x == 128 * NC && tiles > 0) {
      const int head = int(bh % a.heads), batch = int(bh / a.heads);
      stage_expect(q_full, P::kQBytes);
      for (int c = 0; c < DH / kBoxCols; ++c)
        tma_load(base + c * kRows * kSwizzleBytes, &qmap, c * kBoxCols, q_block, head, batch, q_full);
      for (int tile = 0; tile < tiles; ++tile) {
        const int s = tile % ST;
        if (tile >= ST) barrier_wait(empty + s, uint32_t((tile / ST - 1) & 1));  // its previous use is read
        stage_expect(full + s, P::kStageBytes);
        const uint32_t k_at = kv_at + s * P::kStageBytes, v_at = k_at + P::kTileBytes;
        for (int c = 0; c < DH / kBoxCols; ++c) {
          tma_load(k_at + c * KB * kSwizzleBytes, &kmap, c * kBoxCols, tile * KB, head, batch, full + s);
          tma_load(v_at + c * KB * kSwizzleBytes, &vmap, c * kBoxCols, tile * KB, head, batch, full + s);
        }
      }
    }
    return;
  }

  // Consumer warpgroup cw: queries row0 .. row0 + 63; this thread's rows
  // row0 + 16 w + g and + 8 (acc_row), its columns 2 t + acc_col.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int row0 = q_block + 64 * cw, my_row = row0 + 16 * w + g;
  // Causal: the tiles past this warpgroup's last visible key (the first
  // warpgroup stops short of the block's last) are only waited for and
  // released, so that the stage protocol stays the same for all; so are
  // all tiles of a warpgroup whose rows all lie past Tq.
  const int my_end = row0 >= a.tq ? 0 : a.causal ? min(key_end, max(0, row0 + 64 + a.tk - a.tq)) : key_end;
  const int my_tiles = (my_end + KB - 1) / KB;
  const float c = a.scale_log2;
  float o[DH / 2];
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running base-2 max and this thread's partial sums
  if (tiles > 0) barrier_wait(q_full, 0);
  const uint32_t q_at = base + 64 * cw * kSwizzleBytes;  // this warpgroup's rows in every q box
  auto k_of = [&](int tile) { return kv_at + (tile % ST) * P::kStageBytes; };

  // s = q k^T of a tile, issued and committed (one wgmma group).
  auto issue_s = [&](float(&sc)[KB / 2], int tile) {
    const uint32_t k_at = k_of(tile);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc) {
      const uint32_t step = (kc % 4) * 32;  // 32 bytes per k16 step inside a 128-byte row
      wgmma_ss(sc, desc_k_major(q_at + (kc / 4) * kRows * kSwizzleBytes + step),
               desc_k_major(k_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
    }
    wgmma_commit();
  };
  // o += p v of a tile, issued and committed.
  auto issue_pv = [&](uint32_t(&pa)[KB / 16][4], int tile) {
    const uint32_t v_at = k_of(tile) + P::kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk) mma_mn<DH, KB, kSplitN>(o, pa[kk], v_at, kk, 1);
    wgmma_commit();
  };
  // The online softmax of tile `tile`'s scores: removed keys to -inf, m and
  // l moved, p written as A fragments; alpha: what o must be multiplied by
  // before this p v is added.
  auto softmax = [&](float(&sc)[KB / 2], int tile, uint32_t(&pa)[KB / 16][4], float(&alpha)[2]) {
    const int n0 = tile * KB;
    // Keys past Tk and causally hidden keys (only on the tiles that reach
    // them; a row past Tq is never written).
    if (n0 + KB > a.tk || (a.causal && n0 + KB - 1 > row0 + a.tk - a.tq)) {
#pragma unroll
      for (int i = 0; i < KB / 2; ++i) {
        const int col = n0 + 2 * t + acc_col(i), row = my_row + acc_row(i);
        if (col >= a.tk || (a.causal && col > row + a.tk - a.tq)) sc[i] = -INFINITY;
      }
    }
    // On the raw scores: c > 0 keeps the order, so the row max is taken
    // before scaling and p = exp2(s c - m) is one fma.
    float neg_base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 2 * h; i < KB / 2; i += 4) mx = fmaxf(mx, fmaxf(sc[i], sc[i + 1]));
      const float m_new = fmaxf(m[h], attn::quad_max(mx) * c);
      const float base2 = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      alpha[h] = attn::exp2_ftz(m[h] - base2);
      l[h] *= alpha[h];
      m[h] = m_new, neg_base[h] = -base2;
    }
#pragma unroll
    for (int i = 0; i < KB / 2; i += 2) {
      const int h = (i >> 1) & 1;
      const float p0 = attn::exp2_ftz(fmaf(sc[i], c, neg_base[h]));
      const float p1 = attn::exp2_ftz(fmaf(sc[i + 1], c, neg_base[h]));
      l[h] += p0 + p1;
      pa[i / 8][(i % 8) / 2] = attn::pack(p0, p1);
    }
  };
  auto rescale = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < DH / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
  };
  auto pv_done = [&](uint32_t(&pa)[KB / 16][4]) {
#pragma unroll
    for (int i = 0; i < DH / 2; ++i) fence_operand(o[i]);
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) fence_operand(pa[kk][r]);
  };

  float sc[KB / 2], alpha[2];
  uint32_t pa[KB / 16][4];
  if constexpr (!kOverlap) {
    for (int tile = 0; tile < my_tiles; ++tile) {
      barrier_wait(full + tile % ST, uint32_t((tile / ST) & 1));
      issue_s(sc, tile);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < KB / 2; ++i) fence_operand(sc[i]);
      softmax(sc, tile, pa, alpha);
      rescale(alpha);
      issue_pv(pa, tile);
      wgmma_wait<0>();
      pv_done(pa);
      barrier_arrive(empty + tile % ST);  // this thread's reads of the stage are done
    }
  } else if (my_tiles > 0) {
    // FlashAttention-3's overlap inside a warpgroup: the next tile's q k^T
    // and this tile's p v are in flight together, and the next softmax runs
    // while p v still does (o is rescaled once p v is done).
    barrier_wait(full, 0);
    issue_s(sc, 0);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < KB / 2; ++i) fence_operand(sc[i]);
    softmax(sc, 0, pa, alpha);
    // One tile with the next one's q k^T beside its p v: two groups in
    // flight, so that the compiler sees which one wgmma_wait<1> retires. p
    // alternates between two register sets (a copy would write registers a
    // running wgmma reads); the last tile is peeled off.
    uint32_t pb[KB / 16][4];
    auto step = [&](uint32_t(&cur)[KB / 16][4], uint32_t(&nxt)[KB / 16][4], int tile) {
      barrier_wait(full + (tile + 1) % ST, uint32_t(((tile + 1) / ST) & 1));
      issue_s(sc, tile + 1);
      issue_pv(cur, tile);
      wgmma_wait<1>();  // q k^T done (groups complete in order), p v may still run
#pragma unroll
      for (int i = 0; i < KB / 2; ++i) fence_operand(sc[i]);
      softmax(sc, tile + 1, nxt, alpha);
      wgmma_wait<0>();
      pv_done(cur);
      barrier_arrive(empty + tile % ST);
      rescale(alpha);
    };
    auto last = [&](uint32_t(&cur)[KB / 16][4], int tile) {
      issue_pv(cur, tile);
      wgmma_wait<0>();
      pv_done(cur);
      barrier_arrive(empty + tile % ST);
    };
    int tile = 0;
    for (; tile + 2 < my_tiles; tile += 2) step(pa, pb, tile), step(pb, pa, tile + 1);
    if (tile + 1 < my_tiles) {
      step(pa, pb, tile);
      last(pb, tile + 1);
    } else {
      last(pa, tile);
    }
  }
  for (int tile = my_tiles; tile < tiles; ++tile) {  // causal tiles this warpgroup sees none of
    barrier_wait(full + tile % ST, uint32_t((tile / ST) & 1));
    barrier_arrive(empty + tile % ST);
  }
  bf16* out = static_cast<bf16*>(a.out) + a.o_base(bh);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = attn::quad_sum(l[h]);
    const int row = my_row + 8 * h;
    if (row >= a.tq) continue;
    const float inv = total == 0.f ? 0.f : 1.f / total;  // a row with every key removed is zeros
#pragma unroll
    for (int i = 2 * h; i < DH / 2; i += 4)
      *reinterpret_cast<uint32_t*>(out + int64_t(row) * a.o_row + 2 * t + acc_col(i)) =
          attn::pack(o[i] * inv, o[i + 1] * inv);
    if (t == 0) {
      a.lse[bh * a.tq + row] = total == 0.f ? -INFINITY : m[h] * attn::kLn2 + logf(total);
      a.stats[bh * a.tq + row] = make_float2(m[h], inv);
    }
  }
#else
  __trap();
#endif
}

// ---- self-test: one warpgroup, one tile of each stage ------------------------------------

// out_tile[64][DH]: q as read back from shared memory through the 128-byte
// swizzle (16-byte chunk j of row r sits at chunk j ^ (r % 8)); out_s[64][KB]
// = q k^T by wgmma_ss; out_o[64][DH] = p v by wgmma_rs with p[64][KB] read
// from global memory into the A fragment layout. Each isolates one
// assumption: the TMA box and swizzle, the K-major descriptors and the
// accumulator layout, the register A layout and the MN-major descriptor.
template <int DH, int KB>
__global__ void __launch_bounds__(128)
    self_test_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                     const __grid_constant__ CUtensorMap vmap, const bf16* p, float* out_tile, float* out_s,
                     float* out_o, float* out_o2) {
#if HG_LAB_WGMMA
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = aligned_base(raw);
  unsigned char* smem = raw + (base - shared_address(raw));
  const uint32_t k_at = base + 64 * DH * 2, v_at = k_at + KB * DH * 2;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 64 * DH * 2 + 2 * KB * DH * 2);
  if (threadIdx.x == 0) {
    barrier_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    stage_expect(bar, (64 + 2 * KB) * DH * 2);
    for (int c = 0; c < DH / kBoxCols; ++c) {
      tma_load(base + c * 64 * kSwizzleBytes, &qmap, c * kBoxCols, 0, 0, 0, bar);
      tma_load(k_at + c * KB * kSwizzleBytes, &kmap, c * kBoxCols, 0, 0, 0, bar);
      tma_load(v_at + c * KB * kSwizzleBytes, &vmap, c * kBoxCols, 0, 0, 0, bar);
    }
  }
  barrier_wait(bar, 0);
  for (int e = threadIdx.x; e < 64 * DH; e += 128) {
    const int r = e / DH, col = e % DH, box = col / kBoxCols, cb = col % kBoxCols;
    const int chunk = (cb / 8) ^ (r % 8);
    const bf16* at = reinterpret_cast<const bf16*>(smem + box * 64 * kSwizzleBytes + r * kSwizzleBytes + chunk * 16);
    out_tile[e] = __bfloat162float(at[cb % 8]);
  }
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  float sc[KB / 2];
  wgmma_fence();
#pragma unroll
  for (int kc = 0; kc < DH / 16; ++kc)
    wgmma_ss(sc, desc_k_major(base + (kc / 4) * 64 * kSwizzleBytes + (kc % 4) * 32),
             desc_k_major(k_at + (kc / 4) * KB * kSwizzleBytes + (kc % 4) * 32), kc > 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < KB / 2; ++i) {
    fence_operand(sc[i]);
    out_s[(16 * w + g + acc_row(i)) * KB + 2 * t + acc_col(i)] = sc[i];
  }
  uint32_t pa[KB / 16][4];
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pa[kk][r] =
          *reinterpret_cast<const uint32_t*>(p + (16 * w + g + 8 * (r & 1)) * KB + 16 * kk + 8 * (r >> 1) + 2 * t);
  float o[DH / 2], o2[DH / 2];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) mma_mn<DH, KB, false>(o, pa[kk], v_at, kk, kk > 0);
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) mma_mn<DH, KB, true>(o2, pa[kk], v_at, kk, kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) {
    fence_operand(o[i]), fence_operand(o2[i]);
    out_o[(16 * w + g + acc_row(i)) * DH + 2 * t + acc_col(i)] = o[i];
    out_o2[(16 * w + g + acc_row(i)) * DH + 2 * t + acc_col(i)] = o2[i];
  }
#else
  __trap();
#endif
}

// ---- host side ---------------------------------------------------------------------------

// The map of a bf16 tensor (attn::encode_map); false, with the reason on
// stderr, when it cannot be encoded (no encoder in the driver, or an address
// or byte stride that is not a multiple of 16).
inline bool make_map(CUtensorMap* map, const void* p, int dh, int rows, int heads, int64_t batch, int64_t row_stride,
                     int64_t head_stride, int64_t batch_stride, int box_rows) {
  const CUresult r = attn::encode_map(map, p, dh, rows, heads, batch, row_stride, head_stride, batch_stride, box_rows);
  if (r == CUDA_ERROR_NOT_FOUND)
    std::fprintf(stderr, "cuTensorMapEncodeTiled: not found through cudaGetDriverEntryPointByVersion\n");
  else if (r != CUDA_SUCCESS)
    std::fprintf(stderr,
                 "cuTensorMapEncodeTiled: error %d (dh %d, rows %d, heads %d, batch %lld, element strides %lld, "
                 "%lld, %lld, box rows %d)\n",
                 int(r), dh, rows, heads, (long long)batch, (long long)row_stride, (long long)head_stride,
                 (long long)batch_stride, box_rows);
  return r == CUDA_SUCCESS;
}

// A forward kernel over bh = batch * heads heads of a: blocks of `rows`
// queries of `threads` threads, k and v in tiles of `keys`.
// cudaErrorInvalidValue for what the kernels do not do (a mask, scale <= 0,
// strides or addresses the maps refuse); otherwise the launch's error.
template <class Kernel>
cudaError_t launch_forward(Kernel kernel, int rows, int keys, int threads, size_t smem, int dh, const Args& a,
                           int64_t bh, cudaStream_t stream) {
  if (a.mask != nullptr || !(a.scale_log2 > 0.f) || a.heads <= 0 || bh % a.heads != 0) return cudaErrorInvalidValue;
  const int64_t batch = bh / a.heads;
  CUtensorMap qmap, kmap, vmap;
  if (!make_map(&qmap, a.q, dh, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, rows) ||
      !make_map(&kmap, a.k, dh, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, keys) ||
      !make_map(&vmap, a.v, dh, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, keys))
    return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned((a.tq + rows - 1) / rows), unsigned(bh));
  kernel<<<grid, threads, smem, stream>>>(qmap, kmap, vmap, a);
  return cudaGetLastError();
}

// A lab candidate (forward_kernel).
template <int DH, int KB, int ST, bool kOverlap, int NC = 2, bool kSplitN = false>
cudaError_t forward(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  return launch_forward(forward_kernel<DH, KB, ST, kOverlap, NC, kSplitN>, rows_of(NC), KB, threads_of(NC),
                        Plan<DH, KB, ST, NC>::kSmem, DH, a, bh, stream);
}

// The library's kernel itself (cuda/attention_wgmma_kernel.cuh), with the
// launch shape cuda/attention_wgmma.cu gives it.
template <int DH>
cudaError_t forward_production(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  return launch_forward(attn::forward_wgmma_kernel<DH>, attn::kRows, attn::kKeys, attn::kThreadsPerBlock,
                        attn::Plan<DH>::kSmem, DH, a, bh, stream);
}

}  // namespace hg::gpu::lab_wgmma
