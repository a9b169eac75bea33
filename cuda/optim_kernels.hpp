#pragma once
// Launch API of the fused optimizer kernels (cuda/optim_kernels.cu). Plain
// C++ with raw device pointers: core/optim.cpp calls these for CUDA
// parameters after checking shapes, dtypes (F32) and devices. Each update is
// one kernel over the n elements of one parameter, on the handgrad stream.
#include <cstdint>
#include <vector>

#include "core/backend.hpp"

namespace hg::gpu {

// g' = g + weight_decay * p ; v = momentum * v + g' ; p -= lr * v.
// v == nullptr means no momentum buffer: p -= lr * g'.
void sgd_step(float* p, const float* g, float* v, int64_t n, float lr, float momentum, float weight_decay);

// Decoupled weight decay, then Adam with bias correction
// (bias_correction{1,2} = 1 - beta{1,2}^t, computed by the caller):
// p -= lr * wd * p ; m = b1 m + (1 - b1) g ; v = b2 v + (1 - b2) g^2 ;
// p -= lr * (m / bc1) / (sqrt(v / bc2) + eps).
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, float bias_correction1, float bias_correction2);

// sum(x^2) accumulated in double, read back to the host (synchronises).
// Deterministic: per-chunk partial sums, then one block adds them in a fixed
// order; the chunks depend on n only (cuda/multi_tensor_adamw.cu).
double sum_of_squares(const float* x, int64_t n);

// x *= s.
void scale_inplace(float* x, int64_t n, float s);

// Backend::adamw_multi / sum_of_squares on CUDA (cuda/multi_tensor_adamw.cu),
// after the backend's checks (all F32, state F64 on the GPU). 3 launches / 2
// launches whatever the number of tensors. The first call for a set of
// pointers uploads its tensor table (a synchronous copy): run one step before
// capturing a CUDA graph.
void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state);
void sum_of_squares_multi(const std::vector<Tensor>& xs, Tensor& out);

// Backend::zero_multi on CUDA (cuda/multi_tensor_zero.cu): every tensor of
// `outs` (on the GPU, any dtype, any offset) set to 0 in one launch per 192
// tensors. Nothing is uploaded, so it may be called inside a graph capture.
void zero_multi(const std::vector<Tensor>& outs);

}  // namespace hg::gpu
