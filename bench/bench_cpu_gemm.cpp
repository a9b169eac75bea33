// bench_cpu_gemm: the CPU matmul (core/cpu_matmul.hpp: tiles, shared packed
// panels, the level's float32 kernel) on the Linear GEMMs of one training
// step of a bench_train --cpu-model, at every GEMM level this CPU runs (or
// those named), per thread count: GFLOP/s of each product and of all of them
// together, by wall and by process CPU time (the number to read on a shared
// machine; at n threads it counts every thread's time). Median of --iters
// calls after one warm-up call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.hpp"
#include "bench/cpu_gemm_products.hpp"
#include "core/cpu_gemm.hpp"
#include "core/cpu_matmul.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "examples/common/cli.hpp"

using namespace hg;

int main(int argc, char** argv) {
  CLI::App app{"bench_cpu_gemm: the CPU matmul on one training step's Linear GEMMs, per GEMM level and thread count",
               "bench_cpu_gemm"};
  std::string model = "small";
  std::vector<int> threads{1};
  std::vector<std::string> levels;
  int iters = 15;
  app.add_option("--cpu-model", model, "bench_train's CPU model: small (d128, 512 tokens), medium (d256, 2048 tokens)")
      ->capture_default_str()
      ->check(CLI::IsMember({"small", "medium"}));
  app.add_option("--threads", threads, "thread counts, comma-separated")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--levels", levels, "GEMM levels, comma-separated (default: every level this CPU runs)")
      ->delimiter(',');
  app.add_option("--iters", iters, "timed calls per product (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cli::CommonFlags common;
  cli::add_common_flags(app, common, /*threads_flag=*/false);  // --threads is this program's own list
  return cli::run_program(app, common, argc, argv, [&] {
    const std::vector<std::string> runs = cpu::gemm_levels();
    if (levels.empty()) levels = runs;
    for (const std::string& l : levels)
      if (std::find(runs.begin(), runs.end(), l) == runs.end())
        cli::usage_error(
            "--levels", l, ": not a GEMM level of this build and CPU (allowed: ",
            [&] {
              std::string s;
              for (const std::string& r : runs) s += (s.empty() ? "" : ", ") + r;
              return s;
            }(),
            ")");
    const bench::CpuGemmStep step = bench::cpu_gemm_step(model);
    const int64_t d = step.d_model, tokens = step.tokens;
    Generator g(1);
    std::printf("model %s: d_model %lld, %lld tokens; GFLOP/s by wall (by process CPU time)\n", model.c_str(),
                (long long)d, (long long)tokens);
    for (int n : threads) {
      set_num_threads(n);
      std::printf("\n== %d thread(s)\n%-10s %-17s", n, "product", "m x n x k");
      for (const std::string& l : levels) std::printf(" %22s", l.c_str());
      std::printf("\n");
      std::vector<double> wall(levels.size()), cpu(levels.size());
      double flops = 0;
      for (const bench::CpuGemmProduct& p : step.products) {
        bench::CpuGemmOperands ops = bench::random_operands(p, g);
        std::vector<float>&a = ops.a, &b = ops.b, &c = ops.c;
        const MatmulShape s = p.shape();
        const double f = p.flops();
        flops += f;
        p.print_name();
        for (size_t i = 0; i < levels.size(); ++i) {
          cpu::set_gemm_level(levels[i]);
          const bench::WallCpu t =
              bench::median_wall_cpu(iters, [&] { cpu::matmul(a.data(), b.data(), c.data(), s, p.ta, p.tb, false); });
          wall[i] += t.wall_ms, cpu[i] += t.cpu_ms;
          std::printf(" %10.1f (%9.1f)", f / (t.wall_ms * 1e6), f / (std::max(t.cpu_ms, 1e-3) * 1e6));
        }
        std::printf("\n");
      }
      std::printf("%-28s", "all");
      for (size_t i = 0; i < levels.size(); ++i)
        std::printf(" %10.1f (%9.1f)", flops / (wall[i] * 1e6), flops / (std::max(cpu[i], 1e-3) * 1e6));
      std::printf("\n");
    }
    return cli::kExitOk;
  });
}
