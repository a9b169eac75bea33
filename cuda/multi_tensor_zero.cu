// Backend::zero_multi on CUDA: every tensor of a list set to 0 in one launch
// (one per kMaxTensors tensors). Zero is all bits clear in every dtype, so
// the kernel clears bytes and one launch serves f32, bf16, f16 and f64 mixed.
// The tensor table travels as the kernel's argument, not as a device buffer:
// nothing is uploaded or cached, the first call may happen inside a CUDA
// graph capture, and the captured node keeps its own copy of the table.
#include <cstdint>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/optim_kernels.hpp"

namespace hg::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = 64 * 1024;  // bytes per block: 16 stores of 16 bytes per thread
constexpr int kMaxTensors = 192;            // keeps the argument under the 4 KB every driver accepts
constexpr int64_t kMaxBlocks = INT32_MAX;   // the grid's x limit

// Block b clears chunk b - first_block[i] of tensor i, where i is the last
// tensor with first_block[i] <= b.
struct ZeroTable {
  unsigned char* ptr[kMaxTensors];
  int64_t bytes[kMaxTensors];
  int32_t first_block[kMaxTensors];
  int32_t count;
};
static_assert(sizeof(ZeroTable) <= 4000, "kernel arguments are limited to 4 KB");

__global__ void zero_chunks(const __grid_constant__ ZeroTable table) {
  const int block = static_cast<int>(blockIdx.x);
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  const int64_t begin = static_cast<int64_t>(block - table.first_block[lo]) * kChunkBytes;
  const int64_t end = begin + kChunkBytes < table.bytes[lo] ? begin + kChunkBytes : table.bytes[lo];
  unsigned char* const first = table.ptr[lo] + begin;
  unsigned char* const last = table.ptr[lo] + end;
  // The allocator's blocks are aligned, but a slice may start anywhere: 16-byte
  // stores in the aligned middle, the ragged ends (< 16 bytes each) bytewise.
  uintptr_t mid_begin = (reinterpret_cast<uintptr_t>(first) + 15) & ~uintptr_t(15);
  if (mid_begin > reinterpret_cast<uintptr_t>(last)) mid_begin = reinterpret_cast<uintptr_t>(last);
  uintptr_t mid_end = reinterpret_cast<uintptr_t>(last) & ~uintptr_t(15);
  if (mid_end < mid_begin) mid_end = mid_begin;
  const int64_t head = static_cast<int64_t>(mid_begin - reinterpret_cast<uintptr_t>(first));
  const int64_t tail = static_cast<int64_t>(reinterpret_cast<uintptr_t>(last) - mid_end);
  if (threadIdx.x < head) first[threadIdx.x] = 0;
  if (threadIdx.x < tail) reinterpret_cast<unsigned char*>(mid_end)[threadIdx.x] = 0;
  uint4* const mid = reinterpret_cast<uint4*>(mid_begin);
  const int64_t vectors = static_cast<int64_t>(mid_end - mid_begin) / 16;
  for (int64_t i = threadIdx.x; i < vectors; i += kThreads) mid[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace

void zero_multi(const std::vector<Tensor>& outs) {
  ZeroTable table{};
  int64_t blocks = 0;
  const auto launch = [&] {
    if (table.count == 0) return;
    zero_chunks<<<static_cast<unsigned int>(blocks), kThreads, 0, stream()>>>(table);
    HG_CUDA_CHECK_LAUNCH("zero_chunks");
    table.count = 0;
    blocks = 0;
  };
  for (const Tensor& t : outs) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (bytes == 0) continue;
    const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
    if (table.count == kMaxTensors || blocks + chunks > kMaxBlocks) launch();
    HG_CHECK(chunks <= kMaxBlocks, "cuda zero_multi", "a tensor of ", bytes, " bytes needs more than ", kMaxBlocks,
             " blocks");
    table.ptr[table.count] = static_cast<unsigned char*>(t.raw_data());
    table.bytes[table.count] = bytes;
    table.first_block[table.count] = static_cast<int32_t>(blocks);
    ++table.count;
    blocks += chunks;
  }
  launch();
}

}  // namespace hg::gpu
