// bench_cpu_gemm_tiles: how the CPU matmul cuts a product into tiles, measured
// on the Linear GEMMs of one bench_train --cpu-model step. The library
// (core/cpu_matmul.cpp) cuts a product into tiles of at most 64 x 192
// outputs so that 16 threads have work (on one thread a product without an
// epilogue stays whole); each tile multiplies packed panels through the GEMM
// level's kernel. The candidates here run the same packed pieces
// (core/cpu_gemm.hpp PackedGemm) with fixed tile shapes, so the tile's cost
// on one core (kernel edge panels, calls per depth block) is seen apart from
// the threading that motivates it:
//
//   production   cpu::matmul, as the library runs it
//   whole        the level's whole-product call (cpu::gemm: Eigen's own
//                blocking at the Eigen levels), on one thread
//   RxC          every panel of a depth block packed first, then every
//                tile of R x C outputs multiplied (--tiles, several shapes)
//
// Each candidate's C is checked on sampled entries against a float64 dot
// product within the worst-case bound of any summation order (as
// tests/test_cpu_gemm.cpp); a failed check marks the candidate FAILED and
// the program exits 1; it also names the candidates whose C is bitwise the
// library's. GFLOP/s by wall time (by process CPU time), the
// median of --iters calls after one warm-up call.
//
//   bench_cpu_gemm_tiles [--cpu-model small|medium] [--threads 1,16] [--levels L,..]
//                        [--tiles 64x128,64x192,...] [--iters 15]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.hpp"
#include "bench/cpu_gemm_products.hpp"
#include "core/aligned_scratch.hpp"
#include "core/cpu_gemm.hpp"
#include "core/cpu_matmul.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "examples/common/cli.hpp"

using namespace hg;

namespace {

struct TileShape {
  int64_t rows, cols;
  std::string name() const { return std::to_string(rows) + "x" + std::to_string(cols); }
};

TileShape parse_tile(const std::string& s) {
  const size_t x = s.find('x');
  try {
    if (x != std::string::npos) {
      const TileShape t{std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))};
      if (t.rows > 0 && t.cols > 0) return t;
    }
  } catch (const std::exception&) {
  }
  cli::usage_error("--tiles", s, ": expected ROWSxCOLS with both positive, e.g. 64x128");
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// C = op(A) op(B) in tiles of t: per depth block, every panel packed once
// (in parallel), then every tile multiplied (in parallel).
void tiled_product(const cpu::GemmBlock<float>& g, TileShape t) {
  const cpu::PackedGemm<float>& p = cpu::packed_gemm_f32();
  const int64_t kc_max = std::min(g.depth, p.depth_block(g.rows, g.cols, g.depth));
  const int64_t row_tiles = pieces(g.rows, t.rows), col_tiles = pieces(g.cols, t.cols);
  const int64_t row_panel = round_up(round_up(t.rows, p.row_multiple) * kc_max, 16),
                col_panel = round_up(round_up(t.cols, p.col_multiple) * kc_max, 16);
  static cpu::AlignedScratch rows_scratch, cols_scratch;
  float* rows_buf = static_cast<float*>(rows_scratch.get(sizeof(float) * row_tiles * row_panel));
  float* cols_buf = static_cast<float*>(cols_scratch.get(sizeof(float) * col_tiles * col_panel));
  for (int64_t k0 = 0; k0 < g.depth; k0 += kc_max) {
    const int64_t kc = std::min(kc_max, g.depth - k0);
    parallel_for(row_tiles + col_tiles, (g.rows + g.cols) * kc, [&](int64_t i) {
      if (i < row_tiles) {
        const int64_t r0 = i * t.rows;
        p.pack_rows(g, k0, kc, r0, std::min(t.rows, g.rows - r0), rows_buf + i * row_panel);
      } else {
        const int64_t j = i - row_tiles, c0 = j * t.cols;
        p.pack_cols(g, k0, kc, c0, std::min(t.cols, g.cols - c0), cols_buf + j * col_panel);
      }
    });
    parallel_for(row_tiles * col_tiles, g.rows * g.cols * kc, [&](int64_t task) {
      const int64_t i = task / col_tiles, j = task % col_tiles, r0 = i * t.rows, c0 = j * t.cols;
      p.multiply(g, kc, r0, std::min(t.rows, g.rows - r0), c0, std::min(t.cols, g.cols - c0), rows_buf + i * row_panel,
                 cols_buf + j * col_panel, k0 == 0, k0 + kc == g.depth);
    });
  }
}

// Sampled entries of C against float64 dot products: |C - exact| <=
// gamma_(k+2) sum_l |a_il b_lj| with gamma_n = n u / (1 - n u), u = 2^-24.
bool check(const bench::CpuGemmProduct& p, const std::vector<float>& a, const std::vector<float>& b,
           const std::vector<float>& c) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(p.k + 2), gamma = n * u / (1 - n * u);
  for (int64_t s = 0; s < 257; ++s) {
    const int64_t i = (s * 7919) % p.m, j = (s * 104729) % p.n;
    double dot = 0, abs_dot = 0;
    for (int64_t l = 0; l < p.k; ++l) {
      const double x = a[static_cast<size_t>(p.ta ? l * p.m + i : i * p.k + l)];
      const double y = b[static_cast<size_t>(p.tb ? j * p.k + l : l * p.n + j)];
      dot += x * y;
      abs_dot += std::fabs(x * y);
    }
    if (!(std::fabs(c[static_cast<size_t>(i * p.n + j)] - dot) <= gamma * abs_dot)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_cpu_gemm_tiles: the CPU matmul's tile shapes on one training step's Linear GEMMs",
               "bench_cpu_gemm_tiles"};
  std::string model = "medium";
  std::vector<int> threads{1};
  std::vector<std::string> levels, tile_names{"64x128", "64x192", "96x192", "128x384", "256x768"};
  int iters = 15;
  app.add_option("--cpu-model", model, "bench_train's CPU model: small (d128, 512 tokens), medium (d256, 2048 tokens)")
      ->check(CLI::IsMember({"small", "medium"}));
  app.add_option("--threads", threads, "thread counts, comma-separated")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--levels", levels, "GEMM levels, comma-separated (default: the level the library picks)")
      ->delimiter(',');
  app.add_option("--tiles", tile_names, "tile shapes ROWSxCOLS, comma-separated")->delimiter(',');
  app.add_option("--iters", iters, "timed calls per product (median)")->check(CLI::Range(1, 1000));
  cli::CommonFlags common;
  cli::add_common_flags(app, common, /*threads_flag=*/false);
  return cli::run_program(app, common, argc, argv, [&] {
    if (levels.empty()) levels = {cpu::gemm_level()};
    for (const std::string& l : levels) cpu::set_gemm_level(l);  // an unknown name fails here, listing the allowed
    std::vector<TileShape> tiles;
    for (const std::string& s : tile_names) tiles.push_back(parse_tile(s));
    const bench::CpuGemmStep step = bench::cpu_gemm_step(model);
    const int64_t d = step.d_model, tokens = step.tokens;
    std::vector<std::string> names{"production", "whole"};
    for (const TileShape& t : tiles) names.push_back(t.name());
    Generator g(1);
    bool all_passed = true;
    std::printf("model %s: d_model %lld, %lld tokens; GFLOP/s by wall (by process CPU time)\n", model.c_str(),
                (long long)d, (long long)tokens);
    for (const std::string& level : levels) {
      cpu::set_gemm_level(level);
      for (int n : threads) {
        set_num_threads(n);
        std::printf("\n== level %s, %d thread(s)\n%-10s %-17s", level.c_str(), n, "product", "m x n x k");
        for (const std::string& name : names) std::printf(" %20s", name.c_str());
        std::printf("\n");
        std::vector<double> wall(names.size()), cpu_ms(names.size());
        std::vector<bool> passed(names.size(), true), same_bits(names.size(), true);
        std::vector<float> reference_bits;
        double flops = 0;
        for (const bench::CpuGemmProduct& p : step.products) {
          bench::CpuGemmOperands ops = bench::random_operands(p, g);
          std::vector<float>&a = ops.a, &b = ops.b, &c = ops.c;
          cpu::GemmBlock<float> blk;
          blk.rows = p.m, blk.cols = p.n, blk.depth = p.k;
          blk.a = a.data(), blk.lda = p.ta ? p.m : p.k, blk.transpose_a = p.ta;
          blk.b = b.data(), blk.ldb = p.tb ? p.k : p.n, blk.transpose_b = p.tb;
          blk.c = c.data(), blk.ldc = p.n;
          const MatmulShape s = p.shape();
          const double f = p.flops();
          flops += f;
          p.print_name();
          for (size_t v = 0; v < names.size(); ++v) {
            const auto run = [&] {
              if (v == 0) cpu::matmul(a.data(), b.data(), c.data(), s, p.ta, p.tb, false);
              else if (v == 1) cpu::gemm(blk);
              else tiled_product(blk, tiles[v - 2]);
            };
            std::fill(c.begin(), c.end(), std::nanf(""));
            run();
            const bool ok = check(p, a, b, c);
            if (v == 0) reference_bits = c;
            else if (c != reference_bits) same_bits[v] = false;
            passed[v] = passed[v] && ok;
            const bench::WallCpu t = bench::median_wall_cpu(iters, run);
            wall[v] += t.wall_ms, cpu_ms[v] += t.cpu_ms;
            std::printf(" %8.1f (%8.1f)%s", f / (t.wall_ms * 1e6), f / (std::max(t.cpu_ms, 1e-3) * 1e6),
                        ok ? " " : "!");
          }
          std::printf("\n");
        }
        std::printf("%-28s", "all");
        size_t best = 0;
        for (size_t v = 0; v < names.size(); ++v) {
          std::printf(" %8.1f (%8.1f) ", flops / (wall[v] * 1e6), flops / (std::max(cpu_ms[v], 1e-3) * 1e6));
          if (passed[v] && (!passed[best] || wall[v] < wall[best])) best = v;
          all_passed = all_passed && passed[v];
        }
        std::printf("\n");
        for (size_t v = 0; v < names.size(); ++v)
          if (!passed[v]) std::printf("FAILED: %s (entries outside the bound are marked !)\n", names[v].c_str());
        std::printf("fastest that passed: %s\nbitwise production's C on every product:",
                    passed[best] ? names[best].c_str() : "none");
        for (size_t v = 1; v < names.size(); ++v)
          if (same_bits[v]) std::printf(" %s", names[v].c_str());
        std::printf("\n");
      }
    }
    return all_passed ? cli::kExitOk : 1;
  });
}
