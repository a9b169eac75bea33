#pragma once
// Float32 elementwise kernels of the CPU backend on core/simd.hpp's
// vectorised exp/tanh (no libm call per element), each dispatched at run time
// to the best of AVX-512 / AVX2 / baseline x86-64. Same results on every ISA.
#include <cstdint>

namespace hg::cpu_math {

void exp(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void sigmoid(const float* x, float* y, int64_t n);
// GELU, tanh approximation: 0.5 x (1 + tanh(c (x + a x^3))), and its derivative.
void gelu(const float* x, float* y, int64_t n);
void gelu_grad(const float* x, float* y, int64_t n);

}  // namespace hg::cpu_math
