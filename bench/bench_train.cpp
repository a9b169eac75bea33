// bench_train: end-to-end DecoderLM training step, fused vs unfused kernels.
//
// For each device and kernel mode: median step time (forward, loss, backward,
// clip, AdamW), tokens/s, peak GPU memory, then a profiled pass that splits
// the step into op kinds (each op synchronized and timed; see core/profiler.hpp)
// so the fused gain can be read per kind. Writes two CSV files.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/profiler.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"

using namespace hg;

namespace {

struct Size {
  int64_t d_model, heads, layers, seq, batch, vocab;
};

struct Result {
  bench::Timing timing;
  double peak_mib = 0;
  std::vector<prof::Entry> breakdown;  // per step
  double profiled_step_ms = 0;
};

Result run(Device dev, KernelMode mode, const Size& s, int warmup, int iters, int profile_steps) {
  KernelModeScope scope(mode);
  DecoderLMConfig c;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.seq;
  c.d_model = s.d_model;
  c.n_heads = s.heads;
  c.n_layers = s.layers;
  c.seed = 1;
  DecoderLM model(c);
  model.to(dev);
  AdamW opt(model.parameters(), AdamWOptions{});
  // Two input sets, so no step sees the previous step's batch.
  Generator g(2);
  std::vector<Tensor> ids, targets;
  for (int i = 0; i < 2; ++i) {
    std::vector<double> a(static_cast<size_t>(s.batch * s.seq)), b(a.size());
    for (double& v : a) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(s.vocab));
    for (double& v : b) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(s.vocab));
    ids.push_back(Tensor::from_vector(a, {s.batch, s.seq}, DType::F32, dev));
    targets.push_back(Tensor::from_vector(b, {s.batch, s.seq}, DType::F32, dev));
  }
  auto step = [&](int i) {
    model.zero_grad();
    const Tensor logits = model.forward(ids[i]);
    CrossEntropySaved saved;
    Tensor loss;
    {
      HG_PROFILE("cross_entropy", dev);
      loss = cross_entropy_forward(logits, targets[i], -100, &saved);
    }
    Tensor dlogits;
    {
      HG_PROFILE("cross_entropy", dev);
      dlogits = cross_entropy_backward(saved);
    }
    model.backward(dlogits);
    HG_PROFILE("optimizer", dev);
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
  };
  Result r;
  if (dev == Device::CUDA) gpu::reset_peak_memory();
  r.timing = bench::time_op(dev, 2, warmup, iters, step);
  if (dev == Device::CUDA) r.peak_mib = static_cast<double>(gpu::memory_stats().peak_in_use) / (1 << 20);

  prof::reset();
  prof::enable(true);
  for (int i = 0; i < profile_steps; ++i) step(i % 2);
  prof::enable(false);
  for (prof::Entry e : prof::entries()) {
    e.total_ms /= profile_steps;
    e.calls /= profile_steps;
    r.profiled_step_ms += e.total_ms;
    r.breakdown.push_back(e);
  }
  prof::reset();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_train: DecoderLM training step, fused vs unfused, with a per-op-kind breakdown"};
  std::string devices = "auto";
  Size gpu{512, 8, 6, 256, 32, 256};
  Size cpu{128, 4, 2, 64, 8, 256};
  int warmup = 3, iters = 10, profile_steps = 3;
  std::string csv_path = "bench_train.csv", breakdown_path = "bench_train_breakdown.csv";
  app.add_option("--device", devices, "auto (cpu, plus cuda when present), cpu, cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--d-model", gpu.d_model, "CUDA model width")->capture_default_str();
  app.add_option("--heads", gpu.heads, "CUDA heads")->capture_default_str();
  app.add_option("--layers", gpu.layers, "CUDA layers")->capture_default_str();
  app.add_option("--seq-len", gpu.seq, "CUDA sequence length")->capture_default_str();
  app.add_option("--batch", gpu.batch, "CUDA batch")->capture_default_str();
  app.add_option("--vocab", gpu.vocab, "vocabulary (both devices)")->capture_default_str();
  app.add_option("--cpu-d-model", cpu.d_model, "CPU model width")->capture_default_str();
  app.add_option("--cpu-heads", cpu.heads, "CPU heads")->capture_default_str();
  app.add_option("--cpu-layers", cpu.layers, "CPU layers")->capture_default_str();
  app.add_option("--cpu-seq-len", cpu.seq, "CPU sequence length")->capture_default_str();
  app.add_option("--cpu-batch", cpu.batch, "CPU batch")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps")->capture_default_str();
  app.add_option("--iters", iters, "timed steps (median reported)")->capture_default_str();
  app.add_option("--profile-steps", profile_steps, "steps of the per-op-kind breakdown")->capture_default_str();
  app.add_option("--csv", csv_path, "summary CSV")->capture_default_str();
  app.add_option("--breakdown-csv", breakdown_path, "per-op-kind CSV")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  cpu.vocab = gpu.vocab;

  try {
    std::vector<Device> devs;
    if (devices != "cuda") devs.push_back(Device::CPU);
    if (devices == "cuda" || (devices == "auto" && cuda_available())) devs.push_back(Device::CUDA);
    HG_CHECK(devices != "cuda" || cuda_available(), "bench_train", "--device cuda but no CUDA GPU is available");

    bench::Csv csv(csv_path, "device,gpu,mode,d_model,heads,layers,seq,batch,vocab,median_ms,min_ms,tokens_per_s,"
                             "peak_mem_mib,speedup_vs_unfused");
    bench::Csv kinds(breakdown_path, "device,mode,kind,ms_per_step,calls_per_step,share_of_profiled_step");
    for (Device dev : devs) {
      const Size& s = dev == Device::CUDA ? gpu : cpu;
      const std::string gpu_name = dev == Device::CUDA ? gpu::device_name() : "";
      std::printf("\n== %s%s%s: d_model %lld, heads %lld, layers %lld, seq %lld, batch %lld, vocab %lld ==\n",
                  device_name(dev), gpu_name.empty() ? "" : " ", gpu_name.c_str(), (long long)s.d_model,
                  (long long)s.heads, (long long)s.layers, (long long)s.seq, (long long)s.batch, (long long)s.vocab);
      std::map<KernelMode, Result> results;
      for (KernelMode mode : {KernelMode::Unfused, KernelMode::Fused})
        results[mode] = run(dev, mode, s, warmup, iters, profile_steps);
      const double tokens = static_cast<double>(s.batch * s.seq);
      for (KernelMode mode : {KernelMode::Unfused, KernelMode::Fused}) {
        const Result& r = results[mode];
        const double speedup = results[KernelMode::Unfused].timing.median_ms / r.timing.median_ms;
        std::printf("%-8s step %9.2f ms (min %9.2f)  %10.0f tokens/s  peak %8.1f MiB  speedup %.2fx\n",
                    kernel_mode_name(mode), r.timing.median_ms, r.timing.min_ms, tokens / (r.timing.median_ms * 1e-3),
                    r.peak_mib, speedup);
        csv.row(device_name(dev), gpu_name, kernel_mode_name(mode), s.d_model, s.heads, s.layers, s.seq, s.batch,
                s.vocab, r.timing.median_ms, r.timing.min_ms, tokens / (r.timing.median_ms * 1e-3), r.peak_mib,
                speedup);
      }
      // Breakdown side by side: kinds in the unfused run's order.
      std::printf("%-14s %12s %12s %8s\n", "op kind", "unfused ms", "fused ms", "gain");
      const Result& ru = results[KernelMode::Unfused];
      const Result& rf = results[KernelMode::Fused];
      for (const prof::Entry& e : ru.breakdown) {
        double fused_ms = 0;
        for (const prof::Entry& f : rf.breakdown)
          if (f.kind == e.kind) fused_ms = f.total_ms;
        std::printf("%-14s %12.3f %12.3f %7.2fx\n", e.kind.c_str(), e.total_ms, fused_ms,
                    fused_ms > 0 ? e.total_ms / fused_ms : 0.0);
      }
      std::printf("%-14s %12.3f %12.3f %7.2fx  (profiled: every op synchronized)\n", "total", ru.profiled_step_ms,
                  rf.profiled_step_ms, ru.profiled_step_ms / rf.profiled_step_ms);
      for (KernelMode mode : {KernelMode::Unfused, KernelMode::Fused})
        for (const prof::Entry& e : results[mode].breakdown)
          kinds.row(device_name(dev), kernel_mode_name(mode), e.kind, e.total_ms, e.calls,
                    e.total_ms / results[mode].profiled_step_ms);
    }
    std::printf("\nwrote %s and %s\n", csv_path.c_str(), breakdown_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
    return 1;
  }
}
