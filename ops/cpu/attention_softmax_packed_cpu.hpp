#pragma once
// Internal to ops/: softmax attention on the CPU, read from and written to
// the packed layouts in place: q, k, v from qkv (B, T, 3, H, dh), the
// context into (B, T, H, dh), the gradients into dqkv (B, T, 3, H, dh). The
// head split and merge copies of the composed path (split_heads,
// merge_heads) are not needed. One task per (batch, head) does all of that
// head's work, its products single-threaded GEMMs of the current level
// (core/cpu_gemm.hpp) and its softmax rows (ops/cpu/softmax_cpu.hpp), the
// T x T scores and score gradients in a buffer of the thread's own while
// they are in cache: the same operations on every element as the composed
// path, and results that do not depend on the thread count. F32 or F64.
#include <cstdint>

#include "core/softmax_layout.hpp"
#include "core/tensor.hpp"

namespace hg::cpu {

// out (B, T, H dh) = probs v with probs (B, H, T, T) = the softmax of
// q k^T with `layout`'s scale, mask and causal rule (its rows are probs').
// The products over keys leave out those a causal softmax hides.
void packed_forward(const Tensor& qkv, int64_t heads, const SoftmaxRows& layout, Tensor& probs, Tensor& out);

// dqkv from dout (B, T, H dh), the forward's qkv and probs, its scale and
// causal rule: dv = P^T dO, dS = the softmax backward of dP = dO v^T,
// dq = dS k, dk = dS^T q.
void packed_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads, double scale,
                     bool causal, Tensor& dqkv);

}  // namespace hg::cpu
