#pragma once
// Internal to ops/: fused attention on the CPU (Eigen), F32 and F64. Query
// tiles of kQueryTile rows: scratch is O(kQueryTile * Tk), never Tq * Tk.
#include "core/attention_layout.hpp"
#include "core/tensor.hpp"

namespace hg::cpu {

// Operands by base pointer, all of `dtype` (F32 or F64), each addressed
// through the layout's strides (q and dq: layout.q; k, v, dk, dv: layout.kv;
// o and dout: layout.o), as in cuda/attention_kernels.hpp. lse (B, H, Tq)
// is contiguous, in the operands' dtype.
void attention_forward(DType dtype, const void* q, const void* k, const void* v, const AttentionLayout& layout, void* o,
                       Tensor& lse);

// dq, dk, dv from dout; the probabilities are recomputed per tile exactly as
// the forward computed them (max and sum of the row, not the stored lse).
void attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v,
                        const AttentionLayout& layout, void* dq, void* dk, void* dv);

}  // namespace hg::cpu
