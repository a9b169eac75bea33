#pragma once
// Benchmark plumbing: warm-up, per-iteration timing (CUDA events on the GPU,
// steady_clock on the CPU), medians, rotating input sets, CSV output.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/device.hpp"

namespace hg::bench {

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
};

inline Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

// Calls run(i % n_inputs) `warmup` times, then times `iters` calls one by one.
// Rotating over n_inputs distinct input sets keeps the L2 cache from
// flattering the numbers (size n_inputs so their total is several L2s).
inline Timing time_op(Device device, int n_inputs, int warmup, int iters,
                      const std::function<void(int)>& run) {
  for (int i = 0; i < warmup; ++i) run(i % n_inputs);
  std::vector<double> ms;
  ms.reserve(iters);
  if (device == Device::CUDA) {
    gpu::synchronize();
    gpu::Timer timer;
    for (int i = 0; i < iters; ++i) {
      timer.start();
      run(i % n_inputs);
      ms.push_back(timer.stop_ms());
    }
  } else {
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run(i % n_inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return summarize(std::move(ms));
}

// Times `call(set)` over `n_sets` rotating input sets; each timed sample runs
// `reps` calls (so short kernels are not measured as launch gaps) and the
// result is per call. Warm-up covers at least one full rotation, so every
// set's outputs have been allocated once (and the allocator caches warm)
// before anything is timed.
inline Timing time_rotating(Device device, int n_sets, int warmup, int iters, int reps,
                            const std::function<void(int)>& call) {
  int counter = 0;
  const int warm_samples = std::max(warmup, (n_sets + reps - 1) / reps);
  Timing t = time_op(device, 1, warm_samples, iters, [&](int) {
    for (int r = 0; r < reps; ++r) call(counter++ % n_sets);
  });
  t.median_ms /= reps;
  t.min_ms /= reps;
  return t;
}

inline double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

// Appends rows to a CSV file, writing the header once.
class Csv {
 public:
  Csv(const std::string& path, const std::string& header) : out_(path) { out_ << header << '\n'; }
  template <class... Cols> void row(const Cols&... cols) {
    bool first = true;
    ((out_ << (first ? "" : ",") << cols, first = false), ...);
    out_ << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace hg::bench
