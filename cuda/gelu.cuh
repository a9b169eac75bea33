#pragma once
// GELU (tanh approximation) and its derivative on the device: the one
// formula behind UnaryOp::Gelu / GeluGrad (cuda/cuda_backend.cu), which the
// GEMM's composed epilogues use too (cuda/gemm_lt.cu).
#include <cuda_runtime.h>

namespace hg::gpu {

__device__ __forceinline__ float gelu_tanh_of(float v) { return tanhf(v); }
__device__ __forceinline__ double gelu_tanh_of(double v) { return tanh(v); }

// 0.5 x (1 + tanh(c (x + a x^3))), c = sqrt(2 / pi).
template <class T>
__device__ __forceinline__ T gelu_value(T x) {
  constexpr T c = T(0.7978845608028654), a = T(0.044715);
  return T(0.5) * x * (T(1) + gelu_tanh_of(c * (x + a * x * x * x)));
}

// d gelu / dx.
template <class T>
__device__ __forceinline__ T gelu_slope(T x) {
  constexpr T c = T(0.7978845608028654), a = T(0.044715);
  const T t = gelu_tanh_of(c * (x + a * x * x * x));
  const T sech2 = T(1) - t * t;
  // Far in the tails sech2 is exactly 0 while x^2 may overflow: 0 * inf would be NaN.
  if (sech2 == T(0)) return T(0.5) * (T(1) + t);
  return T(0.5) * (T(1) + t) + T(0.5) * x * sech2 * c * (T(1) + T(3) * a * x * x);
}

}  // namespace hg::gpu
