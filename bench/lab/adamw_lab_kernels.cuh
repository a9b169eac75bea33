#pragma once
// The AdamW lab's candidate update kernels (bench/lab/adamw_lab.cu,
// bench/lab/adamw.md). One template, candidate_adamw<S>, walks the product's
// tensor table (cuda/multi_tensor_adamw_kernel.cuh, included, not copied)
// with the shape S picks: threads per block, groups of loads in flight per
// thread (unroll), elements per chunk, elements per access (4: one float4 of
// each of g, p, m, v; 8: two, and a 16-byte bf16 store), the load and store
// cache paths, the element math, and whether the next group's loads are
// issued before this group's math (pipelined). The grid is one block per
// chunk, or fewer blocks that stride over the chunks (persistent). With the
// exact math every shape computes adamw_element (cuda/adamw_math.cuh) on the
// same values, so its bits are the product's.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/multi_tensor_adamw_kernel.cuh"

namespace lab {

using hg::gpu::AdamWScalars;
using hg::gpu::Chunk;
using hg::gpu::TensorRef;

// ---- the folded math -----------------------------------------------------------

// PyTorch's fused AdamW arithmetic (FusedAdamWKernel): the bias corrections
// folded into two per-step scalars, step_size = lr / bc1 and
// 1 / sqrt(bc2), each rounded once from double, so an element takes one sqrt
// and one division where adamw_element takes one sqrt and three divisions.
// Written in explicitly rounded intrinsics like adamw_element: promoting it
// is replacing adamw_element's last two lines and the two bias-correction
// fields of AdamWScalars (bench/lab/adamw.md, "Promoting").
struct FoldedScalars {
  float lr, beta1, beta2, eps, weight_decay, step_size, inv_sqrt_bc2;
};

__device__ __forceinline__ void adamw_element_folded(float g, float& p, float& m, float& v, const FoldedScalars& s) {
  p = __fmaf_rn(-__fmul_rn(s.lr, s.weight_decay), p, p);  // as adamw_element
  m = __fmaf_rn(s.beta1, m, __fmul_rn(1.0f - s.beta1, g));
  v = __fmaf_rn(s.beta2, v, __fmul_rn(__fmul_rn(1.0f - s.beta2, g), g));
  const float denominator = __fmaf_rn(__fsqrt_rn(v), s.inv_sqrt_bc2, s.eps);  // sqrt(v) / sqrt(bc2) + eps
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denominator));
}

__device__ __forceinline__ void element(float g, float& p, float& m, float& v, const AdamWScalars& s) {
  hg::gpu::adamw_element(g, p, m, v, s);
}
__device__ __forceinline__ void element(float g, float& p, float& m, float& v, const FoldedScalars& s) {
  adamw_element_folded(g, p, m, v, s);
}

enum class Math { Exact, Folded };

// This step's scalars from the device state, as chunk_adamw reads them.
template <Math M>
__device__ __forceinline__ auto step_scalars(const double* state, float beta1, float beta2, float eps, float wd) {
  const double lr = state[hg::kAdamWLr], bc1 = state[5], bc2 = state[6];
  if constexpr (M == Math::Exact) return AdamWScalars{float(lr), beta1, beta2, eps, wd, float(bc1), float(bc2)};
  else return FoldedScalars{float(lr), beta1, beta2, eps, wd, float(lr / bc1), float(1.0 / sqrt(bc2))};
}

// ---- cache paths ---------------------------------------------------------------

// Streaming: the product's __ldcs (ld.global.cs). NoAllocate: not kept in L1
// (ld.global.L1::no_allocate; the grads, which nothing writes, through the
// non-coherent path, .nc). EvictFirst: NoAllocate plus an L2 evict-first
// policy (createpolicy, .L2::cache_hint). Prefetch256: NoAllocate asking
// L2 to fetch the whole 256-byte block (.L2::256B).
enum class LoadPath { Streaming, NoAllocate, EvictFirst, Prefetch256 };
enum class StorePath { Streaming, Plain };  // st.global.cs (the product) or st.global

template <LoadPath L>
__device__ __forceinline__ uint64_t load_policy() {
  uint64_t policy = 0;
#if __CUDA_ARCH__ >= 800
  if constexpr (L == LoadPath::EvictFirst) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

#define HG_LAB_LD4(op) asm volatile(op " {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p))
#define HG_LAB_LD4_HINT(op) \
  asm volatile(op " {%0, %1, %2, %3}, [%4], %5;" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p), "l"(policy))

// 16 bytes at p (16-byte aligned). kReadOnly: nothing writes p in the kernel.
// The cache hints need sm_80; older targets take the product's load.
template <LoadPath L, bool kReadOnly>
__device__ __forceinline__ float4 load4(const float* p, uint64_t policy) {
  float4 r;
#if __CUDA_ARCH__ < 800
  if constexpr (true) {
#else
  if constexpr (L == LoadPath::Streaming) {
#endif
    r = __ldcs(reinterpret_cast<const float4*>(p));
  } else if constexpr (L == LoadPath::NoAllocate) {
    if constexpr (kReadOnly) HG_LAB_LD4("ld.global.nc.L1::no_allocate.v4.f32");
    else HG_LAB_LD4("ld.global.L1::no_allocate.v4.f32");
  } else if constexpr (L == LoadPath::EvictFirst) {
    if constexpr (kReadOnly) HG_LAB_LD4_HINT("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32");
    else HG_LAB_LD4_HINT("ld.global.L1::no_allocate.L2::cache_hint.v4.f32");
  } else {
    if constexpr (kReadOnly) HG_LAB_LD4("ld.global.nc.L1::no_allocate.L2::256B.v4.f32");
    else HG_LAB_LD4("ld.global.L1::no_allocate.L2::256B.v4.f32");
  }
  return r;
}
#undef HG_LAB_LD4
#undef HG_LAB_LD4_HINT

template <StorePath S>
__device__ __forceinline__ void store4(float* p, float4 v) {
  if constexpr (S == StorePath::Streaming) __stcs(reinterpret_cast<float4*>(p), v);
  else *reinterpret_cast<float4*>(p) = v;
}

// ---- the candidate kernel --------------------------------------------------------

// kMinBlocks: blocks an SM must hold (__launch_bounds__), which caps the
// registers a thread may take. kPairCopy (4-wide only): lanes 2k and 2k + 1 hold 8 consecutive elements;
// the odd lane hands its 4 bf16 to the even one, which stores all 8 as one
// 16-byte word (half the copy's store instructions, the same bytes).
template <int kThreads_, int kUnroll_, int64_t kChunk_, int kWidth_, Math kMath_, LoadPath kLoad_, StorePath kStore_,
          bool kPipelined_, bool kPairCopy_ = false, int kMinBlocks_ = 1>
struct Shape {
  static constexpr int kThreads = kThreads_, kUnroll = kUnroll_, kWidth = kWidth_, kMinBlocks = kMinBlocks_;
  static constexpr int64_t kChunk = kChunk_;
  static constexpr Math kMath = kMath_;
  static constexpr LoadPath kLoad = kLoad_;
  static constexpr StorePath kStore = kStore_;
  static constexpr bool kPipelined = kPipelined_, kPairCopy = kPairCopy_;
  static_assert(kWidth == 4 || kWidth == 8, "an access is 4 or 8 elements");
  static_assert(!kPairCopy || kWidth == 4, "pairs of lanes make 8 elements from two 4-wide accesses");
  static_assert(kChunk % (kWidth * kThreads) == 0, "a chunk is whole rounds of the block");
};

// W consecutive elements of one tensor, as W / 4 float4 of each array.
template <int W>
struct Group {
  float4 g[W / 4], p[W / 4], m[W / 4], v[W / 4];
};

template <class S>
__device__ __forceinline__ void load_group(const TensorRef& t, int64_t i, Group<S::kWidth>& a, uint64_t policy) {
#pragma unroll
  for (int q = 0; q < S::kWidth / 4; ++q) {
    a.g[q] = load4<S::kLoad, true>(t.g + i + 4 * q, policy);
    a.p[q] = load4<S::kLoad, false>(t.p + i + 4 * q, policy);
    a.m[q] = load4<S::kLoad, false>(t.m + i + 4 * q, policy);
    a.v[q] = load4<S::kLoad, false>(t.v + i + 4 * q, policy);
  }
}

// The bf16 copy of 4 elements at t.copy + i by lane pairs (Shape::kPairCopy).
// The pair is decided on the lanes converged here (__activemask, the same
// value on each of them): an even lane whose odd partner is absent, or an odd
// lane whose even partner is, stores its own 8 bytes; a chunk's last lanes
// may lack a partner.
template <hg::gpu::Store kStore>
__device__ __forceinline__ void store_copy_pair(__nv_bfloat16* copy, int64_t i, const float (&four)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(four[0], four[1]), hi = __floats2bfloat162_rn(four[2], four[3]);
  const uint32_t mine[2] = {*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
  const unsigned active = __activemask();
  const int lane = threadIdx.x & 31;
  const uint32_t next0 = __shfl_down_sync(active, mine[0], 1), next1 = __shfl_down_sync(active, mine[1], 1);
  const bool aligned = reinterpret_cast<uintptr_t>(copy) % 16 == 0;  // i of an even lane is a multiple of 8
  if (aligned && lane % 2 == 0 && (active >> (lane + 1) & 1u)) {
    const uint4 word = make_uint4(mine[0], mine[1], next0, next1);
    if constexpr (kStore == hg::gpu::Store::Streaming) __stcs(reinterpret_cast<uint4*>(copy + i), word);
    else *reinterpret_cast<uint4*>(copy + i) = word;
  } else if (!aligned || lane % 2 == 0 || !(active >> (lane - 1) & 1u)) {
    hg::gpu::store_vec<4, kStore>(copy + i, four);
  }
}

// The math of one group, then its stores (as adamw_vec4, W elements wide).
template <class S, class Scalars>
__device__ __forceinline__ void update_group(const TensorRef& t, int64_t i, Group<S::kWidth>& a, float clip,
                                             const Scalars& s) {
  constexpr int W = S::kWidth;
  constexpr hg::gpu::Store kCopyStore =
      S::kStore == StorePath::Streaming ? hg::gpu::Store::Streaming : hg::gpu::Store::Plain;
  float copy[W];
#pragma unroll
  for (int q = 0; q < W / 4; ++q) {
    element(__fmul_rn(a.g[q].x, clip), a.p[q].x, a.m[q].x, a.v[q].x, s);
    element(__fmul_rn(a.g[q].y, clip), a.p[q].y, a.m[q].y, a.v[q].y, s);
    element(__fmul_rn(a.g[q].z, clip), a.p[q].z, a.m[q].z, a.v[q].z, s);
    element(__fmul_rn(a.g[q].w, clip), a.p[q].w, a.m[q].w, a.v[q].w, s);
    store4<S::kStore>(t.m + i + 4 * q, a.m[q]);
    store4<S::kStore>(t.v + i + 4 * q, a.v[q]);
    store4<S::kStore>(t.p + i + 4 * q, a.p[q]);
    copy[4 * q] = a.p[q].x, copy[4 * q + 1] = a.p[q].y, copy[4 * q + 2] = a.p[q].z, copy[4 * q + 3] = a.p[q].w;
  }
  if (!t.copy) return;
  if constexpr (W == 8) {
    if (reinterpret_cast<uintptr_t>(t.copy + i) % 16 == 0) {
      hg::gpu::store_vec<8, kCopyStore>(t.copy + i, copy);
      return;
    }
  }
#pragma unroll
  for (int q = 0; q < W / 4; ++q) {
    const float four[4] = {copy[4 * q], copy[4 * q + 1], copy[4 * q + 2], copy[4 * q + 3]};
    if constexpr (S::kPairCopy) store_copy_pair<kCopyStore>(t.copy, i, four);
    else hg::gpu::store_vec<4, kCopyStore>(t.copy + i + 4 * q, four);
  }
}

// The aligned body [start, vector_end) of one chunk, W elements an access.
template <class S, class Scalars>
__device__ __forceinline__ void update_body(const TensorRef& t, int64_t start, int64_t vector_end, float clip,
                                            const Scalars& s, uint64_t policy) {
  constexpr int64_t kStride = int64_t(S::kWidth) * S::kThreads, kRound = kStride * S::kUnroll;
  using G = Group<S::kWidth>;
  auto load_round = [&](int64_t base, G(&a)[S::kUnroll]) {
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u)
      if (base + u * kStride < vector_end) load_group<S>(t, base + u * kStride, a[u], policy);
  };
  auto update_round = [&](int64_t base, G(&a)[S::kUnroll]) {
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u)
      if (base + u * kStride < vector_end) update_group<S>(t, base + u * kStride, a[u], clip, s);
  };
  int64_t base = start + int64_t(S::kWidth) * threadIdx.x;
  if constexpr (!S::kPipelined) {
    for (; base < vector_end; base += kRound) {
      G a[S::kUnroll];
      load_round(base, a);
      update_round(base, a);
    }
  } else {  // the next round's loads travel while this round is computed and stored
    G a[S::kUnroll];
    load_round(base, a);
    for (; base < vector_end; base += kRound) {
      G next[S::kUnroll];
      load_round(base + kRound, next);
      update_round(base, a);
#pragma unroll
      for (int u = 0; u < S::kUnroll; ++u) a[u] = next[u];
    }
  }
}

// chunk_adamw's contract with shape S: blocks stride over the chunks (one
// each when the grid has a block per chunk), the chunk's ends and unaligned
// tensors element by element as the product does.
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    candidate_adamw(const TensorRef* __restrict__ tensors, const Chunk* __restrict__ chunks, int chunk_count,
                    const double* __restrict__ state, float beta1, float beta2, float eps, float weight_decay) {
  if (state[hg::kAdamWSkipped] != 0.0) return;
  const float clip = static_cast<float>(state[hg::kAdamWClipScale]);
  const auto s = step_scalars<S::kMath>(state, beta1, beta2, eps, weight_decay);
  const uint64_t policy = load_policy<S::kLoad>();
  for (int c_index = blockIdx.x; c_index < chunk_count; c_index += gridDim.x) {
    const Chunk c = chunks[c_index];
    const TensorRef t = tensors[c.tensor];
    const int64_t end = c.start + S::kChunk < t.n ? c.start + S::kChunk : t.n;
    const int64_t vector_end = t.vec ? c.start + ((end - c.start) & ~int64_t(S::kWidth - 1)) : c.start;
    update_body<S>(t, c.start, vector_end, clip, s, policy);
    for (int64_t i = vector_end + threadIdx.x; i < end; i += S::kThreads) {
      float pi = t.p[i], mi = t.m[i], vi = t.v[i];
      element(__fmul_rn(t.g[i], clip), pi, mi, vi, s);
      t.m[i] = mi;
      t.v[i] = vi;
      t.p[i] = pi;
      if (t.copy) t.copy[i] = __float2bfloat16_rn(pi);
    }
  }
}

}  // namespace lab
