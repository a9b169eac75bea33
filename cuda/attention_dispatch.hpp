#pragma once
// Which BF16 kernels a fused attention call runs: the sm_90a wgmma forward
// and backward (cuda/attention_wgmma.cu) or the mma.sync ones
// (cuda/attention.cu). Plain C++ without CUDA, so that the rules are tested
// on any machine (tests/test_attention.cpp); cuda/attention.cu adds what
// only the device knows. Why each rule: docs/attention.md, "Which kernel
// runs".
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/attention_layout.hpp"

namespace hg::gpu {

// At dh 64 the wgmma kernels win from here on; below it they tie or lose
// (H200 measurements, docs/attention.md). At dh 128 they win at every T, and
// so they do at dh 64 with a key mask (the mma.sync kernels then take every
// tile element by element).
constexpr int64_t kWgmmaMinTokensDh64 = 2048;
// From kWgmmaMinFewTilesDh64 on they also win in a call of at most
// kWgmmaMaxQueryTilesDh64 128-query tiles (B * H * ceil(Tq / 128)): at T 1024
// up to 192 heads, GPT-2 small's attention to batch 16. At T 256 and 512 the
// mma.sync kernels win at every head count measured.
constexpr int64_t kWgmmaMinFewTilesDh64 = 1024;
constexpr int64_t kWgmmaMaxQueryTilesDh64 = 1536;

inline int64_t query_tiles(const AttentionLayout& l) { return l.heads_total() * ((l.tq + 127) / 128); }

// The operand is addressed (batch, head, row) with the batch outermost: the
// contiguous (B, H, T, dh) and packed (B, T, ..., H, dh) layouts, not the
// KV cache's time-major one.
inline bool batch_outermost(const HeadStrides& s, int64_t rows, int64_t dh) {
  return s.row >= dh && s.head >= dh && s.batch >= rows * s.row;
}

// What a TMA tensor map of bf16 elements takes: a 16-byte aligned base,
// byte strides multiples of 16, positive and below 2^40.
inline bool tma_addressable(const void* p, const HeadStrides& s) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (const int64_t v : {s.batch, s.head, s.row})
    if (v <= 0 || v * 2 % 16 != 0 || v * 2 >= (int64_t(1) << 40)) return false;
  return true;
}

// Whether a BF16 call with q, k, v at these addresses takes the wgmma
// forward, given `device_ready`: compute capability 9.0, the library built
// with its sm_90a code and the driver's tensor-map encoder found.
inline bool wgmma_forward_applies(const AttentionLayout& l, const void* q, const void* k, const void* v,
                                  bool device_ready) {
  const int64_t t = std::min(l.tq, l.tk);
  const bool dh64 = l.mask != nullptr || t >= kWgmmaMinTokensDh64 ||
                    (t >= kWgmmaMinFewTilesDh64 && query_tiles(l) <= kWgmmaMaxQueryTilesDh64);
  const bool shape = l.head_dim == 128 || (l.head_dim == 64 && dh64);
  // The kernel takes the row max of the raw scores: scale * log2(e) > 0 and
  // finite as a float keeps their order.
  const float scale_log2 = static_cast<float>(l.scale * 1.4426950408889634);
  const bool scale = scale_log2 > 0.f && std::isfinite(scale_log2);
  return device_ready && shape && scale && l.tq >= 1 && l.tk >= 1 && l.batch < (int64_t(1) << 31) &&
         batch_outermost(l.q, l.tq, l.head_dim) && batch_outermost(l.kv, l.tk, l.head_dim) &&
         batch_outermost(l.o, l.tq, l.head_dim) && tma_addressable(q, l.q) && tma_addressable(k, l.kv) &&
         tma_addressable(v, l.kv);
}

// Whether a BF16 backward with these operands takes the wgmma backward: a
// call the wgmma forward takes (at dh 64 elsewhere below T 2048 the wgmma
// kernels tie or trail the mma.sync ones on the H200, docs/attention.md),
// with do (read at o's strides) addressable by TMA too.
inline bool wgmma_backward_applies(const AttentionLayout& l, const void* q, const void* k, const void* v,
                                   const void* dout, bool device_ready) {
  return wgmma_forward_applies(l, q, k, v, device_ready) && tma_addressable(dout, l.o);
}

}  // namespace hg::gpu
