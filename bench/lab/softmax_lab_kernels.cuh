#pragma once
// The softmax lab's forward kernels (bench/lab/softmax_lab.cu launches and
// times them): the register layouts of cuda/softmax.cu with an optional
// second row per team and a choice of x loads (the launch picks the grid:
// a block per team's rows, or only the resident blocks), and the staged
// layout, whose rows reach shared memory by bulk copies (cuda/bulk_stage.cuh)
// while the group works on the row before. All read 16-byte rows (Tk *
// sizeof(T) a multiple of 16, 16-byte aligned x, y and mask); the product
// sends other rows to its scalar path.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

// First: sm90::barrier_wait, a stage wait that traps after two seconds,
// which the product's staged kernel below takes where HG_SM90A_DEVICE is set.
#include "cuda/wgmma.cuh"

#include "bench/lab/bulk_store.cuh"
#include "cuda/bulk_stage.cuh"
#include "cuda/exp_approx.cuh"
#include "cuda/reduce.cuh"
#include "cuda/row_ring.cuh"                // RowRing, plan_staged
#include "cuda/softmax_staged_forward.cuh"  // the product's staged forward: the "staged, 32 / 96 KB a SM" rows
#include "cuda/vec.cuh"

namespace softmax_lab {

using bf16 = __nv_bfloat16;
using hg::gpu::Load;
using hg::gpu::Store;

constexpr int kLaneTeamBlock = 128, kMaxBlock = 1024;
using hg::gpu::exp2_approx;
using hg::gpu::kLog2e;                   // and exp2_approx: cuda/exp_approx.cuh, the lean exp
constexpr float kMaskThreshold = -1e9f;  // core/softmax_layout.hpp's kSoftmaxMaskThreshold

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// As cuda/softmax.cu: -inf at or below the threshold, a NaN mask value stays NaN.
__device__ __forceinline__ float additive_mask(float m) { return m > kMaskThreshold ? m : m - INFINITY; }

// Scores (B, H, Tq, Tk) as rows; mask: additive, F32, row (b, q)'s at
// mask + b * mask_batch_stride + q * mask_query_stride (the lab's
// (B, 1, 1, Tk) key-padding mask: Tk and 0), or null.
template <class T>
struct Args {
  const T* x;
  T* y;
  const float* mask;
  int64_t rows, tk, tq, rows_per_batch;  // rows_per_batch = H * Tq
  int64_t mask_batch_stride, mask_query_stride;
  float scale;
  bool causal;
};

// A row's mask row (or null) and its visible keys [0, visible), as
// cuda/softmax.cu's row_span.
struct RowSpan {
  const float* mask;
  int64_t visible;
};
// The lab's sizes keep row numbers below 2^32: 32-bit division, as the
// product takes where its sizes allow.
template <class T>
__device__ __forceinline__ RowSpan row_span(const Args<T>& a, int64_t row) {
  RowSpan s{nullptr, a.tk};
  if (a.mask == nullptr && !a.causal) return s;
  const uint32_t r = static_cast<uint32_t>(row);
  const int64_t b = r / static_cast<uint32_t>(a.rows_per_batch), q = r % static_cast<uint32_t>(a.tq);
  if (a.mask != nullptr) s.mask = a.mask + b * a.mask_batch_stride + q * a.mask_query_stride;
  if (a.causal) {
    const int64_t n = q + a.tk - a.tq + 1;
    s.visible = n < 0 ? 0 : (n > a.tk ? a.tk : n);
  }
  return s;
}

// z = scale x (+ mask) for the W keys from k0 (all < tk) given x there;
// lean: one FFMA, else rounded twice as the CPU path.
template <int W, bool kLean>
__device__ __forceinline__ void scores(const RowSpan& span, int64_t k0, float scale, float (&z)[W]) {
  if (span.mask != nullptr) {
    float m[W];
    hg::gpu::load_vec<W, Load::ReadOnly>(span.mask + k0, m);
#pragma unroll
    for (int j = 0; j < W; ++j)
      z[j] = kLean ? fmaf(scale, z[j], additive_mask(m[j])) : __fadd_rn(__fmul_rn(scale, z[j]), additive_mask(m[j]));
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = kLean ? z[j] * scale : __fmul_rn(scale, z[j]);
  }
  if (k0 + W > span.visible)
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (k0 + j >= span.visible) z[j] = -INFINITY;
}

// How the register layouts load x: the read-only path (ld.global.nc), or
// that without allocating in L1, or also asking the L2 to fetch 256 bytes.
enum class XLoad { ReadOnly, NoL1, NoL1Prefetch256 };

template <XLoad L>
__device__ __forceinline__ uint4 load16(const void* p) {
  uint4 r;
  if constexpr (L == XLoad::NoL1)
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  return r;
}

template <class T, int W, bool kLean, XLoad L = XLoad::ReadOnly>
__device__ __forceinline__ void load_z(const T* x_row, const RowSpan& span, int64_t k0, float scale, float (&z)[W]) {
  if constexpr (L != XLoad::ReadOnly) {
    static_assert(W * sizeof(T) == 16, "16-byte loads");
    const uint4 raw = load16<L>(x_row + k0);
    if constexpr (std::is_same_v<T, bf16>) {
      hg::gpu::widen_bf16x8(raw, z);
    } else {
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) z[j] = __uint_as_float(w[j]);
    }
  } else if constexpr (kLean) {
    hg::gpu::load_vec_lean<W>(x_row + k0, z);
  } else {
    hg::gpu::load_vec<W, Load::ReadOnly>(x_row + k0, z);
  }
  scores<W, kLean>(span, k0, scale, z);
}

// ---- teams: who owns a row; each reduces K rows' values at once ---------------------

template <int TPR>
struct LaneTeam {
  __device__ int rank() const { return threadIdx.x % TPR; }
  __device__ int size() const { return TPR; }
  __device__ int slot() const { return threadIdx.x / TPR; }
  __device__ int teams_per_block() const { return blockDim.x / TPR; }
  template <int K>
  __device__ void max(float (&v)[K]) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1)
#pragma unroll
      for (int r = 0; r < K; ++r) v[r] = max_nan(v[r], __shfl_xor_sync(0xffffffffu, v[r], off));
  }
  template <int K>
  __device__ void sum(float (&v)[K]) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1)
#pragma unroll
      for (int r = 0; r < K; ++r) v[r] += __shfl_xor_sync(0xffffffffu, v[r], off);
  }
};

struct WarpMaxNan {
  __device__ float operator()(float v) const {
    float one[1] = {v};
    LaneTeam<32>{}.max(one);
    return one[0];
  }
};

struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};
// Named barrier `id` of `threads` threads (a group of a block).
struct GroupSync {
  int id, threads;
  __device__ void operator()() const { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory"); }
};

// `warps` warps of consecutive threads from `first_warp` own a row; the
// warps meet in `scratch` (K * warps floats) behind `sync` (the block's
// barrier, or a group's named barrier).
template <class Sync>
struct WarpsTeam {
  float* scratch;
  int warps, first_warp;
  Sync sync;
  template <int K, bool kMax>
  __device__ void reduce(float (&v)[K]) const {
    if constexpr (K == 1 && std::is_same_v<Sync, BlockSync>) {  // one row a block: cuda/softmax.cu's BlockTeam
      v[0] = kMax ? hg::gpu::block_reduce(v[0], scratch, WarpMaxNan{}, -INFINITY) : hg::gpu::block_sum(v[0], scratch);
      return;
    }
    const LaneTeam<32> lanes;
    if constexpr (kMax) lanes.max(v);
    else lanes.sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 - first_warp;
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < K; ++r) scratch[r * warps + warp] = v[r];
    sync();
#pragma unroll
    for (int r = 0; r < K; ++r) {
      float t = scratch[r * warps];
      for (int w = 1; w < warps; ++w) t = kMax ? max_nan(t, scratch[r * warps + w]) : t + scratch[r * warps + w];
      v[r] = t;
    }
    sync();  // every warp has read before the next reduction writes
  }
  template <int K>
  __device__ void max(float (&v)[K]) const {
    reduce<K, true>(v);
  }
  template <int K>
  __device__ void sum(float (&v)[K]) const {
    reduce<K, false>(v);
  }
};

// The whole block owns a row. scratch: K * 32 floats.
struct BlockTeam : WarpsTeam<BlockSync> {
  __device__ explicit BlockTeam(float* s) : WarpsTeam<BlockSync>{s, int(blockDim.x / 32), 0, BlockSync{}} {}
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int slot() const { return 0; }
  __device__ int teams_per_block() const { return 1; }
};

// ---- the statistics and the store, shared by every layout -------------------------

// K rows of N chunks of W keys in v (z on entry, y once scaled by the result):
// exp(z - shift) in place; returns each row's 1 / sum, 0 for a fully masked
// row (max -inf: shift 0, so exp(-inf) = 0 and nothing is NaN), NaN for a
// NaN row. The difference comes first in the lean exp (cuda/softmax.cu says why).
template <int K, int N, int W, bool kLean, class Team>
__device__ __forceinline__ void exp_and_inverse(const Team& team, float (&v)[K][N][W], float (&inv)[K]) {
  float mx[K], sum[K];
#pragma unroll
  for (int r = 0; r < K; ++r) {
    mx[r] = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int j = 0; j < W; ++j) mx[r] = max_nan(mx[r], v[r][i][j]);
  }
  team.max(mx);
#pragma unroll
  for (int r = 0; r < K; ++r) {
    const float shift = mx[r] == -INFINITY ? 0.0f : mx[r];
    sum[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int j = 0; j < W; ++j) {
        v[r][i][j] = kLean ? exp2_approx((v[r][i][j] - shift) * kLog2e) : expf(v[r][i][j] - shift);
        sum[r] += v[r][i][j];
      }
  }
  team.sum(sum);
#pragma unroll
  for (int r = 0; r < K; ++r) inv[r] = mx[r] == -INFINITY ? 0.0f : 1.0f / sum[r];
}

// y for the chunks of row y_row this thread holds: chunk i at keys
// (rank + i * size) * W.
template <class T, int N, int W, bool kStreaming>
__device__ __forceinline__ void store_row(T* y_row, int64_t tk, int rank, int size, float inv, float (&v)[N][W]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int64_t k0 = static_cast<int64_t>(rank + i * size) * W;
    if (k0 < tk) {
#pragma unroll
      for (int j = 0; j < W; ++j) v[i][j] *= inv;
      hg::gpu::store_vec<W, kStreaming ? Store::Streaming : Store::Plain>(y_row + k0, v[i]);
    }
  }
}

// ---- register layouts: K rows a team, held in registers ------------------------------

// Each team owns K consecutive rows at a time; every load of the K rows is
// issued before the first reduction, and the K rows' reductions share their
// shuffles and barriers. Requires tk <= size * N * W and tk % W == 0.
template <class T, int W, int N, int K, bool kLean, bool kStreaming, XLoad L, class Team>
__device__ __forceinline__ void forward_rows(const Args<T>& a, const Team& team) {
  const int64_t rows_per_block = int64_t(team.teams_per_block()) * K;
  for (int64_t base = blockIdx.x * rows_per_block; base < a.rows; base += gridDim.x * rows_per_block) {
    const int64_t first = base + int64_t(team.slot()) * K;
    float v[K][N][W];
#pragma unroll
    for (int r = 0; r < K; ++r) {
      const int64_t row = first + r;
      const RowSpan span = row < a.rows ? row_span(a, row) : RowSpan{nullptr, 0};  // spare rows load nothing
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
        if (k0 < span.visible) {
          load_z<T, W, kLean, L>(a.x + row * a.tk, span, k0, a.scale, v[r][i]);
        } else {
#pragma unroll
          for (int j = 0; j < W; ++j) v[r][i][j] = -INFINITY;
        }
      }
    }
    float inv[K];
    exp_and_inverse<K, N, W, kLean>(team, v, inv);
#pragma unroll
    for (int r = 0; r < K; ++r)
      if (first + r < a.rows)
        store_row<T, N, W, kStreaming>(a.y + (first + r) * a.tk, a.tk, team.rank(), team.size(), inv[r], v[r]);
  }
}

template <class T, int TPR, int W, int N, int K, bool kLean, bool kStreaming, XLoad L>
__global__ void __launch_bounds__(kLaneTeamBlock) lanes_kernel(Args<T> a) {
  forward_rows<T, W, N, K, kLean, kStreaming, L>(a, LaneTeam<TPR>{});
}
template <class T, int W, int N, int K, bool kLean, bool kStreaming, XLoad L>
__global__ void __launch_bounds__(kMaxBlock) block_kernel(Args<T> a) {
  __shared__ float scratch[K * 32];
  forward_rows<T, W, N, K, kLean, kStreaming, L>(a, BlockTeam{scratch});
}

// ---- staged layout ---------------------------------------------------------------------

// One thread: stage s of `ring` receives the part of `row` a staged kernel
// reads: its visible keys, rounded up to 16 bytes (none for a causal row
// that sees no key: the arrival alone completes the phase); kStageMask: the
// same keys of its mask row too, after the whole x row.
template <class T, bool kStageMask>
__device__ __forceinline__ void fill_stage(const Args<T>& a, const hg::gpu::RowRing<T>& ring, int s, int64_t row) {
  const RowSpan span = row_span(a, row);
  const uint32_t bytes = static_cast<uint32_t>((span.visible * int64_t(sizeof(T)) + 15) / 16 * 16);
  const bool mask = kStageMask && span.mask != nullptr && span.visible > 0;
  const uint32_t mask_bytes = mask ? static_cast<uint32_t>(span.visible * 4 + 15) / 16 * 16 : 0;
  hg::gpu::stage_expect(ring.bars + s, bytes + mask_bytes);
  if (bytes > 0) hg::gpu::stage_copy(ring.at(s), a.x + row * a.tk, bytes, ring.bars + s);
  if (mask) hg::gpu::stage_copy(ring.at(s) + a.tk * sizeof(T), span.mask, mask_bytes, ring.bars + s);
}

// z for this thread's N chunks of a staged row (chunk i at keys (t + i G) W):
// the mask chunks first (L1/L2; their loads travel while the stage lands),
// or, kStageMask, from the stage; x from the stage once it has landed.
template <class T, int G, int N, bool kStageMask>
__device__ __forceinline__ void staged_scores(const Args<T>& a, const RowSpan& span, const hg::gpu::RowRing<T>& ring,
                                              int t, float (&v)[N][16 / sizeof(T)]) {
  constexpr int W = 16 / sizeof(T);
  const int visible = static_cast<int>(span.visible);
  if constexpr (!kStageMask) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int k0 = (t + i * G) * W;
      if (span.mask != nullptr && k0 < visible) hg::gpu::load_vec<W, Load::ReadOnly>(span.mask + k0, v[i]);
    }
  }
#if HG_SM90A_DEVICE  // a lost copy or a wrong byte count fails the launch instead of hanging
  hg::gpu::sm90::barrier_wait(ring.bars + ring.stage, ring.parity);
  const T* xs = reinterpret_cast<const T*>(ring.at(ring.stage));
#else
  const T* xs = ring.wait();
#endif
  const float* ms = reinterpret_cast<const float*>(xs + a.tk);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int k0 = (t + i * G) * W;
    if (k0 < visible) {
      float x[W];
      if constexpr (std::is_same_v<T, bf16>) hg::gpu::widen_bf16x8(*reinterpret_cast<const uint4*>(xs + k0), x);
      else hg::gpu::load_vec<W>(xs + k0, x);
      if (kStageMask && span.mask != nullptr) hg::gpu::load_vec<W>(ms + k0, v[i]);
      hg::gpu::staged_chunk_scores<W>(v[i], x, v[i], span.mask != nullptr, a.scale, k0, visible);
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;
    }
  }
}

// The lab's variants of the product's staged forward
// (cuda/softmax_staged_forward.cuh, which the "staged, 32 / 96 KB a SM" and
// "mask kept" rows launch): at most 16 keys a thread, evict-first stores of y, or the
// mask staged with x. A group of G threads (one warp, or G / 32 warps
// meeting at a named barrier) owns a row at a time, R groups a block, a
// resident grid. Each group keeps a ring of `stages` rows (cuda/row_ring.cuh's
// RowRing) filled by one bulk copy a row (fill_stage). Per row the group
// takes z into registers (staged_scores), syncs, refills the stage with the
// row `stages` rows ahead, then reduces and stores from registers as the
// register layouts do. Groups never wait for each other past the ring's
// start. Lean arithmetic only. A stage holds a row of x (kStageMask: and
// its mask row, Tk floats, after it). kBulkStore: y goes through shared
// memory instead of registers to global memory: each group writes its row
// of y into one of two out stages (after the input rings) and one thread
// bulk-copies it out (cp.async.bulk.global.shared, bulk_store_row), so the
// stores leave the threads as one asynchronous 2-16 KB copy a row.
template <class T, int G, int N, int R, bool kStreaming, bool kStageMask, bool kBulkStore = false>
__global__ void __launch_bounds__(G* R, G* R <= 512 ? 512 / (G * R) : 1) staged_kernel(Args<T> a, int stages) {
  constexpr int W = 16 / sizeof(T);
  static_assert(G % 32 == 0 && G * R <= 1024 && R <= 15, "bad staged softmax config");
  extern __shared__ __align__(128) unsigned char staged_rows[];  // R rings of `stages` rows
  __shared__ float scratch[R][G / 32];
  __shared__ uint64_t stage_bars[R][hg::gpu::kMaxRowStages];
  const int group = threadIdx.x / G, t = threadIdx.x % G;
  using Ring = hg::gpu::RowRing<T>;
  const uint32_t stage_bytes = static_cast<uint32_t>(a.tk * (sizeof(T) + (kStageMask ? 4 : 0)));
  Ring ring = Ring::of_group(staged_rows, group, stages, stage_bytes, stage_bars[group]);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R + group;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * R;
  if (t == 0)
    for (int s = 0; s < stages; ++s) hg::gpu::stage_barrier_init(ring.bars + s);
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (t == 0)
    for (int s = 0; s < stages && first + s * stride < a.rows; ++s)
      fill_stage<T, kStageMask>(a, ring, s, first + s * stride);
  int64_t next = first + stages * stride;  // the row that refills the stage read next

  using Team = std::conditional_t<G == 32, LaneTeam<32>, WarpsTeam<GroupSync>>;
  Team team{};
  if constexpr (G > 32) team = Team{scratch[group], G / 32, group * (G / 32), GroupSync{1 + group, G}};

  // kBulkStore: the group's two out stages, after every group's input ring.
  const uint32_t row_bytes = static_cast<uint32_t>(a.tk * int64_t(sizeof(T)));
  T* out_stages = reinterpret_cast<T*>(staged_rows + static_cast<uint32_t>(R * stages) * stage_bytes +
                                       static_cast<uint32_t>(group * 2) * row_bytes);
  int out = 0;  // the out stage this row's y goes to

  for (int64_t row = first; row < a.rows; row += stride) {
    const RowSpan span = row_span(a, row);
    float v[1][N][W];
    staged_scores<T, G, N, kStageMask>(a, span, ring, t, v[0]);
    // kBulkStore: the copy out of this row's out stage, two rows ago, has read it.
    if (kBulkStore && t == 0) lab::bulk_store_wait_read<1>();
    if constexpr (G == 32) __syncwarp();  // every thread has read the stage before its refill
    else GroupSync{1 + group, G}();
    if (t == 0 && next < a.rows) fill_stage<T, kStageMask>(a, ring, ring.stage, next);
    next += stride;
    ring.advance();
    float inv[1];
    exp_and_inverse<1, N, W, true>(team, v, inv);
    if constexpr (kBulkStore) {
      T* ys = out_stages + out * a.tk;
      store_row<T, N, W, false>(ys, a.tk, t, G, inv[0], v[0]);
      lab::fence_proxy_async_shared();  // the writes are visible to the bulk copy
      if constexpr (G == 32) __syncwarp();
      else GroupSync{1 + group, G}();
      if (t == 0) lab::bulk_store_row(a.y + row * a.tk, ys, row_bytes);
      out ^= 1;
    } else {
      store_row<T, N, W, kStreaming>(a.y + row * a.tk, a.tk, t, G, inv[0], v[0]);
    }
  }
  if (kBulkStore && t == 0) lab::bulk_store_wait_all();  // shared memory outlives the copies out of it
}

}  // namespace softmax_lab
