// Column sums, out[j] (+)= sum_i x[i * ld + j]: the bias gradients after a
// GEMM. Deterministic: every order of addition is fixed by the shape, no
// atomics. docs/gemm.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/storage_cast.cuh"

namespace hg::gpu {
namespace {

// ---- two launches ------------------------------------------------------------------
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
  // Unrolled so that several rows' loads are in flight; the adds stay in row order.
#pragma unroll 8
  for (int64_t j = chunk * chunk_rows; j < end; ++j) acc += to_f(x[i + j * ld]);
  partial[chunk * cols + i] = acc;
}

template <class O>
__global__ void column_finish_kernel(const float* __restrict__ partial, O* __restrict__ out, int64_t cols,
                                     int64_t chunks, bool accumulate) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= cols) return;
  float acc = 0.f;
  // Unrolled so that several chunks' loads are in flight; the adds stay in chunk order.
#pragma unroll 8
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

void column_sum(const Tensor& x, int64_t rows, int64_t cols, int64_t ld, const Tensor& out, bool accumulate) {
  HG_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "column_sum", "rows ", rows, ", cols ", cols, ", ld ", ld,
           ": expected rows, cols >= 0 and ld >= cols");
  HG_CHECK(x.device() == Device::CUDA && (rows == 0 || (rows - 1) * ld + cols <= x.numel()), "column_sum", "x is ",
           x.describe(), "; expected CUDA storage of ", rows, " rows of ", cols, " columns, ", ld, " apart");
  check_out(out, cols);
  if (cols == 0) return;
  with_type(x, "x",
            [&](auto* xs) { with_type(out, "out", [&](auto* os) { two_pass(xs, os, rows, cols, ld, accumulate); }); });
}

}  // namespace hg::gpu
