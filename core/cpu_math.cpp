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

HG_SIMD_CLONES void gelu(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA {
    return 0.5f * v * (1.f + simd::tanh(kGeluC * (v + kGeluA * v * v * v)));
  });
}

// Far in the tails sech^2 is exactly 0 while x^2 may overflow: 0 * inf would
// be NaN, so there the derivative is 0.5 (1 + t) alone.
HG_SIMD_CLONES void gelu_grad(const float* x, float* y, int64_t n) {
  simd::transform(x, y, n, [](Floats v) HG_SIMD_LAMBDA {
    const Floats t = simd::tanh(kGeluC * (v + kGeluA * v * v * v));
    const Floats sech2 = 1.f - t * t;
    const Floats outer = 0.5f * (1.f + t);
    const Floats full = outer + 0.5f * v * sech2 * kGeluC * (1.f + 3.f * kGeluA * v * v);
    return sech2 == 0.f ? outer : full;
  });
}

}  // namespace hg::cpu_math
