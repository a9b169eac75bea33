#pragma once
// Launch API of the fused attention kernels (cuda/attention.cu). Plain C++:
// ops/attention.cpp calls these for CUDA tensors in fused mode after validating.
#include "core/attention_layout.hpp"
#include "core/tensor.hpp"

namespace hg::gpu {

// o (B, H, Tq, dh) in q's dtype (F32 or BF16), lse (B, H, Tq) F32, and
// stats (B, H, Tq, 2) F32: each row's base-2 max and 1 / sum, which the
// backward rebuilds the probabilities from. Head dims 32, 64 and 128; no
// Tq x Tk buffer.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionLayout& layout, Tensor& o,
                       Tensor& lse, Tensor& stats);

// dq, dk, dv without floating-point atomics: one kernel owns dk and dv per key
// tile, another dq per query tile, so results are bitwise repeatable.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& stats, const AttentionLayout& layout, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace hg::gpu
