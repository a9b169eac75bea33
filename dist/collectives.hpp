#pragma once
// Collectives on flat F32 tensors of one device kind, across every rank of
// dist::world(): CUDA tensors through NCCL (cuda/nccl_comm.hpp, bootstrapped
// here by broadcasting rank 0's unique id over MPI), CPU tensors through MPI's
// nonblocking collectives. Each call starts the collective and returns;
// wait() finishes every started one. The tensors must stay alive and
// unwritten until then.
#include <cstdint>
#include <vector>

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
  // With `wire` (BF16, x's size) the sum travels in bf16: premul_r * x_r is
  // rounded to bf16 into wire, the ranks' values are summed in bf16 and the
  // result is widened back into x (docs/distributed.md, "Precision").
  void all_reduce_sum(Tensor& x, double premul, const Tensor& wire = Tensor());
  // out (n) <- this rank's n-element part of sum over ranks of premul_r * in_r (in: world * n).
  // CPU: `in` is scaled in place first. With wire_in (BF16, in's size) and
  // wire_out (BF16, out's size) the sum travels in bf16, as above.
  void reduce_scatter_sum(Tensor& in, Tensor& out, double premul, const Tensor& wire_in = Tensor(),
                          const Tensor& wire_out = Tensor());
  // In place: this rank's part of `buffer` (world equal parts) reaches every
  // rank. Returns a ticket for wait_for.
  uint64_t all_gather(Tensor& buffer);
  // CPU: lets MPI move the started collectives forward (it does so only inside MPI calls).
  void progress();
  // Every started collective has finished (CUDA: for work queued after this on the handgrad stream).
  void wait(const char* what);
  // The one collective of that ticket has finished (CUDA: for work queued
  // after this on the handgrad stream); the others keep running.
  void wait_for(uint64_t ticket, const char* what);
  // A blocking F64 sum of a (n,) tensor on device(), e.g. a sum of squares.
  void all_reduce_sum_f64(Tensor& x, const char* what);
  // The communication since the last call (CUDA: reads timing events of finished work).
  CommStats take_stats();

 private:
  void check(const Tensor& x, const char* op) const;
  void check_wire(const Tensor& wire, const Tensor& x, const char* op) const;
  // One rank without NCCL on CUDA: out = premul * in, through bf16 when `wire` is defined.
  void scale_locally(const Tensor& in, Tensor& out, double premul, const Tensor& wire);
  Device device_;
  CommStats cpu_stats_;
  std::vector<std::pair<Tensor, Tensor>> cpu_widen_;  // CPU bf16 results (wire, F32 destination) to widen in wait()
};

}  // namespace hg::dist
