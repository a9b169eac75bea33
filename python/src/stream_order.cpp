#include "stream_order.hpp"

#ifdef HG_WITH_CUDA
#include "cuda/cuda_check.hpp"  // hg::gpu::stream() and HG_CUDA_CHECK
#endif

namespace hg::python {

#ifdef HG_WITH_CUDA

intptr_t handgrad_stream() { return reinterpret_cast<intptr_t>(gpu::stream()); }

void order_streams(intptr_t from, intptr_t to) {
  // 0 and 1 (cudaStreamLegacy) are both the legacy default stream.
  if (from == to || (from <= 1 && to <= 1 && from >= 0 && to >= 0)) return;
  cudaEvent_t event = nullptr;
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  // Destroying an event with a pending wait is allowed: the wait still holds.
  const cudaError_t recorded = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(from));
  const cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(to), event, 0) : recorded;
  cudaEventDestroy(event);
  HG_CUDA_CHECK(waited);
}

int cuda_current_device() {
  int device = -1;
  HG_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

#else

intptr_t handgrad_stream() { return 0; }
void order_streams(intptr_t, intptr_t) {}
int cuda_current_device() { return -1; }

#endif

}  // namespace hg::python
