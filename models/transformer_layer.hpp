#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "core/random.hpp"
#include "models/attention.hpp"
#include "models/dropout.hpp"
#include "models/feedforward.hpp"
#include "models/layernorm.hpp"

namespace hg {

// Pre-LN decoder block (GPT-2 style):
//   h = x + Dropout(Attention(LN1(x)))
//   y = h + FeedForward(LN2(h))          (FeedForward ends in its own dropout)
// The first residual add and LN2 run as one op (LayerNorm::forward_residual),
// whose backward also adds the residual gradient in the same pass.
// Backward: the residual passes dy straight through and adds each branch's dx.
class TransformerLayer : public Module {
 public:
  TransformerLayer(int64_t d_model, int64_t n_heads, int64_t ffn_hidden, Generator& gen, double dropout = 0.0,
                   uint64_t dropout_seed = 0, DType dtype = DType::F32, double ln_eps = 1e-5);

  Tensor forward(const Tensor& x, const Tensor& key_padding_mask = Tensor());  // (B, T, d)
  Tensor backward(const Tensor& dy);
  // Inference with a key/value cache: the new tokens x (B, T, d), this
  // layer's keys and values in cache layer `layer`; dropout off, nothing kept.
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer);

  LayerNorm ln1;
  MultiHeadAttention attn;
  Dropout attn_drop;
  LayerNorm ln2;
  FeedForward ffn;
};

}  // namespace hg
