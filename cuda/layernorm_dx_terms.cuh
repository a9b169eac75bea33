#pragma once
// The LayerNorm backward's per-row terms and dx, shared by the resident,
// cluster and staged backward kernels (cuda/layernorm.cu,
// cuda/layernorm_staged_backward.cuh), so that every one sums and rounds the
// same way: the staged kernel's dx is bitwise that of variant 0.
//
// Per row, with xhat' = (x - mean) rstd from the saved, float32-rounded
// mean: s = (sum g dy, sum g dy xhat', sum xhat'). The true xhat has mean 0;
// c = mean(xhat') is the rounding of the saved mean times rstd, removed here:
// xhat = xhat' - c, mean(g dy xhat) = mean(g dy xhat') - c mean(g dy).
#include <cuda_runtime.h>

namespace hg::gpu {
namespace {

struct DxTerms {
  float c, c1, c2;  // mean(xhat'), mean(g dy), mean(g dy xhat)
};

__device__ __forceinline__ DxTerms dx_terms(const float (&s)[3], float inv_d) {
  const float c = s[2] * inv_d;
  const float c1 = s[0] * inv_d;
  return {c, c1, s[1] * inv_d - c * c1};
}

// dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)). __fmul_rn: the same
// rounded g * dy that went into c1; if the compiler contracted g * dy - c1
// into one FMA, D = 1 (exact answer 0) would give the product's rounding
// error times rstd (~316).
__device__ __forceinline__ float dx_element(float g, float dy, float xhat, float rs, const DxTerms& k) {
  return rs * (__fmul_rn(g, dy) - k.c1 - xhat * k.c2);
}

// One slot of a row (VEC columns, gamma in g): x in xh becomes xhat'; its
// terms are added to s. The one definition of the row sums' order and
// rounding, which variant 5 (cuda/layernorm_staged_backward.cuh) shares so
// that its dx is bitwise variant 0's.
template <int VEC>
__device__ __forceinline__ void slot_row_terms(float (&xh)[VEC], const float (&g_dy)[VEC], const float (&g)[VEC],
                                               float m, float rs, float (&s)[3]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    xh[k] = (xh[k] - m) * rs;
    const float gd = __fmul_rn(g[k], g_dy[k]);  // rounded, not fused: see dx_element
    s[0] += gd;
    s[1] += gd * xh[k];
    s[2] += xh[k];
  }
}

}  // namespace
}  // namespace hg::gpu
