#pragma once
// The classifier row pass's lab candidates (bench/lab/classifier_lab.cu,
// bench/lab/classifier.md). Every one keeps the contract of the product's
// lse_rows_grad_staged (cuda/lse_rows_staged.cuh, included here, not
// copied): g = (softmax - onehot(target)) * scale written over the logits,
// row_loss per row, ignored rows zeroed with loss 0, NaN loss for a target
// that is not a class, any row alignment (cuda/row_span.hpp). The product
// takes the max, then the sum of exponentials shifted by it, then g, in
// three passes over the shared copy; the candidates differ in how the stats
// are formed or how the work of a row is laid out:
//   one_pass        the max and the sum in one pass, each thread keeping a
//                   running max and rescaling its sum (bench/lab/online_exp_sum.hpp).
//   pieces          one_pass with the row copied in P pieces with a barrier
//                   each, so the stats pass starts on piece 0 while the rest land.
//   persistent      one block per SM walks rows blockIdx.x, + gridDim.x, ...
//                   through two stages: the next row's bulk copy travels while
//                   the current row is reduced (the product's passes) and its
//                   g stored.
//   bias_stage      the product's kernel with the head's bias added to the
//                   shared copy once it lands (U words of bias loaded per
//                   thread before any is added), so the head's forward GEMM
//                   could run without its bias epilogue.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "bench/lab/online_exp_sum.hpp"
#include "cuda/bulk_stage.cuh"
#include "cuda/lse_rows_staged.cuh"
#include "cuda/wgmma.cuh"  // sm90::barrier_wait on an sm_90a build

namespace lab {

using hg::gpu::RowSpan;
using hg::gpu::VecWidth;

constexpr int kMaxPieces = 8;

// Waits for the phase of `parity`; on an sm_90a build a phase that never
// completes traps after two seconds (a launch error, not a hang).
__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
#if HG_SM90A_DEVICE
  hg::gpu::sm90::barrier_wait(bar, parity);
#else
  hg::gpu::stage_wait(bar, parity);
#endif
}

// A thread that wrote a stage's bytes (its edge elements) through the
// generic proxy: orders those writes before a later bulk copy (the async
// proxy) into the same stage, once the block has synchronised.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

using hg::gpu::RowStats;

// The body's 16-byte words.
template <class T>
__device__ __forceinline__ int64_t body_words(const RowSpan& span) {
  return (span.body_end - span.head) / VecWidth<T>::value;
}

// This thread's 16-byte words of the body of the shared copy s in [w0, w1)
// (word 0 at span.head) into its share: words w0 + threadIdx.x, + blockDim.x, ...
template <class T>
__device__ __forceinline__ void add_body_words(OnlineExpSum& share, const T* s, const RowSpan& span, int64_t w0,
                                               int64_t w1) {
  constexpr int W = VecWidth<T>::value;
  for (int64_t w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
    float v[W];
    hg::gpu::load_vec<W>(s + span.head + w * W, v);
    share.add(v);
  }
}

// Every thread: an ignored row (target -1) gets g = 0 and loss 0; whether it was one.
template <class T>
__device__ __forceinline__ bool ignored_row_zeroed(T* x, const RowSpan& span, int64_t vocab, int64_t target,
                                                   float* loss) {
  if (target != -1) return false;
  hg::gpu::zero_row(x, span, vocab);
  if (threadIdx.x == 0) *loss = 0.f;
  return true;
}

// A block per row as production (512 threads, two blocks an SM, one staged
// row of dynamic shared memory), the body copied in `pieces` (1..kMaxPieces)
// nearly equal runs of 16-byte words, each counted against its own barrier;
// the one-pass stats take each piece as it lands, then the product's g
// pass. One piece: one_pass.
template <class T>
__global__ void __launch_bounds__(hg::gpu::kStagedThreads, 2)
    lse_rows_grad_pieces(T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                         const float* __restrict__ inv_count, float* __restrict__ row_loss, int pieces) {
  extern __shared__ __align__(128) unsigned char staged_row[];
  __shared__ float scratch[32];
  __shared__ uint64_t landed[kMaxPieces];
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const RowSpan span = hg::gpu::row_span_of(x, vocab);
  const int64_t target = hg::gpu::target_class(targets[row], vocab, ignore_index);
  if (ignored_row_zeroed(x, span, vocab, target, row_loss + row)) return;
  constexpr int W = VecWidth<T>::value;
  T* s = hg::gpu::stage_copy_of(staged_row, x);
  const int64_t words = body_words<T>(span);
  const auto first_word = [&](int p) { return words * p / pieces; };
  if (threadIdx.x == 0)
    for (int p = 0; p < pieces; ++p) hg::gpu::stage_barrier_init(&landed[p]);
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (threadIdx.x == 0) {
    for (int p = 0; p < pieces; ++p) {
      const int64_t at = span.head + first_word(p) * W;
      const auto bytes = static_cast<uint32_t>((first_word(p + 1) - first_word(p)) * 16);
      hg::gpu::stage_expect(&landed[p], bytes);  // 0 bytes: the phase completes here
      if (bytes > 0) hg::gpu::stage_copy(s + at, x + at, bytes, &landed[p]);
    }
  }
  OnlineExpSum share;
  hg::gpu::for_edges(span, vocab, [&](int64_t j) {
    const T v = x[j];
    s[j] = v;  // read back by this same thread in the g pass
    share.add(hg::gpu::to_f(v));
  });
  for (int p = 0; p < pieces; ++p) {
    wait_phase(&landed[p], 0);
    add_body_words(share, s, span, first_word(p), first_word(p + 1));
  }
  const float loss =
      hg::gpu::write_staged_grad(s, x, span, vocab, target, inv_count[0], block_row_stats(share, scratch));
  if (threadIdx.x == 0) row_loss[row] = loss;
}

// The at most two edge elements (for_edges' mapping) a thread stages for a
// row, held in registers from their load, issued early, to their store into
// the row's stage an iteration later.
template <class T>
struct EdgeCarry {
  T head{}, tail{};
  __device__ __forceinline__ void load(const T* x, const RowSpan& span, int64_t vocab) {
    if (threadIdx.x < span.head) head = x[threadIdx.x];
    if (span.body_end + threadIdx.x < vocab) tail = x[span.body_end + threadIdx.x];
  }
  __device__ __forceinline__ void store(T* s, const RowSpan& span, int64_t vocab) const {
    const bool has_head = threadIdx.x < span.head, has_tail = span.body_end + threadIdx.x < vocab;
    if (has_head) s[threadIdx.x] = head;
    if (has_tail) s[span.body_end + threadIdx.x] = tail;
    if (has_head || has_tail) fence_proxy_async();
  }
};

// One block of THREADS per SM (grid: a launch choice), rows blockIdx.x +
// k gridDim.x for k = 0, 1, ... through a StageRing of 2 stages of
// stage_bytes (staged_row_bytes) each. Use k of the ring is row k's copy:
// every row, ignored ones too, is copied and waited for, so the phase of
// stage k % 2 is always k / 2 and no copy is still landing when its stage is
// refilled. Iteration k: a barrier (row k's edges are in, every read of row
// k - 1's stage is done), row k + 1 issued into that stage, row k waited for
// and computed (the product's staged_row_grad), row k + 1's edges stored.
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS, 1)
    lse_rows_grad_persistent(T* logits, const float* __restrict__ targets, int64_t vocab, int64_t ignore_index,
                             const float* __restrict__ inv_count, float* __restrict__ row_loss, int64_t rows,
                             uint32_t stage_bytes) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ float scratch[32];
  __shared__ uint64_t bars[2];
  const hg::gpu::StageRing<2> ring{bars};
  if (int64_t(blockIdx.x) >= rows) return;
  const auto row_of = [&](int64_t k) { return int64_t(blockIdx.x) + k * int64_t(gridDim.x); };
  const auto stage_of = [&](int64_t k) {
    return hg::gpu::stage_copy_of(stages + ring.stage(k) * stage_bytes, logits + row_of(k) * vocab);
  };
  const auto issue = [&](int64_t k) {  // thread 0: use k, row_of(k)'s body
    const T* x = logits + row_of(k) * vocab;
    const RowSpan span = hg::gpu::row_span_of(x, vocab);
    const uint32_t bytes = hg::gpu::body_bytes<T>(span);
    uint64_t* bar = ring.arm(k, bytes);  // 0 bytes (no body): the phase completes here
    if (bytes > 0) hg::gpu::stage_copy(stage_of(k) + span.head, x + span.head, bytes, bar);
  };
  if (threadIdx.x == 0) ring.init();
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (threadIdx.x == 0) issue(0);
  EdgeCarry<T> edges;
  {
    const T* x0 = logits + row_of(0) * vocab;
    edges.load(x0, hg::gpu::row_span_of(x0, vocab), vocab);
    edges.store(stage_of(0), hg::gpu::row_span_of(x0, vocab), vocab);
  }
  const float scale = inv_count[0];
  float next_target = targets[row_of(0)];
  for (int64_t k = 0; row_of(k) < rows; ++k) {
    const int64_t row = row_of(k);
    const float target_value = next_target;
    __syncthreads();  // row k's edges are in its stage; every read of the other stage (row k - 1) is done
    const bool more = row_of(k + 1) < rows;
    if (more) {
      if (threadIdx.x == 0) issue(k + 1);
      const T* xn = logits + row_of(k + 1) * vocab;
      edges.load(xn, hg::gpu::row_span_of(xn, vocab), vocab);
      next_target = targets[row_of(k + 1)];  // loaded now, used next iteration
    }
    T* x = logits + row * vocab;
    const RowSpan span = hg::gpu::row_span_of(x, vocab);
    const int64_t target = hg::gpu::target_class(target_value, vocab, ignore_index);
    wait_phase(bars + ring.stage(k), static_cast<uint32_t>((k / 2) & 1));  // StageRing's parity of use k
    float loss = 0.f;
    if (target == -1) hg::gpu::zero_row(x, span, vocab);
    else loss = hg::gpu::staged_row_grad<T>(stage_of(k), x, span, vocab, target, scale, scratch);
    if (threadIdx.x == 0) row_loss[row] = loss;
    if (more) {
      const T* xn = logits + row_of(k + 1) * vocab;
      edges.store(stage_of(k + 1), hg::gpu::row_span_of(xn, vocab), vocab);
    }
  }
}

// How bias_stage orders and loads a thread's bias words.
enum class BiasOrder {
  Same,     // every block from the row's first word: all SMs read the same bias lines at once
  Rotated,  // each block from its own word (blockIdx.x * 613 mod the words), wrapping around
  None,     // no bias loads: only the extra pass over the shared copy (adds zeros)
};

// The product's lse_rows_grad_staged with bias[j] added to the shared copy
// (float32 sum rounded to T) before the passes. Each thread loads U of its
// bias words before adding any, so U loads from L2 are in flight at once.
template <class T, int U, BiasOrder Order>
__global__ void __launch_bounds__(hg::gpu::kStagedThreads, 2)
    lse_rows_grad_bias_stage(T* logits, const T* __restrict__ bias, const float* __restrict__ targets, int64_t vocab,
                             int64_t ignore_index, const float* __restrict__ inv_count, float* __restrict__ row_loss) {
  extern __shared__ __align__(128) unsigned char staged_row[];
  __shared__ float scratch[32];
  __shared__ uint64_t landed;
  constexpr int W = VecWidth<T>::value;
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const RowSpan span = hg::gpu::row_span_of(x, vocab);
  const int64_t target = hg::gpu::target_class(targets[row], vocab, ignore_index);
  if (ignored_row_zeroed(x, span, vocab, target, row_loss + row)) return;
  T* s = hg::gpu::stage_copy_of(staged_row, x);
  const bool bulk = hg::gpu::body_bytes<T>(span) > 0;
  if (threadIdx.x == 0 && bulk) hg::gpu::stage_barrier_init(&landed);
  __syncthreads();
  if (threadIdx.x == 0 && bulk) hg::gpu::issue_body(s, x, span, &landed);
  hg::gpu::for_edges(span, vocab,
                     [&](int64_t j) { s[j] = hg::gpu::from_f<T>(hg::gpu::to_f(x[j]) + hg::gpu::to_f(bias[j])); });
  const bool words = (reinterpret_cast<uintptr_t>(bias) - reinterpret_cast<uintptr_t>(x)) % 16 == 0;
  const int64_t n_words = (span.body_end - span.head) / W;
  const int64_t rot = Order == BiasOrder::Rotated && n_words > 0 ? int64_t(blockIdx.x) * 613 % n_words : 0;
  // Element index of the thread's word w (w < n_words), rotated by rot.
  const auto word_at = [&](int64_t w) { return span.head + W * (w + rot < n_words ? w + rot : w + rot - n_words); };
  if (bulk) hg::gpu::stage_wait(&landed, 0);
  for (int64_t w0 = threadIdx.x; w0 < n_words; w0 += U * int64_t(blockDim.x)) {
    float b[U][W] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t w = w0 + u * int64_t(blockDim.x);
      if (Order == BiasOrder::None || w >= n_words) break;
      const int64_t j = word_at(w);
      if (words) {
        hg::gpu::load_vec<W, hg::gpu::Load::ReadOnly>(bias + j, b[u]);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) b[u][k] = hg::gpu::to_f(bias[j + k]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t w = w0 + u * int64_t(blockDim.x);
      if (w >= n_words) break;
      const int64_t j = word_at(w);
      float v[W];
      hg::gpu::load_vec<W>(s + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] += b[u][k];
      hg::gpu::store_vec<W>(s + j, v);
    }
  }
  __syncthreads();  // the edges and every word biased
  const float loss = hg::gpu::staged_row_grad<T>(s, x, span, vocab, target, inv_count[0], scratch);
  if (threadIdx.x == 0) row_loss[row] = loss;
}

}  // namespace lab
