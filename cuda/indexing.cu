// Row gather and deterministic scatter-add for Embedding (see core/indexing.hpp).
#include <memory>

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

// ---- the CSR of scatter_add_rows built on the device (capturable) --------------
// counts[r] = number of positions of row r (integer atomics: exact).
__global__ void count_rows_kernel(const float* __restrict__ ids, int64_t n, int64_t v, int32_t* counts) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t r = row_of(ids[p], v);
    if (r >= 0) atomicAdd(&counts[r], 1);
  }
}

// data[0..len) becomes its exclusive prefix sum; one block: each thread scans
// a contiguous chunk, the chunk totals are scanned in shared memory.
constexpr int kScanThreads = 1024;
__global__ void exclusive_scan_kernel(int32_t* data, int64_t len) {
  __shared__ int32_t sums[kScanThreads];
  const int64_t chunk = (len + kScanThreads - 1) / kScanThreads;
  const int64_t begin = threadIdx.x * chunk, end = begin + chunk < len ? begin + chunk : len;
  int32_t local = 0;
  for (int64_t i = begin; i < end; ++i) local += data[i];
  sums[threadIdx.x] = local;
  __syncthreads();
  for (int offset = 1; offset < kScanThreads; offset <<= 1) {  // inclusive scan of the totals
    const int32_t add = threadIdx.x >= offset ? sums[threadIdx.x - offset] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int32_t running = sums[threadIdx.x] - local;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t c = data[i];
    data[i] = running;
    running += c;
  }
}

// positions[offsets[r] + k] = the k-th position (ascending) of row r: the
// same order as the host CSR, so the sums are bitwise those of the host path.
__global__ void place_rows_kernel(const float* __restrict__ ids, int64_t n, int64_t v,
                                  const int32_t* __restrict__ offsets, int32_t* __restrict__ positions) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t r = row_of(ids[p], v);
    if (r < 0) continue;
    int32_t rank = 0;
    for (int64_t q = 0; q < p; ++q) rank += row_of(ids[q], v) == r;
    positions[offsets[r] + rank] = static_cast<int32_t>(p);
  }
}

// One thread owns grad_table[v, col]: it sums the grad rows of its positions
// in ascending order, then adds once. No two threads touch the same element.
// Real text is skewed (a space, "the", a comma own thousands of a batch's
// positions), and one load at a time would keep such a row's threads waiting
// on memory latency thousands of times in a row: the loads of kInFlight
// positions are issued before their adds, which still run in position order.
constexpr int kInFlight = 8;
template <class T>
__global__ void scatter_add_rows_kernel(const T* __restrict__ grad, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ positions, int64_t d, T* __restrict__ grad_table) {
  const int64_t v = blockIdx.x;
  const int64_t col = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int32_t begin = offsets[v], end = offsets[v + 1];
  if (col >= d || begin == end) return;
  T acc = 0;
  int32_t j = begin;
  for (; j + kInFlight <= end; j += kInFlight) {
    T g[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) g[k] = grad[static_cast<int64_t>(positions[j + k]) * d + col];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) acc += g[k];
  }
  for (; j < end; ++j) acc += grad[static_cast<int64_t>(positions[j]) * d + col];
  grad_table[v * d + col] += acc;
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

static void launch_scatter(const Tensor& grad, const int32_t* off, const int32_t* pos, Tensor& grad_table) {
  const int64_t v = grad_table.size(0), d = grad_table.size(1);
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>(v), static_cast<unsigned>((d + threads - 1) / threads));
  if (grad.dtype() == DType::F32) {
    scatter_add_rows_kernel<float>
        <<<grid, threads, 0, stream()>>>(grad.data<float>(), off, pos, d, grad_table.data<float>());
  } else {
    scatter_add_rows_kernel<double>
        <<<grid, threads, 0, stream()>>>(grad.data<double>(), off, pos, d, grad_table.data<double>());
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
  std::vector<int32_t> positions(rows.size());
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (size_t p = 0; p < rows.size(); ++p) positions[fill[rows[p]]++] = static_cast<int32_t>(p);
  DeviceBuffer d_offsets = upload(offsets);
  DeviceBuffer d_positions = upload(positions);
  launch_scatter(grad, static_cast<const int32_t*>(d_offsets.get()), static_cast<const int32_t*>(d_positions.get()),
                 grad_table);
  // The buffers go back to the caching allocator here; reuse is stream-ordered.
}

void scatter_add_rows_cuda_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table) {
  const int64_t v = grad_table.size(0), n = ids.numel();
  DeviceBuffer offsets(allocate(static_cast<size_t>(v + 1) * sizeof(int32_t)));
  DeviceBuffer positions(allocate(static_cast<size_t>(n > 0 ? n : 1) * sizeof(int32_t)));
  auto* off = static_cast<int32_t*>(offsets.get());
  auto* pos = static_cast<int32_t*>(positions.get());
  HG_CUDA_CHECK(cudaMemsetAsync(off, 0, static_cast<size_t>(v + 1) * sizeof(int32_t), stream()));
  const int threads = 256;
  const int blocks = static_cast<int>(n / threads + 1 < 4096 ? n / threads + 1 : 4096);
  count_rows_kernel<<<blocks, threads, 0, stream()>>>(ids.data<float>(), n, v, off);
  HG_CUDA_CHECK_LAUNCH("count_rows_kernel");
  exclusive_scan_kernel<<<1, kScanThreads, 0, stream()>>>(off, v + 1);
  HG_CUDA_CHECK_LAUNCH("exclusive_scan_kernel");
  place_rows_kernel<<<blocks, threads, 0, stream()>>>(ids.data<float>(), n, v, off, pos);
  HG_CUDA_CHECK_LAUNCH("place_rows_kernel");
  launch_scatter(grad, off, pos, grad_table);
}

}  // namespace hg::gpu
