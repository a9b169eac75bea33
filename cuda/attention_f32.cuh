#pragma once
// For cuda/attention.cu only: the launchers of the F32 fused attention
// kernels (cuda/attention_f32.cu), for head dims DH = 32, 64, 128;
// heads_total = B * H.
#include <cstdint>

#include "cuda/attention_args.cuh"

namespace hg::gpu::attn {

// o (a.out), lse and stats.
template <int DH>
void forward_f32(const Args& a, int64_t heads_total);

// dq, dk, dv (dq added by the dk, dv blocks in a fixed order).
template <int DH>
void backward_f32(const Args& a, int64_t heads_total);

}  // namespace hg::gpu::attn
