// bench_cpu_kernels: the CPU backend's hot kernels (fused LayerNorm and
// softmax, GELU, a Linear-sized GEMM) at each thread count asked, with wall
// and process CPU time per call. CPU time is the number to read on a shared
// machine, where other jobs stretch wall time (docs/cpu.md). Median of
// --iters calls after one warm-up call.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "examples/common/cli.hpp"

#include "bench/bench_util.hpp"
#include "core/cpu_gemm.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "core/tensor_functions.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"

using namespace hg;

namespace {

void report(const char* name, double bytes, const bench::WallCpu& s) {
  std::printf("%-34s wall %8.2f ms (%6.1f GB/s)   cpu %8.2f ms\n", name, s.wall_ms, bytes / (s.wall_ms * 1e6),
              s.cpu_ms);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_cpu_kernels: CPU fused kernels, GELU and GEMM per thread count", "bench_cpu_kernels"};
  std::vector<int> threads{1};
  int iters = 7;
  app.add_option("--threads", threads, "thread counts to run, comma-separated (hg::set_num_threads)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--iters", iters, "timed calls per kernel (median)")->check(CLI::Range(1, 1000));
  cli::CommonFlags common;
  cli::add_common_flags(app, common, /*threads_flag=*/false);  // --threads is this program's own list
  return cli::run_program(app, common, argc, argv, [&] {
    Generator g(1);
    std::string levels;
    for (const std::string& l : cpu::gemm_levels()) levels += (levels.empty() ? "" : ", ") + l;
    std::printf("GEMM level %s (this CPU runs: %s; HG_GEMM_LEVEL picks one)\n", cpu::gemm_level().c_str(),
                levels.c_str());
    for (int n : threads) {
      set_num_threads(n);
      std::printf("== %d thread(s)\n", n);
      for (auto [M, N] : std::vector<std::pair<int64_t, int64_t>>{{4096, 1024}, {4096, 4096}, {16384, 768}}) {
        const Tensor x = Tensor::randn({M, N}, g), dy = Tensor::randn({M, N}, g);
        const Tensor gamma = Tensor::randn({N}, g), beta = Tensor::randn({N}, g);
        LayerNormSaved saved;
        const double bytes = static_cast<double>(M * N * 4);
        const std::string size = std::to_string(M) + "x" + std::to_string(N);
        report(("layernorm fwd " + size).c_str(), 2 * bytes,
               bench::median_wall_cpu(iters, [&] { layernorm_forward(x, gamma, beta, 1e-5, &saved); }));
        report(("layernorm bwd " + size).c_str(), 3 * bytes,
               bench::median_wall_cpu(iters, [&] { layernorm_backward(dy, x, gamma, saved); }));
      }
      for (auto [B, H, T] : std::vector<std::array<int64_t, 3>>{{8, 8, 128}, {8, 12, 512}}) {
        const Tensor s = Tensor::randn({B, H, T, T}, g), dy = Tensor::randn({B, H, T, T}, g);
        SoftmaxOptions o;
        o.mask = Tensor::zeros({B, 1, 1, T});
        o.scale = 0.125;
        Tensor y = attention_softmax_forward(s, o);
        const double bytes = static_cast<double>(B * H * T * T * 4);
        const std::string size = "(" + std::to_string(B) + "," + std::to_string(H) + "," + std::to_string(T) + ")";
        report(("masked softmax fwd " + size).c_str(), 2 * bytes,
               bench::median_wall_cpu(iters, [&] { y = attention_softmax_forward(s, o); }));
        report(("softmax bwd " + size).c_str(), 3 * bytes,
               bench::median_wall_cpu(iters, [&] { softmax_backward(dy, y, 0.125); }));
      }
      const Tensor h = Tensor::randn({2048, 256}, g);
      report("gelu fwd 2048x256", 2.0 * 2048 * 256 * 4, bench::median_wall_cpu(iters, [&] { gelu(h); }));
      const Tensor a = Tensor::randn({2048, 64}, g), w = Tensor::randn({256, 64}, g);
      const bench::WallCpu mm = bench::median_wall_cpu(iters, [&] { matmul(a, w, false, true); });
      std::printf("%-34s wall %8.2f ms (%6.1f GFLOP/s) cpu %8.2f ms\n", "matmul 2048x64 * (256x64)^T", mm.wall_ms,
                  2.0 * 2048 * 64 * 256 / (mm.wall_ms * 1e6), mm.cpu_ms);
    }
    return cli::kExitOk;
  });
}
