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
#include <cstdint>

#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

struct Moments {
  float mean;  // of x - shift
  float rstd;  // 1 / sqrt(var + eps)
};

// Row sums over one group (the resident kernels' row_sums).
template <int G>
struct GroupSums {
  const RowGroup<G>& grp;
  template <int N>
  __device__ __forceinline__ void operator()(float (&v)[N]) const { grp.sums(v); }
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
  return {mean, rsqrtf(q[0] * inv_d + eps)};
}

// y = (x - shift - mean) rstd gamma + beta for the len elements of a row
// held in v, gamma and beta read through ParamRow.
template <class T, int VEC, int NV, int G, class Param>
__device__ __forceinline__ void normalise_held(const float (&v)[NV][VEC], int len, const Moments& m,
                                               const Param& gamma, const Param& beta, T* yr, int t) {
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
