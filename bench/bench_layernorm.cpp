// LayerNorm bandwidth benchmark: M x N sweep, float32 and bf16, forward and
// backward, fused vs unfused (the public ops under hg::KernelModeScope), on
// CUDA and the CPU. On CUDA it also times the raw fused kernels and a
// device-to-device copy of the same bytes, so results read as % of copy rate.
//
// Bytes counted (the minimum traffic): forward 2*M*N*elt (read x, write y),
// backward 3*M*N*elt (read x and dy, write dx); the O(M + N) terms are left out.
// The raw kernels are production's (the table of this device's memory
// system); candidate kernels are compared in the lab program,
// bench/lab/layernorm_lab.cu. --residual adds the fused residual + LayerNorm
// kernels (impl res_resident: production; res_per_row: the one-block-per-row
// kernels): res_forward 4*M*N*elt (read x, r; write h, y), res_backward
// 4*M*N*elt (read dy, h, dh_in; write dh).
//
//   bench_layernorm --device cuda --csv ln.csv
//   bench_layernorm --device cpu --sizes 1024x768,1024x4096 --iters 10
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "examples/common/progress.hpp"
#include "ops/layernorm.hpp"
#ifdef HG_WITH_CUDA
#include "bench/copy_rates.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/residual_layernorm_kernels.hpp"
#endif

namespace {

using namespace hg;

constexpr double kEps = 1e-5;

struct Size {
  int64_t M, N;
};

std::vector<Size> parse_sizes(const std::string& text) {
  std::vector<Size> sizes;
  for (const auto& [m, n] : bench::parse_pairs("--sizes", text, "MxN")) sizes.push_back({m, n});
  return sizes;
}

// The sweep: M = 4096 with N = 256 ... 16384, and (B, T, D) = (32, 512, 768).
std::vector<Size> default_sizes(Device device) {
  if (device == Device::CUDA)
    return {{4096, 256},  {4096, 512},  {4096, 1024},  {4096, 2048},
            {4096, 4096}, {4096, 8192}, {4096, 16384}, {16384, 768}};
  // Two shared CPU cores: a smaller sweep that still spans the regimes.
  return {{1024, 256}, {1024, 1024}, {1024, 4096}, {2048, 768}};
}

struct Result {
  std::string device, dtype, pass, impl;
  int64_t M = 0, N = 0;
  double bytes = 0, median_ms = 0, min_ms = 0;
  double gbps() const { return bench::gbps(bytes, median_ms); }
};

// n_sets copies of one random draw: same values, distinct buffers, so that
// rotating among them keeps the L2 cache from serving the inputs.
struct Inputs {
  std::vector<Tensor> x, dy;
  std::vector<LayerNormSaved> saved;
  Tensor gamma, beta;
};

Inputs make_inputs(Size s, DType dtype, Device device, int n_sets, Generator& gen) {
  Inputs in;
  const Tensor x = Tensor::randn({s.M, s.N}, gen, DType::F32, device, 0.5, 2.0).to(dtype);
  const Tensor dy = Tensor::randn({s.M, s.N}, gen, DType::F32, device).to(dtype);
  in.gamma = Tensor::randn({s.N}, gen, DType::F32, device, 1.0, 0.1);
  in.beta = Tensor::randn({s.N}, gen, DType::F32, device, 0.0, 0.1);
  KernelModeScope fused(KernelMode::Fused);
  for (int i = 0; i < n_sets; ++i) {
    in.x.push_back(i == 0 ? x : x.clone());
    in.dy.push_back(i == 0 ? dy : dy.clone());
    in.saved.emplace_back();
    layernorm_forward(in.x.back(), in.gamma, in.beta, kEps, &in.saved.back());
  }
  return in;
}

struct Options {
  std::string device = "all";
  std::string sizes;
  std::string dtypes = "f32,bf16";
  int iters = 0;  // 0 (not given): 50 on CUDA, 10 on the CPU
  int warmup = 3;
  bool fused_only = false;
  bool kernels_only = false;
  bool residual = false;
  std::string csv = "bench_layernorm.csv";
  std::string png = "bench_layernorm.png";
  cli::CommonFlags common;
};

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "f64") return DType::F64;
  cli::usage_error("--dtypes", name, ": unknown dtype (allowed: f32, bf16, f64)");
}

void run_device(Device device, const Options& opt, std::vector<Result>& results) {
  const bool cuda = device == Device::CUDA;
  const std::vector<Size> sizes = opt.sizes.empty() ? default_sizes(device) : parse_sizes(opt.sizes);
  const int iters = opt.iters > 0 ? opt.iters : (cuda ? 50 : 10);
  // Inputs in flight: several times the 50 MB H100 L2 on CUDA; on the CPU a
  // few times a typical last-level cache.
  const double cache_bytes = cuda ? 50e6 : 32e6;
  Generator gen(1234);
  if (cuda)
    spdlog::info("LayerNorm production table: {} (cuda/layernorm_table.hpp)",
                 gpu::memory_system_name(gpu::device_memory_system()));

  std::stringstream ds(opt.dtypes);
  std::string dname;
  std::vector<DType> dtypes;
  while (std::getline(ds, dname, ',')) {
    const DType d = parse_dtype(dname);
    if (!cuda && d == DType::BF16) continue;  // BF16 is a CUDA storage type here
    if (cuda && d == DType::F64) continue;    // no fused F64 kernels on CUDA
    dtypes.push_back(d);
  }
  if (dtypes.empty())
    cli::usage_error("--dtypes", opt.dtypes, ": none of them runs on ", device_name(device),
                     " (allowed there: ", cuda ? "f32, bf16" : "f32, f64", ")");

  cli::Progress progress(std::string("bench_layernorm ") + device_name(device) + " case",
                         int64_t(sizes.size() * dtypes.size()), 0, "cases", 1);
  int64_t cases_done = 0;
  for (const Size s : sizes) {
    for (const DType dtype : dtypes) {
      const double elems = double(s.M) * double(s.N);
      const double elt = double(dtype_size(dtype));
      const double set_bytes = 2 * elems * elt;  // x and dy
      const int n_sets = int(std::clamp(std::ceil(4 * cache_bytes / set_bytes), 1.0, 32.0));
      // Enough calls per timed sample for ~1 ms of GPU work at ~2.5 TB/s.
      const int reps = cuda ? int(std::clamp(std::ceil(1e-3 / (3 * elems * elt / 2.5e12)), 1.0, 64.0)) : 1;
      Inputs in = make_inputs(s, dtype, device, n_sets, gen);
      std::vector<Tensor> keep_y(n_sets);          // outputs stay alive across a rotation:
      std::vector<LayerNormGrads> keep_g(n_sets);  // distinct buffers, like the inputs
      std::vector<LayerNormSaved> keep_saved(n_sets);

      auto record = [&](const char* pass, const char* impl, const bench::Timing& t) {
        const std::string p = pass;
        const double streams = p == "backward" ? 3 : p.rfind("res_", 0) == 0 ? 4 : 2;  // copy: like forward
        const double bytes = streams * elems * elt;
        results.push_back({device_name(device), dtype_name(dtype), pass, impl, s.M, s.N, bytes, t.median_ms, t.min_ms});
      };
      auto try_record = [&](const char* pass, const char* impl, const std::function<bench::Timing()>& measure) {
        try {
          record(pass, impl, measure());
        } catch (const hg::Error& e) {
          spdlog::warn("skipped {} {} {} {}x{}: {}", pass, impl, dtype_name(dtype), s.M, s.N, e.what());
        }
      };

      for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
        if (opt.kernels_only || (opt.fused_only && mode == KernelMode::Unfused)) continue;
        KernelModeScope scope(mode);
        const char* impl = kernel_mode_name(mode);
        try_record("forward", impl, [&] {
          return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
            keep_y[i] = layernorm_forward(in.x[i], in.gamma, in.beta, kEps, &keep_saved[i]);
          });
        });
        try_record("backward", impl, [&] {
          return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
            keep_g[i] = layernorm_backward(in.dy[i], in.x[i], in.gamma, in.saved[i]);
          });
        });
      }

#ifdef HG_WITH_CUDA
      if (cuda) {
        // The raw kernels on preallocated outputs, and the copy yardstick of
        // the same bytes.
        std::vector<Tensor> y(n_sets), mean(n_sets), rstd(n_sets), dx(n_sets), dg(n_sets), db(n_sets), copy(n_sets);
        for (int i = 0; i < n_sets; ++i) {
          y[i] = Tensor::empty({s.M, s.N}, dtype, device);
          dx[i] = Tensor::empty({s.M, s.N}, dtype, device);
          copy[i] = Tensor::empty({s.M, s.N}, dtype, device);
          mean[i] = Tensor::empty({s.M}, DType::F32, device);
          rstd[i] = Tensor::empty({s.M}, DType::F32, device);
          dg[i] = Tensor::empty({s.N}, DType::F32, device);
          db[i] = Tensor::empty({s.N}, DType::F32, device);
        }
        try_record("forward", "kernel", [&] {
          return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
            gpu::layernorm_forward_fused(in.x[i], in.gamma, in.beta, float(kEps), y[i], mean[i], rstd[i]);
          });
        });
        try_record("backward", "kernel", [&] {
          return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
            gpu::layernorm_backward_fused(in.dy[i], in.x[i], in.gamma, in.saved[i].mean, in.saved[i].rstd, dx[i], dg[i],
                                          db[i]);
          });
        });
        if (opt.residual) {
          // r: dy's buffers; dh_in: copies of dy; h of the backward: x (with x's saved statistics).
          std::vector<Tensor> h(n_sets), dh_in(n_sets);
          for (int i = 0; i < n_sets; ++i) {
            h[i] = Tensor::empty({s.M, s.N}, dtype, device);
            dh_in[i] = in.dy[i].clone();
          }
          for (const gpu::ResidualLnKernel kernel :
               {gpu::ResidualLnKernel::ResidentRows, gpu::ResidualLnKernel::OneBlockPerRow}) {
            const std::string impl = kernel == gpu::ResidualLnKernel::ResidentRows ? "res_resident" : "res_per_row";
            try_record("res_forward", impl.c_str(), [&] {
              return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
                gpu::residual_layernorm_forward_fused(in.x[i], in.dy[i], in.gamma, in.beta, float(kEps), h[i], y[i],
                                                      mean[i], rstd[i], kernel);
              });
            });
            try_record("res_backward", impl.c_str(), [&] {
              return bench::time_rotating(device, n_sets, opt.warmup, iters, reps, [&](int i) {
                gpu::residual_layernorm_backward_fused(in.dy[i], &dh_in[i], in.x[i], in.gamma, in.saved[i].mean,
                                                       in.saved[i].rstd, dx[i], dg[i], db[i], kernel);
              });
            });
          }
        }
        // cudaMemcpyAsync and our copy kernels on x's bytes (Tensor::clone
        // would synchronise the host after each copy); the fastest is the
        // %copy yardstick.
        const std::vector<bench::CopyRate> copies = bench::time_copies(
            n_sets, opt.warmup, iters, reps, in.x[0].nbytes(), [&](int i) { return in.x[i].raw_data(); },
            [&](int i) { return copy[i].raw_data(); });
        record("copy", "memcpy", copies.front().timing);
        record("copy", "best", bench::best_copy(copies).timing);
        spdlog::info("{} {}x{}: best copy {}", dtype_name(dtype), s.M, s.N, bench::best_copy(copies).name);
      }
#endif
      // The fused rates now, so that a run cut short still leaves its numbers.
      std::string rates;
      for (const Result& r : results)
        if (r.impl == "fused" && r.M == s.M && r.N == s.N && r.dtype == dtype_name(dtype) &&
            r.device == device_name(device))
          rates += " " + r.pass + " " + std::to_string(static_cast<int>(r.gbps())) + " GB/s";
      progress.update(++cases_done, 1,
                      std::string(dtype_name(dtype)) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) + " (" +
                          std::to_string(n_sets) + " input sets, " + std::to_string(reps) +
                          " calls per sample):" + rates);
    }
  }
  progress.finish();
}

// The best copy's rate (bytes read + written: cudaMemcpyAsync or our
// fastest copy kernel) for the same device, dtype and size.
double copy_gbps(const std::vector<Result>& results, const Result& r) {
  for (const Result& c : results)
    if (c.pass == "copy" && c.impl == "best" && c.device == r.device && c.dtype == r.dtype && c.M == r.M && c.N == r.N)
      return c.gbps();
  return 0;
}

double unfused_ms(const std::vector<Result>& results, const Result& r) {
  for (const Result& u : results)
    if (u.impl == "unfused" && u.pass == r.pass && u.device == r.device && u.dtype == r.dtype && u.M == r.M &&
        u.N == r.N)
      return u.median_ms;
  return 0;
}

void report(const std::vector<Result>& results, const std::string& csv_path) {
  bench::Csv csv(csv_path, "device,dtype,pass,impl,M,N,bytes,median_ms,min_ms,gbps,speedup_vs_unfused,pct_of_copy");
  std::printf("%-5s %-5s %-8s %-8s %6s %6s %10s %9s %8s %7s\n", "dev", "dtype", "pass", "impl", "M", "N", "ms", "GB/s",
              "vs_unf", "%copy");
  for (const Result& r : results) {
    const double unf = unfused_ms(results, r);
    const double speedup = (r.impl != "unfused" && unf > 0) ? unf / r.median_ms : 0.0;
    const double cp = copy_gbps(results, r);
    const double pct = (cp > 0 && r.impl != "best") ? 100.0 * r.gbps() / cp : 0.0;
    csv.row(r.device, r.dtype, r.pass, r.impl, r.M, r.N, r.bytes, r.median_ms, r.min_ms, r.gbps(), speedup, pct);
    std::printf("%-5s %-5s %-8s %-8s %6lld %6lld %10.4f %9.1f %8s %7s\n", r.device.c_str(), r.dtype.c_str(),
                r.pass.c_str(), r.impl.c_str(), static_cast<long long>(r.M), static_cast<long long>(r.N), r.median_ms,
                r.gbps(), speedup > 0 ? (std::to_string(speedup).substr(0, 5) + "x").c_str() : "-",
                pct > 0 ? (std::to_string(pct).substr(0, 5)).c_str() : "-");
  }
  spdlog::info("CSV written to {}", csv_path);
}

// GB/s against N for the fused and unfused ops and the copy, at the M most
// sizes share (4096 in the default sweep).
void write_plot(const std::vector<Result>& results, const std::string& path) {
  std::map<int64_t, int> m_count;
  for (const Result& r : results) ++m_count[r.M];
  int64_t m = 0;
  for (const auto& [value, count] : m_count)
    if (m == 0 || count > m_count[m]) m = value;
  bench::PlotLines lines;
  for (const Result& r : results)
    if (r.M == m && r.impl != "kernel")
      lines.add(r.device + " " + r.dtype + " " + r.pass + " " + r.impl, r.N, r.gbps());
  bench::write_gbps_plot(path, "LayerNorm bandwidth, M = " + std::to_string(m), "N (row length)", lines.lines());
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"LayerNorm forward/backward bandwidth: fused vs unfused, CUDA and CPU", "bench_layernorm"};
  app.add_option("--device", opt.device, "cuda, cpu or all (all: CUDA when a GPU is present, then CPU)")
      ->check(CLI::IsMember({"cuda", "cpu", "all"}))
      ->capture_default_str();
  app.add_option("--sizes", opt.sizes, "comma-separated MxN list, e.g. 4096x1024,16384x768 (default: per device)");
  app.add_option("--dtypes", opt.dtypes, "comma-separated: f32, bf16 (CUDA only), f64 (CPU only)")
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "timed samples per case (default 50 CUDA, 10 CPU)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", opt.warmup, "untimed samples per case")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--fused-only", opt.fused_only,
               "skip the unfused op (most of the time of a run at D ~ 1e5; no vs_unf column then)");
  app.add_flag("--kernels-only", opt.kernels_only, "CUDA: only the raw kernels and the copies (no op-level rows)");
  app.add_flag("--residual", opt.residual,
               "CUDA: also time the fused residual + LayerNorm kernels (rows res_resident: production, res_per_row: "
               "one block per row; passes res_forward, res_backward)");
  app.add_option("--csv", opt.csv, "CSV output path")->capture_default_str();
  app.add_option("--png", opt.png, "plot of GB/s against N at the most common M, .png or .svg ('' for none)")
      ->capture_default_str();
  cli::add_common_flags(app, opt.common);

  return cli::run_program(app, opt.common, argc, argv, [&] {
    cli::check_writable(opt.csv, "--csv");
    bench::check_plot_path(opt.png, "--png");
    if (!opt.sizes.empty()) parse_sizes(opt.sizes);  // a bad list fails now, not after the first device
    std::vector<Result> results;
    bench::for_each_device(opt.device, "bench_layernorm", [&](Device d) { run_device(d, opt, results); });
    report(results, opt.csv);
    if (!opt.png.empty()) write_plot(results, opt.png);
    return cli::kExitOk;
  });
}
