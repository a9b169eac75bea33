#pragma once
// Column sums of what a wgmma attention backward block writes (dq, or dk and
// dv), over its resident rows, while the block still holds them in
// registers. Summed over a head's blocks and the batch they are the bias
// gradient of the projection that made q, k and v (its output gradient is
// dq, dk, dv side by side), which a column-sum pass would otherwise read back
// from (B T, 3 H dh) bf16: at GPT-2 small's batch 32, 151 MB a layer.
// Each value is summed as the block stores it (scaled and rounded to bf16),
// so the sums are those of the gradient the QKV backward reads. A block
// writes DH float sums per operand into a row of (B ceil(T / 128), 3 H dh)
// (Args::sums_at); cuda/attention.cu sums that matrix's columns into the
// bias gradient (gpu::column_sum, a fixed order): the sums repeat bitwise.
#include <cuda_bf16.h>

#include "cuda/wgmma.cuh"  // sm90::acc_col

namespace hg::gpu::attn {
namespace {

// Warps of 32 consumer threads a block: two warpgroups of 64 resident rows.
constexpr int kSumWarps = 8;

// Shared memory of the per-warp sums: `operands` rows of kSumWarps x DH floats.
constexpr int column_sums_bytes(int dh, int operands) { return operands * kSumWarps * dh * 4; }

#if HG_SM90A_DEVICE
// This warp's 16 rows of an m64nDH accumulator (a thread's rows row0 and
// row0 + 8; rows from `rows` on count 0), each value times `scale` rounded to
// bf16, into warp_sums[c] for the DH columns c (lanes 0-3 write). The
// shuffle tree is fixed: the same bits every run.
template <int DH>
__device__ __forceinline__ void warp_column_sums(const float (&acc)[DH / 2], float scale, int row0, int rows,
                                                 float* warp_sums) {
  const int lane = threadIdx.x % 32, t = lane % 4;
#pragma unroll
  for (int i = 0; i < DH / 2; i += 4)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float s = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h)  // accumulator index i + 2 h + e: row row0 + 8 h, column 2 t + acc_col(i + e)
        if (row0 + 8 * h < rows) s += __bfloat162float(__float2bfloat16_rn(acc[i + 2 * h + e] * scale));
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (lane < 4) warp_sums[2 * t + sm90::acc_col(i + e)] = s;
    }
}

// Called by all 256 consumer threads (threads 0-255 of the block) after each
// wrote its warp's sums of every operand o into warp_sums[(o kSumWarps +
// warp) DH ..]: the warps' sums of each column added in warp order into
// out[o][c]. Named barrier 1: the producer threads have left by then.
template <int DH, int kOperands>
__device__ __forceinline__ void write_block_column_sums(const float* warp_sums, float* const (&out)[kOperands]) {
  asm volatile("bar.sync 1, 256;" ::: "memory");
  for (int j = threadIdx.x; j < kOperands * DH; j += 256) {
    const int o = j / DH, c = j % DH;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kSumWarps; ++w) s += warp_sums[(o * kSumWarps + w) * DH + c];
    out[o][c] = s;
  }
}
#endif  // HG_SM90A_DEVICE

}  // namespace
}  // namespace hg::gpu::attn
