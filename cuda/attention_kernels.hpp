#pragma once
// Launch API of the fused attention kernels (cuda/attention.cu). Plain C++:
// ops/attention.cpp calls these for CUDA tensors in fused mode after validating.
#include "core/attention_layout.hpp"
#include "core/tensor.hpp"
#include "cuda/lab_switch.hpp"

namespace hg::gpu {

// The operands by base pointer, each addressed through the layout's strides
// (q: layout.q; k, v: layout.kv; out: layout.o), all of `dtype` (F32 or
// BF16): contiguous (B, H, T, dh) tensors, or q, k, v read in place from the
// QKV projection's (B, T, 3, H, dh) output and o written as (B, T, H, dh).
// lse (B, H, Tq) F32 and stats (B, H, Tq, 2) F32 (each row's base-2 max and
// 1 / sum, which the backward rebuilds the probabilities from) are
// contiguous. Head dims 32, 64 and 128; no Tq x Tk buffer.
void attention_forward(DType dtype, const void* q, const void* k, const void* v, const AttentionLayout& layout,
                       void* out, Tensor& lse, Tensor& stats);

// dq (layout.q), dk, dv (layout.kv) from dout (layout.o) without
// floating-point atomics: one kernel owns dk and dv per key tile, another dq
// per query tile (or, in the lab variants of docs/attention.md "One kernel",
// the dk, dv blocks add dq in a fixed order), so results are bitwise repeatable.
void attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v, const void* o,
                        const Tensor& stats, const AttentionLayout& layout, void* dq, void* dk, void* dv);

// HG_ATTN_BF16_VARIANT=V (0 to 9; docs/attention.md, "Lab switch") runs the
// BF16 variant V at every head dim, in each direction that has a variant V
// (the other runs its default); unset, the defaults of cuda/attention.cu.
// Tests force one in-process with LabSwitchScope.
constexpr int kAttentionBf16SwitchValues = 11;
inline LabSwitch& attention_bf16_lab_switch() {
  static LabSwitch s("HG_ATTN_BF16_VARIANT", kAttentionBf16SwitchValues);
  return s;
}

}  // namespace hg::gpu
