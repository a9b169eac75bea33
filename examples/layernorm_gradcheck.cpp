// layernorm_gradcheck: float64 central finite differences against the
// hand-written LayerNorm backward, on a (B, T, D) input from the command line.
//
//   layernorm_gradcheck --B 2 --T 3 --D 8 --seed 0 [--eps 1e-5] [--unfused]
//
// The loss is sum(y * w) for a fixed random w, so the backward is run with
// dy = w. Prints the relative error of dx, dgamma and dbeta. Exit codes:
// 0 PASS, 1 FAIL or runtime error, 2 usage error (examples/common/cli.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/gradcheck.hpp"
#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "examples/common/cli.hpp"
#include "ops/layernorm.hpp"

using namespace hg;

namespace {

constexpr double kThreshold = 1e-6;
// Finite differences run two forward passes per element: quadratic time.
// The cap keeps a run to minutes, not days.
constexpr int64_t kMaxElements = int64_t{1} << 16;

}  // namespace

int main(int argc, char** argv) {
  int64_t B = 2, T = 3, D = 8;
  uint64_t seed = 0;
  double eps = 1e-5;
  bool unfused = false;
  CLI::App app{"layernorm_gradcheck: finite-difference check of the LayerNorm backward (float64, CPU)",
               "layernorm_gradcheck"};
  app.add_option("--B", B, "batch size")->check(CLI::Range(int64_t{1}, kMaxElements))->capture_default_str();
  app.add_option("--T", T, "sequence length")->check(CLI::Range(int64_t{1}, kMaxElements))->capture_default_str();
  app.add_option("--D", D, "normalised (last) dimension")
      ->check(CLI::Range(int64_t{1}, kMaxElements))
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed for x, gamma, beta and w")->capture_default_str();
  // Above ~1 (the inputs' variance) eps dominates it: the gradients shrink
  // as 1/sqrt(eps) and finite differences no longer resolve them (1e8 fails).
  app.add_option("--eps", eps, "LayerNorm epsilon (at most 1, the inputs' variance)")
      ->check(cli::real_range(1e-30, 1))
      ->capture_default_str();
  app.add_flag("--unfused", unfused, "check the unfused (primitive backend) path instead of the fused one");
  cli::CommonFlags common;
  cli::add_common_flags(app, common);

  return cli::run_program(app, common, argc, argv, [&] {
    if (B * T * D > kMaxElements)
      cli::usage_error("--B/--T/--D", B, " x ", T, " x ", D, " = ", B * T * D, " elements: at most ", kMaxElements,
                       " (finite differences run 2 forward passes per element, so the time grows quadratically)");
    KernelModeScope mode(unfused ? KernelMode::Unfused : KernelMode::Fused);
    Generator gen(seed);
    Tensor x = Tensor::randn({B, T, D}, gen, DType::F64);
    Tensor gamma = Tensor::randn({D}, gen, DType::F64, Device::CPU, 1.0, 0.5);
    Tensor beta = Tensor::randn({D}, gen, DType::F64);
    const Tensor w = Tensor::randn({B, T, D}, gen, DType::F64);

    LayerNormSaved saved;
    layernorm_forward(x, gamma, beta, eps, &saved);
    const LayerNormGrads analytic = layernorm_backward(w, x, gamma, saved);

    auto loss = [&] { return weighted_sum(layernorm_forward(x, gamma, beta, eps, nullptr), w); };
    const double h = 1e-5;  // truncation ~h^2, rounding ~1e-16 * |loss| / h
    const double e_dx = rel_error(analytic.dx, numerical_grad(loss, x, h));
    const double e_dgamma = rel_error(analytic.dgamma, numerical_grad(loss, gamma, h));
    const double e_dbeta = rel_error(analytic.dbeta, numerical_grad(loss, beta, h));

    std::printf("layernorm_gradcheck: x (%lld, %lld, %lld) float64 cpu, eps %g, seed %llu, %s path\n",
                static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(D), eps,
                static_cast<unsigned long long>(seed), unfused ? "unfused" : "fused");
    std::printf("  dx      relative error %.3e\n", e_dx);
    std::printf("  dgamma  relative error %.3e\n", e_dgamma);
    std::printf("  dbeta   relative error %.3e\n", e_dbeta);
    const bool pass = e_dx < kThreshold && e_dgamma < kThreshold && e_dbeta < kThreshold;
    std::printf("%s (threshold %.0e)\n", pass ? "PASS" : "FAIL", kThreshold);
    return pass ? cli::kExitOk : cli::kExitRuntime;
  });
}
