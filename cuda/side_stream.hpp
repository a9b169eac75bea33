#pragma once
// For .cu files only: a second stream for a kernel that may run beside the
// handgrad stream's, so that each fills the SMs the other's last wave leaves
// idle (the attention backward's dq kernel beside its dk, dv kernel).
// Constructing a SideStream forks: the side stream waits for all the work
// queued so far on stream(). join() makes stream() wait for all the work
// queued on the side stream since, so handgrad's work is again one ordered
// sequence after it (what the caching allocator relies on, cuda/runtime.cu).
// Call join() before the scope ends; the destructor joins if an exception
// left it undone. Event fork and join are legal inside a CUDA graph capture.
#include <cuda_runtime.h>

namespace hg::gpu {

// A non-blocking stream with the two events of a fork and a join, made once
// by each of its users (SideStream here, gpu::Beside in cuda/runtime.cu).
struct ForkJoin {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;

  void fork() const;                   // `stream` waits for all the work queued so far on stream()
  void join() const;                   // stream() waits for all the work queued on `stream` since
  void join_quietly() const noexcept;  // join() for destructors: errors are left to the next check
};
ForkJoin create_fork_join();

class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t get() const;
  void join();

 private:
  bool joined_ = false;
};

}  // namespace hg::gpu
