#pragma once
// The classifier's row pass with the row staged in shared memory
// (cuda/cross_entropy_lse.cu launches them; docs/classifier.md): each
// logit read from global memory once, by bulk copies (cuda/bulk_stage.cuh),
// then max, sum of exponentials and g taken from the shared copy and g
// written over the logits in 16-byte words. lse_rows_grad_staged: a block
// per row. lse_rows_grad_ring: a block per SM walking its rows with two
// stages, the next row landing while the block works on the current one.
// The shared copy of a row sits at the row's own address mod 16
// (cuda/row_span.hpp), so its words are aligned where the row's are.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/reduce.cuh"
#include "cuda/row_span.hpp"
#include "cuda/storage_cast.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// -1: ignored row; -2: not a class (the loss becomes NaN); else the class.
__device__ __forceinline__ int64_t target_class(float t, int64_t vocab, int64_t ignore_index) {
  if (t == static_cast<float>(ignore_index)) return -1;
  if (!(t >= 0.f && t < static_cast<float>(vocab)) || t != floorf(t)) return -2;
  return static_cast<int64_t>(t);
}

// Both staged kernels run 512 threads: two per-row blocks share an SM (a
// bf16 row of 50304 takes 98 KiB of its 228), a ring block holds two rows.
constexpr int kStagedThreads = 512;

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

// The shared copy of row x in a stage: element j at the result's [j].
template <class T>
__device__ __forceinline__ T* stage_copy_of(unsigned char* stage, const T* x) {
  return reinterpret_cast<T*>(stage + reinterpret_cast<uintptr_t>(x) % 16);
}

template <class T>
__device__ __forceinline__ uint32_t body_bytes(const RowSpan& span) {
  return static_cast<uint32_t>((span.body_end - span.head) * int64_t(sizeof(T)));
}

// Every thread: an ignored row's g = 0, nothing read.
template <class T>
__device__ __forceinline__ void zero_row(T* x, const RowSpan& span, int64_t vocab) {
  constexpr int W = VecWidth<T>::value;
  const float zeros[W] = {};
  for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += int64_t(W) * blockDim.x)
    store_vec<W>(x + j, zeros);
  for_edges(span, vocab, [&](int64_t j) { x[j] = from_f<T>(0.f); });
}

// Thread 0: the row's body (16-byte words) into its shared copy s, counted
// against `bar`, whose current phase it completes.
template <class T>
__device__ __forceinline__ void issue_body(T* s, const T* x, const RowSpan& span, uint64_t* bar) {
  stage_expect(bar, body_bytes<T>(span));
  stage_copy(s + span.head, x + span.head, body_bytes<T>(span), bar);
}

// Every thread, once the row's shared copy s is complete: g over x, and the
// row loss (returned to every thread). SUMMING > 0: the sum of exponentials
// on the first SUMMING threads in lse_rows_grad's order (thread t: j = t,
// t + SUMMING, ...), so with SUMMING = its block size the values are bitwise
// lse_rows_grad's (the max and g do not depend on the order). SUMMING = 0:
// every thread sums its own 16-byte words (another order).
template <class T, int SUMMING>
__device__ __forceinline__ float staged_row_grad(const T* s, T* x, const RowSpan& span, int64_t vocab, int64_t target,
                                                 float scale, float* scratch) {
  constexpr int W = VecWidth<T>::value;
  const int64_t first = span.head + int64_t(W) * threadIdx.x, stride = int64_t(W) * blockDim.x;
  float m = -INFINITY;
  for (int64_t j = first; j < span.body_end; j += stride) {
    float v[W];
    load_vec<W>(s + j, v);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, v[k]);
  }
  for_edges(span, vocab, [&](int64_t j) { m = fmaxf(m, to_f(s[j])); });
  m = block_max(m, scratch);
  float log_s;
  if constexpr (SUMMING == 0) {
    ShiftedExpSum sum{m};
    for (int64_t j = first; j < span.body_end; j += stride) {
      float v[W];
      load_vec<W>(s + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) sum.add(v[k]);
    }
    for_edges(span, vocab, [&](int64_t j) { sum.add(to_f(s[j])); });
    log_s = sum.log_sum(scratch);
  } else {
    log_s = block_log_sum_exp_shifted(
        vocab, m, [&](int64_t j) { return to_f(s[j]); }, scratch, SUMMING);
  }
  const auto grad = [&](int64_t j, float v) {
    const float z = (v - m) - log_s;  // the target's p - 1 as expm1, as lse_backward
    return (j == target ? expm1f(z) : expf(z)) * scale;
  };
  for (int64_t j = first; j < span.body_end; j += stride) {
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
  return target == -2 ? NAN : log_s - (to_f(s[target >= 0 ? target : 0]) - m);
}

// A block per row. Dynamic shared memory: staged_row_bytes(vocab).
template <class T, int SUMMING>
__global__ void __launch_bounds__(kStagedThreads, 2)
    lse_rows_grad_staged(T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                         const float* __restrict__ inv_count, float* __restrict__ row_loss) {
  extern __shared__ __align__(128) unsigned char staged_row[];
  __shared__ float scratch[32];
  __shared__ uint64_t landed;
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const RowSpan span = row_span_of(x, vocab);
  const int64_t target = target_class(targets[row], vocab, ignore_index);  // the same for the whole block
  if (target == -1) {
    zero_row(x, span, vocab);
    if (threadIdx.x == 0) row_loss[row] = 0.f;
    return;
  }
  T* s = stage_copy_of(staged_row, x);
  const bool bulk = body_bytes<T>(span) > 0;
  if (threadIdx.x == 0 && bulk) stage_barrier_init(&landed);
  __syncthreads();  // the barrier is initialised before anyone waits on it
  if (threadIdx.x == 0 && bulk) issue_body(s, x, span, &landed);
  for_edges(span, vocab, [&](int64_t j) { s[j] = x[j]; });
  if (bulk) stage_wait(&landed, 0);
  __syncthreads();  // the edge elements too
  const float loss = staged_row_grad<T, SUMMING>(s, x, span, vocab, target, inv_count[0], scratch);
  if (threadIdx.x == 0) row_loss[row] = loss;
}

// A block per SM: rows blockIdx.x, + gridDim.x, ... through two stages of
// stage_bytes (staged_row_bytes(vocab)) in dynamic shared memory. Thread 0
// refills a stage with the row two ahead once every thread is done with it,
// so that row travels while the block works on the next. A stage's barrier
// completes a phase per bulk copy; every thread knows which rows had one
// (not ignored, a body of whole words), so it waits with the right parity.
template <class T, int SUMMING>
__global__ void __launch_bounds__(kStagedThreads, 1)
    lse_rows_grad_ring(T* logits, const float* __restrict__ targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                       const float* __restrict__ inv_count, float* __restrict__ row_loss, uint32_t stage_bytes) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ float scratch[32];
  __shared__ uint64_t landed[2];
  const int64_t step = gridDim.x;
  const float scale = inv_count[0];
  // Whether row r's body travels by bulk copy, and thread 0's copy of it into stage k.
  const auto travels = [&](int64_t r) {
    return r < rows && target_class(targets[r], vocab, ignore_index) != -1 &&
           body_bytes<T>(row_span_of(logits + r * vocab, vocab)) > 0;
  };
  const auto issue = [&](int k, int64_t r) {
    if (!travels(r)) return;
    T* x = logits + r * vocab;
    issue_body(stage_copy_of(stages + k * stage_bytes, x), x, row_span_of(x, vocab), &landed[k]);
  };
  if (threadIdx.x == 0) stage_barrier_init(&landed[0]), stage_barrier_init(&landed[1]);
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (threadIdx.x == 0) issue(0, blockIdx.x), issue(1, blockIdx.x + step);
  uint32_t parities = 0;  // bit k: the parity stage k's next wait takes
  int k = 0;
  for (int64_t row = blockIdx.x; row < rows; row += step, k ^= 1) {
    T* x = logits + row * vocab;
    const RowSpan span = row_span_of(x, vocab);
    const int64_t target = target_class(targets[row], vocab, ignore_index);
    if (target == -1) {
      zero_row(x, span, vocab);
      if (threadIdx.x == 0) row_loss[row] = 0.f;
    } else {
      T* s = stage_copy_of(stages + k * stage_bytes, x);
      for_edges(span, vocab, [&](int64_t j) { s[j] = x[j]; });
      if (body_bytes<T>(span) > 0) {
        stage_wait(&landed[k], (parities >> k) & 1u);
        parities ^= 1u << k;
      }
      __syncthreads();  // the edge elements too
      const float loss = staged_row_grad<T, SUMMING>(s, x, span, vocab, target, scale, scratch);
      if (threadIdx.x == 0) row_loss[row] = loss;
    }
    // The stage's shared writes (edges) ordered before the bulk copy that
    // refills it, and every thread's reads done first.
    fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) issue(k, row + 2 * step);
  }
}

}  // namespace
}  // namespace hg::gpu
