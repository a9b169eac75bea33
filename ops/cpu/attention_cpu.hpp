#pragma once
// Internal to ops/: fused attention on the CPU (Eigen), F32 and F64. Query
// tiles of kQueryTile rows: scratch is O(kQueryTile * Tk), never Tq * Tk.
#include "core/attention_layout.hpp"
#include "core/tensor.hpp"

namespace hg::cpu {

// o (B, H, Tq, dh) and lse (B, H, Tq) in q's dtype.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionLayout& layout, Tensor& o,
                       Tensor& lse);

// dq, dk, dv from dout and the forward's lse (probabilities recomputed per tile).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, const AttentionLayout& layout, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace hg::cpu
