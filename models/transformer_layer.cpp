#include "models/transformer_layer.hpp"

#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"

namespace hg {

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
  Tensor a;
  {
    HG_PROFILE("layernorm", x.device());
    a = ln1.forward(x);
  }
  a = attn_drop.forward(attn.forward(a, key_padding_mask));
  Tensor h;
  {
    HG_PROFILE("residual", x.device());
    h = add(x, a);
  }
  Tensor f;
  {
    HG_PROFILE("layernorm", x.device());
    f = ln2.forward(h);
  }
  f = ffn.forward(f);
  HG_PROFILE("residual", x.device());
  return add(h, f);
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  Tensor dh_branch = ffn.backward(dy);
  {
    HG_PROFILE("layernorm", dy.device());
    dh_branch = ln2.backward(dh_branch);
  }
  Tensor dh;
  {
    HG_PROFILE("residual", dy.device());
    dh = add(dy, dh_branch);
  }
  Tensor dx_branch = attn.backward(attn_drop.backward(dh));
  {
    HG_PROFILE("layernorm", dy.device());
    dx_branch = ln1.backward(dx_branch);
  }
  HG_PROFILE("residual", dy.device());
  return add(dh, dx_branch);
}

}  // namespace hg
