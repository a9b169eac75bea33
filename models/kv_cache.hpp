#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// One layer's cached keys and values, each time-major (capacity, B, H, dh):
// position n of every sequence and head is one block of B * H * dh elements,
// so appending tokens is one contiguous copy into k.slice(n, n + T) and the
// first n positions are a contiguous view. The fused attention reads them in
// place through strides (attention_forward_kv_cache, ops/attention.hpp).
struct LayerKv {
  Tensor k, v;
};

// The keys and values a DecoderLM has computed for the tokens it has seen,
// per layer, so the next token's forward (DecoderLM::forward_cached) runs on
// that token alone. length() positions are filled, the same for every
// sequence of the batch; positions continue from there. Memory is allocated
// once at construction, on the model's device in its activation dtype.
class KvCache {
 public:
  KvCache(int64_t layers, int64_t batch, int64_t heads, int64_t head_dim, int64_t capacity, DType dtype, Device device);

  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // Forgets every position (the memory stays): the next forward is a prefill.
  void reset() { length_ = 0; }

  LayerKv& layer(int64_t i);
  // Writes the keys and values of `count` new positions, k_new and v_new
  // (count, B, H, dh), of layer i at [length(), length() + count). length()
  // moves only with advance(), once every layer has written.
  void write(int64_t i, const Tensor& k_new, const Tensor& v_new);
  void advance(int64_t count);

 private:
  std::vector<LayerKv> layers_;
  int64_t batch_, heads_, head_dim_, capacity_;
  int64_t length_ = 0;
  DType dtype_;
  Device device_;
};

}  // namespace hg
