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
#include <utility>

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

// ---- launches that overlap the previous kernel's end (sm_90+) ----------
// Programmatic dependent launch: a kernel may be scheduled while the kernel
// before it on the stream runs its last wave, instead of after it has
// finished; inside a CUDA graph that hides most of the ~2 us between two
// kernels. It is safe only because every handgrad kernel begins with
// wait_for_previous_kernel(), which holds the whole block until the previous
// kernel has finished and its writes are visible (so each kernel still sees
// all the work queued before it). CTest `kernel_entry` checks that every
// __global__ function in cuda/ begins so.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // This block has started: the next kernel may be scheduled (its blocks
  // then wait for this kernel to finish, above).
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels on this device are launched to overlap the previous one:
// sm_90+ and `kernel` built for it (code compiled for an older architecture
// has no wait_for_previous_kernel instruction).
bool overlaps_previous_kernel(const void* kernel);

// Launch attributes: the cluster shape (null: none) and the overlap with the
// previous kernel where the device and `kernel` support it.
struct LaunchAttributes {
  cudaLaunchAttribute list[2];
  unsigned count = 0;
  LaunchAttributes(const void* kernel, const cudaLaunchAttribute* cluster_dim) {
    if (cluster_dim != nullptr) list[count++] = *cluster_dim;
    if (overlaps_previous_kernel(kernel)) {
      cudaLaunchAttribute& a = list[count++];
      a = cudaLaunchAttribute{};
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
};

// A launch on the handgrad stream with a cluster shape, or (null) none,
// that waits for the previous kernel to finish.
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

// The launch configuration of `kernel` on `s` with `attrs` (kept alive by the caller).
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s, LaunchAttributes& attrs) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  config.attrs = attrs.list;
  config.numAttrs = attrs.count;
  return config;
}

// kernel<<<grid, block, smem, s>>>(args...), overlapping the previous kernel
// where supported; `cluster_dim`: a cluster shape or null.
template <class... Params, class... Args>
void launch_on_stream(cudaStream_t s, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      const cudaLaunchAttribute* cluster_dim, Args&&... args) {
  LaunchAttributes attrs(reinterpret_cast<const void*>(kernel), cluster_dim);
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, s, attrs);
  HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The same on the handgrad stream without a cluster shape.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  launch_on_stream(stream(), kernel, grid, block, smem, nullptr, std::forward<Args>(args)...);
}

}  // namespace hg::gpu
