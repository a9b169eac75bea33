// The side stream and its fork/join events (cuda/side_stream.hpp): created
// once per process, like the handgrad stream (one device per process).
#include "cuda/side_stream.hpp"

#include "cuda/cuda_check.hpp"

namespace hg::gpu {

namespace {

struct SideHandles {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
};

const SideHandles& side_handles() {
  static const SideHandles h = [] {
    SideHandles made;
    HG_CUDA_CHECK(cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking));
    HG_CUDA_CHECK(cudaEventCreateWithFlags(&made.forked, cudaEventDisableTiming));
    HG_CUDA_CHECK(cudaEventCreateWithFlags(&made.done, cudaEventDisableTiming));
    return made;
  }();
  return h;
}

}  // namespace

SideStream::SideStream() {
  const SideHandles& h = side_handles();
  HG_CUDA_CHECK(cudaEventRecord(h.forked, stream()));
  HG_CUDA_CHECK(cudaStreamWaitEvent(h.stream, h.forked, 0));
}

SideStream::~SideStream() {
  if (joined_) return;
  const SideHandles& h = side_handles();
  if (cudaEventRecord(h.done, h.stream) == cudaSuccess) cudaStreamWaitEvent(stream(), h.done, 0);
}

cudaStream_t SideStream::get() const { return side_handles().stream; }

void SideStream::join() {
  const SideHandles& h = side_handles();
  joined_ = true;
  HG_CUDA_CHECK(cudaEventRecord(h.done, h.stream));
  HG_CUDA_CHECK(cudaStreamWaitEvent(stream(), h.done, 0));
}

}  // namespace hg::gpu
