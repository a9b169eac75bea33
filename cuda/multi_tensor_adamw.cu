// Multi-tensor AdamW with global-norm clipping in 3 launches, whatever the
// number of tensors: (1) per-chunk sums of squares of the grads, (2) one
// block adds them in order and writes norm, clip scale, step count and bias
// corrections into the device state, (3) the AdamW update of every chunk,
// reading its scalars from that state. No host synchronisation, so the step
// can be captured in a CUDA graph. The math per element is adamw_element
// (cuda/adamw_math.cuh), which the per-tensor kernel shares, so results match
// that kernel bit for bit when no clipping happens.
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "cuda/adamw_math.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/optim_kernels.hpp"
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

// The device copy of one group's tensor table, built when the pointers change
// and kept (with its partial-sum buffer) for later steps and graph replays.
struct Table {
  TensorRef* tensors = nullptr;
  Chunk* chunks = nullptr;
  double* partials = nullptr;
  int chunk_count = 0;
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

template <class T>
T* upload(const std::vector<T>& host) {
  auto* dev = static_cast<T*>(allocate(host.size() * sizeof(T)));
  copy_bytes(dev, Device::CUDA, host.data(), Device::CPU, host.size() * sizeof(T));
  return dev;
}

// Tables are cached by their pointer lists and sizes and never freed (a
// captured graph may hold them): an optimizer reuses one for its whole life,
// so steps after the first upload nothing. Each costs ~16 bytes per chunk.
const Table& table_for(const std::vector<TensorRef>& refs) {
  static std::mutex mutex;
  static std::map<std::vector<uintptr_t>, Table> tables;
  std::vector<uintptr_t> key;
  for (const TensorRef& r : refs) {
    for (const void* ptr :
         {(const void*)r.p, (const void*)r.g, (const void*)r.m, (const void*)r.v, (const void*)r.copy})
      key.push_back(reinterpret_cast<uintptr_t>(ptr));
    key.push_back(static_cast<uintptr_t>(r.n));
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tables.find(key);
  if (it != tables.end()) return it->second;
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < refs.size(); ++i)
    for (int64_t start = 0; start < refs[i].n; start += kChunk) chunks.push_back({static_cast<int32_t>(i), start});
  Table t;
  t.chunk_count = static_cast<int>(chunks.size());
  if (t.chunk_count > 0) {
    t.tensors = upload(refs);
    t.chunks = upload(chunks);
    t.partials = static_cast<double*>(allocate(chunks.size() * sizeof(double)));
  }
  return tables.emplace(key, t).first->second;
}

void launch_sum_squares(const Table& t, double* out_state, const AdamWConfig* config) {
  if (t.chunk_count > 0) {
    chunk_sum_squares<<<t.chunk_count, kThreads, 0, stream()>>>(t.tensors, t.chunks, t.partials);
    HG_CUDA_CHECK_LAUNCH("chunk_sum_squares");
  }
  finish_step_scalars<<<1, kThreads, 0, stream()>>>(t.partials, t.chunk_count, out_state,
                                                    config ? config->max_grad_norm : 0.0, config ? config->beta1 : 0.0,
                                                    config ? config->beta2 : 0.0, config ? 1 : 0);
  HG_CUDA_CHECK_LAUNCH("finish_step_scalars");
}

}  // namespace

void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state) {
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const bool has_copy = !group.compute_copies.empty() && group.compute_copies[i].defined();
    TensorRef r{group.params[i].data<float>(),
                group.grads[i].data<float>(),
                group.m[i].data<float>(),
                group.v[i].data<float>(),
                has_copy ? static_cast<__nv_bfloat16*>(group.compute_copies[i].raw_data()) : nullptr,
                group.params[i].numel(),
                0};
    r.vec = aligned16(r.p) && aligned16(r.g) && aligned16(r.m) && aligned16(r.v) &&
            reinterpret_cast<uintptr_t>(r.copy) % 8 == 0;
    refs.push_back(r);
  }
  const Table& t = table_for(refs);
  launch_sum_squares(t, state.data<double>(), &config);
  if (t.chunk_count == 0) return;
  chunk_adamw<<<t.chunk_count, kThreads, 0, stream()>>>(
      t.tensors, t.chunks, state.data<double>(), static_cast<float>(config.beta1), static_cast<float>(config.beta2),
      static_cast<float>(config.eps), static_cast<float>(config.weight_decay));
  HG_CUDA_CHECK_LAUNCH("chunk_adamw");
}

double sum_of_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const Table& t = table_for({{nullptr, x, nullptr, nullptr, nullptr, n, aligned16(x)}});
  auto* total = static_cast<double*>(allocate(sizeof(double)));
  double result = 0.0;
  try {
    launch_sum_squares(t, total, nullptr);
    copy_bytes(&result, Device::CPU, total, Device::CUDA, sizeof(double));
  } catch (...) {
    release(total);
    throw;
  }
  release(total);
  return result;
}

void sum_of_squares_multi(const std::vector<Tensor>& xs, Tensor& out) {
  std::vector<TensorRef> refs;
  for (const Tensor& x : xs) {
    const float* g = x.data<float>();
    refs.push_back({nullptr, g, nullptr, nullptr, nullptr, x.numel(), aligned16(g)});
  }
  launch_sum_squares(table_for(refs), out.data<double>(), nullptr);
}

}  // namespace hg::gpu
