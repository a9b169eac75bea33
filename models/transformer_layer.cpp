#include "models/transformer_layer.hpp"

#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {
namespace {

// x + branch: the skip connection, its own kind in the profiler. Its backward
// is the same sum (the gradient flows unchanged down both paths).
Tensor residual_add(const Tensor& x, const Tensor& branch) {
  HG_PROFILE("residual", x.device());
  return add(x, branch);
}

}  // namespace

TransformerLayer::TransformerLayer(int64_t d_model, int64_t n_heads, int64_t ffn_hidden, Generator& gen,
                                   double dropout, uint64_t dropout_seed, DType dtype, double ln_eps)
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

Tensor TransformerLayer::forward(const Tensor& x, const Tensor& key_padding_mask) {
  const Tensor h = residual_add(x, attn_drop.forward(attn.forward(ln1.forward(x), key_padding_mask)));
  return residual_add(h, ffn.forward(ln2.forward(h)));
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  const Tensor dh = residual_add(dy, ln2.backward(ffn.backward(dy)));
  return residual_add(dh, ln1.backward(attn.backward(attn_drop.backward(dh))));
}

}  // namespace hg
