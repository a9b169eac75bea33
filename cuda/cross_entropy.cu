// Fused log-softmax + NLL (see ops/cross_entropy.hpp, docs/cross_entropy.md).
#include <cmath>
#include <memory>

#include "core/cuda_runtime.hpp"
#include "cuda/cross_entropy_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/reduce.cuh"

namespace hg::gpu {
namespace {

constexpr int kRowThreads = 256;
constexpr int kSumThreads = 1024;

// One block per row: max, sum of exp, then the gradient row and the row loss.
__global__ void cross_entropy_rows_kernel(const float* __restrict__ logits, const float* __restrict__ targets,
                                          int64_t vocab, int64_t ignore_index, float inv_count,
                                          float* __restrict__ dlogits, float* __restrict__ row_loss) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  float* dx = dlogits + row * vocab;
  const int64_t target = static_cast<int64_t>(targets[row]);
  if (target == ignore_index) {  // same for the whole block: no barrier is skipped by only some threads
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) dx[j] = 0.0f;
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m, scratch);
  // Work relative to the max: x - m is exact for nearby logits, while
  // m + log(s) would round to the ulp of m (large offsets lose digits).
  const float log_s = block_log_sum_exp_shifted(
      vocab, m, [&](int64_t j) { return x[j]; }, scratch);
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    dx[j] = softmax_grad_term((x[j] - m) - log_s, j == target) * inv_count;
  }
  if (threadIdx.x == 0) row_loss[row] = log_s - (x[target] - m);
}

// One block: thread i sums rows i, i + 1024, ... then a fixed block tree.
__global__ void sum_rows_kernel(const float* __restrict__ row_loss, int64_t rows, float inv_count,
                                float* __restrict__ loss) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) acc += row_loss[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) loss[0] = acc * inv_count;
}

struct DeviceFree {
  void operator()(void* p) const { release(p); }
};

}  // namespace

void cross_entropy_fused(const Tensor& logits, const Tensor& targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                         float inv_count, Tensor& dlogits, Tensor& loss) {
  std::unique_ptr<void, DeviceFree> row_loss(allocate(static_cast<size_t>(rows) * sizeof(float)));
  float* row_loss_ptr = static_cast<float*>(row_loss.get());
  cross_entropy_rows_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
      logits.data<float>(), targets.data<float>(), vocab, ignore_index, inv_count, dlogits.data<float>(), row_loss_ptr);
  HG_CUDA_CHECK_LAUNCH("cross_entropy_rows_kernel");
  sum_rows_kernel<<<1, kSumThreads, 0, stream()>>>(row_loss_ptr, rows, inv_count, loss.data<float>());
  HG_CUDA_CHECK_LAUNCH("sum_rows_kernel");
}

}  // namespace hg::gpu
