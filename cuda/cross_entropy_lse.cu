// Cross-entropy without saved probabilities (API and contract:
// cuda/cross_entropy_lse_kernels.hpp; the math: docs/cross_entropy.md).
// One block per row, any vocabulary size (threads stride over V, so V need
// not be a multiple of anything). The classifier's row pass also comes
// staged: the row read once into shared memory (docs/classifier.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/bulk_stage.cuh"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"
#include "cuda/reduce.cuh"
#include "cuda/row_span.hpp"
#include "cuda/storage_cast.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

constexpr int kRowThreads = 256;
constexpr int kSumThreads = 1024;

// -1: ignored row; -2: not a class (the loss becomes NaN); else the class.
__device__ __forceinline__ int64_t target_class(float t, int64_t vocab, int64_t ignore_index) {
  if (t == static_cast<float>(ignore_index)) return -1;
  if (!(t >= 0.f && t < static_cast<float>(vocab)) || t != floorf(t)) return -2;
  return static_cast<int64_t>(t);
}

// row_loss[row] = log s - (x[target] - m); counted[row] = 1 unless ignored.
template <class T>
__global__ void lse_rows(const T* __restrict__ logits, const float* __restrict__ targets, int64_t vocab,
                         int64_t ignore_index, float* __restrict__ row_stats, float* __restrict__ row_loss,
                         float* __restrict__ counted) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const int64_t target = target_class(targets[row], vocab, ignore_index);  // the same for the whole block
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, to_f(x[j]));
  m = block_max(m, scratch);
  // m and log s are kept apart: m + log s would round to the ulp of m.
  const float log_s = block_log_sum_exp_shifted(
      vocab, m, [&](int64_t j) { return to_f(x[j]); }, scratch);
  if (threadIdx.x != 0) return;
  row_stats[2 * row] = m;
  row_stats[2 * row + 1] = log_s;
  counted[row] = target == -1 ? 0.f : 1.f;
  row_loss[row] = target == -1 ? 0.f : target == -2 ? NAN : log_s - (to_f(x[target]) - m);
}

// One block: fixed-order sums of the row losses and the counted rows.
__global__ void lse_finish(const float* __restrict__ row_loss, const float* __restrict__ counted, int64_t rows,
                           float* __restrict__ loss, float* __restrict__ inv_count) {
  __shared__ float scratch[32];
  float acc = 0.f, n = 0.f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    acc += row_loss[i];
    n += counted[i];
  }
  acc = block_sum(acc, scratch);
  n = block_sum(n, scratch);  // exact: integers below 2^24
  if (threadIdx.x == 0) {
    const float inv = n > 0.f ? 1.f / n : 0.f;
    loss[0] = acc * inv;
    inv_count[0] = inv;
  }
}

// dlogits may be logits itself (cross_entropy_backward_over_logits): each
// element is read once and written once, by the same thread, so neither
// pointer is __restrict__.
template <class T>
__global__ void lse_backward(const T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                             const float* __restrict__ row_stats, const float* __restrict__ inv_count, float dloss,
                             T* dlogits) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  T* dx = dlogits + row * vocab;
  const int64_t target = target_class(targets[row], vocab, ignore_index);
  const float scale = target == -1 ? 0.f : inv_count[0] * dloss;
  const float m = row_stats[2 * row], log_s = row_stats[2 * row + 1];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    // The target's p - 1 as expm1: exact where p rounds to 1 (a confident row).
    const float z = (to_f(x[j]) - m) - log_s;
    dx[j] = from_f<T>((j == target ? expm1f(z) : expf(z)) * scale);
  }
}

// The classifier's row pass: lse_rows and lse_backward in one kernel, the
// gradient written over the logits. Thread 0 reads x_t before the block's
// reductions, whose barriers every thread passes before any element is
// overwritten.
template <class T>
__global__ void lse_rows_grad(T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                              const float* __restrict__ inv_count, float* __restrict__ row_loss) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const int64_t target = target_class(targets[row], vocab, ignore_index);  // the same for the whole block
  if (target == -1) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) x[j] = from_f<T>(0.f);
    if (threadIdx.x == 0) row_loss[row] = 0.f;
    return;
  }
  const float x_t = target >= 0 && threadIdx.x == 0 ? to_f(x[target]) : 0.f;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, to_f(x[j]));
  m = block_max(m, scratch);
  const float log_s = block_log_sum_exp_shifted(
      vocab, m, [&](int64_t j) { return to_f(x[j]); }, scratch);
  const float scale = inv_count[0];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float z = (to_f(x[j]) - m) - log_s;  // the target's p - 1 as expm1, as lse_backward
    x[j] = from_f<T>((j == target ? expm1f(z) : expf(z)) * scale);
  }
  if (threadIdx.x == 0) row_loss[row] = target == -2 ? NAN : log_s - (x_t - m);
}

// ---- the staged row pass --------------------------------------------------------------

// Two blocks of 512 share an SM (a bf16 row of 50304 takes 98 KiB of its
// 228). The sum of exponentials runs on the first kRowThreads threads in
// lse_rows_grad's order, so the staged pass gives its bits; the max and g
// passes, whose results do not depend on the order, use every thread.
// ALL_SUM (RowPassKernel::StagedAllThreads) sums on every thread instead,
// 16-byte words at a time: another order, so other bits in the last places.
constexpr int kStagedThreads = 512;
static_assert(kStagedThreads % kRowThreads == 0, "the summing threads are a prefix of the block");

template <class T>
__device__ __forceinline__ RowSpan row_span_of(const T* x, int64_t vocab) {
  return row_span(reinterpret_cast<uintptr_t>(x), vocab, sizeof(T));
}

// f(j) for every element j of the row that is not in the body, a thread each.
template <class F>
__device__ __forceinline__ void for_edges(const RowSpan& span, int64_t vocab, F&& f) {
  if (threadIdx.x < span.head) f(static_cast<int64_t>(threadIdx.x));
  if (span.body_end + threadIdx.x < vocab) f(span.body_end + threadIdx.x);
}

// lse_rows_grad with the row read from global memory once: a bulk copy
// (cuda/bulk_stage.cuh) lands the row's 16-byte words in shared memory (the
// few edge elements of a row that is not 16-byte aligned are loaded one by
// one), the max, sum and g passes read that copy, and g is written over the
// logits in 16-byte words. The shared copy sits at the row's own offset mod
// 16, so its words are aligned where the row's are. Values: bitwise
// lse_rows_grad's (max and g do not depend on the order; the sums run in its
// order, see kStagedThreads). Dynamic shared memory: staged_row_bytes
// (cuda/row_span.hpp).
template <class T, bool ALL_SUM>
__global__ void __launch_bounds__(kStagedThreads, 2)
    lse_rows_grad_staged(T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                         const float* __restrict__ inv_count, float* __restrict__ row_loss) {
  constexpr int W = VecWidth<T>::value;
  extern __shared__ __align__(128) unsigned char staged_row[];
  __shared__ float scratch[32];
  __shared__ uint64_t landed;
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const RowSpan span = row_span_of(x, vocab);
  const int64_t stride = int64_t(W) * blockDim.x;
  const int64_t target = target_class(targets[row], vocab, ignore_index);  // the same for the whole block
  if (target == -1) {
    const float zeros[W] = {};
    for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += stride) store_vec<W>(x + j, zeros);
    for_edges(span, vocab, [&](int64_t j) { x[j] = from_f<T>(0.f); });
    if (threadIdx.x == 0) row_loss[row] = 0.f;
    return;
  }
  T* s = reinterpret_cast<T*>(staged_row + reinterpret_cast<uintptr_t>(x) % 16);  // element j of the row: s[j]
  const auto body_bytes = static_cast<uint32_t>((span.body_end - span.head) * int64_t(sizeof(T)));
  if (threadIdx.x == 0 && body_bytes > 0) stage_barrier_init(&landed);
  __syncthreads();  // the barrier is initialised before anyone waits on it
  if (threadIdx.x == 0 && body_bytes > 0) {
    stage_expect(&landed, body_bytes);
    stage_copy(s + span.head, x + span.head, body_bytes, &landed);
  }
  for_edges(span, vocab, [&](int64_t j) { s[j] = x[j]; });
  if (body_bytes > 0) stage_wait(&landed, 0);
  __syncthreads();  // the edge elements too

  float m = -INFINITY;
  for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += stride) {
    float v[W];
    load_vec<W>(s + j, v);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, v[k]);
  }
  for_edges(span, vocab, [&](int64_t j) { m = fmaxf(m, to_f(s[j])); });
  m = block_max(m, scratch);
  float log_s;
  if constexpr (ALL_SUM) {
    ShiftedExpSum sum{m};
    for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += stride) {
      float v[W];
      load_vec<W>(s + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) sum.add(v[k]);
    }
    for_edges(span, vocab, [&](int64_t j) { sum.add(to_f(s[j])); });
    log_s = sum.log_sum(scratch);
  } else {
    log_s = block_log_sum_exp_shifted(
        vocab, m, [&](int64_t j) { return to_f(s[j]); }, scratch, kRowThreads);
  }
  const float scale = inv_count[0];
  const auto grad = [&](int64_t j, float v) {
    const float z = (v - m) - log_s;  // the target's p - 1 as expm1, as lse_backward
    return (j == target ? expm1f(z) : expf(z)) * scale;
  };
  for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += stride) {
    float v[W];
    load_vec<W>(s + j, v);
    if (target >= j && target < j + W) {  // one word of the row: expm1 there only
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = grad(j + k, v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = expf((v[k] - m) - log_s) * scale;
    }
    store_vec<W>(x + j, v);
  }
  for_edges(span, vocab, [&](int64_t j) { x[j] = from_f<T>(grad(j, to_f(s[j]))); });
  if (threadIdx.x == 0) row_loss[row] = target == -2 ? NAN : log_s - (to_f(s[target >= 0 ? target : 0]) - m);
}

// The longest staged row of T on this device (0: none; below sm_90 there
// are no bulk copies). Allows the kernel the most dynamic shared memory and
// prefers shared memory over L1, which it does not use.
template <class T>
int64_t staged_max_vocab() {
  static const int64_t max_vocab = [] {
    size_t limit = SIZE_MAX;
    for (auto kernel : {lse_rows_grad_staged<T, false>, lse_rows_grad_staged<T, true>}) {
      if (!runs_sm90_code(kernel)) return int64_t{0};
      limit = std::min(limit, allow_max_dynamic_smem(kernel));
      HG_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    }
    return limit > 32 ? static_cast<int64_t>((limit - 32) / sizeof(T)) : int64_t{0};
  }();
  return max_vocab;
}

__global__ void count_targets(const float* __restrict__ targets, int64_t rows, int64_t ignore_index,
                              float* __restrict__ inv_count) {
  __shared__ float scratch[32];
  float n = 0.f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) n += targets[i] != static_cast<float>(ignore_index);
  n = block_sum(n, scratch);
  if (threadIdx.x == 0) inv_count[0] = n > 0.f ? 1.f / n : 0.f;
}

__global__ void sum_row_losses(const float* __restrict__ row_loss, int64_t rows, const float* __restrict__ inv_count,
                               float* __restrict__ loss) {
  __shared__ float scratch[32];
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) acc += row_loss[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) loss[0] = acc * inv_count[0];
}

template <class F>
void with_logits_type(DType dtype, F&& f) {
  if (dtype == DType::F32) f(float{});
  else f(__nv_bfloat16{});
}

}  // namespace

void cross_entropy_lse_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& row_stats,
                               Tensor& loss, Tensor& inv_count) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  Tensor scratch = Tensor::empty({2, rows}, DType::F32, Device::CUDA);  // row losses, counted flags
  float* row_loss = scratch.data<float>();
  if (rows > 0) {
    with_logits_type(logits.dtype(), [&](auto zero) {
      using T = decltype(zero);
      lse_rows<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
          static_cast<const T*>(logits.raw_data()), targets.data<float>(), vocab, ignore_index, row_stats.data<float>(),
          row_loss, row_loss + rows);
      HG_CUDA_CHECK_LAUNCH("lse_rows");
    });
  }
  lse_finish<<<1, kSumThreads, 0, stream()>>>(row_loss, row_loss + rows, rows, loss.data<float>(),
                                              inv_count.data<float>());
  HG_CUDA_CHECK_LAUNCH("lse_finish");
}

void cross_entropy_lse_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                const Tensor& row_stats, const Tensor& inv_count, float dloss, Tensor& dlogits) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return;
  with_logits_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    lse_backward<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
        static_cast<const T*>(logits.raw_data()), targets.data<float>(), vocab, ignore_index, row_stats.data<float>(),
        inv_count.data<float>(), dloss, static_cast<T*>(dlogits.raw_data()));
    HG_CUDA_CHECK_LAUNCH("lse_backward");
  });
}

void cross_entropy_count_targets(const Tensor& targets, int64_t ignore_index, Tensor& inv_count) {
  count_targets<<<1, kSumThreads, 0, stream()>>>(targets.data<float>(), targets.numel(), ignore_index,
                                                 inv_count.data<float>());
  HG_CUDA_CHECK_LAUNCH("count_targets");
}

int64_t cross_entropy_staged_max_vocab(DType dtype) {
  int64_t n = 0;
  with_logits_type(dtype, [&](auto zero) { n = staged_max_vocab<decltype(zero)>(); });
  return n;
}

void cross_entropy_lse_rows_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& inv_count,
                                 Tensor& row_loss, RowPassKernel kernel) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const bool fits = vocab <= cross_entropy_staged_max_vocab(logits.dtype());
  HG_CHECK(kernel == RowPassKernel::Best || kernel == RowPassKernel::Strided || fits, "cross_entropy_lse_rows_grad",
           "a staged row of ", vocab, " ", dtype_name(logits.dtype()),
           " elements does not fit in this device's shared memory (at most ",
           cross_entropy_staged_max_vocab(logits.dtype()), "); RowPassKernel::Best falls back to the strided kernel");
  if (rows == 0) return;
  with_logits_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* x = static_cast<T*>(logits.raw_data());
    if (fits && kernel != RowPassKernel::Strided) {
      auto staged =
          kernel == RowPassKernel::StagedAllThreads ? lse_rows_grad_staged<T, true> : lse_rows_grad_staged<T, false>;
      staged<<<static_cast<unsigned>(rows), kStagedThreads, staged_row_bytes(vocab, int64_t(sizeof(T))), stream()>>>(
          x, targets.data<float>(), vocab, ignore_index, inv_count.data<float>(), row_loss.data<float>());
      HG_CUDA_CHECK_LAUNCH("lse_rows_grad_staged");
      return;
    }
    lse_rows_grad<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
        x, targets.data<float>(), vocab, ignore_index, inv_count.data<float>(), row_loss.data<float>());
    HG_CUDA_CHECK_LAUNCH("lse_rows_grad");
  });
}

void cross_entropy_sum_row_losses(const Tensor& row_loss, const Tensor& inv_count, Tensor& loss) {
  sum_row_losses<<<1, kSumThreads, 0, stream()>>>(row_loss.data<float>(), row_loss.numel(), inv_count.data<float>(),
                                                  loss.data<float>());
  HG_CUDA_CHECK_LAUNCH("sum_row_losses");
}

}  // namespace hg::gpu
