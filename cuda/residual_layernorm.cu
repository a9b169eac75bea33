// Fused residual add + LayerNorm (API: cuda/residual_layernorm_kernels.hpp;
// the backward's derivation: docs/residual_layernorm.md). The rows the
// resident kernels (cuda/layernorm.cu) do not take run here, one block per
// row, any D: each thread owns the columns j = tid, tid + blockDim, ... and
// re-reads only elements it wrote itself or read before (L2-resident), so
// no shared row buffer bounds D. Statistics and sums in float32.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/param_grad_write.cuh"
#include "cuda/reduce.cuh"
#include "cuda/residual_layernorm_kernels.hpp"
#include "cuda/storage_cast.cuh"

namespace hg::gpu {
namespace {

constexpr int kThreads = 256;
// Blocks of the backward: fixed (not per device), so dgamma / dbeta are summed
// in the same order on every GPU.
constexpr int64_t kBackwardBlocks = 256;

// h = x + r rounded to T (h may alias x or r: every element is read before
// the same thread writes it); the statistics are those of the stored h, so the
// backward (which re-reads h) sees the same numbers. Mean: two passes (the
// second sums h - m1, small even for rows offset by 1e4); variance: a third
// pass over centred values. ADD false: x is an h stored before and h is x
// (r unused): y and the statistics again, bitwise (activation recomputation).
template <class T, bool ADD = true>
__global__ void residual_ln_forward(const T* x, const T* r, const float* __restrict__ gamma,
                                    const float* __restrict__ beta, float eps, int64_t rows, int64_t D, T* h,
                                    T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  __shared__ float scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * D;
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      T hv;
      if constexpr (ADD) {
        hv = from_f<T>(to_f(x[base + j]) + to_f(r[base + j]));
        h[base + j] = hv;
      } else {
        hv = x[base + j];
      }
      sum += to_f(hv);
    }
    const float m1 = block_sum(sum, scratch) / static_cast<float>(D);
    float shift = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) shift += to_f(h[base + j]) - m1;
    const float mean = m1 + block_sum(shift, scratch) / static_cast<float>(D);
    float sq = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float c = to_f(h[base + j]) - mean;
      sq += c * c;
    }
    float rstd = 1.f / sqrtf(block_sum(sq, scratch) / static_cast<float>(D) + eps);
    if (!(rstd > 0.f)) {  // the squares overflowed (|h - mean| past ~1e19): again on (h - mean) 2^-96
      constexpr float kScale = 0x1p-96f;
      float scaled_sq = 0.f;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        const float c = (to_f(h[base + j]) - mean) * kScale;
        scaled_sq += c * c;
      }
      rstd = kScale / sqrtf(block_sum(scaled_sq, scratch) / static_cast<float>(D) + eps * kScale * kScale);
    }
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      y[base + j] = from_f<T>((to_f(h[base + j]) - mean) * rstd * gamma[j] + beta[j]);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// Per row: xhat = (h - mean) rstd, corrected by its own row mean c (which is
// 0 in exact arithmetic and measures the rounding of the saved mean);
// g = dy gamma; dh = dh_in + rstd (g - mean(g) - xhat mean(g xhat)).
// dh may alias dh_in (in-place residual gradient). Block b owns rows b, b + gridDim, ... and its row of the partials
// (dgamma_partial[b, j], dbeta_partial[b, j]), written only by the thread of column j.
template <class T>
__global__ void residual_ln_backward(const T* __restrict__ dy, const T* dh_in, const T* __restrict__ h,
                                     const float* __restrict__ gamma, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, int64_t rows, int64_t D, T* dh,
                                     float* __restrict__ dgamma_partial, float* __restrict__ dbeta_partial) {
  __shared__ float scratch[kThreads / 32];
  float* dg = dgamma_partial + blockIdx.x * D;
  float* db = dbeta_partial + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dg[j] = db[j] = 0.f;
  const float inv_d = 1.f / static_cast<float>(D);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * D;
    const float mu = mean[row], rs = rstd[row];
    float sum_xhat = 0.f, sum_g = 0.f, sum_g_xhat = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xhat = (to_f(h[base + j]) - mu) * rs;
      const float g = __fmul_rn(to_f(dy[base + j]), gamma[j]);  // _rn: the same rounding as in dx below
      sum_xhat += xhat;
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    const float c = block_sum(sum_xhat, scratch) * inv_d;
    const float mean_g = block_sum(sum_g, scratch) * inv_d;
    // mean(g (xhat - c)) = mean(g xhat) - c mean(g)
    const float mean_g_xhat = block_sum(sum_g_xhat, scratch) * inv_d - c * mean_g;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xhat = (to_f(h[base + j]) - mu) * rs - c;
      const float dyv = to_f(dy[base + j]);
      // _rn keeps dy gamma rounded as in mean_g: a contracted FMA would leave
      // its rounding error (times rstd) where D = 1 must give exactly 0.
      const float dx = rs * (__fmul_rn(dyv, gamma[j]) - mean_g - xhat * mean_g_xhat);
      dh[base + j] = from_f<T>(dh_in ? to_f(dh_in[base + j]) + dx : dx);
      dg[j] += dyv * xhat;
      db[j] += dyv;
    }
  }
}

// out[j] = sum over b < blocks of partial[b, j], b in order (one thread per
// column); `accumulate`: out[j] plus that sum (cuda/param_grad_write.cuh).
__global__ void sum_partial_columns(const float* __restrict__ partial, int64_t blocks, int64_t D,
                                    float* __restrict__ out, bool accumulate) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < D; j += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t b = 0; b < blocks; ++b) acc += partial[b * D + j];
    write_param_grad(out + j, acc, accumulate);
  }
}

unsigned int grid_for_rows(int64_t rows) {
  const int64_t cap = static_cast<int64_t>(sm_count()) * 8;
  return static_cast<unsigned int>(std::min(rows, cap));
}

// Calls f(T{}) with T = float or __nv_bfloat16 for the (already checked) dtype.
template <class F>
void with_storage(DType dtype, F&& f) {
  if (dtype == DType::F32) f(float{});
  else f(__nv_bfloat16{});
}

}  // namespace

void residual_layernorm_forward_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                      float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd,
                                      ResidualLnKernel kernel) {
  const int64_t rows = x.size(0), D = x.size(1);
  if (rows == 0) return;
  if (kernel == ResidualLnKernel::ResidentRows &&
      residual_layernorm_forward_resident(x, r, gamma, beta, eps, h, y, mean, rstd))
    return;
  with_storage(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    residual_ln_forward<T><<<grid_for_rows(rows), kThreads, 0, stream()>>>(
        static_cast<const T*>(x.raw_data()), static_cast<const T*>(r.raw_data()), gamma.data<float>(),
        beta.data<float>(), eps, rows, D, static_cast<T*>(h.raw_data()), static_cast<T*>(y.raw_data()),
        mean.data<float>(), rstd.data<float>());
    HG_CUDA_CHECK_LAUNCH("residual_ln_forward");
  });
}

void residual_layernorm_output_fused(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                     Tensor& mean, Tensor& rstd, ResidualLnKernel kernel) {
  const int64_t rows = h.size(0), D = h.size(1);
  if (rows == 0) return;
  if (kernel == ResidualLnKernel::ResidentRows &&
      residual_layernorm_output_resident(h, gamma, beta, eps, y, mean, rstd))
    return;
  with_storage(h.dtype(), [&](auto zero) {
    using T = decltype(zero);
    // The stored h is both the input and the h the later passes re-read; nothing writes it.
    residual_ln_forward<T, false><<<grid_for_rows(rows), kThreads, 0, stream()>>>(
        static_cast<const T*>(h.raw_data()), nullptr, gamma.data<float>(), beta.data<float>(), eps, rows, D,
        static_cast<T*>(h.raw_data()), static_cast<T*>(y.raw_data()), mean.data<float>(), rstd.data<float>());
    HG_CUDA_CHECK_LAUNCH("residual_ln_forward");
  });
}

void residual_layernorm_backward_fused(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                       Tensor& dbeta, ResidualLnKernel kernel, ParamGradWrite write) {
  const int64_t rows = h.size(0), D = h.size(1);
  const int64_t blocks = std::min(rows, kBackwardBlocks);
  if (blocks == 0) return;  // refused by the op's checks: LayerNorm needs rows
  if (kernel == ResidualLnKernel::ResidentRows &&
      residual_layernorm_backward_resident(dy, dh_in, h, gamma, mean, rstd, dh, dgamma, dbeta, write,
                                           device_memory_system()))
    return;
  Tensor partials = Tensor::empty({2, blocks, D}, DType::F32, Device::CUDA);
  float* dg_partial = partials.data<float>();
  float* db_partial = dg_partial + blocks * D;
  with_storage(h.dtype(), [&](auto zero) {
    using T = decltype(zero);
    residual_ln_backward<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(
        static_cast<const T*>(dy.raw_data()), dh_in ? static_cast<const T*>(dh_in->raw_data()) : nullptr,
        static_cast<const T*>(h.raw_data()), gamma.data<float>(), mean.data<float>(), rstd.data<float>(), rows, D,
        static_cast<T*>(dh.raw_data()), dg_partial, db_partial);
    HG_CUDA_CHECK_LAUNCH("residual_ln_backward");
  });
  const auto cols_grid = static_cast<unsigned>(std::min<int64_t>((D + kThreads - 1) / kThreads, 4096));
  const bool accumulate = write == ParamGradWrite::Accumulate;
  sum_partial_columns<<<cols_grid, kThreads, 0, stream()>>>(dg_partial, blocks, D, dgamma.data<float>(), accumulate);
  HG_CUDA_CHECK_LAUNCH("sum_partial_columns");
  sum_partial_columns<<<cols_grid, kThreads, 0, stream()>>>(db_partial, blocks, D, dbeta.data<float>(), accumulate);
  HG_CUDA_CHECK_LAUNCH("sum_partial_columns");
}

void residual_layernorm_forward_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                      float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd) {
  residual_layernorm_forward_fused(x, r, gamma, beta, eps, h, y, mean, rstd, ResidualLnKernel::ResidentRows);
}

void residual_layernorm_backward_fused(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                       Tensor& dbeta, ParamGradWrite write) {
  residual_layernorm_backward_fused(dy, dh_in, h, gamma, mean, rstd, dh, dgamma, dbeta, ResidualLnKernel::ResidentRows,
                                    write);
}

void residual_layernorm_output_fused(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                     Tensor& mean, Tensor& rstd) {
  residual_layernorm_output_fused(h, gamma, beta, eps, y, mean, rstd, ResidualLnKernel::ResidentRows);
}

}  // namespace hg::gpu
