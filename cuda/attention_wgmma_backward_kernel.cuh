#pragma once
// The BF16 flash attention backward on sm_90a (wgmma + TMA), after
// FlashAttention-3: two kernels of one template, after the delta kernel of
// cuda/attention.cu (delta = rowsum(do . o)), as the mma.sync backward
// splits the work, so that no float atomics are needed and results repeat
// bitwise:
//   dk/dv: per block of 128 keys, q, do tiles of queries streamed:
//          s^T = k q^T, dp^T = v do^T, p^T from the forward's stats,
//          dv += p^T do, ds^T = p^T (dp^T - delta), dk += ds^T q;
//   dq:    per block of 128 queries, k, v tiles of keys streamed:
//          s = q k^T, dp = do v^T, p, ds = p (dp - delta), dq += ds k.
// Or the dk/dv kernel also stores its ds (bf16, as the products use it) and
// dq_from_ds_kernel computes dq += ds k from it: one product where the dq
// kernel above recomputes s and dp for its one (7 tile products become 5),
// for O(Tq Tk) bytes of scratch, taken in chunks of heads by the launcher.
// A block is two consumer warpgroups of 64 resident rows each (wgmma's M)
// and a producer warpgroup that keeps 24 registers a thread and gives the
// rest to the consumers (setmaxnreg: 240 a thread, room for dk and dv's
// accumulators at dh 128). One producer thread stages the resident rows
// once and the streamed tiles in a ring of 2 stages (TMA, 128-byte swizzle,
// zeros past the tensor's ends); in dk/dv a second producer warp copies the
// streamed queries' stats and delta into the stage beside them, so that no
// global load waits between the products. Each tile's products overlap:
// p is computed while dp runs, and dv += p^T do while ds is computed.
// Launched by the library (cuda/attention_wgmma.cu) and, as backward
// variant 14, by the attention lab (bench/lab/attention_lab.cu).
// Only an sm_90a device compile holds the kernel's body; elsewhere it is
// empty. Internal linkage, as cuda/attention_wgmma_kernel.cuh.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention_args.cuh"
#include "cuda/attention_column_sums.cuh"
#include "cuda/attention_row_math.cuh"
#include "cuda/attention_tensor_map.cuh"  // kSwizzleBytes
#include "cuda/bulk_stage.cuh"
#include "cuda/wgmma.cuh"

#define HG_WGMMA_DEVICE HG_SM90A_DEVICE  // cuda/wgmma.cuh: an sm_90a device compile

namespace hg::gpu::attn {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBackwardRows = 128;  // resident rows a block: keys (dk/dv) or queries (dq)
// Streamed rows a stage in the library's kernels: 128 (s and dp as wgmma
// n128, half as many stage barriers as 64-row tiles take) except in dk/dv
// at dh 128, whose dk and dv accumulators leave no registers for a
// 128-query tile's scores. On the H200 128-key tiles make the whole
// backward 4-6% faster at dh 128, and 128-row tiles in both kernels
// 14-18% at dh 64 (bench/lab/attention.md). With a key mask the same: at dh
// 64 masked dk/dv on 128-query tiles serialises its wgmmas for want of
// registers (ptxas C7512) and still beats 64-query tiles by 5-6%.
constexpr int backward_tile(int dh, bool dkdv) { return dkdv && dh == 128 ? 64 : 128; }
constexpr int kBackwardStages = 2;
constexpr int kBackwardConsumers = 2;                             // warpgroups
constexpr int kBackwardThreads = 128 * kBackwardConsumers + 128;  // + the producer warpgroup
static_assert(kBackwardThreads == 384);                           // sm90::kSplit*Registers' block

// Stored ds (DsTiles::at not null): bf16 ds in the order dq_from_ds_kernel
// feeds it to wgmma, 4 KiB per 16 queries x 128 keys: for 16-query group q16
// and key tile kt (128 keys) of head bh, k16 step ks of the tile and lane l
// of the consuming warp, the uint4 at
//   ((bh - bh0) groups + q16) key_tiles + kt) 256 + 32 ks + l
// holds that lane's A fragment (wgmma.cuh: a[r] = rows g + 8 (r & 1),
// columns 2 t + 8 (r >> 1)). A warp of the dk/dv kernel holds one k16 step
// of every query as ds^T, transposes each 8 x 8 block (transpose8x8) and
// stores 512 contiguous bytes a group; a dq warp's 16 queries read 4 KiB.
// Launches cover heads bh0 .. bh0 + gridDim.y - 1 (the chunk of heads whose
// ds fits the scratch).
struct DsTiles {
  uint4* at = nullptr;       // null: the recomputing pair
  int64_t bh0 = 0;           // first head (batch * heads + head) of the launch
  int64_t query_groups = 0;  // 16-query groups a head: 8 ceil(Tq / 128)
  int key_tiles = 0;         // ceil(Tk / 128)
  __device__ uint4* group(int64_t bh, int64_t q16, int kt) const {
    return at + (((bh - bh0) * query_groups + q16) * key_tiles + kt) * 256;
  }
  // The tiles of a call's heads, no scratch yet.
  static DsTiles of(const Args& a) { return {nullptr, 0, 8 * ((a.tq + 127) / 128), (a.tk + 127) / 128}; }
  // The uint4s that `heads` heads' ds take.
  int64_t uint4s(int64_t heads) const { return heads * query_groups * key_tiles * 256; }
};

// Shared memory, byte offsets from a 1024-byte aligned base: the two
// resident operands, ST stages (two streamed tiles of KB rows each), each
// stage's queries' stats (float2) and delta (float), the barriers, the
// resident keys' mask terms (dk/dv with a mask), the warps' column sums of
// the outputs (Args::dq_sums ..).
template <int DH, int KB, int ST = kBackwardStages>
struct BackwardPlan {
  static constexpr int kResBytes = kBackwardRows * DH * 2;
  static constexpr int kTileBytes = KB * DH * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kStatsOffset = 2 * kResBytes + ST * kStageBytes;
  static constexpr int kDeltaOffset = kStatsOffset + ST * KB * 8;
  static constexpr int kBarOffset = kDeltaOffset + ST * KB * 4;
  static constexpr int kKeyMaskOffset = kBarOffset + (1 + 2 * ST) * 8;
  static constexpr int kSumsOffset = kKeyMaskOffset + kBackwardRows * 4;
  static constexpr size_t kSmem = size_t(kSumsOffset) + column_sums_bytes(DH, 2) + 1024;
};

#if HG_WGMMA_DEVICE
using namespace sm90;  // the instructions: cuda/wgmma.cuh

// acc += a b for k16 step kk of a streamed tile whose MN-major b is DH / 64
// boxes of [KB][64] from b_at: one n = DH wgmma.
template <int DH, int KB>
__device__ __forceinline__ void mma_streamed(float (&acc)[DH / 2], const uint32_t (&a)[4], uint32_t b_at, int kk) {
  wgmma_rs(acc, a, desc_mn_major(b_at + kk * 16 * kSwizzleBytes, KB * kSwizzleBytes), 1);
}
#endif  // HG_WGMMA_DEVICE

// kDkDv false: the dq kernel (resident a1 = q, a2 = do; streamed b1 = k,
// b2 = v). True: the dk/dv kernel (resident a1 = k, a2 = v; streamed b1 = q,
// b2 = do). x = a1 b1^T is s (or s^T), y = a2 b2^T is dp (or dp^T). KB:
// streamed rows a stage (backward_tile for the library), ST stages.
// kMasked: a.mask holds a row of additive key biases per batch; dk/dv reads
// its resident keys' terms once, dq its streamed keys' from the stage (the
// stats copier's warp writes them where dk/dv's delta goes). kStoreDs
// (dk/dv only): also store ds into ds.at (DsTiles).
template <int DH, bool kDkDv, int KB, int ST = kBackwardStages, bool kMasked = false, bool kStoreDs = false>
__global__ void __launch_bounds__(kBackwardThreads, 1)
    backward_wgmma_kernel(const __grid_constant__ CUtensorMap a1map, const __grid_constant__ CUtensorMap a2map,
                          const __grid_constant__ CUtensorMap b1map, const __grid_constant__ CUtensorMap b2map, Args a,
                          DsTiles ds) {
  static_assert((DH == 64 || DH == 128) && (KB == 64 || KB == 128) && ST >= 2 && (kDkDv || !kStoreDs));
#if HG_WGMMA_DEVICE
  using P = BackwardPlan<DH, KB, ST>;
  static_assert(P::kStageBytes == 2 * P::kTileBytes && P::kTileBytes == KB * DH * 2);  // load_tile_pairs' ring
  constexpr int NC = kBackwardConsumers;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;  // the first 1024-byte boundary
  unsigned char* smem = raw + (base - shared_address(raw));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + P::kBarOffset);
  uint64_t *res_full = bars, *full = bars + 1, *empty = bars + 1 + ST;
  const uint32_t a2_at = base + P::kResBytes, stages_at = base + 2 * P::kResBytes;
  float2* stage_stats = reinterpret_cast<float2*>(smem + P::kStatsOffset);
  float* stage_delta = reinterpret_cast<float*>(smem + P::kDeltaOffset);
  float* key_mask = reinterpret_cast<float*>(smem + P::kKeyMaskOffset);

  const int64_t bh = ds.bh0 + blockIdx.y;
  // dq: causal blocks with the most keys (the last queries) first; dk/dv:
  // the first keys see the most queries, so the natural order.
  const int r0 = (a.causal && !kDkDv ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBackwardRows;
  const int r_rows = kDkDv ? a.tk : a.tq, s_rows = kDkDv ? a.tq : a.tk;  // resident and streamed extents
  // Streamed tiles first .. first + count - 1.
  int first = 0, end = s_rows;
  if (!kDkDv) end = a.key_end(min(r0 + kBackwardRows, a.tq));
  if (kDkDv && a.causal) first = min(a.first_query(r0), a.tq) / KB;
  const int count = end > first * KB ? (end - first * KB + KB - 1) / KB : 0;
  const int64_t stat_base = bh * a.tq;        // stats and delta of query q at stat_base + q
  constexpr bool kCopier = kDkDv || kMasked;  // a producer warp that fills each stage by plain stores
  init_barriers(res_full, full, empty, ST, NC, kCopier ? 32 : 0);

  if (threadIdx.x >= 128 * NC) {  // the producer warpgroup
    registers_decrease<kSplitProducerRegisters>();
    const int warp = (threadIdx.x - 128 * NC) / 32;
    if (threadIdx.x == 128 * NC && count > 0) {  // one thread issues every copy
      const int head = int(bh % a.heads), batch = int(bh / a.heads);
      stage_expect(res_full, 2 * P::kResBytes);
      tma_load_rows_pair<DH>(base, &a1map, a2_at, &a2map, kBackwardRows, r0, head, batch, res_full);
      load_tile_pairs<DH, KB, ST>(&b1map, &b2map, stages_at, first, count, head, batch, full, empty);
      wait_ring_read<ST>(empty, count);  // the consumers' waits exit (barrier_wait<false>, below)
    }
    if (kCopier && warp == 1) {
      // dk/dv: the stats and delta of each stage's queries ({0, 0} and 0
      // past Tq, where every p is 0), with a mask the resident keys' terms
      // first; dq: the mask terms of each stage's keys. Mask terms are -inf
      // past Tk. Then this warp's arrival.
      const int lane = threadIdx.x % 32;
      const float* mask_row = a.mask_row(bh);
      if constexpr (kDkDv && kMasked)
        for (int j = lane; j < kBackwardRows; j += 32) key_mask[j] = a.key_term(mask_row, r0 + j);
      for (int i = 0; i < count; ++i) {
        const int s = i % ST, n0 = (first + i) * KB;
        wait_stage_free<ST>(empty, i);
        for (int j = lane; j < KB; j += 32) {
          if constexpr (kDkDv) {
            const bool in = n0 + j < a.tq;
            stage_stats[s * KB + j] = in ? a.stats[stat_base + n0 + j] : float2{};
            stage_delta[s * KB + j] = in ? a.delta[stat_base + n0 + j] : 0.f;
          } else {
            stage_delta[s * KB + j] = a.key_term(mask_row, n0 + j);
          }
        }
        barrier_arrive(full + s);  // releases the stores above to the consumers' wait
      }
    }
    return;
  }

  registers_increase<kSplitConsumerRegisters>();
  // Consumer warpgroup cw: resident rows row0 .. row0 + 63; this thread's
  // rows my_row and my_row + 8, its streamed columns 2 t + acc_col.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int row0 = r0 + 64 * cw, my_row = row0 + 16 * w + g;
  const float c = a.scale_log2;
  float acc1[DH / 2], acc2[kDkDv ? DH / 2 : 1];  // dq, or dk and dv
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) acc1[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (kDkDv ? DH / 2 : 1); ++i) acc2[i] = 0.f;
  // dq: the stats and delta of this thread's two query rows ({0, 0}, 0 past Tq).
  float2 row_stats[2] = {};
  float row_delta[2] = {};
  if constexpr (!kDkDv) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (my_row + 8 * h < a.tq)
        row_stats[h] = a.stats[stat_base + my_row + 8 * h], row_delta[h] = a.delta[stat_base + my_row + 8 * h];
  }
  if (count > 0) barrier_wait<false>(res_full, 0);
  const uint32_t a1_wg = base + 64 * cw * kSwizzleBytes, a2_wg = a2_at + 64 * cw * kSwizzleBytes;
  // Whether key k is seen by query q.
  auto seen = [&](int q, int k) { return q < a.tq && k < a.tk && !(a.causal && k > q + a.tk - a.tq); };
  for (int i = 0; i < count; ++i) {
    const int s = i % ST, n0 = (first + i) * KB;
    barrier_wait<false>(full + s, uint32_t((i / ST) & 1));
    if (row0 >= r_rows) {  // a warpgroup past the resident rows only keeps the stage protocol
      barrier_arrive(empty + s);
      continue;
    }
    // The tile's products; kEdge: the tile reaches a (query, key) pair
    // that is not seen (causal, past Tk or Tq), whose p are set to 0.
    // Interior tiles, most of them, skip that test: every streamed and
    // resident row in range and, causal, the warpgroup's last resident key
    // (dk/dv) or the tile's last key (dq) seen by the first query. The two
    // are whole copies of the tile's code: a branch around the p loop alone
    // costs the dh 64 dk/dv kernel registers enough that ptxas serialises
    // its wgmmas.
    auto tile = [&](auto edge) {
      constexpr bool kEdge = decltype(edge)::value;
      const uint32_t b1_at = stages_at + s * P::kStageBytes, b2_at = b1_at + P::kTileBytes;
      float x[KB / 2], y[KB / 2];
      // x = a1 b1^T and y = a2 b2^T, one wgmma group each.
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < DH / 16; ++kc) {
        const uint32_t step = (kc % 4) * 32;  // 16 columns of a 128-byte swizzled row
        wgmma_ss(x, desc_k_major(a1_wg + (kc / 4) * kBackwardRows * kSwizzleBytes + step),
                 desc_k_major(b1_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kc = 0; kc < DH / 16; ++kc) {
        const uint32_t step = (kc % 4) * 32;
        wgmma_ss(y, desc_k_major(a2_wg + (kc / 4) * kBackwardRows * kSwizzleBytes + step),
                 desc_k_major(b2_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
      }
      wgmma_commit();
      // p as soon as x is done (y may still run).
      wgmma_wait<1>();
      fence_operands(x);
      const float2* tile_stats = stage_stats + s * KB;
      const float* tile_delta = stage_delta + s * KB;  // dq with a mask: the keys' mask terms
      // p from x, one exponential each, 0 where a query does not see a key
      // (tested on edge tiles only).
#pragma unroll
      for (int j = 0; j < KB / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + 8 * j + 2 * t + e;  // streamed row: a query (dk/dv) or a key (dq)
          const float2 st = kDkDv ? tile_stats[col - n0] : float2{};
          [[maybe_unused]] const float col_mask = kMasked && !kDkDv ? tile_delta[col - n0] : 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int i_acc = 4 * j + 2 * h + e, row = my_row + 8 * h;
            const bool in = !kEdge || (kDkDv ? seen(col, row) : seen(row, col));
            const float2 sq = kDkDv ? st : row_stats[h];  // the query's {base-2 max, 1 / sum}
            if constexpr (kMasked) {
              // The forward's base-2 logit, 0 where the mask removes the key.
              const float x2 = fmaf(x[i_acc], c, kDkDv ? key_mask[row - r0] : col_mask);
              x[i_acc] = in && x2 != -INFINITY ? exp2_approx(x2 - sq.x) * sq.y : 0.f;
            } else {
              x[i_acc] = in ? exp2_approx(fmaf(x[i_acc], c, -sq.x)) * sq.y : 0.f;
            }
          }
        }
      [[maybe_unused]] uint32_t pp[kDkDv ? KB / 16 : 1][4];  // dk/dv only
      uint32_t pd[KB / 16][4];
      if constexpr (kDkDv) {
        // dv += p^T do beside ds.
#pragma unroll
        for (int e = 0; e < KB / 2; e += 2) pp[e / 8][(e % 8) / 2] = pack(x[e], x[e + 1]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KB / 16; ++kk) mma_streamed<DH, KB>(acc2, pp[kk], b2_at, kk);
        wgmma_commit();
        wgmma_wait<1>();  // y done (groups complete in order); dv may still run
      } else {
        wgmma_wait<0>();
      }
      fence_operands(y);
#pragma unroll
      for (int j = 0; j < KB / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float dl = kDkDv ? tile_delta[8 * j + 2 * t + e] : 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int i_acc = 4 * j + 2 * h + e;
            y[i_acc] = x[i_acc] * (y[i_acc] - (kDkDv ? dl : row_delta[h]));
          }
        }
#pragma unroll
      for (int e = 0; e < KB / 2; e += 2) pd[e / 8][(e % 8) / 2] = pack(y[e], y[e + 1]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < KB / 16; ++kk) mma_streamed<DH, KB>(acc1, pd[kk], b1_at, kk);  // dk or dq
      wgmma_commit();
      if constexpr (kStoreDs) {
        // While dk runs: ds^T's k16 step of this warp's keys, as the dq warps
        // of each 16 queries read it (DsTiles). pd[kk][m] is the 8 x 8 block
        // of keys 8 (m & 1) and queries 8 (m >> 1) of query group kk; its
        // transpose is A register r = 2 (m & 1) + (m >> 1).
        uint4* group = ds.group(bh, n0 / 16, r0 / kBackwardRows) + (4 * cw + w) * 32 + threadIdx.x % 32;
#pragma unroll
        for (int kk = 0; kk < KB / 16; ++kk)
          group[int64_t(kk) * ds.key_tiles * 256] = make_uint4(transpose8x8(pd[kk][0]), transpose8x8(pd[kk][2]),
                                                               transpose8x8(pd[kk][1]), transpose8x8(pd[kk][3]));
      }
      wgmma_wait<0>();
      fence_operands(acc1);
      if constexpr (kDkDv) fence_operands(acc2);
#pragma unroll
      for (int kk = 0; kk < KB / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          fence_operand(pd[kk][r]);
          if constexpr (kDkDv) fence_operand(pp[kk][r]);
        }
    };
    const bool interior =
        kDkDv ? n0 + KB <= a.tq && row0 + 64 <= a.tk && (!a.causal || row0 + 63 <= n0 + a.tk - a.tq)
              : row0 + 64 <= a.tq && n0 + KB <= a.tk && (!a.causal || n0 + KB - 1 <= row0 + a.tk - a.tq);
    if (interior) tile(std::false_type{});
    else tile(std::true_type{});
    barrier_arrive(empty + s);  // this thread's reads of the stage are done
  }

  // dq (or dk) times the scale, dv; rows past the resident extent unwritten.
  bf16* out1 = static_cast<bf16*>(kDkDv ? a.dk : a.dq) + (kDkDv ? a.kv_base(bh) : a.q_base(bh));
  bf16* out2 = static_cast<bf16*>(a.dv) + a.kv_base(bh);
  const int64_t ld = kDkDv ? a.kv_row : a.q_row;
  for_acc_pairs<DH>(my_row, r_rows, [&](int row, int i) {
    const int64_t at = int64_t(row) * ld + 2 * t + acc_col(i);
    *reinterpret_cast<uint32_t*>(out1 + at) = pack(acc1[i] * a.scale, acc1[i + 1] * a.scale);
    if constexpr (kDkDv) *reinterpret_cast<uint32_t*>(out2 + at) = pack(acc2[i], acc2[i + 1]);
  });
  // The block's column sums of what it stored (one branch for the whole block).
  if ((kDkDv ? a.dk_sums : a.dq_sums) != nullptr) {
    float* warp_sums = reinterpret_cast<float*>(smem + P::kSumsOffset);
    float* mine = warp_sums + (threadIdx.x / 32) * DH;
    const int64_t at = a.sums_at(bh, r0, DH);
    warp_column_sums<DH>(acc1, a.scale, my_row, r_rows, mine);
    if constexpr (kDkDv) {
      warp_column_sums<DH>(acc2, 1.f, my_row, r_rows, mine + kSumWarps * DH);
      float* const sums[2] = {a.dk_sums + at, a.dv_sums + at};
      write_block_column_sums<DH, 2>(warp_sums, sums);
    } else {
      float* const sums[1] = {a.dq_sums + at};
      write_block_column_sums<DH, 1>(warp_sums, sums);
    }
  }
#endif  // HG_WGMMA_DEVICE
}

// dq from the stored ds: per block of 128 queries (two consumer warpgroups
// of 64), key tiles of 128 streamed; a producer warp stages each tile's k
// (TMA) and its 8 query groups' ds (4 KiB bulk copies) in a ring of stages,
// and each warp feeds its group's ds from shared memory as wgmma's register
// A: dq += ds k, 8 k16 steps a tile. Memory bound: a stage holds 48 KiB
// (dh 64) or 64 (dh 128), 3 stages in flight. A warp uses zeros for ds its
// queries never see (causal) and for keys past Tk: the dk/dv kernel did not
// write those.
constexpr int kDqFromDsStages = 3;
constexpr int kDqFromDsThreads = 256 + 32;  // two consumer warpgroups and the producer warp

template <int DH>
struct DqFromDsPlan {
  static constexpr int kKeyBytes = kBackwardRows * DH * 2;
  static constexpr int kDsBytes = 8 * 4096;  // 8 query groups x 128 keys
  static constexpr int kStageBytes = kKeyBytes + kDsBytes;
  static constexpr int kBarOffset = kDqFromDsStages * kStageBytes;
  static constexpr int kSumsOffset = kBarOffset + (1 + 2 * kDqFromDsStages) * 8;
  static constexpr size_t kSmem = size_t(kSumsOffset) + column_sums_bytes(DH, 1) + 1024;
};

template <int DH>
__global__ void __launch_bounds__(kDqFromDsThreads, 1)
    dq_from_ds_kernel(const __grid_constant__ CUtensorMap kmap, Args a, DsTiles ds) {
  static_assert(DH == 64 || DH == 128);
#if HG_WGMMA_DEVICE
  using P = DqFromDsPlan<DH>;
  constexpr int KB = kBackwardRows, ST = kDqFromDsStages;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;
  unsigned char* smem = raw + (base - shared_address(raw));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + P::kBarOffset);
  uint64_t *full = bars + 1, *empty = bars + 1 + ST;  // bars[0]: init_barriers' `once`, unused

  const int64_t bh = ds.bh0 + blockIdx.y;
  const int r0 = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBackwardRows;  // most keys first
  const int count = max(0, a.key_end(min(r0 + kBackwardRows, a.tq)) + KB - 1) / KB;     // key tiles 0 .. count - 1
  init_barriers(bars, full, empty, ST, 2);

  if (threadIdx.x >= 256) {  // the producer warp
    if (threadIdx.x == 256) {
      const int head = int(bh % a.heads), batch = int(bh / a.heads);
      for (int i = 0; i < count; ++i) {
        const int s = i % ST;
        wait_stage_free<ST>(empty, i);
        stage_expect(full + s, P::kStageBytes);
        const uint32_t at = base + s * P::kStageBytes;
        for (int c = 0; c < DH / 64; ++c) tma_load(at + c * KB * 128, &kmap, c * 64, i * KB, head, batch, full + s);
        for (int g = 0; g < 8; ++g)
          stage_copy(smem + s * P::kStageBytes + P::kKeyBytes + g * 4096, ds.group(bh, r0 / 16 + g, i), 4096, full + s);
      }
      wait_ring_read<ST>(empty, count);
    }
    return;
  }

  // Warp w of warpgroup cw: queries q0 .. q0 + 15, group 4 cw + w of the block.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4, q0 = r0 + 64 * cw + 16 * w;
  float acc[DH / 2];
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) acc[i] = 0.f;
  const bool rows_in = r0 + 64 * cw < a.tq;  // a warpgroup past Tq only keeps the stage protocol
  for (int i = 0; i < count; ++i) {
    const int s = i % ST;
    barrier_wait<false>(full + s, uint32_t((i / ST) & 1));
    if (rows_in) {
      const uint32_t k_at = base + s * P::kStageBytes;
      const uint4* ds_at =
          reinterpret_cast<const uint4*>(smem + s * P::kStageBytes + P::kKeyBytes + (4 * cw + w) * 4096) + lane;
      // The group sees this tile when its last query sees the tile's first key.
      const bool seen = min(q0 + 15, a.tq - 1) >= a.first_query(i * KB);
      uint32_t af[KB / 16][4];
#pragma unroll
      for (int ks = 0; ks < KB / 16; ++ks) {
        const uint4 v = seen && i * KB + 16 * ks < a.tk ? ds_at[32 * ks] : make_uint4(0, 0, 0, 0);
        af[ks][0] = v.x, af[ks][1] = v.y, af[ks][2] = v.z, af[ks][3] = v.w;
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KB / 16; ++ks) mma_streamed<DH, KB>(acc, af[ks], k_at, ks);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(acc);
#pragma unroll
      for (int ks = 0; ks < KB / 16; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) fence_operand(af[ks][r]);
    }
    barrier_arrive(empty + s);
  }

  bf16* out = static_cast<bf16*>(a.dq) + a.q_base(bh);
  for_acc_pairs<DH>(q0 + g, a.tq, [&](int row, int i) {
    const int64_t at = int64_t(row) * a.q_row + 2 * t + acc_col(i);
    *reinterpret_cast<uint32_t*>(out + at) = pack(acc[i] * a.scale, acc[i + 1] * a.scale);
  });
  if (a.dq_sums != nullptr) {  // the block's column sums of what it stored
    float* warp_sums = reinterpret_cast<float*>(smem + P::kSumsOffset);
    warp_column_sums<DH>(acc, a.scale, q0 + g, a.tq, warp_sums + (threadIdx.x / 32) * DH);
    float* const sums[1] = {a.dq_sums + a.sums_at(bh, r0, DH)};
    write_block_column_sums<DH, 1>(warp_sums, sums);
  }
#endif  // HG_WGMMA_DEVICE
}

}  // namespace
}  // namespace hg::gpu::attn
