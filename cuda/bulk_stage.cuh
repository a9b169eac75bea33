#pragma once
// Shared-memory stages filled by sm_90 bulk copies (the 1D form of the TMA).
// One thread arms a stage's mbarrier with the bytes it will receive and
// issues the copies; every reader waits for the barrier's phase to flip. No
// registers are held while the bytes travel, so a kernel can keep several
// rows in flight per thread group. Rules of use (PTX ISA, cp.async.bulk):
// source and destination 16-byte aligned, sizes multiples of 16, and a stage
// is refilled only after every reader has passed a barrier behind its last
// read of it. Only sm_90+ code calls these; elsewhere they trap.
#include <cuda_runtime.h>

#include <cstdint>

namespace hg::gpu {
namespace {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread: the barrier expects one arrival (the arming thread) per phase.
// The block must synchronise before any thread waits on it.
__device__ __forceinline__ void stage_barrier_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// The arming thread: this phase completes once `bytes` have landed.
__device__ __forceinline__ void stage_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// The arming thread: copies `bytes` from global `src` into shared `dst`,
// counted against `bar`'s expected bytes.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#else
  __trap();
#endif
}

// Every reader: returns once the phase with this parity has completed, i.e.
// the stage's bytes are visible in shared memory. Use k of a stage (k = 0,
// 1, ...) waits with parity k & 1.
__device__ __forceinline__ void stage_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
  }
#else
  __trap();
#endif
}

// A ring of S stages in shared memory, one barrier each: use k (k = 0, 1,
// ...) of the ring lands in stage k % S and completes that barrier's phase
// k / S. The arming thread calls arm(k, bytes), then stage_copy for each
// piece against the barrier arm returns; readers call wait(k).
template <int S>
struct StageRing {
  uint64_t* bars;  // S barriers in shared memory
  __device__ __forceinline__ static int stage(int64_t k) { return static_cast<int>(k % S); }
  // One thread, before the block synchronises.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < S; ++s) stage_barrier_init(bars + s);
  }
  __device__ __forceinline__ uint64_t* arm(int64_t k, uint32_t bytes) const {
    uint64_t* bar = bars + stage(k);
    stage_expect(bar, bytes);
    return bar;
  }
  __device__ __forceinline__ void wait(int64_t k) const {
    stage_wait(bars + stage(k), static_cast<uint32_t>((k / S) & 1));
  }
};

}  // namespace
}  // namespace hg::gpu
