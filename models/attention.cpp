#include "models/attention.hpp"

#include <cmath>

#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"
#include "ops/attention_softmax_packed.hpp"
#include "ops/softmax.hpp"

namespace hg {

AttentionImpl parse_attention_impl(const std::string& name) {
  if (name == "auto") return AttentionImpl::Auto;
  if (name == "flash") return AttentionImpl::Flash;
  if (name == "softmax") return AttentionImpl::Softmax;
  fail("parse_attention_impl", "'", name, "' is not an attention implementation: allowed auto, flash, softmax");
}

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::Auto: return "auto";
    case AttentionImpl::Flash: return "flash";
    case AttentionImpl::Softmax: return "softmax";
  }
  return "unknown";
}

bool MultiHeadAttention::used_flash(const Tensor& x) const {
  if (kernel_mode() == KernelMode::Unfused || impl_ == AttentionImpl::Softmax) return false;
  if (impl_ == AttentionImpl::Flash) return true;  // the op names an unsupported head dim itself
  return x.is_cuda() && (head_dim_ == 32 || head_dim_ == 64 || head_dim_ == 128);
}

MultiHeadAttention::MultiHeadAttention(int64_t d_model, int64_t n_heads, Generator& gen, DType dtype, bool causal)
    : qkv(d_model, 3 * d_model, gen, true, dtype),
      proj(d_model, d_model, gen, true, dtype),
      d_model_(d_model),
      n_heads_(n_heads),
      head_dim_(n_heads > 0 ? d_model / n_heads : 0),
      causal_(causal),
      scale_(0) {
  HG_CHECK(n_heads > 0 && d_model > 0 && d_model % n_heads == 0, "MultiHeadAttention", "d_model ", d_model,
           " must be a positive multiple of n_heads ", n_heads);
  scale_ = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  register_module("qkv", qkv);
  register_module("proj", proj);
}

Tensor MultiHeadAttention::forward(const Tensor& x, const Tensor& key_padding_mask) {
  const char* op = "MultiHeadAttention::forward";
  x.check_defined(op);
  HG_CHECK(x.ndim() == 3 && x.size(2) == d_model_, op, "x must be (B, T, ", d_model_, "), got ", x.shape());
  const int64_t b = x.size(0), t = x.size(1), h = n_heads_;
  if (key_padding_mask.defined())
    HG_CHECK(key_padding_mask.shape() == Shape({b, 1, 1, t}), op,
             "key_padding_mask must be (B, 1, 1, T) = ", Shape({b, 1, 1, t}), ", got ", key_padding_mask.shape(),
             " for x ", x.shape());
  batch_ = b;
  seq_ = t;

  const Tensor packed = qkv.forward(x.reshape({b * t, d_model_}));  // (B*T, 3d) = (B, T, 3, H, dh)
  heads_ = packed_ = probs_ = Tensor();
  flash_ = AttentionSaved();
  if (used_flash(x)) {
    // The attention op reads q, k, v in place and writes (B, T, H, dh): no head split or merge.
    AttentionOptions options;
    options.mask = key_padding_mask;
    options.causal = causal_;
    options.scale = scale_;
    const Tensor merged = attention_forward_packed(packed.reshape({b, t, 3 * d_model_}), h, options, &flash_);
    return proj.forward(merged.reshape({b * t, d_model_})).reshape({b, t, d_model_});
  }
  if (kernel_mode() == KernelMode::Fused && x.device() == Device::CPU &&
      attention_softmax_packed_suits(b, h, t, head_dim_)) {
    // The products read q, k, v in place and write (B, T, H, dh): no head split or merge.
    SoftmaxOptions options;
    options.mask = key_padding_mask;
    options.causal = causal_;
    options.scale = scale_;
    packed_ = packed.reshape({b, t, 3 * d_model_});
    const Tensor merged = attention_softmax_packed_forward(packed_, h, options, probs_);
    return proj.forward(merged.reshape({b * t, d_model_})).reshape({b, t, d_model_});
  }
  heads_ = split_heads(packed.reshape({b, t, 3 * d_model_}), 3, h);  // (3, B, H, T, dh): q, k, v lead
  const Tensor ctx = softmax_core(heads_[0], heads_[1], heads_[2], key_padding_mask, &probs_);  // (B, H, T, dh)
  return proj.forward(merge_heads(ctx).reshape({b * t, d_model_})).reshape({b, t, d_model_});
}

Tensor MultiHeadAttention::softmax_core(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                        Tensor* probs) const {
  const Tensor scores = matmul(q, k, false, true);  // (B, H, Tq, Tk)
  SoftmaxOptions options;
  options.mask = mask;
  options.causal = causal_;
  options.scale = scale_;
  const Tensor p = attention_softmax_forward(scores, options);
  if (probs != nullptr) *probs = p;
  return matmul(p, v);
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
  const char* op = "MultiHeadAttention::forward_cached";
  x.check_defined(op);
  HG_CHECK(x.ndim() == 3 && x.size(2) == d_model_, op, "x must be (B, T, ", d_model_, "), got ", x.shape());
  HG_CHECK(causal_, op, "a key/value cache serves causal attention only");
  const int64_t b = x.size(0), t = x.size(1), h = n_heads_, dh = head_dim_;
  const Tensor packed = qkv.apply(x.reshape({b * t, d_model_})).reshape({b, t, 3 * d_model_});
  // (B, T, 3, d) -> (3, T, B, d): q, k, v lead, each time-major as the cache stores them.
  const Tensor slots = transpose(packed.reshape({b, t, 3, d_model_}), 0, 2);
  cache.write(layer, slots[1].reshape({t, b, h, dh}), slots[2].reshape({t, b, h, dh}));
  const int64_t tk = cache.length() + t;
  const LayerKv& kv = cache.layer(layer);
  Tensor merged;  // (B, T, d)
  if (used_flash(x)) {
    AttentionOptions options;
    options.causal = true;
    options.scale = scale_;
    merged = attention_forward_kv_cache(packed, h, kv.k, kv.v, tk, options);
  } else {
    const Tensor q = transpose(slots[0].reshape({t, b * h, dh}), 0, 1).reshape({b, h, t, dh});
    merged = merge_heads(softmax_core(q, kv_cache_heads(kv.k, tk), kv_cache_heads(kv.v, tk), Tensor(), nullptr));
  }
  return proj.apply(merged.reshape({b * t, d_model_})).reshape({b, t, d_model_});
}

Tensor MultiHeadAttention::backward(const Tensor& dy) {
  const char* op = "MultiHeadAttention::backward";
  HG_CHECK(probs_.defined() || flash_.o.defined(), op, "backward called before forward");
  const int64_t b = batch_, t = seq_, h = n_heads_, dh = head_dim_;
  HG_CHECK(dy.shape() == Shape({b, t, d_model_}), op, "dy ", dy.shape(), " must match the forward output ",
           Shape({b, t, d_model_}));
  const Tensor dmerged = proj.backward(dy.reshape({b * t, d_model_}));  // (B*T, d) = (B, T, H, dh)
  if (flash_.o.defined()) {
    // dq, dk, dv land straight in the (B, T, 3, H, dh) gradient of the QKV
    // projection's output; the CUDA kernels may also sum its columns into
    // the QKV bias gradient as they write it.
    const Tensor dout = dmerged.reshape({b, t, d_model_});
    const PackedAttentionGrads g = qkv.has_bias() ? attention_backward_packed_bias(dout, flash_, qkv.bias.grad)
                                                  : PackedAttentionGrads{attention_backward_packed(dout, flash_)};
    flash_ = AttentionSaved();  // used up: the projection output and o go before the QKV backward
    const Tensor dpacked = g.dqkv.reshape({b * t, 3 * d_model_});
    return (g.bias_summed ? qkv.backward_bias_summed(dpacked) : qkv.backward(dpacked)).reshape({b, t, d_model_});
  }
  if (packed_.defined()) {  // the packed softmax path (fused, CPU)
    const Tensor dpacked =
        attention_softmax_packed_backward(dmerged.reshape({b, t, d_model_}), packed_, probs_, h, scale_, causal_);
    packed_ = probs_ = Tensor();  // used up: freed before the QKV backward
    return qkv.backward(dpacked.reshape({b * t, 3 * d_model_})).reshape({b, t, d_model_});
  }
  // dq, dk, dv are written straight into the slices of one (3, B, H, T, dh)
  // tensor, so no concatenation copy is needed before the QKV backward.
  Tensor dheads = Tensor::empty({3, b, h, t, dh}, dy.dtype(), dy.device());
  {
    const Tensor q = heads_[0], k = heads_[1], v = heads_[2];
    const Tensor dctx = split_heads(dmerged.reshape({b, t, d_model_}), 1, h)[0];  // (B, H, T, dh)
    Tensor dq = dheads[0], dk = dheads[1], dv = dheads[2];
    const Tensor dprobs = matmul(dctx, v, false, true);  // dP = dctx v^T
    matmul_into(probs_, dctx, dv, true, false);          // dv = P^T dctx
    const Tensor dscores = softmax_backward(dprobs, probs_, scale_);
    matmul_into(dscores, k, dq, false, false);  // dq = dS k
    matmul_into(dscores, q, dk, true, false);   // dk = dS^T q
  }
  heads_ = probs_ = Tensor();  // used up: freed before the QKV backward
  return qkv.backward(merge_heads(dheads).reshape({b * t, 3 * d_model_})).reshape({b, t, d_model_});
}

}  // namespace hg
