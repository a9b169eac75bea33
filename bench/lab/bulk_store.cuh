#pragma once
// Bulk copies from shared to global memory (sm_90, cp.async.bulk), for the
// labs' staged row kernels that write a row of output into a shared-memory
// out stage and copy it out as one asynchronous copy: the writers fence
// their shared-memory writes for the async proxy and sync; one thread
// issues the copy as a bulk group; before that stage is written again the
// same thread waits until at most N newer groups still read shared memory.
// Source, destination and size 16-byte multiples (PTX ISA, cp.async.bulk).
#include <cstdint>

#include "cuda/bulk_stage.cuh"

namespace lab {

__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// One thread: copies `bytes` of shared `src` to global `dst` as one bulk group.
template <class T>
__device__ __forceinline__ void bulk_store_row(T* dst, const T* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               "cp.async.bulk.commit_group;" ::"l"(dst),
               "r"(hg::gpu::shared_address(src)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// The issuing thread: every bulk group but the N newest has read its source.
template <int N>
__device__ __forceinline__ void bulk_store_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}

// The issuing thread, before the block exits: every bulk group is complete.
__device__ __forceinline__ void bulk_store_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

}  // namespace lab
