#pragma once
// The world of a program under tests/mpi/: MPI started once per process and
// finalised at exit (mpirun counts a rank that exits without MPI_Finalize as
// failed). A rank whose case failed leaves its peer in a collective: the
// watchdog stops both after a minute.
#include <cstdlib>

#include "core/cuda_runtime.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/watchdog.hpp"
#include "dist/world.hpp"

namespace hg::test {

inline const dist::World& ranks() {
  static const dist::World& w = []() -> const dist::World& {
    const dist::World& world = dist::init_world();
    dist::set_comm_timeout(60);
    std::atexit(dist::finalize_world);
    return world;
  }();
  return w;
}

// CUDA cases: one GPU per rank, NCCL between them (this rank's GPU made current).
inline bool cuda_ranks_available() {
  if (!gpu::nccl::built_with_nccl()) return false;
  if (gpu::device_count() < ranks().local_size) return false;
  gpu::set_device(ranks().local_rank);
  return true;
}

}  // namespace hg::test
