#pragma once
// The staged softmax forward (sm_90+; cuda/softmax.cu launches it for
// non-causal 16-byte rows of Tk 1024..16384): a resident grid whose groups
// of G threads (a warp up to 32 keys a lane, else G / 32 warps at a named
// barrier; 4, 2 or 1 groups a block) each own a row at a time and keep their
// next rows in flight as whole-row bulk copies into a ring of shared-memory
// stages (cuda/row_ring.cuh). Per row: the mask loads (L1) issued, wait for
// the stage, z into registers, group sync, refill the stage with the row
// `stages` ahead, then the lean max, exp, sum and store from registers, with
// the register layouts' arithmetic (cuda/softmax_row_math.cuh). kKeepMask:
// the mask row stays in registers while the group's rows share it (a
// (B, 1, 1, Tk) mask: every row of a batch reads the same one). Causal rows
// copy only their visible keys (rounded up to 16 bytes); the product sends
// causal rows to the register layouts, where they are faster, and
// bench/lab/softmax_lab times both. Why it wins: docs/softmax.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/bulk_stage.cuh"
#include "cuda/row_ring.cuh"
#include "cuda/softmax_row_math.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// Keys a thread holds at most; rows past 512 threads of it (16384 keys)
// have no staged kernel.
constexpr int kStagedSoftmaxKeys = 32;
constexpr int64_t kStagedSoftmaxMaxTk = 512 * kStagedSoftmaxKeys;
// From this Tk (groups of 64 threads and more) cuda/softmax.cu launches the
// kKeepMask kernel where a batch's rows share a mask row: on the H200 it
// gained up to 6 points of the copy rate at Tk 2048 and 4096, and lost 1.3
// at f32 Tk 1024, where its registers cost a block a SM
// (bench/lab/softmax.md, "mask kept").
constexpr int64_t kStagedKeptMaskMinTk = 2048;
// bf16 rows without a mask up to this Tk take the register layouts instead:
// on the H200 they ran 4-11 points of the copy rate ahead there (no mask
// loads beside the row's), 2 behind at Tk 8192; f32 rows without a mask
// stay staged (level at Tk 1024-2048, ahead from 4096; docs/softmax.md).
constexpr int64_t kRegistersUnmaskedBf16MaxTk = 4096;

// G / 32 warps of a group meeting at named barrier `bar` (G threads) in
// `scratch` (a float a warp). Every thread of the group gets the result.
struct WarpGroupTeam {
  float* scratch;
  int first_warp, bar, threads;
  __device__ void sync() const { asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(threads) : "memory"); }
  template <bool kMax>
  __device__ float reduce(float v) const {
    v = kMax ? LaneTeam<32>{}.max(v) : LaneTeam<32>{}.sum(v);
    const int warps = threads / 32, warp = static_cast<int>(threadIdx.x / 32) - first_warp;
    if (threadIdx.x % 32 == 0) scratch[warp] = v;
    sync();
    float t = scratch[0];
    for (int w = 1; w < warps; ++w) t = kMax ? max_nan(t, scratch[w]) : t + scratch[w];
    sync();  // every warp has read before the next reduction writes
    return t;
  }
  __device__ float max(float v) const { return reduce<true>(v); }
  __device__ float sum(float v) const { return reduce<false>(v); }
};

// One thread: stage s of `ring` receives row `row`'s visible keys, rounded
// up to 16 bytes (the whole row unless causal; none for a causal row that
// sees no key: the arrival alone completes the phase).
template <class T>
__device__ __forceinline__ void fill_softmax_stage(const ForwardArgs<T>& a, const RowRing<T>& ring, int s,
                                                   int64_t row) {
  const RowSpan span = row_span<T, true>(a, row);
  const uint32_t bytes = static_cast<uint32_t>((span.visible * int64_t(sizeof(T)) + 15) / 16 * 16);
  stage_expect(ring.bars + s, bytes);
  if (bytes > 0) stage_copy(ring.at(s), a.x + row * a.tk, bytes, ring.bars + s);
}

// Waits for the ring's current stage. Where the includer compiles for
// sm_90a with cuda/wgmma.cuh (bench/lab/softmax_lab), the wait traps after
// two seconds, so a lost copy or a wrong byte count fails the lab's run
// instead of hanging it; the product (sm_90) spins as the LayerNorm staged
// forward does.
template <class T>
__device__ __forceinline__ const T* wait_softmax_stage(const RowRing<T>& ring) {
#if defined(HG_SM90A_DEVICE) && HG_SM90A_DEVICE
  sm90::barrier_wait(ring.bars + ring.stage, ring.parity);
  return reinterpret_cast<const T*>(ring.at(ring.stage));
#else
  return ring.wait();
#endif
}

// z of one chunk of W keys from k0 on, x already widened: scale x plus the
// additive mask (`masked` false: scale x alone), -inf for the keys from
// `visible` on. `mask` may be z itself (the mask loaded into z first).
template <int W>
__device__ __forceinline__ void staged_chunk_scores(float (&z)[W], const float (&x)[W], const float (&mask)[W],
                                                    bool masked, float scale, int k0, int visible) {
#pragma unroll
  for (int j = 0; j < W; ++j) z[j] = masked ? fmaf(scale, x[j], additive_mask(mask[j])) : x[j] * scale;
  if (k0 + W > visible)
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (k0 + j >= visible) z[j] = -INFINITY;
}

// The mask row a group keeps in registers (kKeepMask): `row` is where it
// was read from (null: none yet), m its chunks as staged_scores lays out v.
template <int N, int W>
struct KeptMask {
  const float* row = nullptr;
  float m[N][W];
};

// z for this thread's N chunks of a staged row (chunk i at keys (t + i G) W):
// the mask chunks first (their loads travel while the stage lands), or,
// kKeepMask, from `kept`, read again only when this row's mask row is
// another one; then x from the stage; one FFMA each, as load_z_lean of
// cuda/softmax.cu.
template <class T, int G, int N, bool kKeepMask>
__device__ __forceinline__ void staged_scores(const ForwardArgs<T>& a, const RowSpan& span, const RowRing<T>& ring,
                                              int t, float (&v)[N][16 / sizeof(T)], KeptMask<N, 16 / sizeof(T)>& kept) {
  constexpr int W = 16 / sizeof(T);
  const int visible = static_cast<int>(span.visible);
  if constexpr (kKeepMask) {
    if (span.mask != nullptr && span.mask != kept.row) {  // the group's threads agree: the same row
      // Every key of the row (a causal row sees fewer): the next rows may see more.
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int k0 = (t + i * G) * W;
        if (k0 < a.tk) load_vec<W, Load::ReadOnly>(span.mask + k0, kept.m[i]);
      }
      kept.row = span.mask;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int k0 = (t + i * G) * W;
      if (span.mask != nullptr && k0 < visible) load_vec<W, Load::ReadOnly>(span.mask + k0, v[i]);
    }
  }
  const T* xs = wait_softmax_stage(ring);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int k0 = (t + i * G) * W;
    if (k0 < visible) {
      float x[W];
      if constexpr (std::is_same_v<T, __nv_bfloat16>) widen_bf16x8(*reinterpret_cast<const uint4*>(xs + k0), x);
      else load_vec<W>(xs + k0, x);
      staged_chunk_scores<W>(v[i], x, kKeepMask ? kept.m[i] : v[i], span.mask != nullptr, a.scale, k0, visible);
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;
    }
  }
}

// Rows of tk <= G * N * W keys (tk * sizeof(T) a multiple of 16, x, y, the
// mask and its strides 16-byte aligned; a.index32), R groups of G threads a block,
// `stages` rows in flight a group. Groups never wait for each other past
// the ring's start. kKeepMask: staged_scores keeps the mask row in registers.
template <class T, int G, int N, int R, bool kKeepMask>
__global__ void __launch_bounds__(G* R, G* R <= 512 ? 512 / (G * R) : 1)
    softmax_forward_staged_kernel(ForwardArgs<T> a, int stages) {
  constexpr int W = 16 / sizeof(T);
  static_assert(G % 32 == 0 && G * R <= 1024 && R <= 15, "bad staged softmax config");
  extern __shared__ __align__(128) unsigned char staged_rows[];  // R rings of `stages` rows
  __shared__ float scratch[R][G / 32];
  __shared__ uint64_t stage_bars[R][kMaxRowStages];
  const int group = threadIdx.x / G, t = threadIdx.x % G;
  const uint32_t row_bytes = static_cast<uint32_t>(a.tk * int64_t(sizeof(T)));
  RowRing<T> ring = RowRing<T>::of_group(staged_rows, group, stages, row_bytes, stage_bars[group]);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R + group;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * R;
  if (t == 0)
    for (int s = 0; s < stages; ++s) stage_barrier_init(ring.bars + s);
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (t == 0)
    for (int s = 0; s < stages && first + s * stride < a.rows; ++s) fill_softmax_stage(a, ring, s, first + s * stride);
  int64_t next = first + stages * stride;  // the row that refills the stage read next

  using Team = std::conditional_t<G == 32, LaneTeam<32>, WarpGroupTeam>;
  Team team{};
  if constexpr (G > 32) team = Team{scratch[group], group * (G / 32), 1 + group, G};

  KeptMask<N, W> kept;
  for (int64_t row = first; row < a.rows; row += stride) {
    const RowSpan span = row_span<T, true>(a, row);
    float v[N][W];
    staged_scores<T, G, N, kKeepMask>(a, span, ring, t, v, kept);
    if constexpr (G == 32) __syncwarp();  // every thread has read the stage before its refill
    else team.sync();
    if (t == 0 && next < a.rows) fill_softmax_stage(a, ring, ring.stage, next);
    next += stride;
    ring.advance();

    const float inv = exp_and_inverse<W, N, true>(team, v);  // lean, as the register layouts
    T* y_row = a.y + row * a.tk;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(t + i * G) * W;
      if (k0 < a.tk) {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] *= inv;
        store_vec<W>(y_row + k0, v[i]);
      }
    }
  }
}

// ---- host: which kernel -------------------------------------------------------------

template <class T>
struct StagedSoftmaxKernel {
  void (*kernel)(ForwardArgs<T>, int) = nullptr;  // null: rows past kStagedSoftmaxMaxTk
  int G = 0, R = 0;
};

template <class T, int G, int N, int R, bool kKeepMask>
StagedSoftmaxKernel<T> staged_softmax_kernel_of() {
  return {softmax_forward_staged_kernel<T, G, N, R, kKeepMask>, G, R};
}

// The staged kernel for rows of tk keys: a warp a row (4 a block) holding
// the fewest chunks of W keys (a power of two) that cover the row while it
// fits 32 keys a lane (f32 Tk 1024, bf16 Tk 1024); past that G = tk / 32
// threads (a power of two), 32 keys each, up to 512 threads (Tk 16384).
// kFrom: the shortest row the caller asks for (tk >= kFrom); kernels only
// for shorter rows are not compiled. kKeepMask: the kernel that keeps the
// mask row in registers.
template <class T, int64_t kFrom = 1, bool kKeepMask = false>
StagedSoftmaxKernel<T> staged_softmax_kernel(int64_t tk) {
  constexpr int W = 16 / sizeof(T), NF = kStagedSoftmaxKeys / W;  // f32: 8 chunks, bf16: 4
  if constexpr (32 * W >= kFrom)
    if (tk <= 32 * W) return staged_softmax_kernel_of<T, 32, 1, 4, kKeepMask>();
  if constexpr (64 * W >= kFrom)
    if (tk <= 64 * W) return staged_softmax_kernel_of<T, 32, 2, 4, kKeepMask>();
  if constexpr (128 * W >= kFrom)
    if (tk <= 128 * W) return staged_softmax_kernel_of<T, 32, 4, 4, kKeepMask>();
  if constexpr (NF >= 8 && 256 * W >= kFrom)
    if (tk <= 256 * W) return staged_softmax_kernel_of<T, 32, 8, 4, kKeepMask>();
  if (tk <= 64 * kStagedSoftmaxKeys) return staged_softmax_kernel_of<T, 64, NF, 2, kKeepMask>();
  if (tk <= 128 * kStagedSoftmaxKeys) return staged_softmax_kernel_of<T, 128, NF, 1, kKeepMask>();
  if (tk <= 256 * kStagedSoftmaxKeys) return staged_softmax_kernel_of<T, 256, NF, 1, kKeepMask>();
  if (tk <= 512 * kStagedSoftmaxKeys) return staged_softmax_kernel_of<T, 512, NF, 1, kKeepMask>();
  return {};
}

}  // namespace
}  // namespace hg::gpu
