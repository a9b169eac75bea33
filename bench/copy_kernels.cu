// Copy kernels for the bandwidth yardstick (API: bench/copy_kernels.hpp).
// Every kernel moves 16-byte words (uint4); they differ in what a
// memory-bound kernel can choose: how many loads a thread keeps in flight
// (U), the block size (T), the grid (one wave of resident blocks walking the
// data with a grid-sized stride, or one thread per U words and as many
// waves as that takes), and the cache hints (plain, or loads that skip L1
// allocation and evict-first stores, for data touched once).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "bench/copy_kernels.hpp"
#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::bench {
namespace {

enum class Grid { Wave, OneShot };

__device__ __forceinline__ uint4 load_word(const uint4* p, bool hints) {
  if (!hints) return *p;
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void store_word(uint4* p, const uint4& v, bool hints) {
  if (hints) __stcs(p, v);
  else *p = v;
}

// Wave: blocks walk the words with stride gridDim * T * U, each thread
// loading U words (T apart) before storing any. OneShot: the same U words
// per thread, once.
template <int T, int U, Grid GRID, bool HINTS>
__global__ void __launch_bounds__(T) copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t n) {
  const int64_t tile = int64_t{T} * U;
  const int64_t stride = GRID == Grid::Wave ? tile * gridDim.x : 0;
  for (int64_t base = blockIdx.x * tile + threadIdx.x; base < n; base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < n) v[u] = load_word(src + base + u * T, HINTS);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < n) store_word(dst + base + u * T, v[u], HINTS);
    if constexpr (GRID == Grid::OneShot) break;
  }
}

struct Entry {
  const char* name;
  void (*launch)(uint4*, const uint4*, int64_t);
};

template <int T, int U, Grid GRID, bool HINTS>
void launch(uint4* dst, const uint4* src, int64_t n) {
  auto kernel = copy_kernel<T, U, GRID, HINTS>;
  const int64_t tiles = (n + int64_t{T} * U - 1) / (int64_t{T} * U);
  int64_t blocks = tiles;
  if constexpr (GRID == Grid::Wave) {
    static const int per_sm = [&] {
      int b = 0;
      HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, T, 0));
      return std::max(b, 1);
    }();
    blocks = std::min<int64_t>(tiles, int64_t{per_sm} * gpu::sm_count());
  }
  kernel<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), T, 0, gpu::stream()>>>(dst, src, n);
  HG_CUDA_CHECK_LAUNCH("copy_kernel");
}

constexpr Entry kKernels[] = {
    {"wave-t256-u1", launch<256, 1, Grid::Wave, false>},
    {"wave-t256-u4", launch<256, 4, Grid::Wave, false>},
    {"wave-t512-u4-nc", launch<512, 4, Grid::Wave, true>},
    {"wave-t1024-u8-nc", launch<1024, 8, Grid::Wave, true>},
    {"wave-t128-u8-nc", launch<128, 8, Grid::Wave, true>},
    {"oneshot-t256-u4", launch<256, 4, Grid::OneShot, false>},
    {"oneshot-t256-u4-nc", launch<256, 4, Grid::OneShot, true>},
    {"oneshot-t512-u8-nc", launch<512, 8, Grid::OneShot, true>},
};
constexpr int kCount = static_cast<int>(sizeof(kKernels) / sizeof(kKernels[0]));

}  // namespace

int copy_kernel_count() { return kCount; }

std::string copy_kernel_name(int k) { return k >= 0 && k < kCount ? kKernels[k].name : "?"; }

bool launch_copy_kernel(int k, void* dst, const void* src, size_t bytes) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (k < 0 || k >= kCount || bytes % 16 != 0 || !aligned(dst) || !aligned(src)) return false;
  if (bytes == 0) return true;
  kKernels[k].launch(static_cast<uint4*>(dst), static_cast<const uint4*>(src), static_cast<int64_t>(bytes / 16));
  return true;
}

}  // namespace hg::bench
