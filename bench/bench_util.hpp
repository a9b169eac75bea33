#pragma once
// Benchmark plumbing: warm-up, per-iteration timing (CUDA events on the GPU,
// steady_clock on the CPU), medians, rotating input sets, CSV output.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/plot.hpp"

namespace hg::bench {

// A comma-separated list of `flag` whose items are AxB (form names them,
// e.g. "MxN"), 1 <= A, B <= 2^31; anything else is a usage error naming it.
inline std::vector<std::pair<int64_t, int64_t>> parse_pairs(const std::string& flag, const std::string& text,
                                                            const char* form) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    long long a = 0, b = 0;
    char x = 0, rest = 0;
    if (std::sscanf(item.c_str(), "%lld%c%lld%c", &a, &x, &b, &rest) != 3 || x != 'x' || a < 1 || b < 1 ||
        a > (1LL << 31) || b > (1LL << 31))
      cli::usage_error(flag, text, ": '", item, "' is not ", form, " with both in 1..2^31");
    pairs.emplace_back(a, b);
  }
  if (pairs.empty()) cli::usage_error(flag, text, ": no ", form, " item");
  return pairs;
}

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
};

inline Timing summarize(std::vector<double> ms) {
  HG_CHECK(!ms.empty(), "bench", "no timed samples (iterations must be >= 1)");
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

// Wall and process CPU time of a CPU call (every thread's CPU time counts):
// medians of `iters` calls after one warm-up call. CPU time is the number to
// read on a shared machine, where other jobs stretch wall time.
struct WallCpu {
  double wall_ms, cpu_ms;
};
inline WallCpu median_wall_cpu(int iters, const std::function<void()>& f) {
  f();
  std::vector<double> wall, cpu;
  for (int i = 0; i < iters; ++i) {
    const auto w0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    f();
    cpu.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC * 1e3);
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
  }
  return {summarize(wall).median_ms, summarize(cpu).median_ms};
}

// Calls run(i % n_inputs) `warmup` times, then times `iters` calls one by one.
// Rotating over n_inputs distinct input sets keeps the L2 cache from
// flattering the numbers (size n_inputs so their total is several L2s).
inline Timing time_op(Device device, int n_inputs, int warmup, int iters, const std::function<void(int)>& run) {
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

// Plots GB/s against `size_name` (log axis), one line per PlotLine, with a
// legend; .png or .svg by the file's extension.
inline void write_gbps_plot(const std::string& path, const std::string& title, const std::string& size_name,
                            const std::vector<PlotLine>& lines) {
  cli::PlotSpec spec;
  spec.title = title;
  spec.x_label = size_name;
  spec.y_label = "GB/s (median)";
  spec.log_x = true;
  for (const PlotLine& l : lines) spec.series.push_back({l.name, l.size, l.gbps, true});
  cli::write_plot(path, spec);
  spdlog::info("plot written to {}", path);
}

// Checks a --png path before any work: writable, .png or .svg. Empty: no
// plot. In a build without cairo the plot is skipped with a warning (the CSV
// is the result; scripts/plot_bench.py can plot it) and the path cleared.
inline void check_plot_path(std::string& path, const std::string& flag) {
  if (path.empty()) return;
  const auto ext = path.size() >= 4 ? path.substr(path.size() - 4) : std::string();
  if (ext != ".png" && ext != ".svg") cli::usage_error(flag, path, ": the name must end in .png or .svg");
  if (!cli::plots_available()) {
    spdlog::warn("{} {} skipped: {}", flag, path, cli::plots_unavailable_reason());
    path.clear();
    return;
  }
  cli::check_writable(path, flag);
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
// (CUDA when a GPU is present, then the CPU). "cuda" without a GPU is a usage
// error ("--device cuda: no CUDA GPU ...").
inline void for_each_device(const std::string& which, const char*, const std::function<void(Device)>& run) {
  const bool have_gpu = gpu::device_count() > 0;
  if (which == "cuda") cli::resolve_device("cuda");  // throws without a GPU
  if (which != "cpu" && have_gpu) {
    spdlog::info("GPU: {}, {} SMs, peak DRAM {:.0f} GB/s", gpu::device_name(), gpu::sm_count(), gpu::dram_peak_gbps());
    run(Device::CUDA);
  }
  if (which != "cuda") run(Device::CPU);
}

// Writes a CSV file: the header, then rows, each flushed; a failed open or
// write throws hg::Error (so nothing is reported as written that was not).
class Csv {
 public:
  Csv(const std::string& path, const std::string& header) : path_(path), out_(path) {
    HG_CHECK(out_.good(), "Csv", "cannot open ", path, " for writing");
    out_ << header << '\n';
    check();
  }
  template <class... Cols>
  void row(const Cols&... cols) {
    bool first = true;
    ((out_ << (first ? "" : ",") << cols, first = false), ...);
    out_ << '\n';
    check();
  }
  const std::string& path() const { return path_; }

 private:
  void check() {
    out_.flush();
    HG_CHECK(out_.good(), "Csv", "cannot write to ", path_);
  }
  std::string path_;
  std::ofstream out_;
};

}  // namespace hg::bench
