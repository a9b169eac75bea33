#pragma once
// Benchmark plumbing: warm-up, per-iteration timing (CUDA events on the GPU,
// steady_clock on the CPU), medians, rotating input sets, CSV output.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "examples/png_plot.hpp"

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

// One line of a GB/s plot: points (size, GB/s) in the order given.
struct PlotLine {
  std::string name;
  std::vector<double> size, gbps;
};

// Writes a PNG of GB/s against log2(size), one colour per line, and prints
// which colour is which (the PNG's tiny font has digits only, no legend).
inline void write_gbps_png(const std::string& path, const std::string& size_name,
                           const std::vector<PlotLine>& lines) {
  static const std::array<std::pair<const char*, std::array<uint8_t, 3>>, 12> kColours = {{
      {"blue", {31, 119, 180}},   {"orange", {255, 127, 14}}, {"green", {44, 160, 44}},
      {"red", {214, 39, 40}},     {"purple", {148, 103, 189}}, {"brown", {140, 86, 75}},
      {"pink", {227, 119, 194}},  {"grey", {127, 127, 127}},  {"olive", {188, 189, 34}},
      {"cyan", {23, 190, 207}},   {"black", {0, 0, 0}},       {"gold", {255, 200, 0}},
  }};
  std::vector<plot::Series> series;
  std::printf("PNG %s: GB/s (y) against log2(%s) (x)\n", path.c_str(), size_name.c_str());
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& colour = kColours[i % kColours.size()];
    plot::Series s;
    for (double v : lines[i].size) s.x.push_back(std::log2(v));
    s.y = lines[i].gbps;
    s.rgb = colour.second;
    series.push_back(s);
    std::printf("  %-7s %s%s\n", colour.first, lines[i].name.c_str(), i >= kColours.size() ? " (colour reused)" : "");
  }
  if (!plot::line_plot(path, series)) std::fprintf(stderr, "could not write %s\n", path.c_str());
}

// Groups points into lines by name, keeping first-seen order.
class PlotLines {
 public:
  void add(const std::string& name, double size, double gbps) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, lines_.size()).first;
      lines_.push_back({name, {}, {}});
    }
    lines_[it->second].size.push_back(size);
    lines_[it->second].gbps.push_back(gbps);
  }
  const std::vector<PlotLine>& lines() const { return lines_; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<PlotLine> lines_;
};

// Runs `run(device)` for the devices `which` names: "cuda", "cpu", or "all"
// (CUDA when a GPU is present, then the CPU). "cuda" without a GPU is an error.
inline void for_each_device(const std::string& which, const char* bench, const std::function<void(Device)>& run) {
  const bool have_gpu = gpu::device_count() > 0;
  if (which == "cuda" && !have_gpu) fail(bench, "--device cuda but no GPU is visible");
  if (which != "cpu" && have_gpu) {
    std::fprintf(stderr, "GPU: %s, %d SMs\n", gpu::device_name(), gpu::sm_count());
    run(Device::CUDA);
  }
  if (which != "cuda") run(Device::CPU);
}

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
