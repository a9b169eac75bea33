// The side stream and its fork/join events (cuda/side_stream.hpp): created
// once per process, like the handgrad stream (one device per process).
#include "cuda/side_stream.hpp"

#include "cuda/cuda_check.hpp"

namespace hg::gpu {

ForkJoin create_fork_join() {
  ForkJoin made;
  HG_CUDA_CHECK(cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking));
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&made.forked, cudaEventDisableTiming));
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&made.done, cudaEventDisableTiming));
  return made;
}

namespace {

const ForkJoin& side_handles() {
  static const ForkJoin h = create_fork_join();
  return h;
}

}  // namespace

void ForkJoin::fork() const {
  HG_CUDA_CHECK(cudaEventRecord(forked, hg::gpu::stream()));
  HG_CUDA_CHECK(cudaStreamWaitEvent(stream, forked, 0));
}

void ForkJoin::join() const {
  HG_CUDA_CHECK(cudaEventRecord(done, stream));
  HG_CUDA_CHECK(cudaStreamWaitEvent(hg::gpu::stream(), done, 0));
}

void ForkJoin::join_quietly() const noexcept {
  if (cudaEventRecord(done, stream) == cudaSuccess) cudaStreamWaitEvent(hg::gpu::stream(), done, 0);
}

SideStream::SideStream() { side_handles().fork(); }

SideStream::~SideStream() {
  if (!joined_) side_handles().join_quietly();
}

cudaStream_t SideStream::get() const { return side_handles().stream; }

void SideStream::join() {
  joined_ = true;
  side_handles().join();
}

}  // namespace hg::gpu
