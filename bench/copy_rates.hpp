#pragma once
// The copy yardstick of a benchmark case: cudaMemcpyAsync and every copy
// kernel of bench/copy_kernels.cu timed on the same rotating buffers as the
// case's own kernels. The fastest is "the best copy this GPU does" at that
// size; benchmarks report their kernels as a percentage of it (%copy).
// CUDA builds only (HG_WITH_CUDA).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/copy_kernels.hpp"
#include "core/cuda_runtime.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::bench {

struct CopyRate {
  std::string name;  // "memcpy" or a copy kernel's name
  Timing timing;     // per copy of `bytes`
};

// src(i), dst(i): buffer set i of n_sets, `bytes` each. Kernels that cannot
// run on these buffers (alignment, size) are left out.
template <class Src, class Dst>
std::vector<CopyRate> time_copies(int n_sets, int warmup, int iters, int reps, size_t bytes, const Src& src,
                                  const Dst& dst) {
  std::vector<CopyRate> rates;
  rates.push_back({"memcpy", time_rotating(Device::CUDA, n_sets, warmup, iters, reps, [&](int i) {
                     HG_CUDA_CHECK(cudaMemcpyAsync(dst(i), src(i), bytes, cudaMemcpyDeviceToDevice, gpu::stream()));
                   })});
  for (int k = 0; k < copy_kernel_count(); ++k) {
    if (!launch_copy_kernel(k, dst(0), src(0), bytes)) continue;
    rates.push_back({copy_kernel_name(k), time_rotating(Device::CUDA, n_sets, warmup, iters, reps,
                                                        [&](int i) { launch_copy_kernel(k, dst(i), src(i), bytes); })});
  }
  return rates;
}

// The fastest entry (by median); rates must not be empty.
inline const CopyRate& best_copy(const std::vector<CopyRate>& rates) {
  const CopyRate* best = &rates.front();
  for (const CopyRate& r : rates)
    if (r.timing.median_ms < best->timing.median_ms) best = &r;
  return *best;
}

}  // namespace hg::bench
