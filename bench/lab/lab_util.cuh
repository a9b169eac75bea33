#pragma once
// What every bench/lab program shares: the CUDA error check and the timing
// loop. CUDA runtime only.
#include <cuda_runtime.h>

#include <algorithm>
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

}  // namespace lab
