// Column sums, out[j] (+)= sum_i x[i * ld + j]: the bias gradients after a
// GEMM, and the GELU backward's pass that scales the dgrad GEMM's output by
// gelu'(pre) and sums its columns in the same launch. Deterministic: every
// order of addition is fixed by the shape, no atomics. docs/gemm.md.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gelu.cuh"
#include "cuda/launch.cuh"
#include "cuda/storage_cast.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

namespace cg = cooperative_groups;

// ---- one launch: a thread-block cluster per 32 columns (sm_90+) -------------------
//
// The C blocks of a cluster share 32 columns; block rank r sums the rows
// [r S, (r + 1) S), S = ceil(rows / C). Thread (tx, ty) holds VEC adjacent
// columns (one 16-byte load per row where alignment allows, else VEC = 1)
// and adds rows ty, ty + TY, ... of the slice in increasing order. The block
// adds its TY partials per column in 8 runs of TY / 8, then the 8 runs; rank
// 0 adds the C block sums in rank order, read from the other blocks' shared
// memory (DSMEM), and writes out.
constexpr int kGroupCols = 32;
constexpr int kThreads = 256;
constexpr int kRuns = kThreads / kGroupCols;  // 8
constexpr int kMaxCluster = 8;                // the portable cluster size

template <int VEC>
struct Tile {
  static constexpr int TX = kGroupCols / VEC, TY = kThreads / TX;
  static_assert(TY % kRuns == 0, "the block's partials split into kRuns runs");
};

// GELU: x is the dgrad product, rewritten in place (dx == x, so x is not
// __restrict__) as rn(x gelu'(pre));
// the sums are of those rounded values. U rows are loaded before they are added.
template <class T, class O, int VEC, int U, bool GELU>
__global__ void __launch_bounds__(kThreads)
    column_cluster_kernel(const T* x, const T* __restrict__ pre, T* dx, O* __restrict__ out, int64_t rows, int64_t cols,
                          int64_t ld, bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Shape = Tile<VEC>;
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int64_t group = blockIdx.x / C;
  const int tx = threadIdx.x % Shape::TX, ty = threadIdx.x / Shape::TX;
  const int64_t col = group * kGroupCols + int64_t(tx) * VEC;
  const int64_t slice = (rows + C - 1) / C;
  const int64_t begin = rows < rank * slice ? rows : rank * slice, end = rows < begin + slice ? rows : begin + slice;

  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  if (col < cols) {
    for (int64_t r0 = begin + ty; r0 < end; r0 += int64_t(Shape::TY) * U) {
      float v[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t r = r0 + int64_t(u) * Shape::TY;
        if (r < end) load_vec<VEC>(x + r * ld + col, v[u]);
      }
      if constexpr (GELU) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t r = r0 + int64_t(u) * Shape::TY;
          if (r >= end) continue;
          float p[VEC];
          load_vec<VEC>(pre + r * ld + col, p);
          // __fmul_rn: never contracted into the add below, so the sums are
          // of exactly the values stored.
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[u][k] = round_to_storage<T>(__fmul_rn(v[u][k], gelu_slope(p[k])));
          store_vec<VEC>(dx + r * ld + col, v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r0 + int64_t(u) * Shape::TY < end)
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += v[u][k];
    }
  }

  __shared__ float part[Shape::TY][kGroupCols + 1];
  __shared__ float runs[kRuns][kGroupCols];
  __shared__ float block_sum[kGroupCols];
#pragma unroll
  for (int k = 0; k < VEC; ++k) part[ty][tx * VEC + k] = acc[k];
  __syncthreads();
  {
    constexpr int kLen = Shape::TY / kRuns;
    const int c = threadIdx.x % kGroupCols, run = threadIdx.x / kGroupCols;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kLen; ++i) s += part[run * kLen + i][c];
    runs[run][c] = s;
  }
  __syncthreads();
  if (threadIdx.x < kGroupCols) {
    float s = 0.0f;
#pragma unroll
    for (int run = 0; run < kRuns; ++run) s += runs[run][threadIdx.x];
    block_sum[threadIdx.x] = s;
  }
  cluster.sync();  // every block's block_sum is visible cluster-wide
  if (rank == 0 && threadIdx.x < kGroupCols && out != nullptr) {
    float s = 0.0f;
    for (int r = 0; r < C; ++r) s += cluster.map_shared_rank(block_sum, r)[threadIdx.x];
    const int64_t c = group * kGroupCols + threadIdx.x;
    if (c < cols) out[c] = from_f<O>(accumulate ? to_f(out[c]) + s : s);
  }
  cluster.sync();  // a block's shared memory outlives rank 0's reads of it
#else
  __trap();  // never launched: the host runs clusters only from sm_90+ code
#endif
}

// Blocks per cluster: enough that each block's slice holds at least U
// passes of its TY rows where the rows allow, up to kMaxCluster.
int cluster_size(int64_t rows, int rows_per_pass) {
  const int64_t want = (rows + rows_per_pass - 1) / rows_per_pass;
  return static_cast<int>(std::clamp<int64_t>(want, 1, kMaxCluster));
}

template <class T, class O, int VEC, bool GELU>
void launch_clusters(const T* x, const T* pre, T* dx, O* out, int64_t rows, int64_t cols, int64_t ld, bool accumulate) {
  constexpr int U = GELU ? 4 : 8;  // rows in flight per thread (the GELU pass holds two loads per row)
  const int64_t groups = (cols + kGroupCols - 1) / kGroupCols;
  const int C = cluster_size(rows, Tile<VEC>::TY * U);
  HG_CHECK(groups * C <= INT_MAX, "column_sum", cols, " columns need more blocks than one launch holds");
  cudaLaunchAttribute cluster_dim = cluster_attribute(C);
  const cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(groups * C)), kThreads, 0, &cluster_dim);
  HG_CUDA_CHECK(cudaLaunchKernelEx(&config, column_cluster_kernel<T, O, VEC, U, GELU>, x, pre, dx, out, rows, cols, ld,
                                   accumulate));
  HG_CUDA_CHECK_LAUNCH(GELU ? "column_cluster_kernel (GELU backward)" : "column_cluster_kernel");
}

// 16-byte loads need every row start (and pre's, for the GELU pass) 16-byte
// aligned and whole vectors of columns.
template <class T>
bool vector_loads(const void* x, const void* pre, int64_t cols, int64_t ld) {
  constexpr int VEC = VecWidth<T>::value;
  return aligned16(x) && (pre == nullptr || aligned16(pre)) && (ld * int64_t(sizeof(T))) % 16 == 0 && cols % VEC == 0;
}

template <class T, class O, bool GELU>
void clusters_for(const T* x, const T* pre, T* dx, O* out, int64_t rows, int64_t cols, int64_t ld, bool accumulate) {
  if (vector_loads<T>(x, pre, cols, ld))
    launch_clusters<T, O, VecWidth<T>::value, GELU>(x, pre, dx, out, rows, cols, ld, accumulate);
  else launch_clusters<T, O, 1, GELU>(x, pre, dx, out, rows, cols, ld, accumulate);
}

// ---- two launches (any GPU) -------------------------------------------------------
//
// A thread per column sums a chunk of rows (a warp reads 32 adjacent columns
// of a row: coalesced), and a second kernel adds the chunks' partial sums in
// chunk order.
constexpr int64_t kColumnChunk = 64;
constexpr int64_t kMaxChunks = 65535;  // grid.y
constexpr int kColumnThreads = 256;

template <class T>
__global__ void column_partial_kernel(const T* __restrict__ x, float* __restrict__ partial, int64_t cols, int64_t rows,
                                      int64_t ld, int64_t chunk_rows) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (i >= cols) return;
  const int64_t end = (chunk + 1) * chunk_rows < rows ? (chunk + 1) * chunk_rows : rows;
  float acc = 0.f;
  for (int64_t j = chunk * chunk_rows; j < end; ++j) acc += to_f(x[i + j * ld]);
  partial[chunk * cols + i] = acc;
}

template <class O>
__global__ void column_finish_kernel(const float* __restrict__ partial, O* __restrict__ out, int64_t cols,
                                     int64_t chunks, bool accumulate) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= cols) return;
  float acc = 0.f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * cols + i];
  out[i] = from_f<O>(accumulate ? to_f(out[i]) + acc : acc);
}

template <class T, class O>
void two_pass(const T* x, O* out, int64_t rows, int64_t cols, int64_t ld, bool accumulate) {
  // Chunks of 64 rows; longer ones only past 65535 chunks (4M rows).
  const int64_t chunk_rows = std::max(kColumnChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  Tensor partial = Tensor::empty({chunks, cols}, DType::F32, Device::CUDA);
  const auto blocks = static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
  column_partial_kernel<T><<<dim3(blocks, static_cast<unsigned>(chunks)), kColumnThreads, 0, stream()>>>(
      x, partial.data<float>(), cols, rows, ld, chunk_rows);
  HG_CUDA_CHECK_LAUNCH("column_partial_kernel");
  column_finish_kernel<O>
      <<<blocks, kColumnThreads, 0, stream()>>>(partial.data<float>(), out, cols, chunks, accumulate);
  HG_CUDA_CHECK_LAUNCH("column_finish_kernel");
}

// ---- dispatch ---------------------------------------------------------------------

// Calls f(T*) with x's storage type, then (O*) with out's.
template <class F>
void with_type(const Tensor& t, const char* what, F&& f) {
  switch (t.dtype()) {
    case DType::F32: return f(static_cast<float*>(t.raw_data()));
    case DType::BF16: return f(static_cast<__nv_bfloat16*>(t.raw_data()));
    default: fail("column_sum", what, " has dtype ", dtype_name(t.dtype()), "; f32 or bf16 expected");
  }
}

void check_out(const Tensor& out, int64_t cols) {
  HG_CHECK(out.device() == Device::CUDA && out.numel() == cols, "column_sum", "out is ", out.describe(), "; expected (",
           cols, ") on cuda");
}

}  // namespace

bool column_sum_clusters_run() {
  static const bool run = runs_sm90_code(column_cluster_kernel<float, float, 1, 8, false>);
  return run;
}

void column_sum(const Tensor& x, int64_t rows, int64_t cols, int64_t ld, const Tensor& out, bool accumulate,
                ColumnSumKernels kernels) {
  HG_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "column_sum", "rows ", rows, ", cols ", cols, ", ld ", ld,
           ": expected rows, cols >= 0 and ld >= cols");
  HG_CHECK(x.device() == Device::CUDA && (rows == 0 || (rows - 1) * ld + cols <= x.numel()), "column_sum", "x is ",
           x.describe(), "; expected CUDA storage of ", rows, " rows of ", cols, " columns, ", ld, " apart");
  check_out(out, cols);
  if (cols == 0) return;
  if (kernels == ColumnSumKernels::Auto)
    kernels = column_sum_clusters_run() ? ColumnSumKernels::Clusters : ColumnSumKernels::TwoPass;
  HG_CHECK(kernels == ColumnSumKernels::TwoPass || column_sum_clusters_run(), "column_sum",
           "the cluster kernels need an sm_90+ GPU and sm_90 code");
  with_type(x, "x", [&](auto* xs) {
    using T = std::remove_pointer_t<decltype(xs)>;
    with_type(out, "out", [&](auto* os) {
      if (kernels == ColumnSumKernels::TwoPass) return two_pass(xs, os, rows, cols, ld, accumulate);
      clusters_for<T, std::remove_pointer_t<decltype(os)>, false>(xs, nullptr, nullptr, os, rows, cols, ld, accumulate);
    });
  });
}

void gelu_backward_pass(const Tensor& dx, const Tensor& pre, const Tensor* bias_grad, bool accumulate) {
  const char* op = "gelu_backward_pass";
  HG_CHECK(dx.ndim() == 2 && pre.shape() == dx.shape() && pre.dtype() == dx.dtype() && dx.device() == Device::CUDA &&
               pre.device() == Device::CUDA,
           op, "dx ", dx.describe(), " and pre ", pre.describe(), " must be 2-D CUDA tensors of one shape and dtype");
  HG_CHECK(column_sum_clusters_run(), op, "needs an sm_90+ GPU and sm_90 code (thread-block clusters)");
  const int64_t rows = dx.size(0), cols = dx.size(1);
  if (bias_grad) check_out(*bias_grad, cols);
  if (rows == 0 || cols == 0) return;
  with_type(dx, "dx", [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    const T* p = static_cast<const T*>(pre.raw_data());
    if (bias_grad == nullptr) return clusters_for<T, float, true>(d, p, d, nullptr, rows, cols, cols, false);
    with_type(*bias_grad, "bias_grad", [&](auto* os) {
      clusters_for<T, std::remove_pointer_t<decltype(os)>, true>(d, p, d, os, rows, cols, cols, accumulate);
    });
  });
}

}  // namespace hg::gpu
