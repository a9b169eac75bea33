// Per-tensor optimizer updates (one kernel per parameter per step; see
// cuda/optim_kernels.hpp for the formulas). The norm reductions and the
// multi-tensor AdamW live in cuda/multi_tensor_adamw.cu.
#include "core/cuda_runtime.hpp"
#include "cuda/adamw_math.cuh"
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

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ v, int64_t n,
                           float lr, float momentum, float weight_decay) {
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
                             float* __restrict__ v, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(g[i], pi, mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

}  // namespace

void sgd_step(float* p, const float* g, float* v, int64_t n, float lr, float momentum, float weight_decay) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream()>>>(p, g, v, n, lr, momentum, weight_decay);
  HG_CUDA_CHECK_LAUNCH("sgd_kernel");
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, float bias_correction1, float bias_correction2) {
  if (n <= 0) return;
  const AdamWScalars s{lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2};
  adamw_kernel<<<grid_for(n), kThreads, 0, stream()>>>(p, g, m, v, n, s);
  HG_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void scale_inplace(float* x, int64_t n, float s) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, n, s);
  HG_CUDA_CHECK_LAUNCH("scale_kernel");
}

}  // namespace hg::gpu
