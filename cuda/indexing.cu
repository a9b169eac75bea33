// Row gather and deterministic scatter-add for Embedding (see core/indexing.hpp).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/indexing_kernels.hpp"

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

// One thread owns grad_table[v, col]: it sums the grad rows of its positions
// in ascending order, then adds once. No two threads touch the same element.
// The grid runs over the sorted positions (rows: the row of each, ascending),
// and only the first position of each row's run works, so rows no position
// names cost no block (a batch names a few thousand of GPT-2's 50304 rows).
// Real text is skewed (a space, "the", a comma own thousands of a batch's
// positions), and one load at a time would keep such a row's threads waiting
// on memory latency thousands of times in a row: the loads of kInFlight
// positions are issued before their adds, which still run in position order.
constexpr int kInFlight = 8;
template <class T>
__global__ void scatter_add_rows_kernel(const T* __restrict__ grad, const int32_t* __restrict__ rows,
                                        const int32_t* __restrict__ offsets, const int32_t* __restrict__ positions,
                                        int64_t v, int64_t d, T* __restrict__ grad_table) {
  const int32_t first = blockIdx.x;
  const int64_t col = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int32_t r = rows[first];
  if (col >= d || r >= v || (first > 0 && rows[first - 1] == r)) return;
  const int32_t end = offsets[r + 1];
  T acc = 0;
  int32_t j = first;
  for (; j + kInFlight <= end; j += kInFlight) {
    T g[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) g[k] = grad[static_cast<int64_t>(positions[j + k]) * d + col];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) acc += g[k];
  }
  for (; j < end; ++j) acc += grad[static_cast<int64_t>(positions[j]) * d + col];
  grad_table[r * d + col] += acc;
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
static void launch_scatter(const Tensor& grad, const int32_t* rows, const int32_t* off, const int32_t* pos, int64_t n,
                           Tensor& grad_table) {
  if (n == 0) return;
  const int64_t v = grad_table.size(0), d = grad_table.size(1);
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((d + threads - 1) / threads));
  if (grad.dtype() == DType::F32) {
    scatter_add_rows_kernel<float>
        <<<grid, threads, 0, stream()>>>(grad.data<float>(), rows, off, pos, v, d, grad_table.data<float>());
  } else {
    scatter_add_rows_kernel<double>
        <<<grid, threads, 0, stream()>>>(grad.data<double>(), rows, off, pos, v, d, grad_table.data<double>());
  }
  HG_CUDA_CHECK_LAUNCH("scatter_add_rows_kernel");
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
