#pragma once
// The column-sum kernel, out[j] (+)= sum_i x[i * ld + j], in one launch:
// cuda/column_sum.cu launches it for the bias gradients; bench/lab's
// column_sum_lab times its shapes of work. Device code and a host-side
// shape rule only.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/storage_cast.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {

// A block sums one chunk of rows of one tile of columns: 32 column groups of
// V adjacent columns (16-byte loads, so a warp reads 512 contiguous bytes of
// a row) times LANES row lanes, each lane a fixed stride of the chunk's rows. The
// lanes are added in lane order through shared memory and the chunk's sums
// written to a scratch row. The last block of a tile to finish (a counter per
// tile, reset by that block for the next call) adds the tile's chunk sums the
// same way, lanes over chunks. One launch, no second kernel waiting on the
// first, and every order of addition fixed by the shape.
constexpr int kColumnGroups = 32;

// The rows of a chunk: a multiple of `lanes`, as many chunks as fill about
// `target_blocks` blocks over `tiles` tiles. A function of the shape alone,
// so the order of the sums is too.
struct ColumnChunks {
  int64_t rows_per_chunk, chunks;
};
inline ColumnChunks column_chunks(int64_t rows, int64_t tiles, int64_t target_blocks, int lanes) {
  const int64_t most = std::max<int64_t>(1, (rows + lanes - 1) / lanes);
  const int64_t want = std::clamp<int64_t>((target_blocks + tiles - 1) / tiles, 1, most);
  const int64_t per = std::max<int64_t>(lanes, ((rows + want - 1) / want + lanes - 1) / lanes * lanes);
  return {per, std::max<int64_t>(1, (rows + per - 1) / per)};
}

// Adds V adjacent float chunk sums (16-byte loads through L2 where V > 1).
template <int V>
__device__ __forceinline__ void add_chunk_sums(const float* p, float* acc) {
  if constexpr (V == 1) {
    acc[0] += __ldcg(p);
  } else {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p + k));
      acc[k] += v.x, acc[k + 1] += v.y, acc[k + 2] += v.z, acc[k + 3] += v.w;
    }
  }
}

// Column c of a tile's lane sums added over the lanes, in lane order.
template <int LANES, int COLS>
__device__ __forceinline__ float sum_lanes(const float (&lane_sums)[LANES][COLS], int c) {
  float sum = 0.f;
#pragma unroll
  for (int l = 0; l < LANES; ++l) sum += lane_sums[l][c];
  return sum;
}

// arrivals: one counter per tile, zero before the launch and zero again
// after it (the last block resets its tile's), so launches that run one
// after another share them. chunk_sums: chunks x cols floats of scratch.
template <class T, class O, int V, int LANES>
__global__ void __launch_bounds__(kColumnGroups* LANES)
    column_sum_kernel(const T* __restrict__ x, O* __restrict__ out, float* __restrict__ chunk_sums,
                      unsigned int* __restrict__ arrivals, int64_t rows, int64_t cols, int64_t ld, int64_t chunk_rows,
                      int chunks, bool accumulate) {
  constexpr int kThreads = kColumnGroups * LANES, kTileCols = kColumnGroups * V;
  __shared__ float lane_sums[LANES][kTileCols];
  __shared__ bool last;
  const int group = threadIdx.x % kColumnGroups, lane = threadIdx.x / kColumnGroups, chunk = blockIdx.y;
  const int64_t tile_col = blockIdx.x * int64_t(kTileCols), col = tile_col + group * V;
  const bool in_cols = col < cols;  // V divides cols on the vector path, so a group is all in or all out
  float acc[V] = {};
  if (in_cols) {
    const int64_t begin = chunk * chunk_rows, end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
    // Unrolled so that several rows' loads are in flight; the adds stay in row order.
#pragma unroll 8
    for (int64_t r = begin + lane; r < end; r += LANES) {
      float v[V];
      load_vec<V>(x + r * ld + col, v);  // one 16-byte load where V > 1
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) lane_sums[lane][group * V + k] = acc[k];
  __syncthreads();
  // Thread t adds column t of the tile over the lanes, then its chunk sum goes to scratch.
  const int64_t tile_width = cols - tile_col < kTileCols ? cols - tile_col : kTileCols;
  for (int c = threadIdx.x; c < tile_width; c += kThreads)
    chunk_sums[int64_t(chunk) * cols + tile_col + c] = sum_lanes<LANES>(lane_sums, c);
  // Publish the chunk sums before counting this block in; the last block to arrive reads them all.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&arrivals[blockIdx.x], 1u) == static_cast<unsigned>(chunks - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The same shape of work over the chunk sums: lane l adds chunks l, l + LANES, ...
  // (through L2: other blocks wrote them), then the lanes are added in order.
  float total[V] = {};
  if (in_cols) {
    const float* column = chunk_sums + col;
#pragma unroll 4
    for (int k = lane; k < chunks; k += LANES) add_chunk_sums<V>(column + int64_t(k) * cols, total);
  }
  __syncthreads();  // every thread has read lane_sums above
#pragma unroll
  for (int k = 0; k < V; ++k) lane_sums[lane][group * V + k] = total[k];
  __syncthreads();
  for (int c = threadIdx.x; c < tile_width; c += kThreads) {
    const float sum = sum_lanes<LANES>(lane_sums, c);
    O* dst = out + tile_col + c;
    *dst = from_f<O>(accumulate ? to_f(*dst) + sum : sum);
  }
  if (threadIdx.x == 0) arrivals[blockIdx.x] = 0;  // ready for the next call
}

}  // namespace hg::gpu
