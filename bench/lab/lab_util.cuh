#pragma once
// What every bench/lab program shares: the CUDA error check, the timing loop,
// device attributes, the shared-memory set-up of staged kernels, the copy kernel of the bandwidth yardstick and the
// host-side conversions of the CPU references. CUDA runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
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

// Host-side float <-> storage conversions (round to nearest even into bf16).
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __float2bfloat16_rn(v);
}

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr what) {
  int device = 0, v = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&v, what, device));
  return v;
}

// As the product sets up its shared-memory staged kernels: all the dynamic
// shared memory a block of fn may have, and shared memory over L1.
inline void allow_all_shared_memory(const void* fn) {
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, fn));
  const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - int(attr.sharedSizeBytes);
  CHECK_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  CHECK_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// dst = src, 16 bytes per thread per step: the kernel side of the copy
// yardstick (beside cudaMemcpyAsync) that memory-bound candidates are
// measured against.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Milliseconds of fn(set) between CUDA events on the default stream, after
// `warmup` untimed calls; the input set rotates (call % sets) so that sets
// larger than the L2 are read from memory. EACH: one sample per call; else
// one sample of all `iters` calls queued back to back.
template <class Fn>
std::vector<float> event_samples(int warmup, int iters, int sets, bool each, Fn&& fn) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn(i % sets);
  if (!each) CHECK_CUDA(cudaDeviceSynchronize());
  const int samples = each ? iters : 1, calls = each ? 1 : iters;
  std::vector<float> ms(samples);
  for (int s = 0, i = 0; s < samples; ++s) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int c = 0; c < calls; ++c, ++i) fn((warmup + i) % sets);
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[s], start, stop));
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

// Median milliseconds of `iters` samples of one call each.
template <class Fn>
double median_ms(int warmup, int iters, int sets, Fn&& fn) {
  std::vector<float> ms = event_samples(warmup, iters, sets, true, fn);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

// Mean milliseconds of `iters` calls queued back to back. median_ms pays the
// host's launch latency in every sample (its start event runs on an idle GPU
// before the first launch arrives); here it is paid once, as in a step whose
// launches are queued ahead of the GPU.
template <class Fn>
double back_to_back_ms(int warmup, int iters, int sets, Fn&& fn) {
  return event_samples(warmup, iters, sets, false, fn)[0] / iters;
}

}  // namespace lab
