#pragma once
// The GELU backward GEMM on sm_90a (wgmma + TMA): the input gradient of a
// Linear that feeds on gelu(pre), dx = (dy W) * gelu'(pre), rounded once to
// bf16, and each block's column sums of the rounded dx (the producing
// Linear's bias gradient, finished by cuda/column_sum.cu). cuBLASLt's DGELU
// epilogue runs on an older kernel family than its plain GEMMs and took 1.6x
// their time on an H200, where this kernel keeps the epilogue beside the
// products (docs/gemm.md, "The GELU backward on wgmma"). A block of 128 x
// 128 outputs:
//   - two consumer warpgroups of 64 rows each (wgmma's M, one m64n128
//     accumulator a thread) and one producer warp, one thread of which
//     issues every TMA copy;
//   - per k step of 64: dy's 128 x 64 tile (K-major) and W's 64 x 128 tile
//     (N contiguous: wgmma's transposed B) land by TMA (128-byte swizzle,
//     zeros past every end) in a ring of 3 stages with "full" and "empty"
//     mbarriers; a stage is released once the next step's products were
//     issued and the step's own ones are done (one wgmma group in flight);
//   - pre's 128 x 128 tile is the ring's last fill: it lands in the stage
//     freed first while the last k steps are computed, so the epilogue reads
//     it from shared memory (the swizzle spreads a warp's eight rows over
//     all banks) instead of waiting on global loads;
//   - two blocks a SM (101 KB of shared memory each), so that one block's
//     epilogue (gelu', the stores and the sums) runs while the other's
//     products keep the tensor cores busy.
// Only an sm_90a device compile holds the kernel's body; elsewhere it is
// empty. Internal linkage, as cuda/attention_wgmma_kernel.cuh.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/gelu.cuh"
#include "cuda/tensor_map.cuh"  // kSwizzleBytes, kBoxCols
#include "cuda/wgmma.cuh"

namespace hg::gpu::gelu_gemm {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRows = 128;   // outputs a block: two consumer warpgroups of 64 rows
constexpr int kCols = 128;   // and 128 columns (one m64n128 accumulator a thread)
constexpr int kDepth = 64;   // a k step: one 128-byte swizzled row of dy and of W
constexpr int kStages = 3;   // k steps in flight
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * kConsumers + 32;  // + the producer warp
constexpr int kBlocksPerSm = 2;

// Shared memory, byte offsets from a 1024-byte aligned base (every TMA box
// starts on a swizzle period): the stages (dy's tile, then W's as two boxes
// of 64 k rows x 64 columns), each consumer warp's column sums, the barriers.
struct Plan {
  static constexpr int kABytes = kRows * kDepth * 2;
  static constexpr int kBBytes = kDepth * kCols * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSumsOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kSumsOffset + 4 * kConsumers * kCols * 4;
  static constexpr size_t kSmem = size_t(kBarOffset) + (1 + 2 * kStages) * 8 + 1024;  // + the base's alignment
};
static_assert(kCols == 2 * kBoxCols, "W's tile and pre's are two boxes");
static_assert(kRows * kCols * 2 == Plan::kStageBytes, "pre's tile fills one stage");

struct Args {
  bf16* out;        // [m][n]
  float* col_sums;  // [ceil(m / kRows)][n]: each block row's sums of out; null: none
  int m, n, k;
};

#if HG_SM90A_DEVICE
using namespace sm90;  // the instructions: cuda/wgmma.cuh

// Row `row`, columns col and col + 1 of out from their two products and
// pre's pair, and the rounded values added into this thread's column sums.
__device__ __forceinline__ void store_pair(const Args& g, int row, int col, float x0, float x1, __nv_bfloat162 pre,
                                           float& s0, float& s1) {
  const __nv_bfloat162 o = __floats2bfloat162_rn(x0 * gelu_slope_approx(__low2float(pre)),
                                                 x1 * gelu_slope_approx(__high2float(pre)));
  *reinterpret_cast<__nv_bfloat162*>(g.out + int64_t(row) * g.n + col) = o;
  s0 += __low2float(o), s1 += __high2float(o);
}

// pre's pair at tile row r (0..127), columns c and c + 1 (c even): box c / 64,
// 16-byte chunk (c % 64) / 8 of the row, which the 128-byte swizzle moves
// to chunk ((c % 64) / 8) ^ (r % 8).
__device__ __forceinline__ __nv_bfloat162 tile_pair(const unsigned char* tile, int r, int c) {
  const int chunk = ((c % kBoxCols) / 8) ^ (r % 8);
  return *reinterpret_cast<const __nv_bfloat162*>(tile + (c / kBoxCols) * kRows * kSwizzleBytes + r * kSwizzleBytes +
                                                 chunk * 16 + (c % 8) * 2);
}
#endif  // HG_SM90A_DEVICE

// amap: dy [m][k] in boxes of kRows rows; bmap: W [k][n] in boxes of kDepth
// rows; pmap: pre [m][n] in boxes of kRows rows.
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    gelu_backward_gemm_kernel(const __grid_constant__ CUtensorMap amap, const __grid_constant__ CUtensorMap bmap,
                              const __grid_constant__ CUtensorMap pmap, Args g) {
#if HG_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;
  unsigned char* at_base = raw + (base - shared_address(raw));
  uint64_t* bars = reinterpret_cast<uint64_t*>(at_base + Plan::kBarOffset);
  uint64_t *unused = bars, *full = bars + 1, *empty = bars + 1 + kStages;
  float* sums = reinterpret_cast<float*>(at_base + Plan::kSumsOffset);
  const int n0 = blockIdx.x * kCols, m0 = blockIdx.y * kRows;
  const int steps = (g.k + kDepth - 1) / kDepth;
  init_barriers(unused, full, empty, kStages, kConsumers);

  if (threadIdx.x >= 128 * kConsumers) {  // the producer warp; one thread issues every copy
    if (threadIdx.x == 128 * kConsumers) {
      for (int i = 0; i < steps; ++i) {
        const int s = i % kStages;
        wait_stage_free<kStages>(empty, i);
        stage_expect(full + s, Plan::kStageBytes);
        const uint32_t at = base + s * Plan::kStageBytes;
        tma_load(at, &amap, i * kDepth, m0, 0, 0, full + s);
        for (int c = 0; c < kCols / kBoxCols; ++c)
          tma_load(at + Plan::kABytes + c * kDepth * kSwizzleBytes, &bmap, n0 + c * kBoxCols, i * kDepth, 0, 0,
                   full + s);
      }
      const int s = steps % kStages;  // pre's tile: fill `steps` of the ring
      wait_stage_free<kStages>(empty, steps);
      stage_expect(full + s, Plan::kStageBytes);
      for (int c = 0; c < kCols / kBoxCols; ++c)
        tma_load(base + s * Plan::kStageBytes + c * kRows * kSwizzleBytes, &pmap, n0 + c * kBoxCols, m0, 0, 0,
                 full + s);
    }
    return;
  }

  // Consumer warpgroup cw: rows m0 + 64 cw .. + 63; this thread's rows
  // row and row + 8, its columns 8 j + 2 t (+ 1) of each group j of 8.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  float acc[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) acc[i] = 0.f;
  for (int i = 0; i < steps; ++i) {
    const int s = i % kStages;
    const uint32_t a_at = base + s * Plan::kStageBytes + 64 * cw * kSwizzleBytes;  // this warpgroup's rows
    const uint32_t b_at = base + s * Plan::kStageBytes + Plan::kABytes;
    barrier_wait(full + s, uint32_t((i / kStages) & 1));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDepth / 16; ++kk)  // k16 steps: 32 bytes along dy's rows, 16 rows of W's boxes
      wgmma_ss_mn(acc, desc_k_major(a_at + kk * 32),
                  desc_mn_major(b_at + kk * 16 * kSwizzleBytes, kDepth * kSwizzleBytes), 1);
    wgmma_commit();
    wgmma_wait<1>();  // step i - 1's products are done: its stage may be refilled
    if (i > 0) barrier_arrive(empty + (i - 1) % kStages);
  }
  wgmma_wait<0>();
  fence_operands(acc);
  barrier_wait(full + steps % kStages, uint32_t((steps / kStages) & 1));  // pre's tile
  const unsigned char* pre = at_base + (steps % kStages) * Plan::kStageBytes;

  const int tile_row = 64 * cw + 16 * w + lane / 4, row = m0 + tile_row;
  float* warp_sums = sums + (4 * cw + w) * kCols;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int c = 8 * j + 2 * t, col = n0 + c;  // n % 8 == 0: col + 1 < n when col < n
    float s0 = 0.f, s1 = 0.f;
    if (col < g.n) {
      if (row < g.m) store_pair(g, row, col, acc[4 * j], acc[4 * j + 1], tile_pair(pre, tile_row, c), s0, s1);
      if (row + 8 < g.m)
        store_pair(g, row + 8, col, acc[4 * j + 2], acc[4 * j + 3], tile_pair(pre, tile_row + 8, c), s0, s1);
    }
    // The warp's 16 rows: lanes t, t + 4, ..., t + 28 in a fixed tree.
#pragma unroll
    for (int off = 4; off < 32; off *= 2) {
      s0 += __shfl_xor_sync(~0u, s0, off);
      s1 += __shfl_xor_sync(~0u, s1, off);
    }
    if (lane < 4) warp_sums[8 * j + 2 * t] = s0, warp_sums[8 * j + 2 * t + 1] = s1;
  }
  if (g.col_sums == nullptr) return;
  asm volatile("bar.sync 1, %0;" ::"n"(128 * kConsumers) : "memory");  // the consumers only
  // The block's 128 rows: the eight warps' sums in warp order.
  const int c = threadIdx.x;
  if (c < kCols && n0 + c < g.n) {
    float total = 0.f;
#pragma unroll
    for (int v = 0; v < 4 * kConsumers; ++v) total += sums[v * kCols + c];
    g.col_sums[int64_t(blockIdx.y) * g.n + n0 + c] = total;
  }
#endif  // HG_SM90A_DEVICE
}

}  // namespace
}  // namespace hg::gpu::gelu_gemm
