// Bias gradients and the GELU backward on the GPU, old against new
// (docs/gemm.md). Column sums of (M, N) bf16 into an f32 grad: the two-pass
// kernels into a temp plus the add (colsum_old), and one cluster launch adding
// into the grad (colsum_new). The fc2 dgrad of a GELU FFN, dpre (M, H) = dy
// (M, D) W (D, H) times gelu'(pre), with fc1's bias grad: the plain GEMM alone
// (gemm), cuBLASLt's DGELU epilogue then the old sums and add (dgelu_old) or
// the new sums (dgelu_new), and the plain GEMM then the one fused pass
// (pass: what gemm_lt runs where clusters run). Median of CUDA events over
// rotating input sets.
//
//   bench_bias_grad                   # bench model (D 512, H 2048) and GPT-2 small (768, 3072), M 8192 and 32768
//   bench_bias_grad --csv bias_grad.csv
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/gemm_check.hpp"
#include "core/tensor.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/gemm_lt.hpp"
#include "examples/common/cli.hpp"

namespace {

using namespace hg;

constexpr const char* kBench = "bench_bias_grad";

struct Operands {
  Tensor dy, w, pre, dpre, grad, temp;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bias-gradient column sums and the GELU backward, old against new", kBench};
  int iters = 30, warmup = 5, reps = 10, sets = 3;
  std::string csv;
  app.add_option("--iters", iters, "timed samples")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed samples")->check(CLI::Range(0, 1000000))->capture_default_str();
  app.add_option("--reps", reps, "calls per timed sample")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--sets", sets, "rotating input sets")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--csv", csv, "write the rows to this CSV file");
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  return cli::run_program(app, common, argc, argv, [&] {
    cli::require_cuda(kBench);
    Backend& be = cuda_backend();
    std::optional<bench::Csv> out;
    if (!csv.empty()) out.emplace(csv, "bench,device,form,m,d,h,median_ms");
    std::printf("%s on %s (bf16 operands, f32 bias grads); cluster kernels %s\n", kBench, gpu::device_name(),
                gpu::column_sum_clusters_run() ? "run" : "do not run (two-pass sums only)");
    std::printf("%-10s %6s %6s %6s %10s\n", "form", "M", "D", "H", "ms");
    Generator gen(1);
    for (const auto& [m, d, h] :
         {std::tuple<int64_t, int64_t, int64_t>{8192, 512, 2048}, {8192, 768, 3072}, {32768, 768, 3072}}) {
      std::vector<Operands> ops(sets);
      for (Operands& o : ops) {
        o.dy = Tensor::randn({m, d}, gen, DType::F32, Device::CUDA).to(DType::BF16);
        o.w = Tensor::randn({d, h}, gen, DType::F32, Device::CUDA, 0.0, 0.02).to(DType::BF16);
        o.pre = Tensor::randn({m, h}, gen, DType::F32, Device::CUDA).to(DType::BF16);
        o.dpre = Tensor::empty({m, h}, DType::BF16, Device::CUDA);
        o.grad = Tensor::zeros({h}, DType::F32, Device::CUDA);
        o.temp = Tensor::empty({h}, DType::F32, Device::CUDA);
      }
      const auto gelu_gemm = [&](Operands& o, gpu::GeluBackwardRoute route, bool with_grad) {
        GemmArgs a;
        a.epilogue = GemmEpilogue::GeluBackward;
        a.aux = &o.pre;
        if (with_grad) {
          a.bias_grad = &o.grad;
          a.bias_grad_accumulate = true;
        }
        gpu::gemm_lt(o.dy, o.w, o.dpre, a, check_gemm(o.dy, o.w, o.dpre, a, kBench), route);
      };
      struct Form {
        const char* name;
        bool needs_clusters;
        std::function<void(Operands&)> run;
      };
      const std::vector<Form> forms = {
          {"colsum_old", false,
           [&](Operands& o) {
             gpu::column_sum(o.pre, m, h, h, o.temp, false, gpu::ColumnSumKernels::TwoPass);
             be.zip(BinaryOp::Add, o.grad, o.temp, o.grad);
           }},
          {"colsum_new", true,
           [&](Operands& o) { gpu::column_sum(o.pre, m, h, h, o.grad, true, gpu::ColumnSumKernels::Clusters); }},
          {"gemm", false, [&](Operands& o) { be.gemm(o.dy, o.w, o.dpre, GemmArgs{}); }},
          {"dgelu_old", false,
           [&](Operands& o) {
             gelu_gemm(o, gpu::GeluBackwardRoute::Epilogue, false);
             gpu::column_sum(o.dpre, m, h, h, o.temp, false, gpu::ColumnSumKernels::TwoPass);
             be.zip(BinaryOp::Add, o.grad, o.temp, o.grad);
           }},
          {"dgelu_new", true, [&](Operands& o) { gelu_gemm(o, gpu::GeluBackwardRoute::Epilogue, true); }},
          {"pass", true, [&](Operands& o) { gelu_gemm(o, gpu::GeluBackwardRoute::Pass, true); }},
      };
      for (const Form& f : forms) {
        if (f.needs_clusters && !gpu::column_sum_clusters_run()) continue;
        const bench::Timing t =
            bench::time_rotating(Device::CUDA, sets, warmup, iters, reps, [&](int s) { f.run(ops[s]); });
        std::printf("%-10s %6lld %6lld %6lld %10.4f\n", f.name, static_cast<long long>(m), static_cast<long long>(d),
                    static_cast<long long>(h), t.median_ms);
        if (out) out->row(kBench, gpu::device_name(), f.name, m, d, h, t.median_ms);
      }
    }
    return cli::kExitOk;
  });
}
