#pragma once
// The host's view of a staged kernel's shared memory (cuda/row_ring.cuh's
// StagedRoom), which plan_staged sizes the rings from.
#include <optional>

#include "cuda/launch.cuh"
#include "cuda/row_ring.cuh"

namespace hg::gpu {
namespace {

// The room a staged forward kernel has for its rings on this device, or
// nothing where it cannot run (bulk copies exist only in sm_90 code). Allows
// it the most dynamic shared memory.
template <class Kernel>
std::optional<StagedRoom> staged_room(Kernel kernel, int threads, const char* op) {
  if (!runs_sm90_code(kernel)) return std::nullopt;
  StagedRoom room{};
  room.static_smem = static_smem_bytes(kernel);
  room.smem_per_block = room.static_smem + static_cast<int>(allow_max_dynamic_smem(kernel));
  room.smem_per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  room.reserved_per_block = device_attribute(cudaDevAttrReservedSharedMemoryPerBlock);
  room.blocks_per_sm = blocks_per_sm(kernel, threads, 0, op);
  return room;
}

}  // namespace
}  // namespace hg::gpu
