#pragma once
// A thread group's ring of whole rows in shared memory, each stage filled by
// one bulk copy (cuda/bulk_stage.cuh), and the host's choice of ring depth.
// The staged LayerNorm forwards (cuda/layernorm_staged_forward.cuh,
// cuda/layernorm_staged_pair_forward.cuh) and the staged softmax forward
// (cuda/softmax_staged_forward.cuh) keep their next rows in flight this way.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/bulk_stage.cuh"

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
