#pragma once
// The staged LayerNorm forward (LnRows::Staged, sm_90+; launched by
// cuda/layernorm.cu): resident 16-byte rows of D <= 16384, each group of G
// threads keeping its next rows in flight as whole-row bulk copies into a
// ring of shared-memory stages (cuda/bulk_stage.cuh), so bytes travel while
// the group reduces and stores without holding registers. Per row the group
// reads its stage into registers with the resident kernel's column mapping,
// syncs, refills the stage with the row `stages` rows ahead, then takes the
// statistics and y exactly as the rows in registers do
// (cuda/layernorm_moments.cuh): y, mean and rstd are bitwise theirs. The
// bytes-in-flight arithmetic: docs/layernorm.md, "Staged rows".
// SHARED_PARAMS runs it with the parameters from shared-memory copies on
// warp rows.
#include <algorithm>
#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// Most stages in one group's ring (its barriers are a static array), and
// the fewest the host asks for wherever they fit.
constexpr int kMaxRowStages = 8;
constexpr int kMinRowStages = 2;

// One group's ring of `stages` whole-row buffers (row_bytes each, a
// multiple of 16) with a barrier each. The stage count is a launch argument,
// not a template one, so one kernel serves every D of its width class with
// the shared memory the host sizes for that D. The cursor (stage, parity)
// follows the reads: use n of a stage waits for the barrier phase n & 1.
template <class T>
struct RowRing {
  unsigned char* buf;
  uint64_t* bars;
  int stages;
  uint32_t row_bytes;
  int stage = 0;
  uint32_t parity = 0;

  __device__ __forceinline__ unsigned char* at(int s) const { return buf + static_cast<uint32_t>(s) * row_bytes; }
  // One thread: stage s receives the row at src (16-byte aligned).
  __device__ __forceinline__ void fill(int s, const T* src) const {
    stage_expect(bars + s, row_bytes);
    stage_copy(at(s), src, row_bytes, bars + s);
  }
  // Every reader: the cursor's row, once it has landed.
  __device__ __forceinline__ const T* wait() const {
    stage_wait(bars + stage, parity);
    return reinterpret_cast<const T*>(at(stage));
  }
  __device__ __forceinline__ void advance() {
    if (++stage == stages) stage = 0, parity ^= 1;
  }
  // Group `group`'s ring of `stages` rows in the block's dynamic shared
  // memory `rows_smem`, with its barriers `group_bars`.
  static __device__ __forceinline__ RowRing of_group(unsigned char* rows_smem, int group, int stages,
                                                     uint32_t row_bytes, uint64_t* group_bars) {
    return {rows_smem + static_cast<uint32_t>(group * stages) * row_bytes, group_bars, stages, row_bytes};
  }
  // Every thread of the block: thread t == 0 of each group initialises its
  // barriers, the block syncs, then it issues the group's first rows
  // (first, first + stride, ...; only rows < rows).
  __device__ __forceinline__ void start(int t, const T* x, int64_t first, int64_t stride, int64_t rows, int D) const {
    if (t == 0)
      for (int s = 0; s < stages; ++s) stage_barrier_init(bars + s);
    __syncthreads();  // the barriers are initialised before anyone waits on them
    if (t == 0)
      for (int s = 0; s < stages && first + s * stride < rows; ++s) fill(s, x + (first + s * stride) * D);
  }
};

// Blocks per SM the registers must allow: as the resident kernel, but four
// (64 registers) for warp rows, where ptxas otherwise took 96 registers for
// <32, 32, 8> (2 blocks); at 64 no warp-row layout spills (-Xptxas -v).
constexpr int staged_min_blocks(int G, int R) { return G == 32 ? 4 : min_blocks_for(G * R); }

// Rows of D <= G * EPT elements (D * sizeof(T) a multiple of 16, x 16-byte
// aligned), R groups of G threads per block, `stages` rows in flight per
// group. Every group of a block makes the same trips (a group past the last
// row runs its reductions on an empty row, waits for nothing and stores
// nothing), as the resident backward does (docs/reliability.md).
// SHARED_PARAMS (warp rows): gamma and beta read from the
// block's ParamCopy of each.
template <class T, int VEC, int EPT, int G, int R, bool SHARED_PARAMS = false>
__global__ void __launch_bounds__((G * R), staged_min_blocks(G, R))
    layernorm_forward_staged_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                    const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                    float* __restrict__ rstd_out, int64_t rows, int D, float eps, int stages) {
  constexpr int NV = EPT / VEC;
  static_assert(VEC > 1 && EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad staged LayerNorm config");
  extern __shared__ __align__(128) unsigned char staged_rows[];  // R rings of `stages` rows
  __shared__ GroupScratch<G, R> scratch;
  __shared__ uint64_t stage_bars[R][kMaxRowStages];
  using Copy = ParamCopy<VEC, NV, G>;
  __shared__ float4 param_copy[2][SHARED_PARAMS ? Copy::kFloat4s : 1];
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const uint32_t row_bytes = static_cast<uint32_t>(D) * sizeof(T);
  RowRing<T> ring = RowRing<T>::of_group(staged_rows, grp.group, stages, row_bytes, stage_bars[grp.group]);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R + grp.group;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  ring.start(grp.t, x, first, row_stride, rows, D);
  if constexpr (SHARED_PARAMS) {  // filled while the first rows travel
    Copy::fill(param_copy[0], gamma, D);
    Copy::fill(param_copy[1], beta, D);
    __syncthreads();
  }
  using Param = ParamRow<VEC, NV, G, SHARED_PARAMS>;
  const Param gamma_of{gamma, param_copy[0], grp.t}, beta_of{beta, param_copy[1], grp.t};
  int64_t next = first + stages * row_stride;  // the row that refills the stage read next

  for (int64_t base = first - grp.group; base < rows; base += row_stride) {
    const int64_t row = base + grp.group;
    const bool live = row < rows;
    const int len = live ? D : 0;
    const T* xs = live ? ring.wait() : nullptr;
    const float shift = live ? to_float(xs[0]) : 0.0f;
    float v[NV][VEC];
    load_part<T, VEC, NV, G>(xs, len, grp.t, shift, v);
    grp.sync();  // every thread has read the stage before its refill
    if (live) {
      if (grp.t == 0 && next < rows) ring.fill(ring.stage, x + next * D);
      next += row_stride;
      ring.advance();
    }
    const Moments m = moments_in_registers<VEC, NV, G>(v, len, grp.t, GroupSums<G>{grp}, inv_d, eps);
    normalise_held<T, VEC, NV, G>(v, len, m, gamma_of, beta_of, y + (live ? row : 0) * D, grp.t);
    if (live && grp.t == 0) save_stats(mean_out, rstd_out, row, shift, m);
  }
}

// ---- host: how many stages -----------------------------------------------------------

// What the device and one staged kernel leave for the rings (bytes).
struct StagedRoom {
  int blocks_per_sm;       // by registers and threads alone
  int smem_per_sm;         // shared memory of an SM
  int smem_per_block;      // the most one block may have, static and dynamic together
  int reserved_per_block;  // the runtime's share of each block
  int static_smem;         // the kernel's own (scratch, barriers)
};

struct StagedPlan {
  int blocks_per_sm = 0;  // 0: no ring fits
  int stages = 0;
  size_t smem = 0;  // dynamic shared memory per block
};

// Stages of row_bytes that fit each of a block's R groups at per_sm blocks
// a SM (at most kMaxRowStages).
inline int stages_that_fit(const StagedRoom& room, int per_sm, int R, int row_bytes) {
  const int per_block =
      std::min(room.smem_per_sm / per_sm - room.reserved_per_block, room.smem_per_block) - room.static_smem;
  return std::min(kMaxRowStages, per_block / (R * row_bytes));
}

// The most blocks per SM the registers allow whose rings of one stage fit,
// then enough stages that the SM's rows in flight (blocks x R x stages rows)
// reach target_bytes: at least kMinRowStages where they fit, at most what
// fits or kMaxRowStages.
inline StagedPlan plan_staged(const StagedRoom& room, int R, int row_bytes, int target_bytes) {
  for (int per_sm = room.blocks_per_sm; per_sm >= 1; --per_sm) {
    const int fit = stages_that_fit(room, per_sm, R, row_bytes);
    if (fit < 1) continue;
    const int64_t one_stage = int64_t(per_sm) * R * row_bytes;  // per SM
    const int64_t want = std::max<int64_t>(kMinRowStages, (target_bytes + one_stage - 1) / one_stage);
    const int stages = static_cast<int>(std::min<int64_t>(fit, want));
    return {per_sm, stages, size_t(R) * stages * row_bytes};
  }
  return {};
}

}  // namespace
}  // namespace hg::gpu
