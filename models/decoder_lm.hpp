#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/module.hpp"
#include "core/precision.hpp"
#include "core/random.hpp"
#include "models/dropout.hpp"
#include "models/embedding.hpp"
#include "models/kv_cache.hpp"
#include "models/layernorm.hpp"
#include "models/linear.hpp"
#include "models/transformer_layer.hpp"

namespace hg {

struct DecoderLMConfig {
  int64_t vocab_size = 256;
  int64_t max_seq_len = 128;
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t n_layers = 2;
  int64_t ffn_hidden = 0;  // 0 means 4 * d_model
  double dropout = 0.0;
  double ln_eps = 1e-5;
  uint64_t seed = 0;  // initialisation and dropout masks
  DType dtype = DType::F32;
  // BF16: f32 parameters, bf16 activations and GEMMs (CUDA, sm_80+ only);
  // docs/mixed_precision.md. default_precision(device) picks per device.
  Precision precision = Precision::FP32;
  // Fused-mode attention core (models/attention.hpp): Auto = flash on CUDA.
  AttentionImpl attention = AttentionImpl::Auto;
  // Fused mode: each MLP recomputes gelu(pre) in its backward instead of
  // keeping it (models/feedforward.hpp): less activation memory, one more
  // elementwise pass per layer.
  bool recompute_gelu = false;
  // Every mode: the qkv projection and fc1 of each layer recompute their
  // input, LN1's / LN2's output, in the backward instead of keeping it
  // (models/transformer_layer.hpp): 2 d_model fewer values per token and
  // layer, one more LayerNorm forward each in the backward.
  bool recompute_layernorm = false;
};

// A GPT-style decoder-only language model:
//   h = Dropout(Embedding(ids)); h = Layer_i(h) for each layer; logits = Head(LN_f(h))
// Each layer's last residual add runs in the next LayerNorm's pass (the next
// layer's LN1, or LN_f): TransformerLayer::forward_stream.
// Under bf16 precision the embedding sum stays f32 and is rounded to bf16
// once, by the embedding itself (forward) or at the entry of
// forward_embedded (an f32 h); dropout, the layers, LN_f, the head and the
// logits then run in bf16 (docs/mixed_precision.md). backward returns the
// gradient at h in h's own dtype: bf16 after forward() under bf16 precision.
class DecoderLM : public Module {
 private:
  // Declared first so they exist before the modules that are built from them.
  DecoderLMConfig config_;
  Generator init_gen_;  // every initial weight is drawn from it: same seed, same model

 public:
  explicit DecoderLM(const DecoderLMConfig& config);

  // ids (B, T) F32 token ids -> logits (B, T, vocab).
  Tensor forward(const Tensor& ids, const Tensor& key_padding_mask = Tensor());
  // Everything after the embedding: h (B, T, d) -> logits. forward() calls it.
  Tensor forward_embedded(const Tensor& h, const Tensor& key_padding_mask = Tensor());
  // Accumulates every parameter gradient (embedding tables included) and
  // returns d loss / d h, the gradient at the embedding output. Each module
  // frees what its forward saved once its backward has used it, and dlogits
  // is dropped after the head's backward: pass it with std::move and its
  // (B, T, V) memory serves the rest of the backward.
  Tensor backward(Tensor dlogits);

  // The training step without (B, T, V) logits (models/train_step.hpp with
  // the chunked classifier, ops/classifier.hpp): forward_features runs
  // forward() up to ln_f and returns its output, the features (B, T, d) the
  // head would read (bf16 under bf16 precision); the caller computes the
  // loss and the head's gradients from them (head.weight.grad and
  // head.bias.grad accumulated) and hands d loss / d features to
  // backward_features, which continues as backward() does after the head.
  Tensor forward_features(const Tensor& ids, const Tensor& key_padding_mask = Tensor());
  // Pass dfeatures with std::move: it is dropped after ln_f's backward.
  Tensor backward_features(Tensor dfeatures);

  // Inference with a key/value cache (models/kv_cache.hpp, docs/generation.md).
  // ids (B, T) are the next T tokens of each sequence, at positions
  // cache.length() .. cache.length() + T - 1: the prompt for a prefill, then
  // one token a step. Their keys and values join the cache and its length
  // grows by T. Returns logits (B, T, V), or with CachedLogits::Last only the
  // last position's, (B, 1, V), so a long prefill runs the head on one row.
  // The logits equal forward() (in eval mode) on the whole sequence so far,
  // to rounding. Dropout is off and nothing is kept for a backward. A
  // position past max_seq_len is an error: generate() (models/generation.hpp)
  // crops the context and prefills again, as nanoGPT does.
  enum class CachedLogits { All, Last };
  Tensor forward_cached(const Tensor& ids, KvCache& cache, CachedLogits which = CachedLogits::All);
  // An empty cache for `batch` sequences of up to max_seq_len tokens, on the
  // model's device in its activation dtype (bf16 under bf16 precision).
  KvCache make_kv_cache(int64_t batch);

  const DecoderLMConfig& config() const { return config_; }
  // Called by backward() after the head, ln_f, each layer (last first) and
  // the embedding with that module's parameters: their gradients are final.
  void set_grads_ready_hook(GradsReadyHook hook) { grads_ready_ = std::move(hook); }
  // Called by every forward (forward, forward_features, forward_embedded,
  // forward_cached) before the embedding, each layer, ln_f and the head read
  // their parameters (the head: right after ln_f, also where the caller
  // runs the head itself, as the chunked classifier does).
  void set_values_needed_hook(ValuesNeededHook hook) { values_needed_ = std::move(hook); }

  Embedding embed;
  Dropout embed_drop;
  std::vector<std::unique_ptr<TransformerLayer>> layers;
  LayerNorm ln_f;
  Linear head;

 private:
  // Under bf16 precision on CUDA: every Linear's bf16 weight and bias copies
  // made in one buffer as soon as the model arrives (make_bf16_copies).
  void on_device_change(Device device) override;
  Tensor features_of_embedded(const Tensor& h, const Tensor& key_padding_mask);  // layers, then ln_f
  Tensor head_logits(const Tensor& features);                                    // (B, T, d) -> (B, T, V)
  // What the layers run in and the cache holds: bf16 under bf16 precision, else the weights' dtype.
  DType layers_dtype();
  void grads_ready(Module& finished) {
    if (grads_ready_) grads_ready_(finished.parameters());
  }
  void values_needed(Module& about_to_run) {
    if (values_needed_) values_needed_(about_to_run);
  }
  GradsReadyHook grads_ready_;
  ValuesNeededHook values_needed_;
  bool embedded_from_ids_ = false;  // whether backward should continue into the embedding
  Shape h_shape_;
  DType h_dtype_ = DType::F32;
};

}  // namespace hg
