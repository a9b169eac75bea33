#include "models/decoder_lm.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/tensor_functions.hpp"

namespace hg {

DecoderLM::DecoderLM(const DecoderLMConfig& c)
    : config_(c),
      init_gen_(c.seed),
      embed(c.vocab_size, c.max_seq_len, c.d_model, init_gen_, c.dtype),
      embed_drop(c.dropout, c.seed * 7919 + 1),
      ln_f(c.d_model, c.ln_eps, c.dtype),
      head(c.d_model, c.vocab_size, init_gen_, true, c.dtype) {
  HG_CHECK(c.n_layers >= 0, "DecoderLM", "n_layers must be >= 0, got ", c.n_layers);
  const int64_t hidden = c.ffn_hidden > 0 ? c.ffn_hidden : 4 * c.d_model;
  register_module("embed", embed);
  register_module("embed_drop", embed_drop);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const uint64_t drop_seed = c.seed * 7919 + 2 * static_cast<uint64_t>(i) + 2;
    layers.push_back(std::make_unique<TransformerLayer>(c.d_model, c.n_heads, hidden, init_gen_, c.dropout, drop_seed,
                                                        c.dtype, c.ln_eps));
    layers.back()->attn.set_impl(c.attention);
    layers.back()->ffn.set_recompute_gelu(c.recompute_gelu);
    layers.back()->set_recompute_layernorm(c.recompute_layernorm);
    register_module("layers." + std::to_string(i), *layers.back());
  }
  register_module("ln_f", ln_f);
  register_module("head", head);
}

void DecoderLM::on_device_change(Device device) {
  if (config_.precision != Precision::BF16 || device != Device::CUDA) return;
  std::vector<Parameter*> gemm_params;
  const auto add = [&](Linear& l) {
    gemm_params.push_back(&l.weight);
    if (l.has_bias()) gemm_params.push_back(&l.bias);
  };
  for (auto& layer : layers)
    for (Linear* l : {&layer->attn.qkv, &layer->attn.proj, &layer->ffn.fc1, &layer->ffn.fc2}) add(*l);
  add(head);
  make_bf16_copies(gemm_params);
}

Tensor DecoderLM::forward(const Tensor& ids, const Tensor& key_padding_mask) {
  return head_logits(forward_features(ids, key_padding_mask));
}

Tensor DecoderLM::forward_features(const Tensor& ids, const Tensor& key_padding_mask) {
  values_needed(embed);
  // The embedding emits the layers' dtype: a bf16 stream's input in the same pass.
  const Tensor h = embed_drop.forward(embed.forward(ids, layers_dtype()));
  const Tensor features = features_of_embedded(h, key_padding_mask);
  embedded_from_ids_ = true;
  return features;
}

Tensor DecoderLM::forward_embedded(const Tensor& h, const Tensor& key_padding_mask) {
  return head_logits(features_of_embedded(h, key_padding_mask));
}

Tensor DecoderLM::features_of_embedded(const Tensor& h, const Tensor& key_padding_mask) {
  const char* op = "DecoderLM::forward";
  h.check_defined(op);
  HG_CHECK(h.ndim() == 3 && h.size(2) == config_.d_model, op, "hidden states must be (B, T, ", config_.d_model,
           "), got ", h.shape());
  check_precision_supported(config_.precision, h.device(), op);
  embedded_from_ids_ = false;
  h_shape_ = h.shape();
  h_dtype_ = h.dtype();
  // Each layer leaves its last residual add to the next LayerNorm (ResidualStream).
  ResidualStream x{config_.precision == Precision::BF16 ? h.to(DType::BF16) : h, Tensor()};
  for (auto& layer : layers) {
    values_needed(*layer);
    x = layer->forward_stream(std::move(x), key_padding_mask);
  }
  values_needed(ln_f);
  Tensor features = ln_f.forward_stream(std::move(x)).y;
  values_needed(head);  // every caller runs the head on the features next
  return features;
}

Tensor DecoderLM::head_logits(const Tensor& features) {
  const int64_t rows = features.size(0) * features.size(1);
  return head.forward(features.reshape({rows, config_.d_model}))
      .reshape({features.size(0), features.size(1), config_.vocab_size});
}

DType DecoderLM::layers_dtype() {
  return config_.precision == Precision::BF16 ? DType::BF16 : embed.token.value.dtype();
}

KvCache DecoderLM::make_kv_cache(int64_t batch) {
  return KvCache(config_.n_layers, batch, config_.n_heads, config_.d_model / config_.n_heads, config_.max_seq_len,
                 layers_dtype(), embed.token.value.device());
}

Tensor DecoderLM::forward_cached(const Tensor& ids_in, KvCache& cache, CachedLogits which) {
  const char* op = "DecoderLM::forward_cached";
  ids_in.check_defined(op);
  HG_CHECK(ids_in.ndim() == 2 && ids_in.size(1) >= 1, op, "ids must be (B, T) with T >= 1, got ", ids_in.shape());
  const int64_t b = ids_in.size(0), t = ids_in.size(1), d = config_.d_model;
  const Device dev = embed.token.value.device();
  HG_CHECK(cache.layers() == config_.n_layers && cache.batch() == b && cache.heads() == config_.n_heads &&
               cache.head_dim() == d / config_.n_heads && cache.dtype() == layers_dtype() && cache.device() == dev,
           op, "the cache (", cache.layers(), " layers, batch ", cache.batch(), ", ", cache.heads(), " heads of ",
           cache.head_dim(), ", ", dtype_name(cache.dtype()), " on ", device_name(cache.device()),
           ") does not fit this model and ids ", ids_in.shape(), ": make it with make_kv_cache(", b, ")");
  const int64_t start = cache.length();
  HG_CHECK(start + t <= std::min(cache.capacity(), config_.max_seq_len), op, t, " new tokens after the ", start,
           " cached ones pass the context of ", std::min(cache.capacity(), config_.max_seq_len),
           " positions: crop the context to its last tokens, reset the cache and prefill again (generate() does)");
  check_precision_supported(config_.precision, dev, op);
  values_needed(embed);
  Tensor x = embed.apply(ids_in.to(dev), start, layers_dtype());
  for (size_t i = 0; i < layers.size(); ++i) {
    values_needed(*layers[i]);
    x = layers[i]->forward_cached(x, cache, static_cast<int64_t>(i));
  }
  cache.advance(t);
  values_needed(ln_f);
  values_needed(head);
  Tensor features = ln_f.apply(x);  // (B, T, d)
  if (which == CachedLogits::Last && t > 1) features = transpose(features, 0, 1)[t - 1].reshape({b, 1, d});
  const int64_t rows = features.size(0) * features.size(1);
  return head.apply(features.reshape({rows, d})).reshape({b, features.size(1), config_.vocab_size});
}

Tensor DecoderLM::backward(Tensor dlogits) {
  const char* op = "DecoderLM::backward";
  HG_CHECK(!h_shape_.empty(), op, "backward called before forward");
  const Shape logits_shape{h_shape_[0], h_shape_[1], config_.vocab_size};
  HG_CHECK(dlogits.shape() == logits_shape, op, "dlogits ", dlogits.shape(), " must match the logits ", logits_shape);
  const int64_t rows = h_shape_[0] * h_shape_[1];
  Tensor dx = head.backward(dlogits.reshape({rows, config_.vocab_size}));
  dlogits = Tensor();  // used up; a caller that moved it in frees (B, T, V) here, before the layers' backward
  dx = dx.reshape(h_shape_);
  return backward_features(std::move(dx));
}

Tensor DecoderLM::backward_features(Tensor dfeatures) {
  const char* op = "DecoderLM::backward_features";
  HG_CHECK(!h_shape_.empty(), op, "backward called before forward");
  HG_CHECK(dfeatures.shape() == h_shape_, op, "dfeatures ", dfeatures.shape(), " must match the features ", h_shape_);
  grads_ready(head);
  Tensor dx = ln_f.backward(dfeatures);
  dfeatures = Tensor();  // used up: its memory can serve the layers' backward
  grads_ready(ln_f);
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    dx = (*it)->backward(dx);
    grads_ready(**it);
  }
  dx = dx.to(h_dtype_);
  if (embedded_from_ids_) {
    embed.backward(embed_drop.backward(dx));
    grads_ready(embed);
  }
  return dx;
}

}  // namespace hg
