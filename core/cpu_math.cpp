#include "core/cpu_math.hpp"

#include "core/simd.hpp"

namespace hg::cpu_math {

using simd::Floats;

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

HG_SIMD_CLONES void exp(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA { return simd::exp(v); });
}

HG_SIMD_CLONES void tanh(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA { return simd::tanh(v); });
}

// exp(-x) overflows to inf for very negative x, giving exactly 0: no NaN.
HG_SIMD_CLONES void sigmoid(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA { return 1.f / (1.f + simd::exp(-v)); });
}

// GELU (tanh form) as x sigmoid(2z) = x / (1 + e^{-2z}), z = c (x + a x^3):
// 0.5 (1 + tanh z) = sigmoid(2z), so one exp and one division, and no
// cancellation for negative x (1 + tanh z loses the digits there). Where
// -2z > 80 the result is below 1e-33 in size and is given as exactly 0, as
// is the derivative: that also keeps e^{-2z} and x^2 from overflowing.
HG_SIMD_CLONES void gelu(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA {
    const Floats minus_2z = -2.f * kGeluC * (v + kGeluA * v * v * v);
    return minus_2z > 80.f ? Floats{} : v / (1.f + simd::exp(minus_2z));
  });
}

// d/dx x s(2z) = s + x 2 s (1 - s) dz/dx with s (1 - s) = e s^2, e = e^{-2z}
// (no 1 - s cancellation). Where e is 0 (large x) the derivative is s = 1:
// the second term would be 0 * x^2, NaN once x^2 overflows.
HG_SIMD_CLONES void gelu_grad(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA {
    const Floats minus_2z = -2.f * kGeluC * (v + kGeluA * v * v * v);
    const Floats e = simd::exp(minus_2z);
    const Floats s = 1.f / (1.f + e);
    const Floats full = s + 2.f * kGeluC * v * (e * s * s) * (1.f + 3.f * kGeluA * v * v);
    return minus_2z > 80.f ? Floats{} : (e == 0.f ? s : full);
  });
}

}  // namespace hg::cpu_math
