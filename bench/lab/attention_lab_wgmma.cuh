#pragma once
// BF16 flash attention forward on Hopper's own instructions (sm_90a): the
// lab's wgmma forwards beside the mma.sync kernels of
// attention_lab_kernels.cuh. The library's kernel itself
// (cuda/attention_wgmma_kernel.cuh, forward_production) and its block body
// at other shapes (body_kernel), after FlashAttention-3's plan:
//   - a block of 64 NC queries: NC consumer warpgroups of 64 queries each
//     (wgmma's M) and a producer warp (one thread issues TMA copies);
//   - q (once) and k, v tiles of KB keys land by TMA (cp.async.bulk.tensor,
//     128-byte swizzle, zeros past the ends of the tensor) in a ring of ST
//     stages; each stage has a "full" mbarrier (the bytes arrived) and an
//     "empty" one (all consumer threads are done with it);
//   - s = q k^T by wgmma with both operands in shared memory, the online
//     softmax in registers (exp2 with scale * log2(e) folded into one fma),
//     then o += p v by wgmma with p from registers and v from shared memory
//     through its transposed (MN-major) descriptor.
// The candidate of this file (overlap_kernel) runs the next tile's q k^T
// beside this tile's p v (FlashAttention-3's overlap inside a warpgroup; its
// ping-pong between warpgroups is left to the scheduler).
// Outputs as forward_bf16_kernel writes them: o, the row log-sum-exp and the
// row stats {base-2 max, 1 / sum} the production backward rebuilds p from.
// No key-padding mask, scale > 0 (the launcher refuses the rest).
// Only an sm_90a compile holds the device code; elsewhere the kernels trap
// (the library's is empty).
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
// producer warp. Registers: ptxas bounds the code at 168 a thread at NC 2,
// 128 at NC 3. With a whole producer warpgroup instead (threads_split), the
// producer keeps kProducerRegisters and the consumers take the rest by
// setmaxnreg, as FlashAttention-3 does: 240 a thread at NC 2 (384 threads
// of 168 = 128 x 24 + 256 x 240), 160 at NC 3. The setmaxnreg must sit
// inside each role's branch (cuda/wgmma.cuh), which is why forward_body
// and backward_kernel issue it, not the kernels around them.
constexpr int rows_of(int nc) { return 64 * nc; }
constexpr int threads_of(int nc) { return 128 * nc + 32; }
constexpr int threads_split(int nc) { return 128 * nc + 128; }
constexpr int kProducerRegisters = 24;
// What the consumers of a block of nc consumer warpgroups and a producer
// warpgroup can take: the block's share of the register file (at most 255 a
// thread, in steps of 8) less the producer's, split evenly.
constexpr int consumer_registers(int nc) {
  const int share = (65536 / threads_split(nc)) / 8 * 8;
  const int per = (share * threads_split(nc) - 128 * kProducerRegisters) / (128 * nc) / 8 * 8;
  return per > 240 ? 240 : per;
}

// Shared memory of one forward block: the library's plan
// (cuda/attention_wgmma_kernel.cuh).
template <int DH, int KB, int ST, int NC>
using Plan = attn::ForwardPlan<DH, rows_of(NC), KB, ST>;

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

// ---- the forward kernels --------------------------------------------------------------

// The library's forward (attn::forward_body) at another block shape: NC
// consumer warpgroups, k and v tiles of KB keys in ST stages.
template <int DH, int KB, int ST, int NC>
__global__ void __launch_bounds__(threads_of(NC), 1)
    body_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                const __grid_constant__ CUtensorMap vmap, Args a) {
#if HG_LAB_WGMMA
  attn::forward_body<DH, rows_of(NC), KB, ST>(qmap, kmap, vmap, a);
#else
  __trap();
#endif
}

// The candidate: FlashAttention-3's overlap inside a warpgroup, as the tile
// loop of the library's forward_body. The next tile's q k^T and this tile's
// p v are in flight together, and the next softmax runs while p v still
// does (o is rescaled once p v is done). kSplitN: p v in two n64 halves at
// dh 128 (mma_mn).
//
// kPingPong (two consumer warpgroups): the warpgroups also take turns to
// issue their products (FlashAttention-3's ping-pong), so that one's softmax
// runs while the other's products do. Warpgroup w waits at named barrier
// 1 + w before it issues and then lets the other go (bar.arrive at 2 - w);
// the first turn is the first warpgroup's. Both must issue equally often,
// so a block whose warpgroups see different tile counts (causal rows with
// Tq != Tk, rows past Tq) runs without the turns.
template <bool kSplitN, int kRegisters = 0, bool kPingPong = false>
struct OverlapLoop {
  // forward_body's register split (cuda/attention_wgmma_kernel.cuh); 0: none.
  static constexpr int kConsumerRegisters = kRegisters, kProducerRegisters = lab_wgmma::kProducerRegisters;
  template <int DH, int ROWS, int KB, int ST>
  __device__ static void run(const attn::ConsumerTiles<DH>& s) {
#if HG_LAB_WGMMA
    using P = attn::ForwardPlan<DH, ROWS, KB, ST>;
    const Args& a = s.a;
    static_assert(!kPingPong || ROWS == 128, "ping-pong takes turns between two consumer warpgroups");
    const int cw = threadIdx.x / 128;
    bool turns = false;
    if constexpr (kPingPong) {  // no turns without tiles: nobody would take the first
      // The other warpgroup's tile count, as forward_body counts this one's.
      const int q_block = s.row0 - 64 * cw, other_row0 = q_block + 64 * (1 - cw);
      const int key_end = a.key_end(min(q_block + ROWS, a.tq));
      turns = s.tiles > 0 && (attn::warpgroup_key_end(a, other_row0, key_end) + KB - 1) / KB == s.tiles;
    }
    auto my_turn = [&] {
      if (turns) asm volatile("bar.sync %0, 256;" ::"r"(1 + cw) : "memory");
    };
    int turns_left = s.tiles + 1;  // issue points: the first q k^T, then one a tile
    auto other_turn = [&] {
      // The second warpgroup's last turn would be waited for by nobody.
      if (turns && !(cw == 1 && --turns_left == 0)) asm volatile("bar.arrive %0, 256;" ::"r"(2 - cw) : "memory");
    };
    if (turns && cw == 1) asm volatile("bar.arrive 1, 256;" ::: "memory");  // the first turn is the first's
    auto k_of = [&](int tile) { return s.kv_at + (tile % ST) * P::kStageBytes; };
    auto issue_s = [&](float(&sc)[KB / 2], int tile) { attn::issue_qk<DH, ROWS, KB>(sc, s.q_at, k_of(tile)); };
    auto issue_pv = [&](uint32_t(&pa)[KB / 16][4], int tile) {
      const uint32_t v_at = k_of(tile) + P::kTileBytes;
      if constexpr (kSplitN) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KB / 16; ++kk) mma_mn<DH, KB, true>(s.o, pa[kk], v_at, kk, 1);
        wgmma_commit();
      } else {
        attn::issue_pv<DH, KB>(s.o, pa, v_at);
      }
    };
    // Keys past Tk and causally hidden ones to -inf, then the online softmax.
    auto softmax = [&](float(&sc)[KB / 2], int tile, uint32_t(&pa)[KB / 16][4], float(&alpha)[2]) {
      const int n0 = tile * KB;
      if (n0 + KB > a.tk || (a.causal && n0 + KB - 1 > s.row0 + a.tk - a.tq)) {
#pragma unroll
        for (int i = 0; i < KB / 2; ++i) {
          const int col = n0 + 2 * s.t + acc_col(i), row = s.my_row + acc_row(i);
          if (col >= a.tk || (a.causal && col > row + a.tk - a.tq)) sc[i] = -INFINITY;
        }
      }
      float neg_base[2];
      attn::online_softmax<KB>(sc, pa, neg_base, alpha, s.m, s.l, s.c);
    };
    float sc[KB / 2], alpha[2];
    uint32_t pa[KB / 16][4], pb[KB / 16][4];
    if (s.tiles == 0) return;
    barrier_wait<kRegisters == 0>(s.full, 0);
    my_turn();
    issue_s(sc, 0);
    other_turn();
    wgmma_wait<0>();
    fence_operands(sc);
    softmax(sc, 0, pa, alpha);
    // One tile with the next one's q k^T beside its p v: two groups in
    // flight, so that the compiler sees which one wgmma_wait<1> retires. p
    // alternates between two register sets (a copy would write registers a
    // running wgmma reads); the last tile is peeled off.
    auto step = [&](uint32_t(&cur)[KB / 16][4], uint32_t(&nxt)[KB / 16][4], int tile) {
      barrier_wait<kRegisters == 0>(s.full + (tile + 1) % ST, uint32_t(((tile + 1) / ST) & 1));
      my_turn();
      issue_s(sc, tile + 1);
      issue_pv(cur, tile);
      other_turn();
      wgmma_wait<1>();  // q k^T done (groups complete in order), p v may still run
      fence_operands(sc);
      softmax(sc, tile + 1, nxt, alpha);
      wgmma_wait<0>();
      attn::pv_done<DH, KB>(s.o, cur);
      barrier_arrive(s.empty + tile % ST);
      attn::rescale<DH>(s.o, alpha);
    };
    auto last = [&](uint32_t(&cur)[KB / 16][4], int tile) {
      my_turn();
      issue_pv(cur, tile);
      other_turn();
      wgmma_wait<0>();
      attn::pv_done<DH, KB>(s.o, cur);
      barrier_arrive(s.empty + tile % ST);
    };
    int tile = 0;
    for (; tile + 2 < s.tiles; tile += 2) step(pa, pb, tile), step(pb, pa, tile + 1);
    if (tile + 1 < s.tiles) {
      step(pa, pb, tile);
      last(pb, tile + 1);
    } else {
      last(pa, tile);
    }
#endif
  }
};

template <int DH, int KB, int ST, int NC, bool kSplitN>
__global__ void __launch_bounds__(threads_of(NC), 1)
    overlap_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                   const __grid_constant__ CUtensorMap vmap, Args a) {
#if HG_LAB_WGMMA
  attn::forward_body<DH, rows_of(NC), KB, ST, OverlapLoop<kSplitN>>(qmap, kmap, vmap, a);
#else
  __trap();
#endif
}

// The overlap with a producer warpgroup that gives its registers to the
// consumers (threads_split); kPingPong: with the warpgroups' turns.
template <int DH, int KB, int ST, int NC, bool kPingPong = false>
__global__ void __launch_bounds__(threads_split(NC), 1)
    overlap_split_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap vmap, Args a) {
#if HG_LAB_WGMMA
  attn::forward_body<DH, rows_of(NC), KB, ST, OverlapLoop<false, consumer_registers(NC), kPingPong>>(qmap, kmap, vmap,
                                                                                                     a);
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

// A lab candidate: the library's forward_body at another shape, or with
// kOverlap the overlapped candidate (kSplitN only there).
template <int DH, int KB, int ST, bool kOverlap, int NC = 2, bool kSplitN = false>
cudaError_t forward(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  static_assert(kOverlap || !kSplitN);
  constexpr size_t smem = Plan<DH, KB, ST, NC>::kSmem;
  if constexpr (kOverlap)
    return launch_forward(overlap_kernel<DH, KB, ST, NC, kSplitN>, rows_of(NC), KB, threads_of(NC), smem, DH, a, bh,
                          stream);
  else return launch_forward(body_kernel<DH, KB, ST, NC>, rows_of(NC), KB, threads_of(NC), smem, DH, a, bh, stream);
}

// The overlapped candidate with the register split (overlap_split_kernel),
// kPingPong: and the warpgroups' turns.
template <int DH, int KB, int ST, int NC = 2, bool kPingPong = false>
cudaError_t forward_split(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  return launch_forward(overlap_split_kernel<DH, KB, ST, NC, kPingPong>, rows_of(NC), KB, threads_split(NC),
                        Plan<DH, KB, ST, NC>::kSmem, DH, a, bh, stream);
}

// The library's kernel itself (cuda/attention_wgmma_kernel.cuh), with the
// launch shape cuda/attention_wgmma.cu gives it.
template <int DH>
cudaError_t forward_production(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  return launch_forward(attn::forward_wgmma_kernel<DH>, attn::kRows, attn::forward_keys<DH>(), attn::kThreadsPerBlock,
                        attn::Plan<DH>::kSmem, DH, a, bh, stream);
}

}  // namespace hg::gpu::lab_wgmma
