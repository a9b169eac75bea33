#pragma once
// Internal to ops/: the four products of softmax attention on the CPU, read
// from and written to the packed layouts in place: q, k, v from qkv
// (B, T, 3, H, dh), the context into (B, T, H, dh), the gradients into dqkv
// (B, T, 3, H, dh). The head split and merge copies of the composed path
// (split_heads, merge_heads) are not needed. One task per (batch, head), each
// a single-threaded GEMM of the current level (core/cpu_gemm.hpp), so the
// results do not depend on the thread count. F32 or F64.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::cpu {

// scores (B, H, T, T) = q k^T.
void packed_scores(const Tensor& qkv, int64_t heads, Tensor& scores);

// out (B, T, H dh) = probs v; probs (B, H, T, T). `causal`: probs hide keys
// k > q (exactly 0 there), which the products over keys or queries leave out.
void packed_context(const Tensor& probs, const Tensor& qkv, int64_t heads, bool causal, Tensor& out);

// dprobs (B, H, T, T) = dout v^T, and the v slots of dqkv = probs^T dout;
// dout (B, T, H dh).
void packed_value_grads(const Tensor& dout, const Tensor& probs, const Tensor& qkv, int64_t heads, bool causal,
                        Tensor& dprobs, Tensor& dqkv);

// The q and k slots of dqkv: dq = dscores k, dk = dscores^T q.
void packed_query_key_grads(const Tensor& dscores, const Tensor& qkv, int64_t heads, bool causal, Tensor& dqkv);

}  // namespace hg::cpu
