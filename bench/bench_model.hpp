#pragma once
// The DecoderLM of the training benchmarks (bench_train, bench_ddp): its
// size, its config, and random token batches.
#include <cstdint>
#include <vector>

#include "core/precision.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "models/decoder_lm.hpp"

namespace hg::bench {

struct ModelSize {
  int64_t d_model, heads, layers, seq, batch, vocab;
};

inline DecoderLMConfig decoder_config(const ModelSize& s, Precision precision) {
  DecoderLMConfig c;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.seq;
  c.d_model = s.d_model;
  c.n_heads = s.heads;
  c.n_layers = s.layers;
  c.seed = 1;
  c.precision = precision;
  return c;
}

// `count` (batch, seq) pairs of uniformly random ids and targets.
inline void random_batches(const ModelSize& s, int count, uint64_t seed, Device dev, std::vector<Tensor>& ids,
                           std::vector<Tensor>& targets) {
  Generator g(seed);
  for (int i = 0; i < count; ++i) {
    std::vector<double> a(static_cast<size_t>(s.batch * s.seq)), b(a.size());
    for (double& v : a) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(s.vocab));
    for (double& v : b) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(s.vocab));
    ids.push_back(Tensor::from_vector(a, {s.batch, s.seq}, DType::F32, dev));
    targets.push_back(Tensor::from_vector(b, {s.batch, s.seq}, DType::F32, dev));
  }
}

}  // namespace hg::bench
