#include "models/kv_cache.hpp"

namespace hg {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t heads, int64_t head_dim, int64_t capacity, DType dtype,
                 Device device)
    : batch_(batch), heads_(heads), head_dim_(head_dim), capacity_(capacity), dtype_(dtype), device_(device) {
  HG_CHECK(layers >= 0 && batch > 0 && heads > 0 && head_dim > 0 && capacity > 0, "KvCache",
           "sizes must be positive (layers >= 0), got layers ", layers, ", batch ", batch, ", heads ", heads,
           ", head_dim ", head_dim, ", capacity ", capacity);
  const Shape shape{capacity, batch, heads, head_dim};
  for (int64_t i = 0; i < layers; ++i)
    layers_.push_back({Tensor::empty(shape, dtype, device), Tensor::empty(shape, dtype, device)});
}

LayerKv& KvCache::layer(int64_t i) {
  HG_CHECK(i >= 0 && i < layers(), "KvCache::layer", "layer ", i, " out of range [0, ", layers(), ")");
  return layers_[static_cast<size_t>(i)];
}

void KvCache::write(int64_t i, const Tensor& k_new, const Tensor& v_new) {
  const char* op = "KvCache::write";
  const int64_t count = k_new.defined() && k_new.ndim() == 4 ? k_new.size(0) : 0;
  const Shape want{count, batch_, heads_, head_dim_};
  HG_CHECK(count > 0 && k_new.shape() == want && v_new.defined() && v_new.shape() == want, op,
           "k_new and v_new must be (count, B, H, dh) with B, H, dh = ", batch_, ", ", heads_, ", ", head_dim_,
           "; got ", k_new.defined() ? k_new.shape() : Shape{}, " and ", v_new.defined() ? v_new.shape() : Shape{});
  HG_CHECK(length_ + count <= capacity_, op, count, " new positions do not fit: the cache holds ", length_, " of ",
           capacity_);
  LayerKv& kv = layer(i);
  kv.k.slice(length_, length_ + count).copy_(k_new);
  kv.v.slice(length_, length_ + count).copy_(v_new);
}

void KvCache::advance(int64_t count) {
  HG_CHECK(count >= 0 && length_ + count <= capacity_, "KvCache::advance", "cannot advance ", count,
           " positions: the cache holds ", length_, " of ", capacity_);
  length_ += count;
}

}  // namespace hg
