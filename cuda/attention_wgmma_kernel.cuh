#pragma once
// The BF16 flash attention forward on sm_90a (wgmma + TMA), after
// FlashAttention-3: the kernel, its block shape and its shared-memory plan.
// Launched by the library (cuda/attention_wgmma.cu) and, as forward variant
// 9, by the attention lab (bench/lab/attention_lab.cu), so that the lab
// times the production kernel itself (docs/attention.md, "The wgmma
// forward"). A block of 128 queries:
//   - two consumer warpgroups of 64 queries each (wgmma's M) and one
//     producer warp, one thread of which issues every TMA copy;
//   - q (once) and k, v tiles of 128 keys land by TMA (128-byte swizzle,
//     zeros past the tensor's ends) in a ring of 2 stages; each stage has a
//     "full" mbarrier (its bytes arrived) and an "empty" one (every consumer
//     thread is done with it);
//   - s = q k^T by wgmma with both operands in shared memory (ss), the
//     online softmax in registers (scale * log2(e) folded into one fma
//     before exp2), then o += p v by wgmma with p from registers and v from
//     shared memory through its transposed (MN-major) descriptor (rs).
// Outputs as the mma.sync forward writes them: o, the row log-sum-exp and
// the row stats {base-2 max, 1 / sum} the backward rebuilds p from.
// Only an sm_90a device compile holds the kernel's body; elsewhere it is
// empty. Internal linkage (the unnamed namespace), as in cuda/bulk_stage.cuh:
// each .cu that includes it compiles its own copy.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_args.cuh"
#include "cuda/attention_row_math.cuh"
#include "cuda/attention_tensor_map.cuh"  // kSwizzleBytes, kBoxCols
#include "cuda/bulk_stage.cuh"
#include "cuda/wgmma.cuh"

#define HG_WGMMA_DEVICE HG_SM90A_DEVICE  // cuda/wgmma.cuh: an sm_90a device compile

namespace hg::gpu::attn {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRows = 128;                               // queries a block: two consumer warpgroups of 64
constexpr int kKeys = 128;                               // keys a tile
constexpr int kStages = 2;                               // k, v tiles in flight
constexpr int kConsumers = 2;                            // warpgroups
constexpr int kThreadsPerBlock = 128 * kConsumers + 32;  // + the producer warp

// Shared memory of one block, byte offsets from a 1024-byte aligned base
// (the 128-byte swizzle repeats every 8 rows of 128 bytes, and TMA and
// wgmma both apply it to address bits 4-6 xor 7-9, so every box starts on a
// 1024-byte boundary). A [rows][DH] tile is DH / 64 boxes of [rows][64].
template <int DH>
struct Plan {
  static constexpr int kQBytes = kRows * DH * 2;
  static constexpr int kTileBytes = kKeys * DH * 2;  // k or v of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kBarOffset = kQBytes + kStages * kStageBytes;
  static constexpr size_t kSmem = size_t(kBarOffset) + (1 + 2 * kStages) * 8 + 1024;  // + the base's alignment
};

#if HG_WGMMA_DEVICE
using namespace sm90;  // the instructions: cuda/wgmma.cuh
#endif

template <int DH>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    forward_wgmma_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap vmap, Args a) {
  static_assert(DH == 64 || DH == 128);
#if HG_WGMMA_DEVICE
  using P = Plan<DH>;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;  // the first 1024-byte boundary
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw + (base + P::kBarOffset - shared_address(raw)));
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kStages;
  const uint32_t kv_at = base + P::kQBytes;  // stage s: k at kv_at + s * kStageBytes, v kTileBytes on

  const int64_t bh = blockIdx.y;
  const int q_block = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;  // long causal blocks first
  const int key_end = a.key_end(min(q_block + kRows, a.tq));
  const int tiles = key_end > 0 ? (key_end + kKeys - 1) / kKeys : 0;
  // bars[0]: q, one arrival (the producer's expect_tx); then the stages'
  // "full" barriers (the same) and "empty" ones (every consumer thread).
  if (threadIdx.x == 0) {
    barrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) barrier_init(full + s, 1), barrier_init(empty + s, 128 * kConsumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= 128 * kConsumers) {  // the producer warp; one thread issues every copy
    if (threadIdx.x == 128 * kConsumers && tiles > 0) {
      const int head = int(bh % a.heads), batch = int(bh / a.heads);
      stage_expect(q_full, P::kQBytes);
      for (int c = 0; c < DH / kBoxCols; ++c)
        tma_load(base + c * kRows * kSwizzleBytes, &qmap, c * kBoxCols, q_block, head, batch, q_full);
      for (int tile = 0; tile < tiles; ++tile) {
        const int s = tile % kStages;
        if (tile >= kStages) barrier_wait(empty + s, uint32_t((tile / kStages - 1) & 1));  // its last use is read
        stage_expect(full + s, P::kStageBytes);
        const uint32_t k_at = kv_at + s * P::kStageBytes, v_at = k_at + P::kTileBytes;
        for (int c = 0; c < DH / kBoxCols; ++c) {
          tma_load(k_at + c * kKeys * kSwizzleBytes, &kmap, c * kBoxCols, tile * kKeys, head, batch, full + s);
          tma_load(v_at + c * kKeys * kSwizzleBytes, &vmap, c * kBoxCols, tile * kKeys, head, batch, full + s);
        }
      }
    }
    return;
  }

  // Consumer warpgroup cw: queries row0 .. row0 + 63; this thread's rows
  // my_row and my_row + 8, its columns 2 t + acc_col.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int row0 = q_block + 64 * cw, my_row = row0 + 16 * w + g;
  // Causal: tiles past this warpgroup's last visible key are only waited
  // for and released, so the stage protocol is the same for every
  // consumer; so are all tiles of a warpgroup whose rows all lie past Tq.
  const int my_end = row0 >= a.tq ? 0 : a.causal ? min(key_end, max(0, row0 + 64 + a.tk - a.tq)) : key_end;
  const int my_tiles = (my_end + kKeys - 1) / kKeys;
  const float c = a.scale_log2;
  float o[DH / 2];
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running base-2 max, this thread's partial sums
  if (tiles > 0) barrier_wait(q_full, 0);
  const uint32_t q_at = base + 64 * cw * kSwizzleBytes;  // this warpgroup's rows in every q box

  float sc[kKeys / 2];
  uint32_t pa[kKeys / 16][4];
  for (int tile = 0; tile < my_tiles; ++tile) {
    const int s = tile % kStages;
    const uint32_t k_at = kv_at + s * P::kStageBytes, v_at = k_at + P::kTileBytes;
    barrier_wait(full + s, uint32_t((tile / kStages) & 1));
    // s = q k^T
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc) {
      const uint32_t step = (kc % 4) * 32;  // 32 bytes a k16 step inside a 128-byte row
      wgmma_ss(sc, desc_k_major(q_at + (kc / 4) * kRows * kSwizzleBytes + step),
               desc_k_major(k_at + (kc / 4) * kKeys * kSwizzleBytes + step), kc > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) fence_operand(sc[i]);
    // Keys past Tk and causally hidden keys to -inf (only on the tiles that
    // reach them; a row past Tq is never written).
    const int n0 = tile * kKeys;
    if (n0 + kKeys > a.tk || (a.causal && n0 + kKeys - 1 > row0 + a.tk - a.tq)) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        const int col = n0 + 2 * t + acc_col(i), row = my_row + acc_row(i);
        if (col >= a.tk || (a.causal && col > row + a.tk - a.tq)) sc[i] = -INFINITY;
      }
    }
    // The online softmax on the raw scores: c > 0 keeps their order, so the
    // row max is taken before scaling and p = exp2(s c - m) is one fma.
    float neg_base[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 2 * h; i < kKeys / 2; i += 4) mx = fmaxf(mx, fmaxf(sc[i], sc[i + 1]));
      const float m_new = fmaxf(m[h], quad_max(mx) * c);
      const float base2 = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
      alpha[h] = exp2_ftz(m[h] - base2);
      l[h] *= alpha[h];
      m[h] = m_new, neg_base[h] = -base2;
    }
#pragma unroll
    for (int i = 0; i < kKeys / 2; i += 2) {
      const int h = (i >> 1) & 1;
      const float p0 = exp2_ftz(fmaf(sc[i], c, neg_base[h]));
      const float p1 = exp2_ftz(fmaf(sc[i + 1], c, neg_base[h]));
      l[h] += p0 + p1;
      pa[i / 8][(i % 8) / 2] = pack(p0, p1);
    }
#pragma unroll
    for (int i = 0; i < DH / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
    // o += p v
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_rs(o, pa[kk], desc_mn_major(v_at + kk * 16 * kSwizzleBytes, kKeys * kSwizzleBytes), 1);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < DH / 2; ++i) fence_operand(o[i]);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) fence_operand(pa[kk][r]);
    barrier_arrive(empty + s);  // this thread's reads of the stage are done
  }
  for (int tile = my_tiles; tile < tiles; ++tile) {  // tiles this warpgroup sees none of
    barrier_wait(full + tile % kStages, uint32_t((tile / kStages) & 1));
    barrier_arrive(empty + tile % kStages);
  }
  bf16* out = static_cast<bf16*>(a.out) + a.o_base(bh);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = quad_sum(l[h]);
    const int row = my_row + 8 * h;
    if (row >= a.tq) continue;
    const float inv = total == 0.f ? 0.f : 1.f / total;  // a row with every key removed is zeros
#pragma unroll
    for (int i = 2 * h; i < DH / 2; i += 4)
      *reinterpret_cast<uint32_t*>(out + int64_t(row) * a.o_row + 2 * t + acc_col(i)) =
          pack(o[i] * inv, o[i + 1] * inv);
    if (t == 0) {
      a.lse[bh * a.tq + row] = total == 0.f ? -INFINITY : m[h] * kLn2 + logf(total);
      a.stats[bh * a.tq + row] = make_float2(m[h], inv);
    }
  }
#endif  // HG_WGMMA_DEVICE
}

}  // namespace
}  // namespace hg::gpu::attn
