#pragma once
// The BF16 flash attention forward on sm_90a (wgmma + TMA), after
// FlashAttention-3: the kernel, its block shape and its shared-memory plan.
// Launched by the library (cuda/attention_wgmma.cu) and, as forward variant
// 9, by the attention lab (bench/lab/attention_lab.cu), so that the lab
// times the production kernel itself (docs/attention.md, "The wgmma
// forward"). A block of 128 queries:
//   - two consumer warpgroups of 64 queries each (wgmma's M) and one
//     producer warp, one thread of which issues every TMA copy;
//   - q (once) and k, v tiles of 64 or 128 keys (forward_keys) land by
//     TMA (128-byte swizzle, zeros past the tensor's ends) in a ring of 2
//     stages; each stage has a "full" mbarrier (its bytes arrived) and an
//     "empty" one (every consumer thread is done with it);
//   - s = q k^T by wgmma with both operands in shared memory (ss), the
//     online softmax in registers (scale * log2(e) folded into one fma
//     before exp2), then o += p v by wgmma with p from registers and v from
//     shared memory through its transposed (MN-major) descriptor (rs).
// With a key mask (kMasked) the producer is a warpgroup whose second warp
// stages each tile's keys' mask terms, and s becomes base-2 logits
// s * scale * log2(e) + term before the row max.
// Outputs as the mma.sync forward writes them: o, the row log-sum-exp and
// the row stats {base-2 max, 1 / sum} the backward rebuilds p from.
// The kernel's steps are functions here so that the lab's candidates are
// built from them too, but only where that leaves the kernel's machine code
// as it was (nvcc 13.0 emitted other code for it when the Tk and causal
// masking, the block's setup or the consumer's state moved into functions,
// so those stay inline in forward_body; compare the cubin before and after
// a change here, as docs/architecture.md says).
// Only an sm_90a device compile holds the kernel's body; elsewhere it is
// empty. Internal linkage (the unnamed namespace), as in cuda/bulk_stage.cuh:
// each .cu that includes it compiles its own copy.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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
constexpr int kStages = 2;                               // k, v tiles in flight
constexpr int kConsumers = 2;                            // warpgroups
constexpr int kThreadsPerBlock = 128 * kConsumers + 32;  // + the producer warp
// The masked kernel's block: a whole producer warpgroup, which gives the
// consumers registers (MaskedRegisters, below).
constexpr int forward_threads(bool masked) { return masked ? 128 * kConsumers + 128 : kThreadsPerBlock; }

// Shared memory of a block of ROWS queries with k, v tiles of KB keys in ST
// stages, byte offsets from a 1024-byte aligned base (the 128-byte swizzle
// repeats every 8 rows of 128 bytes, and TMA and wgmma both apply it to
// address bits 4-6 xor 7-9, so every box starts on a 1024-byte boundary).
// A [rows][DH] tile is DH / 64 boxes of [rows][64]. After the barriers,
// each stage's keys' mask terms (the masked kernel).
template <int DH, int ROWS, int KB, int ST>
struct ForwardPlan {
  static constexpr int kQBytes = ROWS * DH * 2;
  static constexpr int kTileBytes = KB * DH * 2;  // k or v of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kBarOffset = kQBytes + ST * kStageBytes;
  static constexpr int kMaskOffset = kBarOffset + (1 + 2 * ST) * 8;
  static constexpr size_t kSmem = size_t(kMaskOffset) + ST * KB * 4 + 1024;  // + the base's alignment
};
// Keys a k, v tile, and the blocks a SM (the kernel's launch bound). At dh
// 64 without a mask, 64-key tiles hold a consumer thread to 96 registers, so
// two blocks share a SM and one block's softmax, first tile and stores run
// beside the other's products (1.15-1.25x the one-block kernel on 128-key
// tiles, docs/attention.md). At dh 128, and in the masked kernel with its
// producer warpgroup, a block takes the SM's registers either way, and
// 128-key tiles wait on half as many stage barriers.
template <int DH, bool kMasked = false>
constexpr bool two_blocks_per_sm() {
  return DH == 64 && !kMasked;
}
template <int DH, bool kMasked = false>
constexpr int forward_keys() {
  return two_blocks_per_sm<DH, kMasked>() ? 64 : 128;
}
template <int DH, bool kMasked = false>
using Plan = ForwardPlan<DH, kRows, forward_keys<DH, kMasked>(), kStages>;

// What a consumer thread's tile loop works on, for a Loop given to
// forward_body (the attention lab's candidates): the arguments and c =
// scale * log2(e); its rows my_row and my_row + 8 of warpgroup rows row0 ..
// row0 + 63, its columns 2 t + acc_col; its visible tiles 0 .. tiles - 1;
// q's rows at q_at, the stages from kv_at with their barriers; and o, m, l,
// which forward_body stores afterwards.
template <int DH>
struct ConsumerTiles {
  const Args& a;
  float c;
  int row0, my_row, t, tiles;
  uint32_t q_at, kv_at;
  uint64_t *full, *empty;
  float (&o)[DH / 2];
  float (&m)[2];
  float (&l)[2];
};

#if HG_WGMMA_DEVICE
using namespace sm90;  // the instructions: cuda/wgmma.cuh

// The producer thread: q once, then every k, v tile, each into its stage
// once the stage's previous tile is released.
template <int DH, int ROWS, int KB, int ST>
__device__ __forceinline__ void load_tiles(const CUtensorMap& qmap, const CUtensorMap& kmap, const CUtensorMap& vmap,
                                           const Args& a, uint32_t base, uint32_t kv_at, uint64_t* q_full,
                                           uint64_t* full, uint64_t* empty, int64_t bh, int q_block, int tiles) {
  using P = ForwardPlan<DH, ROWS, KB, ST>;
  const int head = int(bh % a.heads), batch = int(bh / a.heads);
  stage_expect(q_full, P::kQBytes);
  for (int c = 0; c < DH / kBoxCols; ++c)
    tma_load(base + c * ROWS * kSwizzleBytes, &qmap, c * kBoxCols, q_block, head, batch, q_full);
  static_assert(P::kStageBytes == 2 * P::kTileBytes && P::kTileBytes == KB * DH * 2);  // load_tile_pairs' ring
  load_tile_pairs<DH, KB, ST>(&kmap, &vmap, kv_at, 0, tiles, head, batch, full, empty);
}

// s = q k^T of one tile, issued and committed (one wgmma group): q the
// warpgroup's 64 rows at q_at in boxes of ROWS rows, k a tile at k_at.
template <int DH, int ROWS, int KB>
__device__ __forceinline__ void issue_qk(float (&sc)[KB / 2], uint32_t q_at, uint32_t k_at) {
  wgmma_fence();
#pragma unroll
  for (int kc = 0; kc < DH / 16; ++kc) {
    const uint32_t step = (kc % 4) * 32;  // 32 bytes a k16 step inside a 128-byte row
    wgmma_ss(sc, desc_k_major(q_at + (kc / 4) * ROWS * kSwizzleBytes + step),
             desc_k_major(k_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
  }
  wgmma_commit();
}

// Raw scores to base-2 logits: s c + each key's mask term (mask_term, -inf
// past Tk; the mma.sync and F32 kernels' arithmetic, one fma), from the
// stage's terms of the tile's keys; online_softmax then takes them at c = 1.
// A consumer thread's key columns are 2 t + acc_col(i).
template <int KB>
__device__ __forceinline__ void add_mask_terms(float (&sc)[KB / 2], const float* terms, int t, float c) {
#pragma unroll
  for (int i = 0; i < KB / 2; i += 4) {
    const float2 term = *reinterpret_cast<const float2*>(terms + 2 * t + acc_col(i));
    sc[i] = fmaf(sc[i], c, term.x), sc[i + 1] = fmaf(sc[i + 1], c, term.y);          // row my_row
    sc[i + 2] = fmaf(sc[i + 2], c, term.x), sc[i + 3] = fmaf(sc[i + 3], c, term.y);  // row my_row + 8
  }
}

// The online softmax of one tile's raw scores sc (removed keys at -inf):
// the running base-2 max m and partial sums l of this thread's two rows
// moved on, p written as A fragments; alpha: what o is to be multiplied by
// before this tile's p v is added. c = scale * log2(e) > 0 keeps the
// scores' order, so the row max is taken before scaling and
// p = exp2(s c - m) is one fma. neg_base is the caller's, declared beside
// alpha (in this function, nvcc 13.0 emitted other code for the kernel).
template <int KB>
__device__ __forceinline__ void online_softmax(float (&sc)[KB / 2], uint32_t (&pa)[KB / 16][4], float (&neg_base)[2],
                                               float (&alpha)[2], float (&m)[2], float (&l)[2], float c) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 2 * h; i < KB / 2; i += 4) mx = fmaxf(mx, fmaxf(sc[i], sc[i + 1]));
    const float m_new = fmaxf(m[h], quad_max(mx) * c);
    const float base2 = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: every p is 0
    alpha[h] = exp2_approx(m[h] - base2);
    l[h] *= alpha[h];
    m[h] = m_new, neg_base[h] = -base2;
  }
#pragma unroll
  for (int i = 0; i < KB / 2; i += 2) {
    const int h = (i >> 1) & 1;
    const float p0 = exp2_approx(fmaf(sc[i], c, neg_base[h]));
    const float p1 = exp2_approx(fmaf(sc[i + 1], c, neg_base[h]));
    l[h] += p0 + p1;
    pa[i / 8][(i % 8) / 2] = pack(p0, p1);
  }
}

// o scaled by its row's factor (alpha[0] for my_row, alpha[1] for my_row + 8).
template <int DH>
__device__ __forceinline__ void rescale(float (&o)[DH / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
}

// o += p v of one tile, issued and committed: p as A fragments, v a tile
// at v_at through its MN-major descriptor.
template <int DH, int KB>
__device__ __forceinline__ void issue_pv(float (&o)[DH / 2], const uint32_t (&pa)[KB / 16][4], uint32_t v_at) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk)
    wgmma_rs(o, pa[kk], desc_mn_major(v_at + kk * 16 * kSwizzleBytes, KB * kSwizzleBytes), 1);
  wgmma_commit();
}

// After p v has completed: o and the p fragments it read are fenced, so
// that nothing reads o before, or reuses a p register during, the wgmma.
template <int DH, int KB>
__device__ __forceinline__ void pv_done(float (&o)[DH / 2], uint32_t (&pa)[KB / 16][4]) {
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) fence_operand(o[i]);
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) fence_operand(pa[kk][r]);
}

// A consumer thread's tiles from `first` to `tiles` (those its warpgroup
// sees none of): waited for and released, so that the stage protocol is the
// same for every consumer.
template <int ST, bool kTrap = true>
__device__ __forceinline__ void release_unseen(uint64_t* full, uint64_t* empty, int first, int tiles) {
  for (int tile = first; tile < tiles; ++tile) {
    barrier_wait<kTrap>(full + tile % ST, uint32_t((tile / ST) & 1));
    barrier_arrive(empty + tile % ST);
  }
}

// o / l, the log-sum-exp and the stats {base-2 max, 1 / sum} of a
// consumer thread's rows my_row and my_row + 8 (those below Tq), its
// columns 2 t + acc_col.
template <int DH>
__device__ __forceinline__ void store_rows(const Args& a, int64_t bh, int my_row, int t, const float (&o)[DH / 2],
                                           const float (&m)[2], const float (&l)[2]) {
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
}

// The keys a consumer warpgroup of queries row0 .. row0 + 63 sees, of the
// block's key_end: none past Tq, causally fewer, and never below 0 (causal
// with Tq > Tk: a block of queries that see no key has a key_end below 0;
// from -255 on, a negative end would count -1 tiles, and release_unseen
// would wait on a stage that never fills).
__device__ __forceinline__ int warpgroup_key_end(const Args& a, int row0, int key_end) {
  return row0 >= a.tq ? 0 : a.causal ? max(0, min(key_end, row0 + 64 + a.tk - a.tq)) : key_end;
}

// Registers moved from the producer to the consumers (setmaxnreg), 0 for
// none. A block that moves them has a whole producer warpgroup (2 ROWS +
// 128 threads), which keeps `producer` a thread and gives the rest away,
// and its consumers' waits exit instead of trapping (barrier_wait<false>).
// A Loop asks for it with kConsumerRegisters > 0 (the attention lab's
// candidates). The masked kernel's producer needs a second warp (the mask
// terms' copier), so it takes a whole warpgroup and gives the consumers
// 240, as the backward's block does.
template <class Loop>
struct LoopRegisters {
  static constexpr int producer = Loop::kProducerRegisters, consumer = Loop::kConsumerRegisters;
};
template <>
struct LoopRegisters<void> {
  static constexpr int producer = 0, consumer = 0;
};
struct MaskedRegisters {
  static constexpr int producer = sm90::kSplitProducerRegisters, consumer = sm90::kSplitConsumerRegisters;
};

// One block of the forward, for blocks of ROWS queries (ROWS / 64 consumer
// warpgroups and the producer warp: 2 ROWS + 32 threads) and k, v tiles of
// KB keys in ST stages. The library's kernel runs it at kRows,
// forward_keys, kStages with its own tile loop; the attention lab also at other shapes,
// and with a Loop of its own (Loop::run<DH, ROWS, KB, ST>(ConsumerTiles))
// in place of that loop. `a` is taken by value, as the kernel takes it
// (through a reference nvcc 13.0 emitted other code).
template <int DH, int ROWS, int KB, int ST, class Loop = void, bool kMasked = false>
__device__ __forceinline__ void forward_body(const CUtensorMap& qmap, const CUtensorMap& kmap, const CUtensorMap& vmap,
                                             Args a) {
  static_assert((DH == 64 || DH == 128) && ROWS % 64 == 0 && (KB == 64 || KB == 128) && ST >= 2);
  static_assert(!kMasked || std::is_void_v<Loop>, "the key mask is the library's tile loop's");
  using P = ForwardPlan<DH, ROWS, KB, ST>;
  constexpr int kConsumers = ROWS / 64;  // warpgroups
  using Registers = std::conditional_t<kMasked, MaskedRegisters, LoopRegisters<Loop>>;
  constexpr bool kSplit = Registers::consumer > 0;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;  // the first 1024-byte boundary
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw + (base + P::kBarOffset - shared_address(raw)));
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + ST;
  const uint32_t kv_at = base + P::kQBytes;  // stage s: k at kv_at + s * kStageBytes, v kTileBytes on
  float* stage_mask = reinterpret_cast<float*>(raw + (base + P::kMaskOffset - shared_address(raw)));

  const int64_t bh = blockIdx.y;
  const int q_block = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ROWS;  // long causal blocks first
  const int key_end = a.key_end(min(q_block + ROWS, a.tq));
  const int tiles = key_end > 0 ? (key_end + KB - 1) / KB : 0;
  init_barriers(q_full, full, empty, ST, kConsumers, kMasked ? 32 : 0);  // + the mask copier's warp

  if (threadIdx.x >= 128 * kConsumers) {  // the producer warp(s); one thread issues every copy
    if constexpr (kSplit) registers_decrease<Registers::producer>();
    if constexpr (kMasked) {
      // The producer's second warp: each stage's keys' mask terms, then its
      // arrival on the stage (as the backward's stats copier).
      if ((threadIdx.x - 128 * kConsumers) / 32 == 1) {
        const float* mask_row = a.mask_row(bh);
        for (int i = 0; i < tiles; ++i) {
          const int s = i % ST, n0 = i * KB;
          wait_stage_free<ST>(empty, i);
          for (int j = threadIdx.x % 32; j < KB; j += 32) stage_mask[s * KB + j] = a.key_term(mask_row, n0 + j);
          barrier_arrive(full + s);  // releases the stores above to the consumers' wait
        }
      }
    }
    if (threadIdx.x == 128 * kConsumers && tiles > 0) {
      load_tiles<DH, ROWS, KB, ST>(qmap, kmap, vmap, a, base, kv_at, q_full, full, empty, bh, q_block, tiles);
      if constexpr (kSplit) wait_ring_read<ST>(empty, tiles);  // the consumers' waits exit
    }
    return;
  }

  if constexpr (kSplit) registers_increase<Registers::consumer>();
  // Consumer warpgroup cw: queries row0 .. row0 + 63; this thread's rows
  // my_row and my_row + 8, its columns 2 t + acc_col.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int row0 = q_block + 64 * cw, my_row = row0 + 16 * w + g;
  // Causal: tiles past this warpgroup's last visible key are only waited
  // for and released, so the stage protocol is the same for every
  // consumer; so are all tiles of a warpgroup whose rows all lie past Tq.
  const int my_end = warpgroup_key_end(a, row0, key_end);
  const int my_tiles = (my_end + KB - 1) / KB;
  const float c = a.scale_log2;
  float o[DH / 2];
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running base-2 max, this thread's partial sums
  if (tiles > 0) barrier_wait<!kSplit>(q_full, 0);
  const uint32_t q_at = base + 64 * cw * kSwizzleBytes;  // this warpgroup's rows in every q box

  if constexpr (!std::is_void_v<Loop>) {
    Loop::template run<DH, ROWS, KB, ST>(
        ConsumerTiles<DH>{a, c, row0, my_row, t, my_tiles, q_at, kv_at, full, empty, o, m, l});
  } else {
    float sc[KB / 2];
    uint32_t pa[KB / 16][4];
    for (int tile = 0; tile < my_tiles; ++tile) {
      const int s = tile % ST;
      const uint32_t k_at = kv_at + s * P::kStageBytes, v_at = k_at + P::kTileBytes;
      barrier_wait<!kSplit>(full + s, uint32_t((tile / ST) & 1));
      issue_qk<DH, ROWS, KB>(sc, q_at, k_at);  // s = q k^T
      wgmma_wait<0>();
      fence_operands(sc);
      if constexpr (kMasked) add_mask_terms<KB>(sc, stage_mask + s * KB, t, c);
      const int n0 = tile * KB;
      // Keys past Tk and causally hidden keys to -inf (only on the tiles that
      // reach them; a row past Tq is never written).
      if (n0 + KB > a.tk || (a.causal && n0 + KB - 1 > row0 + a.tk - a.tq)) {
#pragma unroll
        for (int i = 0; i < KB / 2; ++i) {
          const int col = n0 + 2 * t + acc_col(i), row = my_row + acc_row(i);
          if (col >= a.tk || (a.causal && col > row + a.tk - a.tq)) sc[i] = -INFINITY;
        }
      }
      float neg_base[2], alpha[2];
      online_softmax<KB>(sc, pa, neg_base, alpha, m, l, kMasked ? 1.f : c);
      rescale<DH>(o, alpha);
      issue_pv<DH, KB>(o, pa, v_at);  // o += p v
      wgmma_wait<0>();
      pv_done<DH, KB>(o, pa);
      barrier_arrive(empty + s);  // this thread's reads of the stage are done
    }
  }
  release_unseen<ST, !kSplit>(full, empty, my_tiles, tiles);
  store_rows<DH>(a, bh, my_row, t, o, m, l);
}
#endif  // HG_WGMMA_DEVICE

// kMasked: a.mask holds a row of additive key biases per batch.
template <int DH, bool kMasked = false>
__global__ void __launch_bounds__(forward_threads(kMasked), two_blocks_per_sm<DH, kMasked>() ? 2 : 1)
    forward_wgmma_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap vmap, Args a) {
  static_assert(DH == 64 || DH == 128);
#if HG_WGMMA_DEVICE
  forward_body<DH, kRows, forward_keys<DH, kMasked>(), kStages, void, kMasked>(qmap, kmap, vmap, a);
#endif  // HG_WGMMA_DEVICE
}

}  // namespace
}  // namespace hg::gpu::attn
