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
// Every residual add runs inside a LayerNorm's pass (LayerNorm::forward_residual),
// whose backward adds the residual gradient in the same pass: h with LN2;
// y, in a stack (forward_stream), with the next LayerNorm (the next layer's
// LN1, or the model's final one), which also takes the layer's input as a
// pending sum. Backward: the residual passes dy straight through; LN2's and
// LN1's backward each add their branch's dx to it.
//
// recompute_layernorm: the qkv projection and fc1 do not keep their inputs
// LN1(x) and LN2(h) between the forward and the backward (LayerNorm keeps
// its own input x / h and the row statistics anyway); each Linear's
// backward recomputes its input from them when it starts (one LayerNorm
// forward, nothing saved) and releases it after its dW GEMM. That frees
// 2 d values per token and layer, 2 bytes each in bf16 (gpt2s at B32:
// 2 x 32768 x 768 x 2 = 100.7 MB a layer), for one more LayerNorm forward
// each in the backward. Each recompute runs its forward's op again
// (LayerNorm::recompute_output), so the gradients are bitwise those of the
// layer that keeps the outputs, in every kernel mode and on every device.
class TransformerLayer : public Module {
 public:
  TransformerLayer(int64_t d_model, int64_t n_heads, int64_t ffn_hidden, Generator& gen, double dropout = 0.0,
                   uint64_t dropout_seed = 0, DType dtype = DType::F32, double ln_eps = 1e-5);

  // x: the input, (B, T, d), as a stream whose sum LN1 forms (pass it with
  // std::move: its branch is freed then). Returns y as {h, FeedForward's
  // output}: the sum is left to the next LayerNorm.
  ResidualStream forward_stream(ResidualStream x, const Tensor& key_padding_mask = Tensor());
  // A layer on its own: y formed here, by one residual add.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask = Tensor());
  // dy: the gradient of y (the output stream's value) -> that of x (the input's value).
  Tensor backward(const Tensor& dy);
  // Inference with a key/value cache: the new tokens x (B, T, d), this
  // layer's keys and values in cache layer `layer`; dropout off, nothing kept.
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer);

  void set_recompute_layernorm(bool on) { recompute_layernorm_ = on; }
  bool recompute_layernorm() const { return recompute_layernorm_; }

  LayerNorm ln1;
  MultiHeadAttention attn;
  Dropout attn_drop;
  LayerNorm ln2;
  FeedForward ffn;

 private:
  bool recompute_layernorm_ = false;
  // ln's forward output again, as (rows, d): the input its Linear consumed.
  static Tensor ln_output_rows(LayerNorm& ln);
};

}  // namespace hg
