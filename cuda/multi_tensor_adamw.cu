// Multi-tensor AdamW with global-norm clipping in 3 launches, whatever the
// number of tensors: (1) per-chunk sums of squares of the grads, (2) one
// block adds them in order and writes norm, clip scale, step count and bias
// corrections into the device state, (3) the AdamW update of every chunk,
// reading its scalars from that state. No host synchronisation, so the step
// can be captured in a CUDA graph. The math per element is adamw_kernel's
// (cuda/optim_kernels.cu), so results match the per-tensor kernel bit for bit
// when no clipping happens.
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/optim_kernels.hpp"

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

__global__ void chunk_sum_squares(const TensorRef* __restrict__ tensors, const Chunk* __restrict__ chunks,
                                  double* __restrict__ partials) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  const int64_t end = c.start + kChunk < t.n ? c.start + kChunk : t.n;
  double acc = 0.0;
  for (int64_t i = c.start + threadIdx.x; i < end; i += kThreads) {
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

__global__ void chunk_adamw(const TensorRef* __restrict__ tensors, const Chunk* __restrict__ chunks,
                            const double* __restrict__ state, float beta1, float beta2, float eps, float weight_decay) {
  if (state[kAdamWSkipped] != 0.0) return;
  const float lr = static_cast<float>(state[kAdamWLr]);
  const float scale = static_cast<float>(state[kAdamWClipScale]);
  const float bias_correction1 = static_cast<float>(state[5]), bias_correction2 = static_cast<float>(state[6]);
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  const int64_t end = c.start + kChunk < t.n ? c.start + kChunk : t.n;
  for (int64_t i = c.start + threadIdx.x; i < end; i += kThreads) {
    const float gi = t.g[i] * scale;  // x * 1.0f is exact: unclipped steps match adamw_kernel
    float pi = t.p[i];
    pi -= lr * weight_decay * pi;  // decoupled decay uses the pre-update value
    const float mi = beta1 * t.m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * t.v[i] + (1.0f - beta2) * gi * gi;
    t.m[i] = mi;
    t.v[i] = vi;
    pi -= lr * (mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps);
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
    refs.push_back({group.params[i].data<float>(), group.grads[i].data<float>(), group.m[i].data<float>(),
                    group.v[i].data<float>(),
                    has_copy ? static_cast<__nv_bfloat16*>(group.compute_copies[i].raw_data()) : nullptr,
                    group.params[i].numel()});
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
  const Table& t = table_for({{nullptr, x, nullptr, nullptr, nullptr, n}});
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
  for (const Tensor& x : xs) refs.push_back({nullptr, x.data<float>(), nullptr, nullptr, nullptr, x.numel()});
  launch_sum_squares(table_for(refs), out.data<double>(), nullptr);
}

}  // namespace hg::gpu
