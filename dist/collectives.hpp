#pragma once
// Collectives on flat F32 tensors of one device kind, across every rank of
// dist::world(): CUDA tensors through NCCL (cuda/nccl_comm.hpp, bootstrapped
// here by broadcasting rank 0's unique id over MPI), CPU tensors through MPI's
// nonblocking collectives. Each call starts the collective and returns;
// wait() finishes every started one. The tensors must stay alive and
// unwritten until then.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::dist {

struct CommStats {
  double busy_ms = 0;     // CUDA: collective time on the communication stream; CPU: time inside MPI calls
  double exposed_ms = 0;  // the part the step waited for (CUDA: after the backward's last kernel; CPU: in wait)
  int64_t collectives = 0;
};

class Collectives {
 public:
  explicit Collectives(Device device);
  Device device() const { return device_; }

  // x <- sum over ranks of premul_r * x_r (x: F32, contiguous, on device()).
  void all_reduce_sum(Tensor& x, double premul);
  // out (n) <- this rank's n-element part of sum over ranks of premul_r * in_r (in: world * n).
  // CPU: `in` is scaled in place first.
  void reduce_scatter_sum(Tensor& in, Tensor& out, double premul);
  // In place: this rank's part of `buffer` (world equal parts) reaches every rank.
  void all_gather(Tensor& buffer);
  // CPU: lets MPI move the started collectives forward (it does so only inside MPI calls).
  void progress();
  // Every started collective has finished (CUDA: for work queued after this on the handgrad stream).
  void wait(const char* what);
  // A blocking F64 sum of a (n,) tensor on device(), e.g. a sum of squares.
  void all_reduce_sum_f64(Tensor& x, const char* what);
  // The communication since the last call (CUDA: reads timing events of finished work).
  CommStats take_stats();

 private:
  void check(const Tensor& x, const char* op) const;
  Device device_;
  CommStats cpu_stats_;
};

}  // namespace hg::dist
