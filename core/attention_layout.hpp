#pragma once
#include <cstdint>

#include "core/softmax_layout.hpp"  // kSoftmaxMaskThreshold, the same rule as the softmax op

namespace hg {

// How the fused attention kernels (CPU and CUDA) see one validated call:
// q (B, H, Tq, dh), k and v (B, H, Tk, dh), contiguous; the optional additive
// key mask is read at mask[b * mask_batch_stride + j] (stride 0 when one mask
// row serves every batch). Plain data so both backends may include it.
struct AttentionLayout {
  int64_t batch = 0, heads = 0, tq = 0, tk = 0, head_dim = 0;
  const void* mask = nullptr;  // F32 (F64 for F64 inputs), or none
  int64_t mask_batch_stride = 0;
  bool causal = false;  // key j masked for query i when j > i + (tk - tq)
  double scale = 1.0;

  int64_t heads_total() const { return batch * heads; }
  // The last key query i may see (exclusive bound), before padding masks.
  int64_t key_end(int64_t i) const { return causal ? i + (tk - tq) + 1 : tk; }
};

}  // namespace hg
