#include "models/training_memory.hpp"

namespace hg {

int64_t parameter_count(const DecoderLMConfig& c) {
  const int64_t d = c.d_model, v = c.vocab_size, hidden = c.ffn_hidden > 0 ? c.ffn_hidden : 4 * d;
  const int64_t layer = 2 * (2 * d)              // ln1, ln2: gamma and beta
                        + (d * 3 * d + 3 * d)    // attention qkv
                        + (d * d + d)            // attention projection
                        + (d * hidden + hidden)  // fc1
                        + (hidden * d + d);      // fc2
  return v * d + c.max_seq_len * d               // token and position embeddings
         + c.n_layers * layer + 2 * d            // layers, ln_f
         + (d * v + v);                          // head
}

TrainingMemory estimate_training_memory(const DecoderLMConfig& c, int64_t batch, int64_t seq_len) {
  TrainingMemory m;
  m.parameters = parameter_count(c);
  m.batch = batch;
  m.weight_bytes = 4.0 * 4.0 * static_cast<double>(m.parameters);  // f32 value, gradient, two moments
  const double activation = c.precision == Precision::BF16 ? 2.0 : 4.0;
  // Per token: each layer keeps about 24 d values (LayerNorm inputs and
  // outputs, qkv, the attention output, both FFN activations) plus the
  // probabilities and their gradient, 2 H T; the logits, their softmax and
  // gradient about 4 V. Measured on `train --device cpu` (2026-11-28):
  // 12.4k-26.2k floats per token where this gives 13.9k-25.5k.
  const double d = static_cast<double>(c.d_model), heads = static_cast<double>(c.n_heads),
               t = static_cast<double>(seq_len), v = static_cast<double>(c.vocab_size);
  // Recomputed activations are not counted (in the backward one layer's
  // come back at a time, within the estimate's margin): gelu(pre), the 4 d
  // of the second FFN activation (fused mode only; unfused mode keeps it,
  // so its peak only grows further past the estimate), and LN1's and LN2's
  // outputs, 2 d.
  const double per_layer = 24.0 * d - (c.recompute_gelu ? 4.0 * d : 0.0) - (c.recompute_layernorm ? 2.0 * d : 0.0);
  const double per_token = static_cast<double>(c.n_layers) * (per_layer + 2.0 * heads * t) + 4.0 * v;
  m.per_sequence_bytes = activation * per_token * t;
  return m;
}

}  // namespace hg
