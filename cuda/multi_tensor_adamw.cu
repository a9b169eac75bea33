// Multi-tensor AdamW with global-norm clipping in 3 launches, whatever the
// number of tensors: (1) per-chunk sums of squares of the grads, (2) one
// block adds them in order and writes norm, clip scale, step count and bias
// corrections into the device state, (3) the AdamW update of every chunk,
// reading its scalars from that state. No host synchronisation, so the step
// can be captured in a CUDA graph. The math per element is adamw_element
// (cuda/adamw_math.cuh), which the per-tensor kernel shares, so results match
// that kernel bit for bit when no clipping happens. The kernels are in
// cuda/multi_tensor_adamw_kernel.cuh, which bench/lab/adamw_lab.cu shares.
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/multi_tensor_adamw_kernel.cuh"
#include "cuda/optim_kernels.hpp"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// The device copy of one group's tensor table, built when the pointers change
// and kept (with its partial-sum buffer) for later steps and graph replays.
struct Table {
  TensorRef* tensors = nullptr;
  Chunk* chunks = nullptr;
  double* partials = nullptr;
  int chunk_count = 0;
};

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
