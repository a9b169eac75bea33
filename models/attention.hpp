#pragma once
#include <cstdint>

#include <string>
#include "core/module.hpp"
#include "core/random.hpp"

#include "models/kv_cache.hpp"
#include "models/linear.hpp"
#include "ops/attention.hpp"

namespace hg {

// How the fused mode computes the attention core (the unfused mode always
// composes GEMM + softmax + GEMM from primitive passes):
//  - Flash: one attention op (ops/attention.hpp), O(T) memory, no T x T
//    probabilities saved; on CUDA it needs a head dim of 32, 64 or 128;
//  - Softmax: scores GEMM, the fused attention softmax, GEMM (saves P);
//  - Auto: Flash on CUDA where the head dim has a kernel, Softmax otherwise.
enum class AttentionImpl { Auto, Flash, Softmax };
AttentionImpl parse_attention_impl(const std::string& name);  // "auto", "flash", "softmax"
const char* attention_impl_name(AttentionImpl impl);

// Causal multi-head self-attention with a fused QKV projection:
//   [q k v] = x Wqkv^T + b          (one Linear(d, 3d))
//   P_h     = softmax(q_h k_h^T / sqrt(dh) + mask, causal)
//   out     = concat_h(P_h v_h) Wo^T + bo
// Backward is written by hand through every step; docs/attention.md derives it.
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t d_model, int64_t n_heads, Generator& gen, DType dtype = DType::F32, bool causal = true);

  // x (B, T, d). key_padding_mask: optional additive (B, 1, 1, T) (0 keeps a
  // key, a large negative or -inf drops it); undefined means no padding mask.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask = Tensor());
  Tensor backward(const Tensor& dy);  // dy (B, T, d) -> dx (B, T, d)

  // Inference with a key/value cache (causal attention only): x (B, T, d)
  // holds the new tokens, at positions cache.length() .. + T - 1. Their keys
  // and values are written to the cache's layer `layer`, and each token
  // attends to every cached position up to its own. The same implementation
  // as forward (flash, or the softmax path); nothing is kept for a backward.
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer);

  int64_t heads() const { return n_heads_; }
  void set_impl(AttentionImpl impl) { impl_ = impl; }
  AttentionImpl impl() const { return impl_; }

  Linear qkv;
  Linear proj;

 private:
  int64_t d_model_, n_heads_, head_dim_;
  bool causal_;
  double scale_;
  AttentionImpl impl_ = AttentionImpl::Auto;
  bool used_flash(const Tensor& x) const;
  // The softmax path's core on (B, H, Tq, dh) q and (B, H, Tk, dh) k, v:
  // P = softmax(scale q k^T + mask, causal), returns P v; P into *probs when given.
  Tensor softmax_core(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, Tensor* probs) const;
  // Saved by forward: the softmax path's P with its (3, B, H, T, dh)
  // head-split projections (composed) or the packed (B, T, 3, H, dh)
  // projection itself (fused mode on the CPU), or the flash path's attention
  // state (the packed projection, its output and O(T) statistics).
  Tensor heads_, probs_, packed_;
  AttentionSaved flash_;
  int64_t batch_ = 0, seq_ = 0;
};

}  // namespace hg
