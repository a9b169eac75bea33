// Column sums, out[j] (+)= sum_i x[i * ld + j]: the bias gradients after a
// GEMM. Deterministic: every order of addition is fixed by the shape (the
// one atomic counts blocks, it adds no values). docs/gemm.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/column_sum.cuh"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::gpu {
namespace {

// One launch of cuda/column_sum.cuh's kernel per slab of kMaxTiles tiles.
// 16 row lanes of 16-byte loads and about two blocks per SM: enough loads in
// flight to stream at copy speed on wide inputs, and few enough chunk sums
// for the last block (bench/lab/column_sum_lab times the alternatives).
constexpr int kLanes = 16;
constexpr int64_t kTargetBlocks = 256;
constexpr int64_t kMaxTiles = 4096;  // tile counters; wider inputs are summed in slabs of tiles

// Per-tile arrival counters. Every count is back at zero when a kernel ends,
// so kernels that run one after another on one stream share them: one set
// for handgrad's stream, one for a Beside's (core/cuda_runtime.hpp).
__device__ unsigned int g_tile_arrivals[kMaxTiles];
__device__ unsigned int g_tile_arrivals_beside[kMaxTiles];

// The chunk sums' scratch beside handgrad's stream. The caching allocator
// reuses a freed block in the order of handgrad's stream only, so this one
// grows and never returns a block (each was taken after the Beside's fork,
// so nothing earlier still uses it).
float* beside_scratch(int64_t floats) {
  static float* block = nullptr;
  static int64_t capacity = 0;
  if (floats > capacity) {
    block = static_cast<float*>(allocate(size_t(floats) * sizeof(float)));
    capacity = floats;
  }
  return block;
}

template <class T, class O, int V>
void launch_columns(const T* x, O* out, int64_t rows, int64_t cols, int64_t ld, bool accumulate) {
  constexpr int64_t kTileCols = kColumnGroups * V;
  const bool beside = beside_active();
  unsigned int* arrivals = nullptr;
  HG_CUDA_CHECK(
      cudaGetSymbolAddress(reinterpret_cast<void**>(&arrivals), beside ? g_tile_arrivals_beside : g_tile_arrivals));
  for (int64_t first = 0; first < cols; first += kMaxTiles * kTileCols) {
    const int64_t width = std::min(cols - first, kMaxTiles * kTileCols);
    const int64_t tiles = (width + kTileCols - 1) / kTileCols;
    const ColumnChunks c = column_chunks(rows, tiles, kTargetBlocks, kLanes);
    Tensor scratch;  // on handgrad's stream, from the caching allocator
    float* partial = beside ? beside_scratch(c.chunks * width)
                            : (scratch = Tensor::empty({c.chunks, width}, DType::F32, Device::CUDA)).data<float>();
    column_sum_kernel<T, O, V, kLanes>
        <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(c.chunks)), kColumnGroups * kLanes, 0, stream()>>>(
            x + first, out + first, partial, arrivals, rows, width, ld, c.rows_per_chunk, static_cast<int>(c.chunks),
            accumulate);
    HG_CUDA_CHECK_LAUNCH("column_sum_kernel");
  }
}

// 16-byte loads when every row's columns start 16-byte aligned and V divides the width.
template <class T, class O>
void sum_columns(const T* x, O* out, int64_t rows, int64_t cols, int64_t ld, bool accumulate) {
  constexpr int V = 16 / sizeof(T);
  const bool vector = aligned16(x) && ld % V == 0 && cols % V == 0;
  if (vector) launch_columns<T, O, V>(x, out, rows, cols, ld, accumulate);
  else launch_columns<T, O, 1>(x, out, rows, cols, ld, accumulate);
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
  with_type(x, "x", [&](auto* xs) {
    with_type(out, "out", [&](auto* os) { sum_columns(xs, os, rows, cols, ld, accumulate); });
  });
}

}  // namespace hg::gpu
