#pragma once
// Programmatic dependent launch (sm_90+): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it on the stream is still running; it must call
// wait_for_prior_grids() before it reads anything that kernel writes. A
// kernel calls allow_dependent_grids() to let the next such kernel start
// early. Both are no-ops in a kernel launched the ordinary way, and below
// sm_90.

namespace hg::gpu {
namespace {

// Blocks until every grid this one depends on has completed and its writes are visible.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The next kernel on the stream (if launched programmatically) may start now.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace
}  // namespace hg::gpu
