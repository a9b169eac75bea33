// Device-to-device copy bandwidth: cudaMemcpyAsync and the copy kernels of
// bench/copy_kernels.cu at each size, bytes counted read + write (as
// bench_layernorm counts its forward), so the best row is the yardstick the
// memory-bound kernels are measured against. Sizes are the bytes of one
// tensor; the defaults cover the tensors of the LayerNorm and softmax sweeps
// (bench/lab/layernorm.md).
//
//   bench_copy --sizes-mib 32,128,512 --csv copy.csv
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#ifdef HG_WITH_CUDA
#include "bench/copy_rates.hpp"
#endif

namespace {

using namespace hg;

struct Options {
  std::string sizes_mib = "8,16,24,32,48,64,96,128,256,512";
  int iters = 30;
  int warmup = 3;
  std::string csv = "bench_copy.csv";
  cli::CommonFlags common;
};

std::vector<double> parse_mib(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !(v > 0) || v > 16384)
      cli::usage_error("--sizes-mib", text, ": '", item, "' is not a size in MiB in (0, 16384]");
    out.push_back(v);
  }
  return out;
}

#ifdef HG_WITH_CUDA
void run(const Options& opt) {
  bench::Csv csv(opt.csv, "bytes,impl,median_ms,min_ms,gbps,pct_of_best");
  std::printf("%10s %-20s %10s %9s %7s\n", "MiB", "impl", "ms", "GB/s", "%best");
  for (const double mib : parse_mib(opt.sizes_mib)) {
    const size_t bytes = static_cast<size_t>(mib * 1024 * 1024) / 16 * 16;
    const int n_sets = int(std::clamp(std::ceil(4 * 50e6 / (2.0 * bytes)), 1.0, 32.0));
    const int reps = int(std::clamp(std::ceil(1e-3 / (2.0 * bytes / 2.5e12)), 1.0, 64.0));
    std::vector<Tensor> src(n_sets), dst(n_sets);
    for (int i = 0; i < n_sets; ++i) {
      src[i] = Tensor::zeros({static_cast<int64_t>(bytes / 4)}, DType::F32, Device::CUDA);
      dst[i] = Tensor::empty({static_cast<int64_t>(bytes / 4)}, DType::F32, Device::CUDA);
    }
    const std::vector<bench::CopyRate> rates = bench::time_copies(
        n_sets, opt.warmup, opt.iters, reps, bytes, [&](int i) { return src[i].raw_data(); },
        [&](int i) { return dst[i].raw_data(); });
    const double best = bench::gbps(2.0 * bytes, bench::best_copy(rates).timing.median_ms);
    for (const bench::CopyRate& r : rates) {
      const double g = bench::gbps(2.0 * bytes, r.timing.median_ms);
      csv.row(bytes, r.name, r.timing.median_ms, r.timing.min_ms, g, 100.0 * g / best);
      std::printf("%10.1f %-20s %10.4f %9.1f %7.1f\n", mib, r.name.c_str(), r.timing.median_ms, g, 100.0 * g / best);
    }
    std::printf("%10.1f %-20s %10s %9.1f\n", mib, ("best: " + bench::best_copy(rates).name).c_str(), "", best);
    gpu::empty_cache();
  }
  spdlog::info("CSV written to {}", opt.csv);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Device-to-device copy bandwidth: cudaMemcpyAsync and our copy kernels", "bench_copy"};
  app.add_option("--sizes-mib", opt.sizes_mib, "comma-separated tensor sizes in MiB (one copy reads and writes this)")
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "timed samples per kernel")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", opt.warmup, "untimed samples per kernel")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--csv", opt.csv, "CSV output path")->capture_default_str();
  cli::add_common_flags(app, opt.common);
  return cli::run_program(app, opt.common, argc, argv, [&] {
    parse_mib(opt.sizes_mib);  // a bad list fails before any GPU work
    cli::check_writable(opt.csv, "--csv");
#ifdef HG_WITH_CUDA
    cli::resolve_device("cuda");  // a usage error without a GPU
    run(opt);
#else
    cli::usage_error("--device", "cuda", ": bench_copy needs a CUDA build (handgrad was built without CUDA)");
#endif
    return cli::kExitOk;
  });
}
