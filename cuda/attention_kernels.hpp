#pragma once
// Launch API of the fused attention kernels (cuda/attention.cu). Plain C++:
// ops/attention.cpp calls these for CUDA tensors in fused mode after validating.
#include "core/attention_layout.hpp"
#include "core/tensor.hpp"

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

// The kernel attention_forward runs for a call, on the current device:
// F32 inputs run the F32 kernels; BF16 runs the sm_90a wgmma forward where
// wgmma_forward_applies (cuda/attention_dispatch.hpp) and the device runs
// it, else the mma.sync one. The pointers matter (TMA takes 16-byte aligned
// bases).
// WgmmaStoredDs (backward only): the wgmma backward whose dk/dv kernel
// stores ds for the dq kernel (cuda/attention_dispatch.hpp,
// wgmma_backward_stores_ds).
enum class AttentionKernel { F32, MmaSync, Wgmma, WgmmaStoredDs };

// Whether BF16 calls may take the wgmma kernels where they apply (true
// unless set otherwise): false runs the mma.sync kernels everywhere, as
// torch.nn.attention.sdpa_kernel narrows SDPA's backends, to compare the two
// on the same inputs (tests, benchmarks). For the whole process; not for a
// change while another thread runs attention.
void allow_wgmma_attention(bool allowed);
bool wgmma_attention_allowed();
// Whether the wgmma backward may store ds where it applies (true unless set
// otherwise): false makes it recompute s and dp in its dq kernel everywhere,
// to compare the two (tests, benchmarks). For the whole process, as above.
void allow_stored_ds_attention(bool allowed);
AttentionKernel attention_forward_kernel(DType dtype, const void* q, const void* k, const void* v,
                                         const AttentionLayout& layout);

// dq (layout.q), dk, dv (layout.kv) from dout (layout.o) without
// floating-point atomics: BF16 runs one kernel for dk and dv per key tile and
// another for dq per query tile; F32 adds dq from the dk, dv blocks in a
// fixed order (docs/attention.md, "One kernel"). Results are bitwise repeatable.
// qkv_sums (optional; F32, 3 H dh elements, CUDA): where Tq = Tk and
// the wgmma kernels run, they also sum the columns of dq, dk and dv as they
// store them, and those sums over batch and rows (each head's dh columns at
// o H dh + h dh for o = q, k, v: the bias gradient of the projection that
// made q, k and v) are added into it, in an order fixed by the shape.
// Returns whether they were; elsewhere the caller sums the columns itself.
bool attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v, const void* o,
                        const Tensor& stats, const AttentionLayout& layout, void* dq, void* dk, void* dv,
                        const Tensor* qkv_sums = nullptr);

// The kernels attention_backward runs for a call, on the current device:
// BF16 runs the sm_90a wgmma backward where wgmma_backward_applies
// (cuda/attention_dispatch.hpp) and the device runs it, storing ds where
// wgmma_backward_stores_ds, else the mma.sync kernels.
AttentionKernel attention_backward_kernel(DType dtype, const void* dout, const void* q, const void* k, const void* v,
                                          const AttentionLayout& layout);

}  // namespace hg::gpu
