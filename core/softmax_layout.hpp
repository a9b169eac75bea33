#pragma once
#include <cstdint>

// The row layout of a softmax and the mask threshold: plain data shared by
// ops/ (validation, the CPU kernels) and cuda/ (the fused kernels), which may
// not include each other's headers. No code, no knowledge of how a softmax
// is computed; the rules themselves are in ops/softmax.hpp and docs/softmax.md.
namespace hg {

class Tensor;

// An additive mask value at or below this (including -inf) masks its key
// outright: weight exactly 0. Larger negative values stay ordinary biases.
inline constexpr double kSoftmaxMaskThreshold = -1e9;

// x viewed as (rows, tk) with rows = B * H * Tq. Row r belongs to batch
// b = r / (heads * tq) and query q = r % tq; its additive mask element for
// key k is mask[b * mask_batch_stride + q * mask_query_stride + k]
// (mask_query_stride = 0 for a (B, 1, 1, Tk) key-padding mask).
struct SoftmaxRows {
  int64_t rows = 0;
  int64_t tk = 0;
  int64_t tq = 1;  // queries per (b, h); 1 for plain softmax
  int64_t heads = 1;
  const Tensor* mask = nullptr;  // optional, x's dtype family, on x's device
  int64_t mask_batch_stride = 0;
  int64_t mask_query_stride = 0;
  bool causal = false;  // key k masked for query q when k > q + (tk - tq)
  double scale = 1.0;   // applied to x before the mask (float32 on the GPU)
};

}  // namespace hg
