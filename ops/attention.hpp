#pragma once
#include <optional>

#include "core/tensor.hpp"

namespace hg {

// Scaled dot-product attention in one op, forward and hand-written backward
// (derivation: docs/attention.md, "Fused attention").
//
//   q (B, H, Tq, dh), k and v (B, H, Tk, dh), all one dtype and device.
//   z[i, j] = scale * q_i . k_j + mask[b, j]     (mask (B|1, 1, 1, Tk), additive)
//   o_i     = sum_j softmax_j(z[i, :]) v_j
//   lse_i   = log sum_j exp(z[i, j])              saved, float32 (float64 for F64)
// Same conventions as attention_softmax_forward: with causal, key j is masked
// for query i when j > i + (Tk - Tq); a mask value at or below
// kSoftmaxMaskThreshold (-1e9, -inf included) removes its key outright; a row
// whose every key is removed gives o_i = 0, lse_i = -inf and zero gradients.
struct AttentionOptions {
  Tensor mask;  // optional key-padding mask; F32 (F64 for F64 q)
  bool causal = false;
  std::optional<double> scale;  // default 1 / sqrt(dh)
};

// What the backward needs: the inputs, the output and the log-sum-exp, O(T)
// beside them (no Tq x Tk buffer on the fused paths).
struct AttentionSaved {
  Tensor q, k, v, o, lse;
  Tensor qkv;         // packed form (attention_forward_packed): the (B, T, 3 H dh) input; o is (B, T, H dh)
  int64_t heads = 0;  // packed form: H
  Tensor mask;
  bool causal = false;
  double scale = 1.0;
  Tensor probs;          // unfused path only: the (B, H, Tq, Tk) probabilities it saves anyway
  Tensor softmax_stats;  // CUDA fused only: (B, H, Tq, 2) row max and 1 / sum, O(T)
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// Paths: CPU (F32, F64; tiled, O(Tk) scratch per query tile), unfused (GEMM +
// attention softmax + GEMM on the primitive backend, any device), CUDA fused
// (BF16 on tensor cores, F32 on the CUDA cores; head dims 32, 64, 128).
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         AttentionSaved* saved);

AttentionGrads attention_backward(const Tensor& dout, const AttentionSaved& saved);

// Self-attention on the fused QKV projection's output, without the head
// split and merge copies: qkv (B, T, 3 * H * dh) holds, per token, q, k and
// v, each as H heads of dh side by side ((B, T, 3, H, dh)); the result is
// (B, T, H * dh) with the heads side by side, the output projection's input.
// The fused paths (CPU, CUDA) read q, k, v in place through strides and
// write o in place; the unfused mode splits the heads with transposes and
// runs the unfused op. Same options and numerics as attention_forward.
Tensor attention_forward_packed(const Tensor& qkv, int64_t heads, const AttentionOptions& options,
                                AttentionSaved* saved);

// dout (B, T, H * dh) -> dqkv (B, T, 3 * H * dh), the QKV projection's
// output gradient, dq, dk, dv written straight into their slices.
Tensor attention_backward_packed(const Tensor& dout, const AttentionSaved& saved);

// attention_backward_packed that may also add dqkv's column sums over B and
// T, the QKV projection's bias gradient, into qkv_bias_grad (3 * H * dh):
// where the CUDA kernels sum them as they store dq, dk and dv
// (gpu::attention_backward: the wgmma kernels, F32 grad), which saves the
// QKV backward a pass over dqkv. bias_summed says whether they were added;
// where not, qkv_bias_grad is untouched.
struct PackedAttentionGrads {
  Tensor dqkv;
  bool bias_summed = false;
};
PackedAttentionGrads attention_backward_packed_bias(const Tensor& dout, const AttentionSaved& saved,
                                                    Tensor& qkv_bias_grad);

// Inference over a key/value cache (models/kv_cache.hpp), no saved state and
// no backward. qkv (B, Tq, 3 * H * dh) is the new tokens' QKV projection
// output: their queries are read in place (its k and v are not read; the
// caller has already written them to the cache). k_cache and v_cache are
// time-major, (capacity, B, H, dh), and the first `tk` positions are the
// keys and values (tk >= Tq: the new tokens are the last Tq of them). With
// options.causal, key j is hidden from query i when j > i + (tk - Tq), so a
// prefill (tk = Tq) is the ordinary causal attention and one decoded token
// sees every cached key. The mask, if any, is (B|1, 1, 1, tk). Returns
// (B, Tq, H * dh), the output projection's input, as the packed form does.
// The fused paths (CPU, CUDA) read the cache in place through strides; the
// unfused mode copies the prefix to (B, H, tk, dh) and runs the unfused op.
Tensor attention_forward_kv_cache(const Tensor& qkv, int64_t heads, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t tk, const AttentionOptions& options);

// The first `length` positions of a time-major (capacity, B, H, dh) cache as
// a contiguous (B, H, length, dh) copy: the operand form of the unfused paths.
Tensor kv_cache_heads(const Tensor& cache, int64_t length);

// The head split and merge that the packed form avoids, as transpose copies
// (the unfused packed form and MultiHeadAttention's softmax path use them).
// split_heads: x (B, T, S * heads * dh), S slots of heads side by side per
// token (S = 3 for q, k, v; 1 for an attention output) -> (S, B, heads, T, dh).
// merge_heads: the inverse, (S, B, H, T, dh) -> (B, T, S * H * dh); a 4-D
// (B, H, T, dh) is one slot.
Tensor split_heads(const Tensor& x, int64_t slots, int64_t heads);
Tensor merge_heads(const Tensor& x);

}  // namespace hg
