#pragma once
// Residual add + LayerNorm on the resident LayerNorm kernels' rows
// (cuda/layernorm.cu launches them through its width table, for 16-byte rows
// of D <= 16384). A group of G threads holds a row in registers exactly as
// layernorm_forward_kernel and layernorm_backward_kernel do, with the same
// row functions, so the statistics, y and dx round as theirs. Design and bytes:
// docs/residual_layernorm.md, "Resident rows".
#include <cstdint>

#include "cuda/layernorm_dx_terms.cuh"
#include "cuda/layernorm_moments.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// h = x + r rounded to T, stored, and y = LN(h) of those rounded values held
// in registers (shift = h[row, 0], the held value of the group's thread 0):
// y, mean and rstd are those layernorm_forward_kernel takes of the stored h.
// x, r and h may alias (h = x or h = r): no __restrict__ on them.
// ADD false: x is an h this kernel stored before, loaded as it was held (the
// same floats), r and h are unused: y, mean and rstd again, bitwise
// (activation recomputation).
template <class T, int VEC, int EPT, int G, int R, bool ADD = true>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    residual_layernorm_forward_kernel(const T* x, const T* r, const float* __restrict__ gamma,
                                      const float* __restrict__ beta, T* h, T* __restrict__ y,
                                      float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int D,
                                      float eps) {
  constexpr int NV = EPT / VEC;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + grp.group; row < rows; row += row_stride) {
    const int64_t start = row * D;
    float v[NV][VEC];
    if constexpr (ADD) add_rows_part<T, VEC, NV, G>(x + start, r + start, h + start, D, grp.t, v);
    else load_part<T, VEC, NV, G>(x + start, D, grp.t, 0.0f, v);  // minus 0: the held values exactly
    if (prefetch_next_row(G * R) && row + row_stride < rows) {
      prefetch_row_l2<T, G, EPT>(x + start + row_stride * D, D, grp.t);
      if constexpr (ADD) prefetch_row_l2<T, G, EPT>(r + start + row_stride * D, D, grp.t);
    }
    // Thread 0 holds column 0; read from registers, not memory, where h may be x or r.
    const float shift = grp.first(v[0][0]);
    subtract_shift<VEC, NV, G>(v, D, grp.t, shift);
    const Moments m = moments_in_registers<VEC, NV, G>(v, D, grp.t, GroupSums<G>{grp}, inv_d, eps);
    normalise_chunk<T, VEC, NV, G>(v, D, m, gamma, beta, y + start, grp.t);
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, shift, m);
  }
}

// dh_in as the residual backward holds it (HeldAddIn: this thread's slots
// as floats, zeros past len; bf16 rows hold it with 8-byte slots, 4
// elements a slot). add(j, i, out): out += dh_in for slot j
// (dx_in_registers' AddIn).
template <class T, int VEC, int NV, int G>
struct HeldAddIn {
  float v[NV][VEC];
  __device__ __forceinline__ void load(const T* p, int len, int t) { load_part<T, VEC, NV, G>(p, len, t, 0.0f, v); }
  __device__ __forceinline__ void operator()(int j, int, float (&out)[VEC]) const {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = v[j][e] + out[e];
  }
};

// StreamedAddIn: dh_in read slot by slot as dx is stored (one 16-byte load a
// slot, no registers held across the row's reductions); p is the row's start.
template <class T, int VEC, int NV, int G>
struct StreamedAddIn {
  const T* p;
  __device__ __forceinline__ void load(const T* row, int, int) { p = row; }
  __device__ __forceinline__ void operator()(int, int i, float (&out)[VEC]) const {
    float v[VEC];
    load_vec<VEC>(p + i, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = v[e] + out[e];
  }
};

// dh = dh_in + LN_backward(dy) for rows of D <= G * EPT: layernorm_backward_kernel
// (rows in registers) reading h for x, with dh_in added to dx before its
// one rounding: held in registers next to h and dy (AddIn = HeldAddIn, the
// warp rows cuda/layernorm.cu names) or read as dx is stored
// (StreamedAddIn, the others). dh may be dh_in: a thread writes only slots
// it has read. Partials as the LayerNorm backward's: per group in shared
// memory, then one partial row per block for kernel 2.
template <class T, int VEC, int EPT, int G, int R, template <class, int, int, int> class AddIn>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    residual_layernorm_backward_kernel(const T* __restrict__ dy, const T* dh_in, const T* __restrict__ h,
                                       const float* __restrict__ gamma, const float* __restrict__ mean,
                                       const float* __restrict__ rstd, T* dh, float* __restrict__ partial_dgamma,
                                       float* __restrict__ partial_dbeta, int64_t rows, int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  extern __shared__ float4 acc_storage[];  // R * 2 * CAP floats
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  float* acc_dgamma = reinterpret_cast<float*>(acc_storage) + grp.group * 2 * CAP;
  float* acc_dbeta = acc_dgamma + CAP;
  zero_group_partials<VEC, NV, G>(acc_dgamma, acc_dbeta, t);

  // As in layernorm_backward_kernel: every group makes the same trips (a
  // group past the last row on an empty row), so named barriers stay matched.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * R; base < rows; base += row_stride) {
    const int64_t row = base + grp.group;
    const bool live = row < rows;
    const int row_len = live ? D : 0;
    const int64_t start = (live ? row : 0) * D;
    float xh[NV][VEC], g_dy[NV][VEC];  // h, then xhat'; dy
    AddIn<T, VEC, NV, G> add;
    load_part<T, VEC, NV, G>(h + start, row_len, t, 0.0f, xh);
    load_part<T, VEC, NV, G>(dy + start, row_len, t, 0.0f, g_dy);
    add.load(dh_in + start, row_len, t);
    if (prefetch_next_row(G * R) && row + row_stride < rows) {
      prefetch_row_l2<T, G, EPT>(h + start + row_stride * D, D, t);
      prefetch_row_l2<T, G, EPT>(dy + start + row_stride * D, D, t);
      prefetch_row_l2<T, G, EPT>(dh_in + start + row_stride * D, D, t);
    }
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float s[3] = {0.0f, 0.0f, 0.0f};
    row_terms_in_registers<VEC, NV, G>(xh, g_dy, gamma, row_len, t, m, rs, s);
    grp.sums(s);
    const DxTerms k = dx_terms(s, inv_d);
    dx_in_registers<T, VEC, NV, G>(dh + start, gamma, xh, g_dy, row_len, t, rs, k, acc_dgamma, acc_dbeta, add);
  }
  const int64_t partial = static_cast<int64_t>(blockIdx.x) * D;
  write_block_partials<R, CAP>(reinterpret_cast<const float*>(acc_storage), D, partial_dgamma + partial,
                               partial_dbeta + partial);
}

}  // namespace
}  // namespace hg::gpu
