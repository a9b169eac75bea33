// Row gather and deterministic scatter-add for Embedding (see core/indexing.hpp).
#include <memory>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/indexing_kernels.hpp"

namespace hg::gpu {
namespace {

template <class T>
__global__ void gather_rows_kernel(const T* __restrict__ table, const float* __restrict__ ids,
                                   int64_t n, int64_t d, T* __restrict__ out) {
  const int64_t total = n * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = static_cast<int64_t>(ids[i / d]);
    out[i] = table[row * d + i % d];
  }
}

// One thread owns grad_table[v, col]: it sums the grad rows of its positions
// in ascending order, then adds once. No two threads touch the same element.
template <class T>
__global__ void scatter_add_rows_kernel(const T* __restrict__ grad, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ positions, int64_t d,
                                        T* __restrict__ grad_table) {
  const int64_t v = blockIdx.x;
  const int64_t col = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int32_t begin = offsets[v], end = offsets[v + 1];
  if (col >= d || begin == end) return;
  T acc = 0;
  for (int32_t j = begin; j < end; ++j) acc += grad[static_cast<int64_t>(positions[j]) * d + col];
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
    gather_rows_kernel<float><<<blocks, threads, 0, stream()>>>(table.data<float>(), ids.data<float>(), n,
                                                                d, out.data<float>());
  } else {
    gather_rows_kernel<double><<<blocks, threads, 0, stream()>>>(table.data<double>(), ids.data<float>(),
                                                                 n, d, out.data<double>());
  }
  HG_CUDA_CHECK_LAUNCH("gather_rows_kernel");
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
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>(v), static_cast<unsigned>((d + threads - 1) / threads));
  const auto* off = static_cast<const int32_t*>(d_offsets.get());
  const auto* pos = static_cast<const int32_t*>(d_positions.get());
  if (grad.dtype() == DType::F32) {
    scatter_add_rows_kernel<float><<<grid, threads, 0, stream()>>>(grad.data<float>(), off, pos, d,
                                                                   grad_table.data<float>());
  } else {
    scatter_add_rows_kernel<double><<<grid, threads, 0, stream()>>>(grad.data<double>(), off, pos, d,
                                                                    grad_table.data<double>());
  }
  HG_CUDA_CHECK_LAUNCH("scatter_add_rows_kernel");
  // The buffers go back to the caching allocator here; reuse is stream-ordered.
}

}  // namespace hg::gpu
