// Backend::gemm throughput (cuBLASLt) at the shapes of bench_train's linear
// layers: M = batch * seq rows against K x N weights, K, N in {512, 1536,
// 2048}, in the three forms a Linear runs (forward x W^T, input gradient
// dy W, weight gradient dy^T x accumulated into an F32 grad), plus the
// BiasGelu epilogue of the first FFN linear, and the second's input gradient
// with GeluBackward (gelu_bwd: cuBLASLt's DGELU epilogue and the bias
// gradient's column sums). TFLOP/s = 2 M N K / median time (CUDA events,
// warm-up, rotating input sets), and % of a stated dense peak.
//
//   bench_gemm                       # bf16, M = 8192, peak 790 TFLOP/s
//   bench_gemm --dtype f32 --tf32    # the fp32 model's GEMMs with TF32
//   bench_gemm --m 4096 --peak 989 --csv gemm.csv   (the CSV is rewritten)
//   bench_gemm --m 32768 --sizes 3072x768   # GPT-2 small's fc2 at batch 32
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/math_mode.hpp"
#include "core/tensor.hpp"
#include "examples/common/cli.hpp"

namespace {

using namespace hg;

constexpr const char* kBench = "bench_gemm";

struct Operands {
  Tensor x, w, dy, out_fwd, out_dx, out_dw, bias, aux, pre_dx, bias_grad_dx;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cuBLASLt GEMM throughput at bench_train's linear-layer shapes", "bench_gemm"};
  int64_t m = 8192;
  std::string dtype_text = "bf16";
  bool tf32 = false;
  double peak = 790.0;
  int iters = 30, warmup = 5, reps = 10, sets = 3;
  std::string csv, sizes_text = "512x512,512x1536,512x2048,1536x512,1536x1536,1536x2048,2048x512,2048x1536,2048x2048";
  app.add_option("--m", m, "rows (batch * seq)")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dtype", dtype_text, "operand dtype")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_flag("--tf32", tf32, "allow TF32 for f32 operands");
  app.add_option("--peak", peak, "dense peak TFLOP/s of the GPU for the % column")
      ->check(cli::real_range(1e-3, 1e6))
      ->capture_default_str();
  app.add_option("--iters", iters, "timed samples")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed samples")->check(CLI::Range(0, 1000000))->capture_default_str();
  app.add_option("--reps", reps, "calls per timed sample")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--sets", sets, "rotating input sets")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--csv", csv, "write the rows to this CSV file");
  app.add_option("--sizes", sizes_text, "Linear shapes KxN (in x out features), comma-separated")
      ->capture_default_str();
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  return cli::run_program(app, common, argc, argv, [&] {
    const auto sizes = bench::parse_pairs("--sizes", sizes_text, "KxN");  // a bad list fails before the device
    cli::require_cuda(kBench, "bench_cpu_kernels (its GEMM rows)");
    const DType dtype = dtype_text == "bf16" ? DType::BF16 : DType::F32;
    set_allow_tf32(tf32);
    Backend& be = cuda_backend();
    std::optional<bench::Csv> out;
    if (!csv.empty()) out.emplace(csv, "bench,device,dtype,tf32,form,m,k,n,median_ms,tflops");
    std::printf("%s on %s, %s%s, M = %lld, peak %.0f TFLOP/s\n", kBench, gpu::device_name(), dtype_text.c_str(),
                tf32 ? " (TF32 allowed)" : "", static_cast<long long>(m), peak);
    std::printf("%-10s %6s %6s %10s %10s %7s\n", "form", "K", "N", "ms", "TFLOP/s", "%peak");
    Generator gen(1);
    for (const auto& [k, n] : sizes) {
      std::vector<Operands> ops(sets);
      for (Operands& o : ops) {
        o.x = Tensor::randn({m, k}, gen, DType::F32, Device::CUDA).to(dtype);
        o.w = Tensor::randn({n, k}, gen, DType::F32, Device::CUDA, 0.0, 0.02).to(dtype);
        o.dy = Tensor::randn({m, n}, gen, DType::F32, Device::CUDA).to(dtype);
        o.out_fwd = Tensor::empty({m, n}, dtype, Device::CUDA);
        o.out_dx = Tensor::empty({m, k}, dtype, Device::CUDA);
        o.out_dw = Tensor::zeros({n, k}, DType::F32, Device::CUDA);
        o.bias = Tensor::zeros({n}, dtype, Device::CUDA);
        o.aux = Tensor::empty({m, n}, dtype, Device::CUDA);
        o.pre_dx = Tensor::randn({m, k}, gen, DType::F32, Device::CUDA).to(dtype);
        o.bias_grad_dx = Tensor::zeros({k}, DType::F32, Device::CUDA);
      }
      struct Form {
        const char* name;
        std::function<void(Operands&)> run;
      };
      const std::vector<Form> forms = {
          {"forward",
           [&](Operands& o) {
             be.gemm(o.x, o.w, o.out_fwd, {false, true});
           }},
          {"dgrad", [&](Operands& o) { be.gemm(o.dy, o.w, o.out_dx, {}); }},
          {"wgrad",
           [&](Operands& o) {
             GemmArgs a;
             a.transpose_a = true;
             a.accumulate = true;
             be.gemm(o.dy, o.x, o.out_dw, a);
           }},
          {"bias_gelu",
           [&](Operands& o) {
             GemmArgs a;
             a.transpose_b = true;
             a.epilogue = GemmEpilogue::BiasGelu;
             a.bias = &o.bias;
             a.aux = &o.aux;
             be.gemm(o.x, o.w, o.out_fwd, a);
           }},
          {"gelu_bwd",
           [&](Operands& o) {
             GemmArgs a;
             a.epilogue = GemmEpilogue::GeluBackward;
             a.aux = &o.pre_dx;
             a.bias_grad = &o.bias_grad_dx;
             a.bias_grad_accumulate = true;
             be.gemm(o.dy, o.w, o.out_dx, a);
           }},
      };
      for (const Form& f : forms) {
        const bench::Timing t =
            bench::time_rotating(Device::CUDA, sets, warmup, iters, reps, [&](int s) { f.run(ops[s]); });
        const double tflops = 2.0 * double(m) * double(n) * double(k) / (t.median_ms * 1e-3) / 1e12;
        std::printf("%-10s %6lld %6lld %10.4f %10.1f %6.1f%%\n", f.name, static_cast<long long>(k),
                    static_cast<long long>(n), t.median_ms, tflops, 100.0 * tflops / peak);
        if (out) out->row(kBench, gpu::device_name(), dtype_text, tf32 ? 1 : 0, f.name, m, k, n, t.median_ms, tflops);
      }
    }
    return cli::kExitOk;
  });
}
