// Whether a kernel launch may overlap the previous kernel (cuda/launch.cuh).
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "cuda/launch.cuh"

namespace hg::gpu {

namespace {
std::atomic<bool> overlap{true};
}  // namespace

void set_kernel_overlap(bool on) { overlap = on; }
bool kernel_overlap() { return overlap; }

bool overlaps_previous_kernel(const void* kernel) {
  if (!overlap || compute_capability() < 90) return false;
  // One attribute query per kernel: launches are on the hot path.
  static std::mutex mutex;
  static std::unordered_map<const void*, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(kernel);
  if (it != known.end()) return it->second;
  cudaFuncAttributes attr{};
  HG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return known[kernel] = attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

}  // namespace hg::gpu
