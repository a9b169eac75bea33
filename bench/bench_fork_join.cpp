// bench_fork_join: the thread pool's cost of one parallel_for call that does
// almost nothing (4 tasks per thread, each one atomic add), back to back, at
// each thread count asked: the fixed overhead every threaded op pays (waking
// or catching the workers, claiming tasks, waiting for the last one).
// Median and 90th percentile of --calls calls, in microseconds, per round.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/parallel.hpp"
#include "examples/common/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"bench_fork_join: parallel_for's fixed overhead per call", "bench_fork_join"};
  std::vector<int> threads{1, 2};
  int calls = 20000, rounds = 3;
  app.add_option("--threads", threads, "thread counts to run, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--calls", calls, "calls per round")->check(CLI::Range(1, 10000000));
  app.add_option("--rounds", rounds, "rounds per thread count")->check(CLI::Range(1, 100));
  hg::cli::CommonFlags common;
  hg::cli::add_common_flags(app, common, /*threads_flag=*/false);  // --threads is this program's own list
  return hg::cli::run_program(app, common, argc, argv, [&] {
    std::atomic<int64_t> sink{0};
    for (int n : threads) {
      hg::set_num_threads(n);
      for (int r = 0; r < rounds; ++r) {
        std::vector<double> us;
        for (int i = 0; i < calls; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          hg::parallel_for(4 * n, hg::kSerialWork, [&](int64_t t) { sink.fetch_add(t, std::memory_order_relaxed); });
          us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("threads %3d  fork-join median %7.2f us  p90 %7.2f us\n", n, us[us.size() / 2],
                    us[us.size() * 9 / 10]);
      }
    }
    return 0;
  });
}
