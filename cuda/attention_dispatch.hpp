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

// Head dim 64 without a key mask (H200 measurements, docs/attention.md; at
// dh 128, and at dh 64 with a key mask, where the mma.sync kernels take
// every tile element by element, the wgmma kernels win at every T):
// - the wgmma forward (64-key tiles, two blocks a SM) wins at every T and
//   head count measured, from T 256 (shorter T: not measured);
// - the wgmma backward storing ds (below) wins from T 1024 at every head
//   count measured; recomputing s and dp instead, it wins from T 2048, and
//   from T 1024 in a call of at most kWgmmaMaxQueryTilesDh64 128-query
//   tiles (B * H * ceil(Tq / 128)). Below T 1024 it ties or trails the
//   mma.sync backward.
constexpr int64_t kWgmmaForwardMinTokensDh64 = 256;
constexpr int64_t kWgmmaBackwardMinTokensDh64 = 2048;
constexpr int64_t kWgmmaBackwardMinFewTilesDh64 = 1024;
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

// What both wgmma directions need besides the head-dim rules: `device_ready`
// (compute capability 9.0, the library built with its sm_90a code and the
// driver's tensor-map encoder found), q, k, v addressable by TMA with the
// batch outermost, and a scale whose log2(e) multiple is positive and finite
// as a float (the kernels take the row max of the raw scores, so the scale
// must keep their order).
inline bool wgmma_takes(const AttentionLayout& l, const void* q, const void* k, const void* v, bool device_ready) {
  const float scale_log2 = static_cast<float>(l.scale * 1.4426950408889634);
  const bool scale = scale_log2 > 0.f && std::isfinite(scale_log2);
  return device_ready && (l.head_dim == 64 || l.head_dim == 128) && scale && l.tq >= 1 && l.tk >= 1 &&
         l.batch < (int64_t(1) << 31) && batch_outermost(l.q, l.tq, l.head_dim) &&
         batch_outermost(l.kv, l.tk, l.head_dim) && batch_outermost(l.o, l.tq, l.head_dim) && tma_addressable(q, l.q) &&
         tma_addressable(k, l.kv) && tma_addressable(v, l.kv);
}

// Whether a BF16 forward with q, k, v at these addresses takes the wgmma
// kernel: dh 128, or dh 64 with a key mask or T = min(Tq, Tk) from 256.
inline bool wgmma_forward_applies(const AttentionLayout& l, const void* q, const void* k, const void* v,
                                  bool device_ready) {
  const bool dh64 = l.mask != nullptr || std::min(l.tq, l.tk) >= kWgmmaForwardMinTokensDh64;
  return (l.head_dim == 128 || dh64) && wgmma_takes(l, q, k, v, device_ready);
}

// Whether the wgmma backward stores ds (the dk/dv kernel writes it as bf16,
// the dq kernel reads it instead of recomputing s and dp): at head dim 128,
// and at head dim 64 from T = min(Tq, Tk) 1024, where a head's ds is at most
// kStoredDsMaxHeadBytes (T 4096 by 4096). Why: it moves 64 bytes a tile
// pair to save 2 products of 128 x 128 x dh, 128 FLOP a byte at dh 128, 64
// at dh 64 (docs/attention.md, "The stored ds").
//
// The scratch is O(Tq Tk) a head, so a call runs in chunks of heads
// alternating between two streams (two scratches): a chunk's last blocks
// (causal: the key tiles that see few queries) and its memory-bound dq
// kernel run beside the next chunk's dk/dv. A chunk is about
// kStoredDsChunkKeyTiles dk/dv blocks (a block a key tile of a head) and
// at most kStoredDsChunkBytes of ds: on the H200 halving the chunks of T
// 2048 and 4096 (to 256 and 128 blocks) lost 3-12% of the causal
// backward; at T 1024, chunks of 768-1024 blocks gained nothing over the
// backward without stored ds, chunks of 512 gained 4-9%.
constexpr int64_t kStoredDsMaxHeadBytes = int64_t(32) << 20;
constexpr int64_t kStoredDsChunkBytes = int64_t(256) << 20;
constexpr int64_t kStoredDsChunkKeyTiles = 512;
constexpr int64_t kStoredDsMinTokensDh64 = 1024;

// bf16 ds over whole 128 x 128 tiles (what the kernels address).
inline int64_t stored_ds_bytes_per_head(const AttentionLayout& l) {
  return ((l.tq + 127) / 128) * ((l.tk + 127) / 128) * 128 * 128 * 2;
}

// Heads a chunk of the stored-ds backward: kStoredDsChunkKeyTiles key tiles'
// worth, fewer where kStoredDsChunkBytes holds fewer, at least one, at most
// the call's.
inline int64_t stored_ds_heads_per_chunk(const AttentionLayout& l) {
  const int64_t by_tiles = kStoredDsChunkKeyTiles / ((l.tk + 127) / 128);
  const int64_t by_bytes = kStoredDsChunkBytes / stored_ds_bytes_per_head(l);
  return std::clamp<int64_t>(std::min(by_tiles, by_bytes), 1, l.heads_total());
}

// The scratch of a stored-ds call: one chunk's ds, twice where the call
// takes more than one chunk (a scratch a stream).
inline int64_t stored_ds_scratch_bytes(const AttentionLayout& l) {
  const int64_t heads = stored_ds_heads_per_chunk(l);
  return (heads < l.heads_total() ? 2 : 1) * heads * stored_ds_bytes_per_head(l);
}

inline bool wgmma_backward_stores_ds(const AttentionLayout& l) {
  const bool head_dim = l.head_dim == 128 || (l.head_dim == 64 && std::min(l.tq, l.tk) >= kStoredDsMinTokensDh64);
  return head_dim && stored_ds_bytes_per_head(l) <= kStoredDsMaxHeadBytes;
}

// Whether a BF16 backward with these operands takes the wgmma kernels: dh
// 128, or dh 64 with a key mask, storing ds, from T 2048, or from T 1024
// with few query tiles; do (read at o's strides) addressable by TMA too.
// Either forward's row stats serve either backward: both forwards write
// them alike.
inline bool wgmma_backward_applies(const AttentionLayout& l, const void* q, const void* k, const void* v,
                                   const void* dout, bool device_ready) {
  const int64_t t = std::min(l.tq, l.tk);
  const bool dh64 = l.mask != nullptr || wgmma_backward_stores_ds(l) || t >= kWgmmaBackwardMinTokensDh64 ||
                    (t >= kWgmmaBackwardMinFewTilesDh64 && query_tiles(l) <= kWgmmaMaxQueryTilesDh64);
  return (l.head_dim == 128 || dh64) && wgmma_takes(l, q, k, v, device_ready) && tma_addressable(dout, l.o);
}

}  // namespace hg::gpu
