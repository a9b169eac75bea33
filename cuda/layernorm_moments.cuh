#pragma once
// The forward's statistics and normalisation of a row held in registers
// (minus its shift, zeros past its length), shared by the resident, cluster
// and staged LayerNorm forward kernels (cuda/layernorm.cu,
// cuda/layernorm_staged_forward.cuh), so that every one rounds the same way:
// the staged kernels' y, mean and rstd are bitwise those of the rows in
// registers.
// Stability: statistics are taken of x - shift with shift = x[row, 0], so a
// large common offset cancels exactly before any sum is formed; the variance
// is a second pass, sum((x - shift - m)^2) / D, never E[x^2] - E[x]^2.
// Range: where the squares overflow float32 (|x - shift| past ~1e19), rstd
// comes out 0; those rows take the statistics again on (x - shift) 2^-96
// (scaled_moments), a branch uniform over the row's threads.
#include <cstdint>

#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

struct Moments {
  float mean;  // of x - shift
  float rstd;  // 1 / sqrt(var + eps)
};

// The statistics' overflow guard. rstd = rsqrt(var + eps) is at least
// 2^-64 wherever var + eps is a finite float, so rstd that is not > 0 means
// the sum of squares (or the sum, or var + eps) overflowed (or a NaN): the
// row's statistics are taken again on d 2^-96. With |d| < 2^128 (a finite
// float), |d - mean| 2^-96 < 2^33 and D < 2^31 squares of it sum below
// 2^97: no overflow. A row gets here only if its squares sum past 2^128, so
// its largest scaled square is at least 2^128 2^-192 / D > 2^-95, a normal
// float: the terms that matter are not flushed. var + eps scales by 2^-192
// (eps 2^-192 underflows to 0 where eps < 2^43, next to var > 2^97 / D), and
// rstd = 2^-96 rsqrt(var 2^-192 + eps 2^-192) is a normal float down to
// row standard deviations of ~2^126. Every thread of a row holds the same
// sums, so the branch is uniform and the slow path's reductions (barriers,
// cluster exchanges) stay matched; rows that do not overflow run only the
// compare.
constexpr float kOverflowScale = 0x1p-96f;
constexpr float kOverflowUnscale = 0x1p96f;

__device__ __forceinline__ bool statistics_overflowed(float rstd) { return !(rstd > 0.0f); }

// Moments of d 2^-96 turned back into those of d (scaled by a power of two:
// exact).
__device__ __forceinline__ Moments unscale_moments(float scaled_mean, float scaled_q, float inv_d, float eps) {
  const float scaled_eps = eps * kOverflowScale * kOverflowScale;
  return {scaled_mean * kOverflowUnscale, kOverflowScale * rsqrtf(scaled_q * inv_d + scaled_eps)};
}

// A row held as for_each_held reads it (get(j, out): slot j's x - shift).
// The statistics of a row that overflowed, on d 2^-96 (d = x - shift).
template <int VEC, int NV, int G, class Row, class RowSums>
__device__ __forceinline__ Moments scaled_moments(const Row& h, int len, int t, const RowSums& row_sums, float inv_d,
                                                  float eps) {
  float s[1] = {0.0f};
  for_each_held<VEC, NV, G>(h, len, t, [&](float d) { s[0] += d * kOverflowScale; });
  row_sums(s);
  const float mean = s[0] * inv_d;
  float q[1] = {0.0f};
  for_each_held<VEC, NV, G>(h, len, t, [&](float d) {
    const float c = d * kOverflowScale - mean;
    q[0] += c * c;
  });
  row_sums(q);
  return unscale_moments(mean, q[0], inv_d, eps);
}

// A row held in registers (v: x - shift) as for_each_held reads it.
template <int VEC, int NV>
struct RegisterRow {
  const float (&v)[NV][VEC];
  __device__ __forceinline__ void get(int j, float (&out)[VEC]) const {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = v[j][k];
  }
};

// Row sums over one group (the resident kernels' row_sums).
template <int G>
struct GroupSums {
  const RowGroup<G>& grp;
  template <int N>
  __device__ __forceinline__ void operator()(float (&v)[N]) const {
    grp.sums(v);
  }
};

// A row of len elements held in v (minus shift, zeros past len); row_sums
// adds a per-thread partial over the whole row (the group, or the cluster).
template <int VEC, int NV, int G, class RowSums>
__device__ __forceinline__ Moments moments_in_registers(const float (&v)[NV][VEC], int len, int t,
                                                        const RowSums& row_sums, float inv_d, float eps) {
  float s[1] = {0.0f};
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int k = 0; k < VEC; ++k) s[0] += v[j][k];
  row_sums(s);
  const float mean = s[0] * inv_d;
  float q[1] = {0.0f};
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if ((j * G + t) * VEC < len)
#pragma unroll
      for (int k = 0; k < VEC; ++k) q[0] += (v[j][k] - mean) * (v[j][k] - mean);
  row_sums(q);
  const float rstd = rsqrtf(q[0] * inv_d + eps);
  if (statistics_overflowed(rstd))
    return scaled_moments<VEC, NV, G>(RegisterRow<VEC, NV>{v}, len, t, row_sums, inv_d, eps);
  return {mean, rstd};
}

// y = (x - shift - mean) rstd gamma + beta for the len elements of a row
// held in v, gamma and beta read through ParamRow.
template <class T, int VEC, int NV, int G, class Param>
__device__ __forceinline__ void normalise_held(const float (&v)[NV][VEC], int len, const Moments& m, const Param& gamma,
                                               const Param& beta, T* yr, int t) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = (j * G + t) * VEC;
    if (i < len) {
      float g[VEC], b[VEC], out[VEC];
      gamma.get(j, i, g);
      beta.get(j, i, b);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = (v[j][k] - m.mean) * m.rstd * g[k] + b[k];
      store_vec<VEC, Store::Streaming>(yr + i, out);
    }
  }
}

// normalise_held for the chunk elements of a row; gamma, beta, yr point at
// the chunk's first column.
template <class T, int VEC, int NV, int G>
__device__ __forceinline__ void normalise_chunk(const float (&v)[NV][VEC], int chunk, const Moments& m,
                                                const float* gamma, const float* beta, T* yr, int t) {
  using Param = ParamRow<VEC, NV, G, false>;
  normalise_held<T, VEC, NV, G>(v, chunk, m, Param{gamma, nullptr, t}, Param{beta, nullptr, t}, yr, t);
}

// The row's statistics for the backward: its mean (shift + mean of x - shift) and rstd.
__device__ __forceinline__ void save_stats(float* mean_out, float* rstd_out, int64_t row, float shift,
                                           const Moments& m) {
  mean_out[row] = shift + m.mean;
  rstd_out[row] = m.rstd;
}

}  // namespace
}  // namespace hg::gpu
