#pragma once
// Launch utilities shared by the fused kernels: the dynamic shared-memory
// opt-in, occupancy, what a kernel's compiled code can do, and launches with
// a cluster shape. One place for these calls, so a launcher states what it
// needs ("this many bytes", "blocks resident per SM") and not how the
// runtime is asked.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::gpu {

// Past 48 KB of dynamic shared memory a kernel must opt in; below it the
// call is skipped (it costs a driver round trip).
constexpr size_t kDefaultDynamicSmem = 48 * 1024;

template <class Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultDynamicSmem)
    HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr what) {
  int device = 0, value = 0;
  HG_CUDA_CHECK(cudaGetDevice(&device));
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&value, what, device));
  return value;
}

// Blocks of `kernel` (`threads` each, `smem` dynamic bytes, already allowed)
// resident per SM; 0 where none fits.
template <class Kernel>
int active_blocks_per_sm(Kernel kernel, int threads, size_t smem) {
  int n = 0;
  HG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return n;
}

// Blocks of `kernel` (`threads` each, `smem` dynamic bytes) resident per SM;
// fails naming `op` when not even one fits.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem, const char* op) {
  allow_dynamic_smem(kernel, smem);
  const int n = active_blocks_per_sm(kernel, threads, smem);
  HG_CHECK(n >= 1, op, "kernel does not fit on an SM (", threads, " threads, ", smem, " bytes of shared memory)");
  return n;
}

// Blocks of `kernel` the whole GPU holds at once (at least one per SM).
template <class Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t smem) {
  allow_dynamic_smem(kernel, smem);
  return int64_t(std::max(active_blocks_per_sm(kernel, threads, smem), 1)) * sm_count();
}

// Whether `kernel` runs Hopper code on this device: the device is sm_90+ and
// the kernel's compiled code targets it (bulk copies, clusters and other
// sm_90 instructions exist only there).
template <class Kernel>
bool runs_sm90_code(Kernel kernel) {
  if (compute_capability() < 90) return false;
  cudaFuncAttributes attr{};
  HG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

// The static shared memory of one block of `kernel`.
template <class Kernel>
int static_smem_bytes(Kernel kernel) {
  cudaFuncAttributes attr{};
  HG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return static_cast<int>(attr.sharedSizeBytes);
}

// The most dynamic shared memory one block of `kernel` may take on this
// device (the opt-in limit less the kernel's static shared memory), allowed
// to the kernel; 0 if there is none.
template <class Kernel>
size_t allow_max_dynamic_smem(Kernel kernel) {
  const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - static_smem_bytes(kernel);
  if (limit <= 0) return 0;
  HG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  return static_cast<size_t>(limit);
}

// A cluster of C blocks along x.
inline cudaLaunchAttribute cluster_attribute(int C) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = C, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
  return a;
}

// A launch on the handgrad stream with a cluster shape, or (null) none.
inline cudaLaunchConfig_t launch_config(dim3 grid, int threads, size_t smem, cudaLaunchAttribute* cluster_dim) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  config.attrs = cluster_dim;
  config.numAttrs = cluster_dim != nullptr ? 1 : 0;
  return config;
}

}  // namespace hg::gpu
