#pragma once
// The LayerNorm backward's per-row terms and dx, shared by the resident,
// cluster and staged backward kernels (cuda/layernorm.cu,
// cuda/layernorm_staged_backward.cuh), so that every one sums and rounds the
// same way: the staged kernel's dx is bitwise that of the kernel holding rows
// in registers.
//
// Per row, with xhat' = (x - mean) rstd from the saved, float32-rounded
// mean: s = (sum g dy, sum g dy xhat', sum xhat'). The true xhat has mean 0;
// c = mean(xhat') is the rounding of the saved mean times rstd, removed here:
// xhat = xhat' - c, mean(g dy xhat) = mean(g dy xhat') - c mean(g dy).
#include <cuda_runtime.h>

#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

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
// rounding, which the staged kernel (cuda/layernorm_staged_backward.cuh)
// shares so that its dx is bitwise that of the rows in registers.
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

// A resident row (slice): x in xh becomes xhat'; this thread's terms of s.
template <int VEC, int NV, int G>
__device__ __forceinline__ void row_terms_in_registers(float (&xh)[NV][VEC], const float (&g_dy)[NV][VEC],
                                                       const float* gamma, int len, int t, float m, float rs,
                                                       float (&s)[3]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float g[VEC];
      load_vec<VEC>(gamma + i, g);
      slot_row_terms<VEC>(xh[j], g_dy[j], g, m, rs, s);
    }
  }
}

// dx as stored: LayerNorm's own (NoAddIn), or the residual backward's
// dh_in + dx (HeldAddIn, StreamedAddIn: cuda/layernorm_residual.cuh):
// add_in(j, i, out) adds dh_in to slot j (row offset i) of dx before its
// one rounding.
struct NoAddIn {
  template <int VEC>
  __device__ __forceinline__ void operator()(int, int, float (&)[VEC]) const {}
};

// A resident row (slice): stores dx (through add_in) and adds dy * xhat, dy
// to this group's accumulators (a thread touches only its own columns).
template <class T, int VEC, int NV, int G, class AddIn = NoAddIn>
__device__ __forceinline__ void dx_in_registers(T* dxr, const float* gamma, const float (&xh)[NV][VEC],
                                                const float (&g_dy)[NV][VEC], int len, int t, float rs,
                                                const DxTerms& k, float* acc_dgamma, float* acc_dbeta,
                                                const AddIn& add_in = AddIn{}) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float g[VEC], out[VEC], dg[VEC];
      load_vec<VEC>(gamma + i, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xhat = xh[j][e] - k.c;
        out[e] = dx_element(g[e], g_dy[j][e], xhat, rs, k);
        dg[e] = g_dy[j][e] * xhat;
      }
      add_in(j, i, out);
      store_vec<VEC, Store::Streaming>(dxr + i, out);
      add_vec<VEC>(acc_dgamma + i, dg);
      add_vec<VEC>(acc_dbeta + i, g_dy[j]);
    }
  }
}

// The resident backward's per-group partials in shared memory (CAP floats
// of dgamma, then CAP of dbeta per group): this thread's columns zeroed.
template <int VEC, int NV, int G>
__device__ __forceinline__ void zero_group_partials(float* acc_dgamma, float* acc_dbeta, int t) {
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      acc_dgamma[(j * G + t) * VEC + k] = 0.0f;
      acc_dbeta[(j * G + t) * VEC + k] = 0.0f;
    }
}

// After the last row: the block adds its R groups' partials (acc: R groups
// of 2 CAP floats) in group order into its partial row.
template <int R, int CAP>
__device__ __forceinline__ void write_block_partials(const float* acc, int len, float* block_dgamma,
                                                     float* block_dbeta) {
  __syncthreads();
  for (int c = threadIdx.x; c < len; c += blockDim.x) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) sg += acc[r * 2 * CAP + c], sb += acc[r * 2 * CAP + CAP + c];
    block_dgamma[c] = sg;
    block_dbeta[c] = sb;
  }
}

}  // namespace
}  // namespace hg::gpu
