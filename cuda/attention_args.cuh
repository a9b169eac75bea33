#pragma once
// For the fused attention .cu files only (cuda/attention.cu, BF16 and the
// launchers; cuda/attention_f32.cu, F32): the kernel arguments and constants
// both share.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/attention_layout.hpp"
#include "cuda/exp_approx.cuh"

namespace hg::gpu::attn {

using hg::gpu::kLog2e;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kMaskThreshold = static_cast<float>(kSoftmaxMaskThreshold);

// The base-2 term mask value m adds to a logit: m log2(e), or -inf where m
// is at or below the threshold (the key is removed); a NaN stays NaN.
__device__ __forceinline__ float mask_term(float m) { return m > kMaskThreshold ? m * kLog2e : m - INFINITY; }

struct Args {
  const void *q, *k, *v, *o, *dout;
  void *out, *dq, *dk, *dv;
  float* lse;
  float2* stats;  // per query row: base-2 max and 1 / sum, what the backward rebuilds p from
  float* delta;
  // Optional (null: none), written by the wgmma backward with Tq = Tk: per
  // block of 128 resident rows, the column sums of its dq, dk or dv rows as
  // stored (cuda/attention_column_sums.cuh), those of batch b's block j of
  // head h at [(b ceil(T / 128) + j) sums_ld + h dh].
  float *dq_sums, *dk_sums, *dv_sums;
  int64_t sums_ld;
  const float* mask;
  int64_t mask_batch_stride;
  int heads, tq, tk;
  bool causal;
  float scale, scale_log2;
  // Element strides (batch, head, row) of q and dq; k, v, dk, dv; o and dout.
  int64_t q_batch, q_head, q_row, kv_batch, kv_head, kv_row, o_batch, o_head, o_row;

  __device__ int64_t q_base(int64_t bh) const { return (bh / heads) * q_batch + (bh % heads) * q_head; }
  __device__ int64_t kv_base(int64_t bh) const { return (bh / heads) * kv_batch + (bh % heads) * kv_head; }
  __device__ int64_t o_base(int64_t bh) const { return (bh / heads) * o_batch + (bh % heads) * o_head; }
  // Where the column sums of head bh's resident rows r0 .. r0 + 127 start in
  // dq_sums, dk_sums or dv_sums.
  __device__ int64_t sums_at(int64_t bh, int r0, int dh) const {
    return ((bh / heads) * ((tq + 127) / 128) + r0 / 128) * sums_ld + (bh % heads) * dh;
  }
  __device__ const float* mask_row(int64_t bh) const {
    return mask == nullptr ? nullptr : mask + (bh / heads) * mask_batch_stride;
  }
  // Key j's term from its batch's mask row (mask_term), -inf past Tk.
  __device__ float key_term(const float* row, int j) const { return j < tk ? mask_term(row[j]) : -INFINITY; }
  // Exclusive end of the keys any query in [q_begin, q_end) may see.
  __device__ int key_end(int q_end) const { return causal ? min(tk, q_end + tk - tq) : tk; }
  // First query that sees key j (causal), 0 otherwise.
  __device__ int first_query(int j) const { return causal ? max(0, j - (tk - tq)) : 0; }
};

}  // namespace hg::gpu::attn
