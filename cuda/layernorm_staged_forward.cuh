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
#include <cstdint>

#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/row_ring.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

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

}  // namespace
}  // namespace hg::gpu
