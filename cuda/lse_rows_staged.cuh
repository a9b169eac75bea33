#pragma once
// The classifier's row pass with the row staged in shared memory
// (cuda/cross_entropy_lse.cu launches it; docs/classifier.md): a block per
// row, each logit read from global memory once by a bulk copy
// (cuda/bulk_stage.cuh), then three passes over the shared copy: the max,
// the sum of exponentials shifted by it (ShiftedExpSum, cuda/reduce.cuh),
// and g written over the logits in 16-byte words. The shared copy sits at
// the row's own address mod 16 (cuda/row_span.hpp), so its words are
// aligned where the row's are.
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

// Two blocks of 512 share an SM (a bf16 row of 50304 takes 98 KiB of its 228).
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

// Every thread, given the row's stats: g over x from the complete shared
// copy s, and the row loss (returned to every thread).
template <class T>
__device__ __forceinline__ float write_staged_grad(const T* s, T* x, const RowSpan& span, int64_t vocab, int64_t target,
                                                   float scale, RowStats st) {
  constexpr int W = VecWidth<T>::value;
  const auto grad = [&](int64_t j, float v) { return softmax_grad_term((v - st.m) - st.log_s, j == target) * scale; };
  for (int64_t j = span.head + int64_t(W) * threadIdx.x; j < span.body_end; j += int64_t(W) * blockDim.x) {
    float v[W];
    load_vec<W>(s + j, v);
    if (target >= j && target < j + W) {  // one word of the row: expm1 there only
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = grad(j + k, v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = exp_approx((v[k] - st.m) - st.log_s) * scale;
    }
    store_vec<W>(x + j, v);
  }
  for_edges(span, vocab, [&](int64_t j) { x[j] = from_f<T>(grad(j, to_f(s[j]))); });
  return target == -2 ? NAN : st.log_s - (to_f(s[target >= 0 ? target : 0]) - st.m);
}

// Every thread, once the row's shared copy s is complete: the row's max,
// then log sum_j exp(x_j - max), each thread taking its 16-byte words, then
// its edge elements. Three passes over the copy (with g's) rather than one
// that keeps a running max and rescales its sum: with exponentials of one
// instruction (exp_approx) the independent terms run 6-7% faster
// (bench/lab/classifier.md).
template <class T>
__device__ __forceinline__ RowStats staged_row_stats(const T* s, const RowSpan& span, int64_t vocab, float* scratch) {
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
  ShiftedExpSum sum{m};
  for (int64_t j = first; j < span.body_end; j += stride) {
    float v[W];
    load_vec<W>(s + j, v);
#pragma unroll
    for (int k = 0; k < W; ++k) sum.add(v[k]);
  }
  for_edges(span, vocab, [&](int64_t j) { sum.add(to_f(s[j])); });
  return {m, sum.log_sum(scratch)};
}

// Every thread, once the row's shared copy s is complete: g over x, and the
// row loss (returned to every thread). The arithmetic of lse_rows_grad (m
// and log s apart, the terms equal to the max counted exactly, expm1 for
// the target); only the order in which the threads add the exponentials
// differs.
template <class T>
__device__ __forceinline__ float staged_row_grad(const T* s, T* x, const RowSpan& span, int64_t vocab, int64_t target,
                                                 float scale, float* scratch) {
  return write_staged_grad(s, x, span, vocab, target, scale, staged_row_stats(s, span, vocab, scratch));
}

// A block per row. Dynamic shared memory: staged_row_bytes(vocab).
template <class T>
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
  const float loss = staged_row_grad<T>(s, x, span, vocab, target, inv_count[0], scratch);
  if (threadIdx.x == 0) row_loss[row] = loss;
}

}  // namespace
}  // namespace hg::gpu
