#include "models/transformer_layer.hpp"

#include <utility>

#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {
namespace {

// x + branch where no LayerNorm takes the sum in its pass (a layer on its
// own, the cached inference): the skip connection, its own kind in the profiler.
Tensor residual_add(const Tensor& x, const Tensor& branch) {
  HG_PROFILE("residual", x.device());
  return add(x, branch);
}

}  // namespace

TransformerLayer::TransformerLayer(int64_t d_model, int64_t n_heads, int64_t ffn_hidden, Generator& gen, double dropout,
                                   uint64_t dropout_seed, DType dtype, double ln_eps)
    : ln1(d_model, ln_eps, dtype),
      attn(d_model, n_heads, gen, dtype),
      attn_drop(dropout, dropout_seed),
      ln2(d_model, ln_eps, dtype),
      ffn(d_model, ffn_hidden, gen, dropout, dropout_seed + 1, dtype) {
  register_module("ln1", ln1);
  register_module("attn", attn);
  register_module("attn_drop", attn_drop);
  register_module("ln2", ln2);
  register_module("ffn", ffn);
}

ResidualStream TransformerLayer::forward_stream(ResidualStream x, const Tensor& key_padding_mask) {
  ResidualLayerNormOutput in = ln1.forward_stream(std::move(x));  // in.h: the input's value (its sum), in.y: LN1 of it
  // LN1's output lives on only in the qkv projection: moved out here and
  // dropped there, it is freed with this statement's temporaries.
  const Tensor a = attn_drop.forward(attn.forward(std::exchange(in.y, Tensor()), key_padding_mask));
  if (recompute_layernorm_) attn.qkv.forget_input([this] { return ln_output_rows(ln1); });
  // h = x + a and LN2(h) in one pass.
  const ResidualLayerNormOutput seam = ln2.forward_residual(in.h, a);
  ResidualStream y{seam.h, ffn.forward(seam.y)};
  if (recompute_layernorm_) ffn.fc1.forget_input([this] { return ln_output_rows(ln2); });
  return y;
}

Tensor TransformerLayer::forward(const Tensor& x, const Tensor& key_padding_mask) {
  const ResidualStream y = forward_stream({x, Tensor()}, key_padding_mask);
  return residual_add(y.h, y.branch);
}

Tensor TransformerLayer::ln_output_rows(LayerNorm& ln) { return ln.recompute_output().reshape({-1, ln.dim()}); }

Tensor TransformerLayer::forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
  const Tensor a = attn.forward_cached(ln1.apply(x), cache, layer);
  const ResidualLayerNormOutput seam = ln2.apply_residual(x, a);
  return residual_add(seam.h, ffn.apply(seam.y));
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  // dh = dy (the residual path) + LN2's backward of the FFN's input gradient, in one pass.
  const Tensor dh = ln2.backward_residual(ffn.backward(dy), dy);
  // dx = dh (the residual path) + LN1's backward of the attention's input gradient, in one pass.
  return ln1.backward_residual(attn.backward(attn_drop.backward(dh)), dh);
}

}  // namespace hg
