#pragma once
#include <cstdint>

#include "core/softmax_layout.hpp"  // kSoftmaxMaskThreshold, the same rule as the softmax op

namespace hg {

// Where the head-dim vector of (batch b, head h, token i) of one attention
// operand starts, in elements from the operand's base pointer:
//   b * batch + h * head + i * row        (the dh elements follow contiguously)
struct HeadStrides {
  int64_t batch = 0, head = 0, row = 0;

  int64_t offset(int64_t b, int64_t h) const { return b * batch + h * head; }
  // A contiguous (B, H, T, dh) tensor.
  static HeadStrides contiguous(int64_t heads, int64_t t, int64_t dh) { return {heads * t * dh, t * dh, dh}; }
  // Heads side by side in each token's row of `width` elements, (B, T, ..., H, dh):
  // the fused QKV projection's (B, T, 3, H, dh) output (width 3 H dh, k and v
  // starting H dh and 2 H dh elements in), or the (B, T, H, dh) input of the
  // output projection (width H dh).
  static HeadStrides packed(int64_t t, int64_t dh, int64_t width) { return {t * width, dh, width}; }
  // A time-major (T, B, H, dh) tensor: the key/value cache of models/kv_cache.hpp,
  // whose first n positions are one contiguous block.
  static HeadStrides time_major(int64_t batch, int64_t heads, int64_t dh) {
    return {heads * dh, dh, batch * heads * dh};
  }
};

// How the fused attention kernels (CPU and CUDA) see one validated call:
// q (B, H, Tq, dh), k and v (B, H, Tk, dh), each addressed through its
// strides (q also for dq; kv for k, v, dk, dv; o for o and dout). The
// optional additive key mask is read at mask[b * mask_batch_stride + j]
// (stride 0 when one mask row serves every batch). Plain data so both
// backends may include it.
struct AttentionLayout {
  int64_t batch = 0, heads = 0, tq = 0, tk = 0, head_dim = 0;
  HeadStrides q, kv, o;
  const void* mask = nullptr;  // F32 (F64 for F64 inputs), or none
  int64_t mask_batch_stride = 0;
  bool causal = false;  // key j masked for query i when j > i + (tk - tq)
  double scale = 1.0;

  int64_t heads_total() const { return batch * heads; }
  // The last key query i may see (exclusive bound), before padding masks.
  int64_t key_end(int64_t i) const { return causal ? i + (tk - tq) + 1 : tk; }
};

}  // namespace hg
