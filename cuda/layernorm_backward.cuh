#pragma once
// The fused LayerNorm backward kernels (launched by cuda/layernorm.cu; the
// staged kernel is in cuda/layernorm_staged_backward.cuh). Header-only
// device code, so that the lab program (bench/lab/layernorm_lab.cu) times
// these very kernels. Thread mapping as the forward's
// (cuda/layernorm_forward.cuh).
//
// Kernel 1 writes dx for every row and, per block (per cluster), partial
// dgamma = sum dy * xhat and dbeta = sum dy over the rows it handled to its
// partial row; kernel 2 sums the partial rows in a fixed order. The row
// terms and dx: cuda/layernorm_dx_terms.cuh.
#include <cstdint>

#include "cuda/layernorm_dx_terms.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/param_grad_write.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// Rows (CLUSTER: row slices) of up to CAP = G * EPT elements: x and dy held
// in registers, read once. Each group keeps its running partials in shared
// memory (CAP floats of dgamma, then CAP of dbeta); at the end the block adds
// its R groups in group order into its partial row.
template <class T, int VEC, int EPT, int G, int R, bool CLUSTER>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                              float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta, int64_t rows,
                              int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && R * G <= 1024 && R <= 15, "bad LayerNorm config");
  static_assert(!CLUSTER || R == 1, "a cluster block holds one row slice");
  extern __shared__ float4 acc_storage[];  // R * 2 * CAP floats
  __shared__ GroupScratch<G, R> scratch;
  __shared__ float slots[2][kMaxRowSums];  // CLUSTER: exchange of block sums
  int parity = 0;

  const RowGroup<G> grp = row_group<G, R>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const RowSplit part = split_rows<CLUSTER, R, VEC>(D, grp.group);
  const int len = part.len;  // D unless CLUSTER
  float* block_dgamma = partial_dgamma + part.partial * D + part.col0;
  float* block_dbeta = partial_dbeta + part.partial * D + part.col0;
  const float* gamma_p = gamma + part.col0;
  const int64_t row_stride = part.row_stride;

  float* acc_dgamma = reinterpret_cast<float*>(acc_storage) + grp.group * 2 * CAP;
  float* acc_dbeta = acc_dgamma + CAP;
  zero_group_partials<VEC, NV, G>(acc_dgamma, acc_dbeta, t);

  // Every group of the block runs the same sequence of barriers: a group
  // past the last row still makes the trip, on an empty row (no loads, no
  // stores), and joins its named barriers (compute-sanitizer racecheck
  // reported hazards when groups ran different row counts:
  // docs/reliability.md, "GPU sanitizers").
  for (int64_t base = part.first_row - grp.group; base < rows; base += row_stride) {
    const int64_t row = base + grp.group;
    const bool live = row < rows;
    const int row_len = live ? len : 0;  // columns this group reads and writes this trip
    const int64_t start = (live ? row : 0) * D + part.col0;
    float xh[NV][VEC], g_dy[NV][VEC];  // x, then xhat'; dy
    load_part<T, VEC, NV, G>(x + start, row_len, t, 0.0f, xh);
    load_part<T, VEC, NV, G>(dy + start, row_len, t, 0.0f, g_dy);
    if (prefetch_next_row(G * R) && row + row_stride < rows) {
      prefetch_row_l2<T, G, EPT>(x + start + row_stride * D, len, t);
      prefetch_row_l2<T, G, EPT>(dy + start + row_stride * D, len, t);
    }
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float s[3] = {0.0f, 0.0f, 0.0f};
    row_terms_in_registers<VEC, NV, G>(xh, g_dy, gamma_p, row_len, t, m, rs, s);
    grp.sums(s);
    if constexpr (CLUSTER) cluster_sums<3>(s, slots, parity);
    const DxTerms k = dx_terms(s, inv_d);
    dx_in_registers<T, VEC, NV, G>(dx + start, gamma_p, xh, g_dy, row_len, t, rs, k, acc_dgamma, acc_dbeta);
  }

  write_block_partials<R, CAP>(reinterpret_cast<const float*>(acc_storage), len, block_dgamma, block_dbeta);
  cluster_exit_barrier<CLUSTER>();
}

// Rows of any length, one block of G threads per row, in chunks of G * EPT,
// read twice (sums, then dx); the partials are added straight into the
// block's partial row in global memory, each thread on its own columns.
template <class T, int VEC, int EPT, int G>
__global__ void __launch_bounds__(G, min_blocks_for(G))
    layernorm_backward_chunked_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ gamma, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, T* __restrict__ dx,
                                      float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta,
                                      int64_t rows, int D) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  static_assert(EPT % VEC == 0 && G % 32 == 0 && G <= 1024, "bad LayerNorm config");
  __shared__ GroupScratch<G, 1> scratch;
  const RowGroup<G> grp = row_group<G, 1>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) + grp.group;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x);
  float* block_dgamma = partial_dgamma + static_cast<int64_t>(blockIdx.x) * D;
  float* block_dbeta = partial_dbeta + static_cast<int64_t>(blockIdx.x) * D;

  // Zero this block's partial rows: exactly the columns this thread adds to later.
  for (int off = 0; off < D; off += CAP) {
    const int len = min(CAP, D - off);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = (j * G + t) * VEC;
      if (i < len)
#pragma unroll
        for (int k = 0; k < VEC; ++k) block_dgamma[off + i + k] = 0.0f, block_dbeta[off + i + k] = 0.0f;
    }
  }
  float xh[NV][VEC], g_dy[NV][VEC];  // x; dy
  for (int64_t row = first_row; row < rows; row += row_stride) {
    const T* xr = x + row * D;
    const T* dyr = dy + row * D;
    T* dxr = dx + row * D;
    const float m = mean[row], rs = rstd[row];
    float s[3] = {0.0f, 0.0f, 0.0f};
    for (int off = 0; off < D; off += CAP) {
      const int len = min(CAP, D - off);
      load_part<T, VEC, NV, G>(xr + off, len, t, 0.0f, xh);
      load_part<T, VEC, NV, G>(dyr + off, len, t, 0.0f, g_dy);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < len) {
          float g[VEC];
          load_vec<VEC>(gamma + off + i, g);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float gd = __fmul_rn(g[k], g_dy[j][k]);
            const float xhat_saved = (xh[j][k] - m) * rs;
            s[0] += gd;
            s[1] += gd * xhat_saved;
            s[2] += xhat_saved;
          }
        }
      }
    }
    grp.sums(s);
    const DxTerms k = dx_terms(s, inv_d);
    for (int off = 0; off < D; off += CAP) {
      const int len = min(CAP, D - off);
      load_part<T, VEC, NV, G>(xr + off, len, t, 0.0f, xh);
      load_part<T, VEC, NV, G>(dyr + off, len, t, 0.0f, g_dy);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = (j * G + t) * VEC;
        if (i < len) {
          float g[VEC], out[VEC];
          load_vec<VEC>(gamma + off + i, g);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float xhat = (xh[j][e] - m) * rs - k.c;
            out[e] = dx_element(g[e], g_dy[j][e], xhat, rs, k);
            block_dgamma[off + i + e] += g_dy[j][e] * xhat;
            block_dbeta[off + i + e] += g_dy[j][e];
          }
          store_vec<VEC, Store::Streaming>(dxr + off + i, out);
        }
      }
    }
  }
}

// Backward, kernel 2: dgamma[c] = sum over partial rows p of
// partial_dgamma[p][c] (same for dbeta), in a fixed order: thread (tx, ty)
// sums p = ty, ty + 32, ... ascending, then one thread adds the 32 results in
// ty order. Nothing depends on timing: bitwise the same on every run.
// `accumulate`: each column's sum is added to what dgamma / dbeta hold
// (cuda/param_grad_write.cuh) instead of overwriting it.
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 32;

__global__ void __launch_bounds__(kReduceCols* kReduceLanes)
    layernorm_reduce_partials_kernel(const float* __restrict__ partial_dgamma, const float* __restrict__ partial_dbeta,
                                     int n_partials, int D, float* __restrict__ dgamma, float* __restrict__ dbeta,
                                     bool accumulate) {
  __shared__ float sum_g[kReduceLanes][kReduceCols + 1];
  __shared__ float sum_b[kReduceLanes][kReduceCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kReduceCols + tx;
  float a = 0.0f, b = 0.0f;
  if (c < D) {
#pragma unroll 4
    for (int p = ty; p < n_partials; p += kReduceLanes) {
      a += partial_dgamma[static_cast<int64_t>(p) * D + c];
      b += partial_dbeta[static_cast<int64_t>(p) * D + c];
    }
  }
  sum_g[ty][tx] = a;
  sum_b[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < D) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int l = 0; l < kReduceLanes; ++l) sg += sum_g[l][tx], sb += sum_b[l][tx];
    write_param_grad(dgamma + c, sg, accumulate);
    write_param_grad(dbeta + c, sb, accumulate);
  }
}

}  // namespace
}  // namespace hg::gpu
