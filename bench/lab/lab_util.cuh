#pragma once
// What every bench/lab program shares: the CUDA error check, the timing loop
// and the copy kernel of the bandwidth yardstick. CUDA runtime only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace lab {

// dst = src, 16 bytes per thread per step: the kernel side of the copy
// yardstick (beside cudaMemcpyAsync) that memory-bound candidates are
// measured against.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// The copy kernels of the benchmarks' yardstick (bench/copy_kernels.cu, which
// links handgrad's runtime, so the lab has its own): U 16-byte words in
// flight per thread of T, one wave of resident blocks walking the data or one
// shot per tile, plain or no-L1-allocate loads and evict-first stores.
template <int T, int U, bool WAVE, bool HINTS>
__global__ void __launch_bounds__(T)
    copy_words_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  const int64_t tile = int64_t{T} * U;
  for (int64_t base = blockIdx.x * tile + threadIdx.x; base < n; base += WAVE ? tile * gridDim.x : n) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < n) {
        if constexpr (HINTS)
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                       : "l"(src + base + u * T));
        else v[u] = src[base + u * T];
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < n) {
        if constexpr (HINTS) __stcs(dst + base + u * T, v[u]);
        else dst[base + u * T] = v[u];
      }
  }
}

template <int T, int U, bool WAVE, bool HINTS>
void launch_copy_words(const void* src, void* dst, int64_t n, int sms) {
  auto k = copy_words_kernel<T, U, WAVE, HINTS>;
  int64_t blocks = (n + int64_t{T} * U - 1) / (int64_t{T} * U);
  if constexpr (WAVE) {
    static int per_sm = 0;
    if (per_sm == 0) CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, T, 0));
    blocks = std::min<int64_t>(blocks, int64_t{std::max(per_sm, 1)} * sms);
  }
  k<<<unsigned(std::max<int64_t>(blocks, 1)), T>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), n);
}

// Median milliseconds of `iters` samples of fn(set) on the default stream,
// timed by CUDA events after `warmup` untimed ones; the input set rotates
// (sample % sets) so that sets larger than the L2 are read from memory.
template <class Fn>
double median_ms(int warmup, int iters, int sets, Fn&& fn) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn(i % sets);
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    fn((warmup + i) % sets);
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

// median_ms with `calls` back-to-back calls per sample (sets rotating over
// the calls), per call: launch gaps count as in a program that runs kernels
// back to back, as the benchmarks (bench_layernorm, bench_softmax) time them.
template <class Fn>
double median_ms_per_call(int warmup, int iters, int sets, int calls, Fn&& fn) {
  int counter = 0;
  return median_ms(warmup, iters, 1,
                   [&](int) {
                     for (int c = 0; c < calls; ++c) fn(counter++ % sets);
                   }) /
         calls;
}

// Calls per timed sample for about 1 ms of GPU work at 2.5 TB/s moving
// `bytes` per call, 1..64: the benchmarks' rule.
inline int calls_for(double bytes) {
  return static_cast<int>(std::clamp(std::ceil(1e-3 / (bytes / 2.5e12)), 1.0, 64.0));
}

// The best copy of `bytes` (a multiple of 16; src(s), dst(s) 16-byte aligned
// buffers of set s): the fastest of cudaMemcpyAsync and the copy kernels
// above, timed like the candidates. Its name goes to *name.
template <class Src, class Dst>
double best_copy_ms(int warmup, int iters, int sets, int calls, size_t bytes, int sms, const Src& src, const Dst& dst,
                    const char** name = nullptr) {
  const int64_t n = int64_t(bytes / 16);
  struct Entry {
    const char* name;
    void (*launch)(const void*, void*, int64_t, int);
  };
  const Entry kernels[] = {
      {"memcpy", [](const void* s, void* d, int64_t words,
                    int) { CHECK_CUDA(cudaMemcpyAsync(d, s, size_t(words) * 16, cudaMemcpyDeviceToDevice)); }},
      {"wave-t512-u4-nc", launch_copy_words<512, 4, true, true>},
      {"wave-t256-u4", launch_copy_words<256, 4, true, false>},
      {"oneshot-t256-u4-nc", launch_copy_words<256, 4, false, true>},
      {"oneshot-t512-u8-nc", launch_copy_words<512, 8, false, true>},
  };
  double best = 0;
  for (const Entry& e : kernels) {
    const double ms = median_ms_per_call(warmup, iters, sets, calls, [&](int s) { e.launch(src(s), dst(s), n, sms); });
    if (best == 0 || ms < best) {
      best = ms;
      if (name != nullptr) *name = e.name;
    }
  }
  return best;
}

}  // namespace lab
