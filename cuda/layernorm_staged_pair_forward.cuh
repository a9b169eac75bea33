#pragma once
// The staged LayerNorm forward taking two rows a step
// (LnRows::StagedTwoAStep, sm_90+; launched by cuda/layernorm.cu): the
// staged forward's rings and row assignment (cuda/layernorm_staged_forward.cuh), but each group works on
// its rows r and r + row_stride together, so the two rows share one group
// reduction per statistic (group_sums<G, 2>: the barrier rounds per row
// halve) and one gamma/beta load per column slot. x is not held in
// registers: each pass reads it from the stage (registers stay at the
// staged kernel's), and the two stages are refilled only after the normalisation. Each
// row's arithmetic is the staged kernel's (the same slots, per-thread sum
// order, group reduction order and normalisation), so y, mean and rstd are
// bitwise those of the rows in registers.
#include <algorithm>
#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/layernorm_staged_forward.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// Slot j of thread t's part of a staged row of len elements, minus shift;
// zeros past len (one slot of load_part, read from shared memory).
template <class T, int VEC, int G>
__device__ __forceinline__ void staged_slot(const T* xs, int len, int j, int t, float shift, float (&v)[VEC]) {
  const int i = (j * G + t) * VEC;
  if (i < len) {
    load_vec<VEC>(xs + i, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] -= shift;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = 0.0f;
  }
}

// A staged row as for_each_held reads it (slot j's x - shift).
template <class T, int VEC, int G>
struct StagedRow {
  const T* xs;
  int len, t;
  float shift;
  __device__ __forceinline__ void get(int j, float (&out)[VEC]) const {
    staged_slot<T, VEC, G>(xs, len, j, t, shift, out);
  }
};

// The staged kernel (same widths, launch bounds, rings) with two rows a
// step. A row past the last ("empty": len 0) runs the reductions on zeros,
// waits for nothing and stores nothing, so every group of a block makes the
// same trips, an odd share of rows included.
template <class T, int VEC, int EPT, int G, int R>
__global__ void __launch_bounds__((G * R), staged_min_blocks(G, R))
    layernorm_forward_staged_pair_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, T* __restrict__ y,
                                         float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                                         int D, float eps, int stages) {
  constexpr int NV = EPT / VEC;
  static_assert(VEC > 1 && EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad staged LayerNorm config");
  extern __shared__ __align__(128) unsigned char staged_rows[];  // R rings of `stages` rows
  __shared__ GroupScratch<G, R> scratch;
  __shared__ uint64_t stage_bars[R][kMaxRowStages];
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const uint32_t row_bytes = static_cast<uint32_t>(D) * sizeof(T);
  RowRing<T> ring = RowRing<T>::of_group(staged_rows, grp.group, stages, row_bytes, stage_bars[grp.group]);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R + grp.group;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  const int64_t ahead = stages * row_stride;  // a stage's next row comes this many rows later
  ring.start(grp.t, x, first, row_stride, rows, D);

  for (int64_t base = first - grp.group; base < rows; base += 2 * row_stride) {
    int64_t row[2];
    int len[2], stage[2];
    const T* xs[2];
    float shift[2], s[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r] = base + r * row_stride + grp.group;
      const bool live = row[r] < rows;
      len[r] = live ? D : 0;
      stage[r] = ring.stage;
      xs[r] = live ? ring.wait() : nullptr;
      if (live) ring.advance();
      shift[r] = live ? to_float(xs[r][0]) : 0.0f;
      s[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        float v[VEC];
        staged_slot<T, VEC, G>(xs[r], len[r], j, grp.t, shift[r], v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s[r] += v[k];
      }
    }
    grp.sums(s);
    float mean[2], q[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mean[r] = s[r] * inv_d;
      q[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < NV; ++j)
        if ((j * G + grp.t) * VEC < len[r]) {
          float v[VEC];
          staged_slot<T, VEC, G>(xs[r], len[r], j, grp.t, shift[r], v);
#pragma unroll
          for (int k = 0; k < VEC; ++k) q[r] += (v[k] - mean[r]) * (v[k] - mean[r]);
        }
    }
    grp.sums(q);
    Moments m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = {mean[r], rsqrtf(q[r] * inv_d + eps)};
      if (statistics_overflowed(m[r].rstd))  // uniform over the group
        m[r] = scaled_moments<VEC, NV, G>(StagedRow<T, VEC, G>{xs[r], len[r], grp.t, shift[r]}, len[r], grp.t,
                                          GroupSums<G>{grp}, inv_d, eps);
    }
    // normalise_chunk's y for both rows, gamma and beta loaded once a slot (len[1] <= len[0]).
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = (j * G + grp.t) * VEC;
      if (i < len[0]) {
        float g[VEC], b[VEC];
        load_vec<VEC>(gamma + i, g);
        load_vec<VEC>(beta + i, b);
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (i < len[r]) {
            float v[VEC], out[VEC];
            staged_slot<T, VEC, G>(xs[r], len[r], j, grp.t, shift[r], v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) out[k] = (v[k] - m[r].mean) * m[r].rstd * g[k] + b[k];
            store_vec<VEC, Store::Streaming>(y + row[r] * D + i, out);
          }
      }
    }
    grp.sync();  // every thread has read both stages before their refills
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (len[r] > 0 && grp.t == 0) {
        if (row[r] + ahead < rows) ring.fill(stage[r], x + (row[r] + ahead) * D);
        save_stats(mean_out, rstd_out, row[r], shift[r], m[r]);
      }
  }
}

// ---- host: how many stages -----------------------------------------------------------

// The two rows a group works on keep their stages until normalised, so a ring
// of S stages has S - 2 rows travelling while the group computes. The most
// blocks per SM the registers allow whose rings of kMinPairStages fit (else
// of 2), then enough stages that blocks x R x (S - 2) rows reach
// target_bytes per SM, at most what fits or kMaxRowStages.
constexpr int kMinPairStages = 3;

inline StagedPlan plan_staged_pairs(const StagedRoom& room, int R, int row_bytes, int target_bytes) {
  for (const int least : {kMinPairStages, 2})
    for (int per_sm = room.blocks_per_sm; per_sm >= 1; --per_sm) {
      const int fit = stages_that_fit(room, per_sm, R, row_bytes);
      if (fit < least) continue;
      const int64_t one_stage = int64_t(per_sm) * R * row_bytes;  // per SM
      const int64_t travelling = std::max<int64_t>(1, (target_bytes + one_stage - 1) / one_stage);
      const int stages = static_cast<int>(std::min<int64_t>(fit, 2 + travelling));
      return {per_sm, stages, size_t(R) * stages * row_bytes};
    }
  return {};
}

}  // namespace
}  // namespace hg::gpu
