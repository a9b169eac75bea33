// bench_attention: scaled dot-product attention forward and backward, fused
// (one kernel, O(T) memory) against unfused (GEMM + softmax + GEMM), on the
// sizes of shared/anchors/torch_sdpa.py: B*T = tokens, H*dh = width.
// TFLOP/s as that script counts them: forward 4*B*H*Tq*Tk*dh, backward 2.5x,
// causal halves both. Peak extra memory: the most the allocator held above
// the inputs during one forward + backward. --key-mask adds a padding mask
// (batch b pads its last (b % 4) T / 8 keys; FLOPs still count every key),
// --mma-sync runs the mma.sync kernels where the wgmma ones would run,
// --recompute-dq the wgmma backward's recomputing dq kernel where it would
// store ds.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "cuda/attention_kernels.hpp"
#include "examples/common/cli.hpp"
#include "ops/attention.hpp"

using namespace hg;

namespace {

struct Result {
  bench::Timing fwd, bwd;
  double peak_extra_mib = 0;
};

// Rotated input sets (so the L2 does not hold the next call's data), drawn once
// per (dtype, T, dh): drawing them is most of the bench's wall time.
constexpr int kSets = 2;
struct Inputs {
  std::vector<Tensor> q, k, v, dout;
  Tensor mask;  // (B, 1, 1, T) in the math dtype, or none
};

// Batch b's last (b % 4) * T / 8 keys removed (-inf), the rest 0.
Tensor padding_mask(DType dtype, int64_t batch, int64_t t) {
  std::vector<double> m(static_cast<size_t>(batch * t), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = t - (b % 4) * t / 8; j < t; ++j) m[static_cast<size_t>(b * t + j)] = -INFINITY;
  return Tensor::from_vector(m, {batch, 1, 1, t}, math_dtype(dtype)).to(Device::CUDA);
}

Inputs make_inputs(DType dtype, int64_t t, int64_t dh, int64_t tokens, int64_t width, bool key_mask) {
  Generator gen(1);
  Inputs in;
  for (int s = 0; s < kSets; ++s)
    for (auto* list : {&in.q, &in.k, &in.v, &in.dout})
      list->push_back(Tensor::randn({tokens / t, width / dh, t, dh}, gen, dtype, Device::CUDA));
  if (key_mask) in.mask = padding_mask(dtype, tokens / t, t);
  return in;
}

Result measure(const Inputs& in, bool causal, KernelMode mode, int warmup, int iters) {
  KernelModeScope scope(mode);
  const std::vector<Tensor>& q = in.q;
  const std::vector<Tensor>& k = in.k;
  const std::vector<Tensor>& v = in.v;
  const std::vector<Tensor>& dout = in.dout;
  AttentionOptions opt;
  opt.causal = causal;
  opt.mask = in.mask;
  std::vector<AttentionSaved> saved(kSets);
  Result r;
  r.fwd = bench::time_op(Device::CUDA, kSets, warmup, iters,
                         [&](int i) { attention_forward(q[i], k[i], v[i], opt, &saved[i]); });
  r.bwd = bench::time_op(Device::CUDA, kSets, warmup, iters, [&](int i) { attention_backward(dout[i], saved[i]); });
  saved = std::vector<AttentionSaved>(kSets);
  gpu::synchronize();
  const size_t base = gpu::memory_stats().in_use;
  gpu::reset_peak_memory();
  {
    AttentionSaved s;
    attention_forward(q[0], k[0], v[0], opt, &s);
    attention_backward(dout[0], s);
    gpu::synchronize();
  }
  r.peak_extra_mib = double(gpu::memory_stats().peak_in_use - base) / (1 << 20);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_attention: fused vs unfused attention, TFLOP/s and peak memory (CUDA)"};
  int64_t tokens = 16384, width = 2048;
  int warmup = 3, iters = 15;
  int64_t max_unfused_t = 4096;
  bool fused_only = false, key_mask = false, mma_sync = false, recompute_dq = false;
  std::string csv_path;
  std::vector<int64_t> seqs{512, 1024, 2048, 4096}, head_dims{64, 128};
  std::vector<std::string> dtypes{"bf16", "f32"};
  app.add_option("--tokens", tokens, "B * T")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--width", width, "H * dh")->check(CLI::Range(int64_t(32), int64_t(1) << 16));
  app.add_option("--seq", seqs, "sequence lengths T")->delimiter(',')->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--head-dim", head_dims, "head dims (32, 64, 128)")
      ->delimiter(',')
      ->check(CLI::IsMember({32, 64, 128}));
  app.add_option("--dtype", dtypes, "bf16 and/or f32")->delimiter(',')->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--warmup", warmup, "untimed calls per case")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "timed calls per case (median)")->check(CLI::Range(1, 100000));
  app.add_option("--max-unfused-seq", max_unfused_t, "skip the unfused path above this T (its memory grows as T^2)");
  app.add_flag("--fused-only", fused_only, "time only the fused path");
  app.add_flag("--key-mask", key_mask, "a padding mask: batch b removes its last (b % 4) * T / 8 keys");
  app.add_flag("--mma-sync", mma_sync, "BF16: the mma.sync kernels where the sm_90a wgmma ones would run");
  app.add_flag("--recompute-dq", recompute_dq,
               "BF16: the wgmma backward recomputes s and dp for dq where it would store ds");
  app.add_option("--csv", csv_path, "write every row here too");
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  return cli::run_program(app, common, argc, argv, [&] {
    cli::require_cuda("bench_attention", "hg_op attention, bench_train --device cpu");
    if (!csv_path.empty()) cli::check_writable(csv_path, "--csv");
    gpu::allow_wgmma_attention(!mma_sync);
    gpu::allow_stored_ds_attention(!recompute_dq);
    std::printf("GPU: %s; tokens %lld, width %lld; median of %d after %d warm-up%s%s%s\n", gpu::device_name(),
                static_cast<long long>(tokens), static_cast<long long>(width), iters, warmup,
                key_mask ? "; padding mask" : "", mma_sync ? "; mma.sync kernels" : "",
                recompute_dq ? "; dq recomputed" : "");
    std::printf("%-5s %5s %4s %6s %-7s | %9s %9s | %8s %8s | %9s\n", "dtype", "T", "dh", "causal", "path", "fwd ms",
                "bwd ms", "fwd TF/s", "bwd TF/s", "peak MiB");
    std::unique_ptr<bench::Csv> csv;
    if (!csv_path.empty())
      csv = std::make_unique<bench::Csv>(csv_path, "dtype,T,B,H,dh,causal,path,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops,"
                                                   "peak_extra_mib");
    for (const std::string& dt : dtypes)
      for (int64_t dh : head_dims)
        for (int64_t t : seqs) {
          if (tokens % t != 0 || width % dh != 0) continue;
          const DType dtype = dt == "bf16" ? DType::BF16 : DType::F32;
          const Inputs inputs = make_inputs(dtype, t, dh, tokens, width, key_mask);
          for (bool causal : {false, true})
            for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
              if (mode == KernelMode::Unfused && (fused_only || t > max_unfused_t)) continue;
              const Result r = measure(inputs, causal, mode, warmup, iters);
              const double flops = 4.0 * double(tokens) * double(t) * double(width) * (causal ? 0.5 : 1.0);
              const double fwd_tf = flops / (r.fwd.median_ms * 1e-3) * 1e-12;
              const double bwd_tf = 2.5 * flops / (r.bwd.median_ms * 1e-3) * 1e-12;
              const char* path = mode == KernelMode::Fused ? "fused" : "unfused";
              std::printf("%-5s %5lld %4lld %6s %-7s | %9.3f %9.3f | %8.1f %8.1f | %9.1f\n", dt.c_str(),
                          static_cast<long long>(t), static_cast<long long>(dh), causal ? "yes" : "no", path,
                          r.fwd.median_ms, r.bwd.median_ms, fwd_tf, bwd_tf, r.peak_extra_mib);
              std::fflush(stdout);
              if (csv)
                csv->row(dt, t, tokens / t, width / dh, dh, causal ? 1 : 0, path, r.fwd.median_ms, r.bwd.median_ms,
                         fwd_tf, bwd_tf, r.peak_extra_mib);
            }
        }
    return cli::kExitOk;
  });
}
