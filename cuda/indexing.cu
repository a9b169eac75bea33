// Row gather and deterministic scatter-add for Embedding (see core/indexing.hpp).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <type_traits>

#include <cuda_bf16.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/indexing_kernels.hpp"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// The row an id names, or -1 when it is not an integer in [0, v).
__device__ __forceinline__ int32_t row_of(float id, int64_t v) {
  return (id >= 0.0f && id < static_cast<float>(v) && id == floorf(id)) ? static_cast<int32_t>(id) : -1;
}

// An id that names no row (possible only on the device-checked path) gives a
// NaN row, so the loss reports it instead of a read out of bounds.
template <class T>
__global__ void gather_rows_kernel(const T* __restrict__ table, const float* __restrict__ ids, int64_t n, int64_t d,
                                   int64_t v, T* __restrict__ out) {
  const int64_t total = n * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = row_of(ids[i / d], v);
    out[i] = row >= 0 ? table[static_cast<int64_t>(row) * d + i % d] : T(NAN);
  }
}

// out[r, :] = Out(table[ids[r], :] + positions[r % t, :]): the embedding's
// gather, position add and rounding to the residual stream's dtype in one
// pass, where gather, add and cast would move the rows three times. One
// block a row, W floats a thread (4: 16-byte loads when rows are aligned);
// an id that names no row gives a NaN row, as gather_rows_kernel.
template <class Out, int W>
__global__ void embed_rows_kernel(const float* __restrict__ table, const float* __restrict__ positions,
                                  const float* __restrict__ ids, int64_t n, int64_t t, int64_t d, int64_t v,
                                  Out* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int32_t row = row_of(ids[r], v);
    const float* token = table + static_cast<int64_t>(row) * d;
    const float* position = positions + (r % t) * d;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < d; c += static_cast<int64_t>(blockDim.x) * W) {
      float sum[W], p[W];
      load_vec<W>(position + c, p);
      if (row >= 0) {
        load_vec<W>(token + c, sum);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) sum[k] = NAN;
      }
#pragma unroll
      for (int k = 0; k < W; ++k) sum[k] += p[k];
      store_vec<W>(out + r * d + c, sum);
    }
  }
}

// The ids row_of rejects, `except` apart: summed over each warp, then one
// integer atomic a warp (exact in any order).
__global__ void count_bad_indices_kernel(const float* __restrict__ ids, int64_t n, int64_t limit, double except,
                                         unsigned long long* __restrict__ count) {
  unsigned long long bad = 0;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float id = ids[p];
    bad += static_cast<double>(id) != except && row_of(id, limit) < 0;
  }
  for (int offset = 16; offset > 0; offset >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, offset);
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(count, bad);
}

// ---- the CSR of scatter_add_rows built on the device (capturable) --------------
// For each position p: counts[r] += 1 (integer atomics: exact), the sort key
// r (ids that name no row get v, sorted past every row), and p itself.
__global__ void row_keys_kernel(const float* __restrict__ ids, int64_t n, int64_t v, int32_t* __restrict__ counts,
                                int32_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t r = row_of(ids[p], v);
    if (r >= 0) atomicAdd(&counts[r], 1);
    keys[p] = r >= 0 ? r : static_cast<int32_t>(v);
    positions[p] = static_cast<int32_t>(p);
  }
}

// One thread owns W columns of grad_table[v, :]: it sums the grad rows of
// its positions in ascending order, then adds once. No two threads touch the
// same element, and each column's sum runs in the same order whatever W is.
// The grid runs over the sorted positions (rows: the row of each, ascending),
// and only the first position of each row's run works, so rows no position
// names cost no block (a batch names a few thousand of GPT-2's 50304 rows).
// W is 16 bytes of grad (8 bf16, 4 f32) where rows are aligned: one block
// of D / W threads covers a row, where one column a thread took six blocks
// of 128 threads for GPT-2's 768, and the block launches, not the bytes, set
// the time. Real text is skewed (a space, "the", a comma own thousands of a
// batch's positions), and one load at a time would keep such a row's
// threads waiting on memory latency thousands of times in a row: the loads
// of kInFlight positions are issued before their adds, which still run in
// position order. A bf16 grad is widened (exactly) as it is read: the sums
// of its float32 cast, without the cast's pass.
constexpr int kInFlight = 8;

// W elements read or written as one access (16-byte aligned when W > 1).
template <class E, int W>
struct alignas(W > 1 ? 16 : alignof(E)) Piece {
  E v[W];
};

template <class G, class T>
__device__ __forceinline__ T widened(G g) {
  if constexpr (std::is_same_v<G, __nv_bfloat16>) return __bfloat162float(g);
  else return g;
}

template <class G, class T, int W>
__global__ void scatter_add_rows_kernel(const G* __restrict__ grad, const int32_t* __restrict__ rows,
                                        const int32_t* __restrict__ offsets, const int32_t* __restrict__ positions,
                                        int64_t v, int64_t d, T* __restrict__ grad_table) {
  using GradPiece = Piece<G, W>;
  const int32_t first = blockIdx.x;
  const int64_t col = (blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x) * W;
  const int32_t r = rows[first];
  if (col >= d || r >= v || (first > 0 && rows[first - 1] == r)) return;
  const int32_t end = offsets[r + 1];
  auto piece = [&](int32_t j) {
    return *reinterpret_cast<const GradPiece*>(grad + static_cast<int64_t>(positions[j]) * d + col);
  };
  T acc[W] = {};
  int32_t j = first;
  for (; j + kInFlight <= end; j += kInFlight) {
    GradPiece g[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) g[k] = piece(j + k);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
#pragma unroll
      for (int e = 0; e < W; ++e) acc[e] += widened<G, T>(g[k].v[e]);
  }
  for (; j < end; ++j) {
    const GradPiece g = piece(j);
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e] += widened<G, T>(g.v[e]);
  }
  // The table's W columns: 16-byte words for bf16 and f32 grads (W 8 and 4
  // of f32, W 2 of f64); scalars when W is 1.
  auto* row = reinterpret_cast<Piece<T, W>*>(grad_table + r * d + col);
  Piece<T, W> sum = *row;
#pragma unroll
  for (int e = 0; e < W; ++e) sum.v[e] += acc[e];
  *row = sum;
}

struct DeviceFree {
  void operator()(void* p) const { release(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

DeviceBuffer upload(const std::vector<int32_t>& host) {
  const size_t bytes = host.size() * sizeof(int32_t);
  DeviceBuffer buf(allocate(bytes));
  // Pageable source: returns once the bytes are staged, so `host` may die after.
  HG_CUDA_CHECK(cudaMemcpyAsync(buf.get(), host.data(), bytes, cudaMemcpyHostToDevice, stream()));
  return buf;
}

}  // namespace

void gather_rows_cuda(const Tensor& table, const Tensor& ids, int64_t n, Tensor& out) {
  const int64_t d = table.size(1);
  const int threads = 256;
  const int64_t blocks64 = (n * d + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks64 < 65535 * 8 ? blocks64 : 65535 * 8);
  if (table.dtype() == DType::F32) {
    gather_rows_kernel<float><<<blocks, threads, 0, stream()>>>(table.data<float>(), ids.data<float>(), n, d,
                                                                table.size(0), out.data<float>());
  } else {
    gather_rows_kernel<double><<<blocks, threads, 0, stream()>>>(table.data<double>(), ids.data<float>(), n, d,
                                                                 table.size(0), out.data<double>());
  }
  HG_CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

// Threads for a block that covers one row of `pieces` per-thread pieces:
// whole warps, at most 256 (a longer row takes several blocks or strides).
static int row_block_threads(int64_t pieces) {
  const int64_t lanes = (pieces + 31) / 32 * 32;
  return static_cast<int>(lanes < 256 ? lanes : 256);
}

template <class Out, int W>
void launch_embed_rows(const Tensor& table, const Tensor& positions, const Tensor& ids, int64_t t, Out* out) {
  const int64_t n = ids.numel(), d = table.size(1);
  const int threads = row_block_threads((d + W - 1) / W);
  const int blocks = static_cast<int>(n < (int64_t{1} << 20) ? n : (int64_t{1} << 20));
  embed_rows_kernel<Out, W><<<blocks, threads, 0, stream()>>>(table.data<float>(), positions.data<float>(),
                                                              ids.data<float>(), n, t, d, table.size(0), out);
  HG_CUDA_CHECK_LAUNCH("embed_rows_kernel");
}

template <class Out>
void embed_rows_as(const Tensor& table, const Tensor& positions, const Tensor& ids, int64_t t, Out* out) {
  const bool vector =
      table.size(1) % 4 == 0 && aligned16(table.data<float>()) && aligned16(positions.data<float>()) && aligned16(out);
  if (vector) launch_embed_rows<Out, 4>(table, positions, ids, t, out);
  else launch_embed_rows<Out, 1>(table, positions, ids, t, out);
}

void embed_rows_cuda(const Tensor& table, const Tensor& positions, const Tensor& ids, Tensor& out) {
  if (ids.numel() == 0) return;
  const int64_t t = positions.size(0);
  if (out.dtype() == DType::BF16) embed_rows_as(table, positions, ids, t, static_cast<__nv_bfloat16*>(out.raw_data()));
  else embed_rows_as(table, positions, ids, t, out.data<float>());
}

std::vector<int64_t> count_bad_indices_cuda(const std::vector<IndexSet>& sets) {
  // Slot i (8 bytes) holds set i's count, an integer.
  Tensor counts = Tensor::zeros({static_cast<int64_t>(sets.size())}, DType::F64, Device::CUDA);
  auto* slots = static_cast<unsigned long long*>(counts.raw_data());
  for (size_t i = 0; i < sets.size(); ++i) {
    const int64_t n = sets[i].ids.numel();
    if (n == 0) continue;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1024));
    count_bad_indices_kernel<<<blocks, threads, 0, stream()>>>(sets[i].ids.data<float>(), n, sets[i].limit,
                                                               sets[i].except, slots + i);
    HG_CUDA_CHECK_LAUNCH("count_bad_indices_kernel");
  }
  std::vector<unsigned long long> bad(sets.size());
  copy_bytes(bad.data(), Device::CPU, slots, Device::CUDA, bad.size() * sizeof(bad[0]));
  return {bad.begin(), bad.end()};
}

// The sums of the n sorted positions `pos` (row `rows[i]` each; rows
// ascending, v for an id that names no row; offsets: each row's first slot).
template <class G, class T, int W>
void launch_scatter_as(const G* grad, const int32_t* rows, const int32_t* off, const int32_t* pos, int64_t n, int64_t v,
                       int64_t d, T* grad_table) {
  const int64_t pieces = (d + W - 1) / W;
  const int threads = row_block_threads(pieces);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((pieces + threads - 1) / threads));
  scatter_add_rows_kernel<G, T, W><<<grid, threads, 0, stream()>>>(grad, rows, off, pos, v, d, grad_table);
  HG_CUDA_CHECK_LAUNCH("scatter_add_rows_kernel");
}

// 16 bytes of grad a thread where every row starts 16-byte aligned.
template <class G, class T>
void launch_scatter_typed(const Tensor& grad, const int32_t* rows, const int32_t* off, const int32_t* pos, int64_t n,
                          Tensor& grad_table) {
  constexpr int W = 16 / sizeof(G);
  const int64_t v = grad_table.size(0), d = grad_table.size(1);
  const auto* g = static_cast<const G*>(grad.raw_data());
  auto* table = static_cast<T*>(grad_table.raw_data());
  if (d % W == 0 && aligned16(g) && aligned16(table)) launch_scatter_as<G, T, W>(g, rows, off, pos, n, v, d, table);
  else launch_scatter_as<G, T, 1>(g, rows, off, pos, n, v, d, table);
}

static void launch_scatter(const Tensor& grad, const int32_t* rows, const int32_t* off, const int32_t* pos, int64_t n,
                           Tensor& grad_table) {
  if (n == 0) return;
  if (grad.dtype() == DType::BF16) launch_scatter_typed<__nv_bfloat16, float>(grad, rows, off, pos, n, grad_table);
  else if (grad.dtype() == DType::F32) launch_scatter_typed<float, float>(grad, rows, off, pos, n, grad_table);
  else launch_scatter_typed<double, double>(grad, rows, off, pos, n, grad_table);
}

void scatter_add_rows_cuda(const Tensor& grad, const std::vector<int32_t>& rows, Tensor& grad_table) {
  const int64_t v = grad_table.size(0);
  const int64_t d = grad_table.size(1);
  // Counting sort of positions by row (a CSR), so each GPU thread owns one
  // (row, column) and sums its positions in ascending order.
  std::vector<int32_t> offsets(static_cast<size_t>(v) + 1, 0);
  for (int32_t r : rows) ++offsets[r + 1];
  for (int64_t r = 0; r < v; ++r) offsets[r + 1] += offsets[r];
  std::vector<int32_t> positions(rows.size()), sorted_rows(rows.size());
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (size_t p = 0; p < rows.size(); ++p) {
    sorted_rows[static_cast<size_t>(fill[rows[p]])] = rows[p];
    positions[static_cast<size_t>(fill[rows[p]]++)] = static_cast<int32_t>(p);
  }
  DeviceBuffer d_rows = upload(sorted_rows);
  DeviceBuffer d_offsets = upload(offsets);
  DeviceBuffer d_positions = upload(positions);
  launch_scatter(grad, static_cast<const int32_t*>(d_rows.get()), static_cast<const int32_t*>(d_offsets.get()),
                 static_cast<const int32_t*>(d_positions.get()), static_cast<int64_t>(rows.size()), grad_table);
  // The buffers go back to the caching allocator here; reuse is stream-ordered.
}

void scatter_add_rows_cuda_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table) {
  const int64_t v = grad_table.size(0), n = ids.numel();
  HG_CHECK(v < INT32_MAX && n < INT32_MAX, "scatter_add_rows", "at most ", INT32_MAX - 1, " rows and ids, got ", v,
           " rows and ", n, " ids");
  const int items = static_cast<int>(n), count = items > 0 ? items : 1;
  // Integers each: counts (v + 1, then the offsets in place), keys in and
  // out, positions in and out.
  DeviceBuffer counts(allocate(static_cast<size_t>(v + 1) * sizeof(int32_t)));
  DeviceBuffer keys(allocate(4 * static_cast<size_t>(count) * sizeof(int32_t)));
  auto* off = static_cast<int32_t*>(counts.get());
  int32_t* keys_in = static_cast<int32_t*>(keys.get());
  int32_t* keys_out = keys_in + count;
  int32_t* pos_in = keys_out + count;
  int32_t* pos = pos_in + count;
  HG_CUDA_CHECK(cudaMemsetAsync(off, 0, static_cast<size_t>(v + 1) * sizeof(int32_t), stream()));
  const int threads = 256;
  const int blocks = static_cast<int>(n / threads + 1 < 4096 ? n / threads + 1 : 4096);
  row_keys_kernel<<<blocks, threads, 0, stream()>>>(ids.data<float>(), n, v, off, keys_in, pos_in);
  HG_CUDA_CHECK_LAUNCH("row_keys_kernel");
  // The offsets are the exclusive sum of the counts; a stable radix sort of
  // the positions by row keeps each row's positions ascending, the order of
  // the host CSR (so the sums are bitwise those of scatter_add_rows_cuda).
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= v) ++end_bit;  // keys 0..v
  const int rows = static_cast<int>(v + 1);
  size_t scan_bytes = 0, sort_bytes = 0;
  HG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, off, off, rows, stream()));
  HG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_in, keys_out, pos_in, pos, items, 0, end_bit,
                                                stream()));
  DeviceBuffer temp(allocate(std::max<size_t>({scan_bytes, sort_bytes, 1})));
  HG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.get(), scan_bytes, off, off, rows, stream()));
  HG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, keys_in, keys_out, pos_in, pos, items, 0,
                                                end_bit, stream()));
  launch_scatter(grad, keys_out, off, pos, n, grad_table);
}

}  // namespace hg::gpu
