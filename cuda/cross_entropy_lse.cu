// Cross-entropy without saved probabilities (API and contract:
// cuda/cross_entropy_lse_kernels.hpp; the math: docs/cross_entropy.md).
// One block per row, any vocabulary size (threads stride over V, so V need
// not be a multiple of anything). The classifier's row pass also comes
// staged: the row read once into shared memory (cuda/lse_rows_staged.cuh,
// docs/classifier.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"
#include "cuda/lse_rows_staged.cuh"
#include "cuda/reduce.cuh"
#include "cuda/row_span.hpp"
#include "cuda/storage_cast.cuh"

namespace hg::gpu {
namespace {

constexpr int kRowThreads = 256;
constexpr int kSumThreads = 1024;

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
    dx[j] = from_f<T>(softmax_grad_term((to_f(x[j]) - m) - log_s, j == target) * scale);
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
    x[j] = from_f<T>(softmax_grad_term((to_f(x[j]) - m) - log_s, j == target) * scale);
  }
  if (threadIdx.x == 0) row_loss[row] = target == -2 ? NAN : log_s - (x_t - m);
}

// The longest staged row of T on this device (0: none; below sm_90 there
// are no bulk copies). Allows the kernel the most dynamic shared memory and
// prefers shared memory over L1, which it does not use.
template <class T>
int64_t staged_max_vocab() {
  static const int64_t max_vocab = [] {
    auto kernel = lse_rows_grad_staged<T>;
    if (!runs_sm90_code(kernel)) return int64_t{0};
    const size_t limit = allow_max_dynamic_smem(kernel);
    HG_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
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

int64_t cross_entropy_staged_min_vocab(DType dtype) {
  HG_CHECK(dtype == DType::BF16 || dtype == DType::F32, "cross_entropy_staged_min_vocab",
           "logits must be bf16 or f32, got ", dtype_name(dtype));
  return int64_t{kStagedThreads} * 16 / int64_t(dtype_size(dtype));
}

void cross_entropy_lse_rows_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& inv_count,
                                 Tensor& row_loss, RowPassKernel kernel) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const bool fits = vocab <= cross_entropy_staged_max_vocab(logits.dtype());
  HG_CHECK(kernel != RowPassKernel::Staged || fits, "cross_entropy_lse_rows_grad", "a staged row of ", vocab, " ",
           dtype_name(logits.dtype()), " elements does not fit in this device's shared memory (at most ",
           cross_entropy_staged_max_vocab(logits.dtype()), "); RowPassKernel::Best falls back to the strided kernel");
  if (rows == 0) return;
  with_logits_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* x = static_cast<T*>(logits.raw_data());
    const bool staged = kernel == RowPassKernel::Staged || (kernel == RowPassKernel::Best && fits &&
                                                            vocab >= cross_entropy_staged_min_vocab(logits.dtype()));
    if (staged) {
      lse_rows_grad_staged<T>
          <<<static_cast<unsigned>(rows), kStagedThreads, staged_row_bytes(vocab, int64_t(sizeof(T))), stream()>>>(
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
