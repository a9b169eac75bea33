// Fused optimizer updates and the gradient-norm reduction (one kernel per
// parameter per step; see cuda/optim_kernels.hpp for the formulas).
#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/optim_kernels.hpp"

namespace hg::gpu {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU; a grid-stride loop covers the rest.
unsigned int grid_for(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * 16;
  return static_cast<unsigned int>(wanted < cap ? wanted : cap);
}

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ v,
                           int64_t n, float lr, float momentum, float weight_decay) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float step = g[i] + weight_decay * p[i];
    if (v != nullptr) {
      step = momentum * v[i] + step;
      v[i] = step;
    }
    p[i] -= lr * step;
  }
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float bias_correction1,
                             float bias_correction2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    float pi = p[i];
    pi -= lr * weight_decay * pi;  // decoupled decay uses the pre-update value
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= lr * (mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps);
    p[i] = pi;
  }
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

// Block-wide sum of doubles in a fixed tree order; the result is valid in thread 0.
__device__ double block_sum_double(double v) {
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

// Stage 1: block b sums the squares of its grid-stride share into partials[b].
__global__ void sum_squares_partials(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const double xi = x[i];
    acc += xi * xi;
  }
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Stage 2: one block adds the partials in a fixed order.
__global__ void sum_partials(const double* __restrict__ partials, int count, double* __restrict__ out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

void sgd_step(float* p, const float* g, float* v, int64_t n, float lr, float momentum, float weight_decay) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream()>>>(p, g, v, n, lr, momentum, weight_decay);
  HG_CUDA_CHECK_LAUNCH("sgd_kernel");
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, float bias_correction1, float bias_correction2) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream()>>>(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                                       bias_correction1, bias_correction2);
  HG_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void scale_inplace(float* x, int64_t n, float s) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, n, s);
  HG_CUDA_CHECK_LAUNCH("scale_kernel");
}

double sum_of_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  // The grid depends on n only (not on the GPU), so the summation order and
  // hence the bits of the result are the same on every device.
  constexpr int64_t kMaxBlocks = 1024;
  const int64_t wanted = (n + 4 * kThreads - 1) / (4 * kThreads);
  const int blocks = static_cast<int>(wanted < kMaxBlocks ? wanted : kMaxBlocks);

  // partials[0 .. blocks) then the total at partials[blocks].
  auto* partials = static_cast<double*>(allocate((blocks + 1) * sizeof(double)));
  double total = 0.0;
  try {
    sum_squares_partials<<<blocks, kThreads, 0, stream()>>>(x, n, partials);
    HG_CUDA_CHECK_LAUNCH("sum_squares_partials");
    sum_partials<<<1, kThreads, 0, stream()>>>(partials, blocks, partials + blocks);
    HG_CUDA_CHECK_LAUNCH("sum_partials");
    copy_bytes(&total, Device::CPU, partials + blocks, Device::CUDA, sizeof(double));
  } catch (...) {
    release(partials);
    throw;
  }
  release(partials);
  return total;
}

}  // namespace hg::gpu
