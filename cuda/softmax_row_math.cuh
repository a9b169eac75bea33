#pragma once
// What every fused softmax forward layout shares (cuda/softmax.cu's register
// and streaming layouts, cuda/softmax_staged_forward.cuh): the arguments, a
// row's mask and visible keys, the NaN-keeping max, the mask threshold, the
// lean exp and the fully-masked-row rule. Numerics: docs/softmax.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/softmax_layout.hpp"  // kSoftmaxMaskThreshold: one definition for every path
#include "cuda/exp_approx.cuh"      // exp2_approx, kLog2e: the lean exp

namespace hg::gpu {
namespace {

constexpr float kMaskThreshold = static_cast<float>(kSoftmaxMaskThreshold);

// max that returns NaN when either input is NaN (fmaxf would drop it and hide
// a NaN row behind a finite answer).
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
}

// What a mask value adds to z: itself, or -inf at or below the threshold.
// Subtracting inf (rather than returning -inf) keeps a NaN mask value NaN,
// exactly as the CPU path does.
__device__ __forceinline__ float additive_mask(float m) { return m > kMaskThreshold ? m : m - INFINITY; }

// TPR consecutive lanes of a warp own one row. Shuffles with xor offsets below
// TPR stay inside the team; all 32 lanes always take part (no early exit).
template <int TPR>
struct LaneTeam {
  static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "TPR is a power of two <= 32");
  __device__ int rank() const { return threadIdx.x % TPR; }
  __device__ int size() const { return TPR; }
  __device__ int slot() const { return threadIdx.x / TPR; }  // which of the block's rows
  __device__ int rows_per_block() const { return blockDim.x / TPR; }
  __device__ float max(float v) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
  }
  __device__ float sum(float v) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
  }
};

// ---- forward arguments -------------------------------------------------------------

template <class T>
struct ForwardArgs {
  const T* x;
  T* y;
  const float* mask;                     // null: no mask
  int64_t rows, tk, tq, rows_per_batch;  // rows_per_batch = heads * tq
  int64_t mask_batch_stride, mask_query_stride;
  float scale;
  bool causal;
  bool index32;  // row coordinates fit 32-bit division (much cheaper than 64-bit)
};

// The part of a row's setup that depends on its (batch, query) coordinates.
struct RowSpan {
  const float* mask;  // this row's mask, or null
  int64_t visible;    // keys [0, visible) can be seen; the rest are masked without a load
};

// kIndex32: the caller launches only where a.index32 holds (no 64-bit
// division compiled: fewer registers).
template <class T, bool kIndex32 = false>
__device__ __forceinline__ RowSpan row_span(const ForwardArgs<T>& a, int64_t row) {
  RowSpan s{nullptr, a.tk};
  if (a.mask == nullptr && !a.causal) return s;
  int64_t b, q;
  if (kIndex32 || a.index32) {
    const uint32_t r = static_cast<uint32_t>(row);
    b = r / static_cast<uint32_t>(a.rows_per_batch);
    q = r % static_cast<uint32_t>(a.tq);
  } else {
    b = row / a.rows_per_batch;
    q = row % a.tq;
  }
  if (a.mask != nullptr) s.mask = a.mask + b * a.mask_batch_stride + q * a.mask_query_stride;
  if (a.causal) {
    const int64_t n = q + a.tk - a.tq + 1;  // keys k <= q + (tk - tq)
    s.visible = n < 0 ? 0 : (n > a.tk ? a.tk : n);
  }
  return s;
}

// The row max becomes the exp shift. A fully masked row (max = -inf) shifts by
// 0 instead, so exp(-inf - 0) = 0, its sum is 0 and 1/sum is replaced by 0:
// zeros, not (-inf) - (-inf) = NaN. A NaN max leaves everything NaN.
struct Normaliser {
  float shift;
  bool all_masked;
  __device__ explicit Normaliser(float row_max)
      : shift(row_max == -INFINITY ? 0.0f : row_max), all_masked(row_max == -INFINITY) {}
  __device__ float inverse(float row_sum) const { return all_masked ? 0.0f : 1.0f / row_sum; }
};

// A row held as this thread's N chunks of W keys, z on entry: exp(z - shift)
// in place, and the row's 1 / sum returned (0 for a fully masked row, NaN
// for a NaN row); `team` reduces over the row's threads. kLean: the
// forward's lean exp (SoftmaxForwardConfig::lean), else expf.
template <int W, int N, bool kLean, class Team>
__device__ __forceinline__ float exp_and_inverse(const Team& team, float (&v)[N][W]) {
  float row_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < W; ++j) row_max = max_nan(row_max, v[i][j]);
  const Normaliser norm(team.max(row_max));

  float row_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < W; ++j) {
      // lean: exp(z - shift) = 2^((z - shift) log2e). The difference comes
      // first: z log2e - shift log2e in one FFMA would leave the rounding
      // of shift log2e (an ulp of 2^77 at logits of 1e30) in the max key's
      // exponent, whose exp must be exactly 1.
      if constexpr (kLean) v[i][j] = exp2_approx((v[i][j] - norm.shift) * kLog2e);
      else v[i][j] = expf(v[i][j] - norm.shift);
      row_sum += v[i][j];
    }
  return norm.inverse(team.sum(row_sum));
}

}  // namespace
}  // namespace hg::gpu
