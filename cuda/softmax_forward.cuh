#pragma once
// The fused softmax forward's register layouts (lane and block teams) and
// what they share with the rest of cuda/softmax.cu (its only library
// includer): numerics, who owns a row, the mask and causal span, the
// forward configuration. Header-only device code, so that the lab program
// (bench/lab/softmax_lab.cu) times these very kernels. Design:
// docs/softmax.md, "Fused GPU kernels".
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/softmax_layout.hpp"  // kSoftmaxMaskThreshold: one definition for every path
#include "cuda/grid_dependency.cuh"
#include "cuda/reduce.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

constexpr int kLaneTeamBlock = 128;  // threads per block in the lane-team layout
constexpr int kMaxBlock = 1024;      // block-team and streaming layouts
// Elements per thread in the forward's block-team layout: the row lives in
// registers, capped at 64 per thread by __launch_bounds__(1024).
constexpr int kForwardBlockElems = 16;
constexpr float kMaskThreshold = static_cast<float>(kSoftmaxMaskThreshold);

// ---- numerics -----------------------------------------------------------------

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

// ---- who owns a row ---------------------------------------------------------------

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

struct WarpMaxNan {
  __device__ float operator()(float v) const { return LaneTeam<32>{}.max(v); }
};

// The whole block owns one row; `scratch` holds one float per warp.
struct BlockTeam {
  float* scratch;
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int slot() const { return 0; }
  __device__ int rows_per_block() const { return 1; }
  __device__ float max(float v) const { return block_reduce(v, scratch, WarpMaxNan{}, -INFINITY); }
  __device__ float sum(float v) const { return block_sum(v, scratch); }
};

// ---- forward --------------------------------------------------------------------

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

template <class T>
__device__ __forceinline__ RowSpan row_span(const ForwardArgs<T>& a, int64_t row) {
  RowSpan s{nullptr, a.tk};
  if (a.mask == nullptr && !a.causal) return s;
  int64_t b, q;
  if (a.index32) {
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

// z for the W keys starting at k0 (all < tk): scale * x + mask, -inf past `visible`.
template <class T, int W>
__device__ __forceinline__ void load_z(const T* x_row, const RowSpan& span, int64_t k0, float scale, float (&z)[W]) {
  load_vec<W, Load::ReadOnly>(x_row + k0, z);
  if (span.mask != nullptr) {
    float m[W];
    load_vec<W, Load::ReadOnly>(span.mask + k0, m);
    // _rn: no fused multiply-add, so z rounds exactly as the CPU path's z.
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = __fadd_rn(__fmul_rn(scale, z[j]), additive_mask(m[j]));
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = __fmul_rn(scale, z[j]);
  }
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (k0 + j >= span.visible) z[j] = -INFINITY;  // only the chunk that straddles the diagonal
}

// ---- forward configuration -------------------------------------------------------
// What the forward's register layouts (lane and block teams) do for one
// dtype and access width. The streaming layout has no options, nor has the
// backward.
struct SoftmaxForwardConfig {
  bool lean;          // z = scale x + mask as one FFMA; exp as ex2.approx of (z - max) log2e; bf16 widened by masks
  int lane_max_keys;  // rows longer than this (past one chunk a lane) go to the block team; 0: no limit
  bool pdl = false;   // launched programmatically (sm_90+): may start while the kernel before drains
};

// Per dtype {f32, bf16} for rows read 16 bytes at a time: lean arithmetic,
// rows of Tk > 512 in the block team (bf16 Tk 1024: 64 threads a row),
// programmatic launches (H200 2026-11-29: +0.2-3%).
// Measured alternatives and how to promote one: bench/lab/softmax.md.
constexpr SoftmaxForwardConfig kVectorForward[2] = {{true, 512, true}, {true, 512, true}};
// Rows read one element at a time: the exact arithmetic of the CPU path.
constexpr SoftmaxForwardConfig kScalarForward = {false, 0};

constexpr float kLog2e = 1.4426950408889634f;

// 2^v by the SFU (max relative error ~2^-22; results below 2^-126 flush to
// 0, which a probability never misses next to its row's 1 / sum).
__device__ __forceinline__ float exp2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// load_z with one FFMA per element (scale x + mask rounded once, not twice:
// within an ulp of z of the CPU path), bf16 widened by masks, and the
// per-key causal test only in the chunk that straddles `visible`.
template <class T, int W>
__device__ __forceinline__ void load_z_lean(const T* x_row, const RowSpan& span, int64_t k0, float scale,
                                            float (&z)[W]) {
  load_vec_lean<W>(x_row + k0, z);
  if (span.mask != nullptr) {
    float m[W];
    load_vec<W, Load::ReadOnly>(span.mask + k0, m);
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = fmaf(scale, z[j], additive_mask(m[j]));
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] *= scale;
  }
  if (k0 + W > span.visible)
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (k0 + j >= span.visible) z[j] = -INFINITY;
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

// Row held in registers: chunk i of a thread covers keys [(rank + i * size) * W, +W).
// Requires tk <= size * N * W and, for W > 1, tk % W == 0 (chunks never straddle tk).
// kLean: SoftmaxForwardConfig::lean.
template <class T, int W, int N, bool kLean, class Team>
__device__ __forceinline__ void forward_rows_in_registers(const ForwardArgs<T>& a, const Team& team) {
  wait_for_prior_grids();  // programmatic launches: the previous kernel's writes are visible
  allow_dependent_grids();
  const int64_t rows_per_block = team.rows_per_block();
  for (int64_t base = blockIdx.x * rows_per_block; base < a.rows; base += gridDim.x * rows_per_block) {
    const int64_t row = base + team.slot();
    const bool valid = row < a.rows;  // false only for spare teams of the last block
    const RowSpan span = valid ? row_span(a, row) : RowSpan{nullptr, 0};
    const T* x_row = a.x + row * a.tk;

    float v[N][W];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < span.visible) {
        if constexpr (kLean) load_z_lean<T, W>(x_row, span, k0, a.scale, v[i]);
        else load_z<T, W>(x_row, span, k0, a.scale, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;  // masked or past the row: no load
      }
    }

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
    const float inv = norm.inverse(team.sum(row_sum));

    if (!valid) continue;
    T* y_row = a.y + row * a.tk;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < a.tk) {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] *= inv;
        store_vec<W>(y_row + k0, v[i]);
      }
    }
  }
}

template <class T, int TPR, int W, int N, bool kLean>
__global__ void __launch_bounds__(kLaneTeamBlock) softmax_forward_lanes_kernel(ForwardArgs<T> a) {
  forward_rows_in_registers<T, W, N, kLean>(a, LaneTeam<TPR>{});
}

template <class T, int W, int N, bool kLean>
__global__ void __launch_bounds__(kMaxBlock) softmax_forward_block_kernel(ForwardArgs<T> a) {
  __shared__ float scratch[32];
  forward_rows_in_registers<T, W, N, kLean>(a, BlockTeam{scratch});
}

}  // namespace
}  // namespace hg::gpu
