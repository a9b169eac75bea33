#pragma once
// The kernels of the multi-tensor AdamW (cuda/multi_tensor_adamw.cu, which
// launches them; docs/multi_tensor_adamw.md): the tensor table's entries, the
// per-chunk sums of squares, the step scalars and the update. In a header so
// that the AdamW lab (bench/lab/adamw_lab.cu) compiles the very same kernels
// beside its candidates.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/backend.hpp"
#include "cuda/adamw_math.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;  // elements per block: 32 per thread

struct TensorRef {
  float* p;
  const float* g;
  float* m;
  float* v;
  __nv_bfloat16* copy;  // nullptr: no compute copy
  int64_t n;
  int vec;  // 1: p, g, m, v 16-byte aligned and copy 8-byte aligned, so chunks take 4 elements an access
};

struct Chunk {
  int32_t tensor;
  int64_t start;
};

// Block-wide sum in a fixed tree order; valid in thread 0.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Chunk c's elements of its tensor end at `end`; those before `vector_end`
// go 4 at a time (a multiple of 4 from the chunk's start, which is one too).
struct ChunkSpan {
  int64_t end, vector_end;
};
__device__ __forceinline__ ChunkSpan chunk_span(const TensorRef& t, const Chunk& c) {
  const int64_t end = c.start + kChunk < t.n ? c.start + kChunk : t.n;
  return {end, t.vec ? c.start + ((end - c.start) & ~int64_t(3)) : c.start};
}

// Each thread sums its own elements (4 an access where aligned), then the
// block adds the threads' sums in a fixed tree: the order depends only on the
// chunk, so the norm is the same bits every run.
__global__ void chunk_sum_squares(const TensorRef* __restrict__ tensors, const Chunk* __restrict__ chunks,
                                  double* __restrict__ partials) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  const auto [end, vec_end] = chunk_span(t, c);
  double acc = 0.0;
  for (int64_t i = c.start + 4 * threadIdx.x; i < vec_end; i += 4 * kThreads) {
    const float4 g = __ldcs(reinterpret_cast<const float4*>(t.g + i));
    acc += double(g.x) * g.x + double(g.y) * g.y + double(g.z) * g.z + double(g.w) * g.w;
  }
  for (int64_t i = vec_end + threadIdx.x; i < end; i += kThreads) {
    const double x = t.g[i];
    acc += x * x;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: the norm from the partials, then this step's scalars.
__global__ void finish_step_scalars(const double* __restrict__ partials, int count, double* __restrict__ state,
                                    double max_norm, double beta1, double beta2, int adamw) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x != 0) return;
  if (!adamw) {  // sum_of_squares: state is the (1,) output
    state[0] = acc;
    return;
  }
  const double norm = sqrt(acc);
  const double t = state[kAdamWStep] + 1.0;
  state[kAdamWStep] = t;
  state[kAdamWGradNorm] = norm;
  state[kAdamWSkipped] = isfinite(norm) ? 0.0 : 1.0;
  state[kAdamWClipScale] = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
  state[5] = 1.0 - pow(beta1, t);
  state[6] = 1.0 - pow(beta2, t);
}

// g * clip is exact when not clipping (clip = 1): unclipped steps are adamw_kernel's bits.
__device__ __forceinline__ void adamw_vec4(const TensorRef& t, int64_t i, float4 g, float4 p, float4 m, float4 v,
                                           float clip, const AdamWScalars& s) {
  adamw_element(__fmul_rn(g.x, clip), p.x, m.x, v.x, s);
  adamw_element(__fmul_rn(g.y, clip), p.y, m.y, v.y, s);
  adamw_element(__fmul_rn(g.z, clip), p.z, m.z, v.z, s);
  adamw_element(__fmul_rn(g.w, clip), p.w, m.w, v.w, s);
  __stcs(reinterpret_cast<float4*>(t.m + i), m);
  __stcs(reinterpret_cast<float4*>(t.v + i), v);
  __stcs(reinterpret_cast<float4*>(t.p + i), p);
  if (t.copy) {
    const float copy[4] = {p.x, p.y, p.z, p.w};
    store_vec<4, Store::Streaming>(t.copy + i, copy);
  }
}

// The update of one chunk. Aligned chunks take 16-byte accesses (a quarter of
// the memory instructions), each thread issuing the loads of kUnroll groups
// of 4 before any arithmetic, so that more bytes are in flight; the ends and
// unaligned tensors go one element at a time. Every element is read and
// written once, with evict-first hints: nothing reads them again in the step.
constexpr int kUnroll = 2;

__global__ void chunk_adamw(const TensorRef* __restrict__ tensors, const Chunk* __restrict__ chunks,
                            const double* __restrict__ state, float beta1, float beta2, float eps, float weight_decay) {
  if (state[kAdamWSkipped] != 0.0) return;
  const float clip = static_cast<float>(state[kAdamWClipScale]);
  const AdamWScalars s{
      static_cast<float>(state[kAdamWLr]), beta1, beta2, eps, weight_decay, static_cast<float>(state[5]),
      static_cast<float>(state[6])};
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  const auto [end, vec_end] = chunk_span(t, c);
  for (int64_t base = c.start + 4 * threadIdx.x; base < vec_end; base += 4 * kThreads * kUnroll) {
    float4 g[kUnroll], p[kUnroll], m[kUnroll], v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * 4 * kThreads;
      if (i < vec_end) {
        g[u] = __ldcs(reinterpret_cast<const float4*>(t.g + i));
        p[u] = __ldcs(reinterpret_cast<const float4*>(t.p + i));
        m[u] = __ldcs(reinterpret_cast<const float4*>(t.m + i));
        v[u] = __ldcs(reinterpret_cast<const float4*>(t.v + i));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * 4 * kThreads;
      if (i < vec_end) adamw_vec4(t, i, g[u], p[u], m[u], v[u], clip, s);
    }
  }
  for (int64_t i = vec_end + threadIdx.x; i < end; i += kThreads) {
    float pi = t.p[i], mi = t.m[i], vi = t.v[i];
    adamw_element(__fmul_rn(t.g[i], clip), pi, mi, vi, s);
    t.m[i] = mi;
    t.v[i] = vi;
    t.p[i] = pi;
    if (t.copy) t.copy[i] = __float2bfloat16_rn(pi);
  }
}

}  // namespace
}  // namespace hg::gpu
