// bench_train: the end-to-end DecoderLM training step (models/train_step.hpp:
// forward, cross-entropy, backward, clip, AdamW), per device, precision and
// kernel mode: median step time (CUDA events, warm-up, two rotating batches),
// tokens/s, peak GPU memory, MFU; then a profiled pass that splits the step
// into op kinds (each op synchronized and timed; core/profiler.hpp).
// Writes two CSV files. --floor (CUDA) adds a lower bound for the fused step
// from its parts timed alone (bench/step_floor.hpp) and a third CSV.
// docs/training.md and docs/mixed_precision.md explain the numbers;
// docs/benchmarks.md records them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/bench_util.hpp"
#include "bench/kernel_trace.hpp"
#include "bench/step_floor.hpp"
#ifdef HG_WITH_CUDA
#include "bench/step_floor_timing.hpp"
#endif
#include "core/cuda_runtime.hpp"
#include "core/gemm_algorithms.hpp"
#include "core/kernel_mode.hpp"
#include "core/math_mode.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "core/profiler.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/gemm_flags.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "ops/classifier.hpp"

using namespace hg;

namespace {

using Size = bench::ModelSize;

// --cpu-model presets, the same models as bench/torch_cpu_step.py --config
// (d_model, heads, layers, seq, batch, vocab; the vocabulary comes from --vocab).
const std::map<std::string, Size> kCpuModels = {{"small", {128, 4, 2, 64, 8, 256}},
                                                {"medium", {256, 4, 4, 128, 16, 256}}};

struct Result {
  bench::Timing timing;
  double peak_mib = 0;            // the allocator's blocks
  double peak_requested_mib = 0;  // what the tensors asked for, as PyTorch's max_memory_allocated counts
  bool graph = false;
  std::string graph_note;
  std::vector<prof::Entry> breakdown;  // per step
  double profiled_step_ms = 0;
  int64_t parameters = 0;
  bench::KernelTraceResult trace;  // --kernel-trace: totals over trace_steps steps
  int trace_steps = 0;
};

// Model FLOPs of one training step (forward + backward = 3x forward):
//   6 * N * tokens            N = weight elements of every Linear (QKV, proj,
//                             fc1, fc2 per layer, and the LM head); embeddings,
//                             LayerNorm and biases do no GEMM work
// + 12 * L * T * d * tokens   attention scores and P V (4 B T^2 d per layer
//                             forward), counted in full: the causal half is computed too.
double model_flops_per_step(const Size& s, int64_t ffn_hidden) {
  const double d = static_cast<double>(s.d_model), h = static_cast<double>(ffn_hidden);
  const double L = static_cast<double>(s.layers), T = static_cast<double>(s.seq);
  const double tokens = static_cast<double>(s.batch * s.seq);
  const double n_matmul = L * (d * 3 * d + d * d + 2 * d * h) + d * static_cast<double>(s.vocab);
  return 6 * n_matmul * tokens + 12 * L * T * d * tokens;
}

// Dense bf16 tensor-core peak (TFLOP/s, no sparsity) of known GPUs; 0 when unknown.
double bf16_peak_tflops(const std::string& gpu_name) {
  auto has = [&](const char* s) { return gpu_name.find(s) != std::string::npos; };
  if (has("H100") && (has("PCIe") || has("PCIE"))) return 756;
  if (has("H100") || has("H200") || has("GH200")) return 989;  // SXM / HBM3 parts
  if (has("A100")) return 312;
  return 0;
}

// One benchmarked configuration: the device, the step's kernels and model,
// and how long to measure.
struct RunSettings {
  Device device = Device::CPU;
  KernelMode mode = KernelMode::Fused;
  Precision precision = Precision::FP32;
  AttentionImpl attention = AttentionImpl::Auto;
  bool use_graph = true;
  bool chunked_classifier = true;
  int64_t chunk_rows = 0;  // 0: the classifier's default
  bool recompute_gelu = false;
  bool recompute_layernorm = false;
  bool weight_grads_beside = true;
  Size size{};
  int warmup = 3, iters = 10, profile_steps = 3;
  int kernel_trace = 0;  // > 0: trace that many timed steps' kernels (CUDA)
};

Result run(const RunSettings& rs) {
  const Device dev = rs.device;
  const Size& s = rs.size;
  KernelModeScope scope(rs.mode);
  if (rs.kernel_trace > 0) bench::kernel_trace_enable();  // before the graph is captured
  DecoderLMConfig c = bench::decoder_config(s, rs.precision);
  c.attention = rs.attention;
  c.recompute_gelu = rs.recompute_gelu;
  c.recompute_layernorm = rs.recompute_layernorm;
  DecoderLM model(c);
  model.to(dev);
  AdamWOptions adamw;
  adamw.max_grad_norm = 1.0;  // clipping inside the multi-tensor update
  AdamW opt(model.parameters(), adamw);
  TrainStepOptions options;
  options.use_graph = rs.use_graph;
  options.chunked_classifier = rs.chunked_classifier;
  options.classifier_chunk_rows = rs.chunk_rows;
  options.weight_grads_beside = rs.weight_grads_beside;
  TrainStep step(model, opt, options);
  // Two input sets, so no step sees the previous step's batch.
  std::vector<Tensor> ids, targets;
  bench::random_batches(s, 2, 2, dev, ids, targets);
  Result r;
  if (dev == Device::CUDA) gpu::reset_peak_memory();
  r.timing = bench::time_op(dev, 2, rs.warmup, rs.iters, [&](int i) { step.run(ids[i], targets[i]); });
  if (dev == Device::CUDA) {
    const gpu::MemoryStats m = gpu::memory_stats();
    r.peak_mib = static_cast<double>(m.peak_in_use) / (1 << 20);
    r.peak_requested_mib = static_cast<double>(m.peak_requested) / (1 << 20);
  }
  r.graph = step.graph_active();
  r.graph_note = step.graph_note();
  r.parameters = model.num_parameters();
  if (rs.kernel_trace > 0) {
    bench::kernel_trace_open();
    for (int i = 0; i < rs.kernel_trace; ++i) step.run(ids[i % 2], targets[i % 2]);
    r.trace = bench::kernel_trace_close();
    r.trace_steps = rs.kernel_trace;
  }
  const int profile_steps = rs.profile_steps;
  if (profile_steps <= 0) return r;

  // The breakdown needs every op launched (and synchronized) on its own: no graph.
  TrainStepOptions plain = options;
  plain.use_graph = false;
  TrainStep profiled(model, opt, plain);
  prof::reset();
  prof::enable(true);
  for (int i = 0; i < profile_steps; ++i) profiled.run(ids[i % 2], targets[i % 2]);
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

// What --gemm-algorithms measured chose: the shapes measured so far (each
// once per process), those where a candidate beat the heuristic's first,
// and one call of each shape summed under either choice.
void report_gemm_choices() {
  const std::vector<GemmAlgorithmChoice> choices = gemm_algorithm_choices();
  int changed = 0, from_file = 0;
  double first_us = 0, chosen_us = 0;
  for (const GemmAlgorithmChoice& c : choices) {
    changed += c.chosen != 0;
    from_file += c.from_file;
    first_us += c.first_us;
    chosen_us += c.chosen_us;
  }
  std::printf(
      "GEMM algorithms measured: %zu shapes (%d from the algorithm file), %d not the heuristic's first; one call "
      "of each: %.1f us with the heuristic's first, %.1f us with the fastest\n",
      choices.size(), from_file, changed, first_us, chosen_us);
}

// --kernel-trace: the GPU's time a step by kernel (the `top` largest), and
// the time no kernel ran.
void report_kernel_trace(const Result& r, int top, double step_ms) {
  const double steps = r.trace_steps;
  const bench::KernelTraceResult& t = r.trace;
  std::printf("\nkernels of the step (CUPTI, %d steps): %.0f launches a step; GPU busy %.3f of %.3f ms a step "
              "(%.3f ms with nothing running; timed step median %.3f ms)\n",
              r.trace_steps, t.launches / steps, t.busy_us / steps * 1e-3, t.span_us / steps * 1e-3,
              (t.span_us - t.busy_us) / steps * 1e-3, step_ms);
  std::printf("%10s %7s %9s  %s\n", "us/step", "calls", "us each", "kernel");
  int shown = 0;
  for (const bench::KernelTime& k : t.kernels) {
    if (shown++ == top) break;
    std::printf("%10.1f %7.1f %9.2f  %s\n", k.total_us / steps, k.calls / steps, k.total_us / k.calls,
                k.name.substr(0, 100).c_str());
  }
}

// A CSV text field: quoted (the descriptions hold commas).
[[maybe_unused]] std::string quoted(const std::string& text) { return "\"" + text + "\""; }

#ifdef HG_WITH_CUDA
// The floor of the fused step beside its measured time: a table of the
// parts (GEMMs, attention, memory-bound ops at copy speed), then the GEMMs
// and the byte counts one by one, each also a CSV row.
void report_floor(const bench::FloorShape& f, const bench::FloorTimes& t, double step_ms, bench::Csv& csv) {
  const double L = double(f.size.layers);
  const double attention_ms = L * (t.attention_fwd_ms + t.attention_bwd_ms);
  const double gemm_ms = t.gemm_ms(), memory_ms = t.memory_ms(), sum = gemm_ms + attention_ms + memory_ms;
  double bytes = 0, flops = 0;
  int64_t gemm_calls = 0;
  for (const bench::FloorBytes& b : t.bytes) bytes += b.bytes;
  for (const bench::FloorTimedGemm& g : t.gemms) flops += g.gemm.flops(), gemm_calls += g.gemm.per_step;
  std::printf("\nfloor of the fused step (each part alone, CUDA events, median; %lld classifier rows per chunk)\n",
              (long long)f.chunk_rows);
  std::printf("%-34s %9s %7s  %s\n", "part", "ms", "share", "what");
  const auto part = [&](const char* name, double ms, const std::string& what) {
    std::printf("%-34s %9.3f %6.1f%%  %s\n", name, ms, 100 * ms / sum, what.c_str());
    csv.row("part", quoted(name), "", ms, 100 * ms / sum, "", quoted(what));
  };
  char text[160];
  std::snprintf(text, sizeof text, "%lld GEMMs, %.3f TFLOP at %.0f TFLOP/s", (long long)gemm_calls, flops / 1e12,
                flops / (gemm_ms * 1e-3) / 1e12);
  part("GEMMs (plain epilogues)", gemm_ms, text);
  std::snprintf(text, sizeof text, "%lld layers x (fwd %.3f + bwd %.3f ms)", (long long)f.size.layers,
                t.attention_fwd_ms, t.attention_bwd_ms);
  part("attention fwd + bwd", attention_ms, text);
  std::snprintf(text, sizeof text, "%.3f GB at %.0f GB/s (best copy: %s)", bytes / 1e9, t.copy_gbps,
                t.copy_name.c_str());
  part("memory-bound ops at copy speed", memory_ms, text);
  std::printf("%-34s %9.3f\n", "floor sum", sum);
  std::printf("%-34s %9.3f  = %.2f x the floor, %.3f ms above it\n", "fused step (median)", step_ms, step_ms / sum,
              step_ms - sum);
  // The row pass alone on one chunk: read once + written once is its floor.
  const double chunk = t.rows_chunk_bytes;
  std::printf("classifier row pass alone on one chunk (%.1f MB of logits; GB/s: the chunk read once and written "
              "once over the time): floor %.3f ms\n",
              chunk / 1e6, t.bytes_ms(2 * chunk));
  for (const auto& [name, ms] : t.row_pass_ms) {
    std::printf("  %-30s %7.3f ms %6.0f GB/s\n", name.c_str(), ms, bench::gbps(2 * chunk, ms));
    csv.row("row pass", quoted(name + ", one chunk"), 1, ms, "", 2 * chunk, "");
  }
  csv.row("total", quoted("floor sum"), "", sum, 100.0, "", "");
  csv.row("total", quoted("fused step"), "", step_ms, 100 * step_ms / sum, "", quoted("median of the timed steps"));

  std::printf("\n%-28s %6s %6s %6s %6s %9s %9s %8s\n", "GEMM", "M", "N", "K", "calls", "ms each", "ms/step", "TFLOP/s");
  for (const bench::FloorTimedGemm& g : t.gemms) {
    const double each_tflops = g.gemm.flops() / double(g.gemm.per_step) / (g.ms * 1e-3) / 1e12;
    std::printf("%-28s %6lld %6lld %6lld %6lld %9.4f %9.3f %8.1f\n", g.gemm.name.c_str(), (long long)g.gemm.m,
                (long long)g.gemm.n, (long long)g.gemm.k, (long long)g.gemm.per_step, g.ms,
                g.ms * double(g.gemm.per_step), each_tflops);
    csv.row("gemm", quoted(g.gemm.name), g.gemm.per_step, g.ms * double(g.gemm.per_step),
            100 * g.ms * g.gemm.per_step / sum, "",
            quoted(std::to_string(g.gemm.m) + "x" + std::to_string(g.gemm.n) + "x" + std::to_string(g.gemm.k)));
  }
  std::printf("\n%-20s %9s %9s  %s\n", "memory-bound op", "MB/step", "ms/step", "bytes counted");
  for (const bench::FloorBytes& b : t.bytes) {
    std::printf("%-20s %9.1f %9.3f  %s\n", b.op.c_str(), b.bytes / 1e6, t.bytes_ms(b.bytes), b.count.c_str());
    csv.row("bytes", quoted(b.op), "", t.bytes_ms(b.bytes), 100 * t.bytes_ms(b.bytes) / sum, b.bytes, quoted(b.count));
  }
}
#endif

// --floor for the CUDA step of size s that `results` timed: the floor's
// shape, two consistency checks against the model, the parts timed, the report.
void run_floor(const Size& s, Precision precision, int64_t chunk_rows_flag, const std::map<KernelMode, Result>& results,
               int warmup, int iters, const std::string& path) {
#ifdef HG_WITH_CUDA
  const char* op = "bench_train --floor";
  KernelModeScope scope(KernelMode::Fused);
  const DType act = precision == Precision::BF16 ? DType::BF16 : DType::F32;
  bench::FloorShape f;
  f.size = s;
  f.ffn = 4 * s.d_model;
  f.act_bytes = static_cast<int64_t>(dtype_size(act));
  const int64_t rows = s.batch * s.seq;
  f.chunk_rows =
      std::min(rows, chunk_rows_flag > 0 ? chunk_rows_flag : default_classifier_chunk_rows(s.vocab, act, Device::CUDA));
  // Every Linear's GEMMs once: their FLOPs are the model count's GEMM part.
  double gemm_flops = 0;
  for (const bench::FloorGemm& g : bench::floor_gemms(f)) gemm_flops += g.flops();
  const double tokens = double(rows), attention_flops = 12.0 * double(s.layers * s.seq * s.d_model) * tokens;
  const double linear_flops = model_flops_per_step(s, f.ffn) - attention_flops;
  HG_CHECK(std::abs(gemm_flops - linear_flops) <= 1e-9 * linear_flops, op, "the floor's GEMMs do ", gemm_flops,
           " FLOPs per step, the model's Linears ", linear_flops);
  const Result& fused = results.at(KernelMode::Fused);
  HG_CHECK(bench::floor_params(f).all == fused.parameters, op, "the floor counts ", bench::floor_params(f).all,
           " parameters, the model has ", fused.parameters);
  const bench::FloorTimes t = bench::time_floor(f, act, precision == Precision::BF16, warmup, iters);
  bench::Csv csv(path, "kind,name,calls_per_step,ms_per_step,pct_of_floor,bytes_per_step,what");
  report_floor(f, t, fused.timing.median_ms, csv);
  std::printf("wrote %s\n", path.c_str());
#else
  (void)s, (void)precision, (void)chunk_rows_flag, (void)results, (void)warmup, (void)iters, (void)path;
  fail("bench_train --floor", "this build has no CUDA");
#endif
}

std::vector<KernelMode> modes_for(const std::string& kernels) {
  if (kernels == "fused") return {KernelMode::Fused};
  if (kernels == "unfused") return {KernelMode::Unfused};
  return {KernelMode::Unfused, KernelMode::Fused};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_train: DecoderLM training step per precision and kernel mode, with MFU and a per-op-kind "
               "breakdown",
               "bench_train"};
  std::string devices = "auto", precision_name_arg = "auto", kernels = "both", attention = "auto";
  Size gpu{512, 8, 6, 256, 32, 256};
  Size cpu = kCpuModels.at("small");
  std::string cpu_model = "small";
  int warmup = 3, iters = 10, profile_steps = 3;
  bool tf32 = false, no_graph = false;
  std::string classifier = "chunked";
  int64_t classifier_chunk_rows = 0;
  double peak_tflops = 0;
  std::string csv_path = "bench_train.csv", breakdown_path = "bench_train_breakdown.csv";
  bool floor = false;
  std::string floor_path = "bench_train_floor.csv";
  int kernel_trace = 0, kernel_trace_top = 30;
  std::string kernel_trace_json;
  app.add_option("--device", devices, "auto (cpu, plus cuda when present), cpu, cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", precision_name_arg,
                 "auto (bf16 on GPUs with sm_80+, fp32 on the CPU), fp32, bf16 (CUDA only)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  app.add_option("--kernels", kernels, "both, fused or unfused")->check(CLI::IsMember({"both", "fused", "unfused"}));
  app.add_flag("--tf32", tf32, "let fp32 GEMMs use TF32 tensor cores (off: exact FP32)");
  cli::GemmFlags gemm;
  cli::add_gemm_flags(app, gemm);
  app.add_option("--attention", attention, "fused-mode attention core: auto (flash on CUDA), flash, softmax")
      ->check(CLI::IsMember({"auto", "flash", "softmax"}));
  bool recompute_gelu = false;
  app.add_flag("--recompute-gelu", recompute_gelu,
               "fused mode: each MLP recomputes gelu(pre) in its backward instead of keeping it (less memory)");
  bool recompute_layernorm = false;
  app.add_flag("--recompute-layernorm", recompute_layernorm,
               "each layer's qkv projection and fc1 recompute their input, LN1's / LN2's output, in the backward "
               "instead of keeping it (less memory; both kernel modes)");
  app.add_flag("--no-graph", no_graph, "launch every kernel each step instead of replaying a CUDA graph");
  bool serial_weight_grads = false;
  app.add_flag("--serial-weight-grads", serial_weight_grads,
               "CUDA: each Linear's weight gradient on handgrad's stream before its input gradient, instead of "
               "beside the backward on a second stream");
  app.add_option("--classifier", classifier,
                 "fused mode's head and loss: chunked (the chunked classifier, no (B*T, V) logits) or composed "
                 "(logits, cross-entropy, the head's backward, as unfused mode)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chunked", "composed"}));
  app.add_option("--classifier-chunk-rows", classifier_chunk_rows,
                 "rows per chunk of the chunked classifier (0: its default, a bounded chunk of logits)")
      ->capture_default_str()
      ->check(cli::at_least(0));
  const CLI::Validator positive = cli::at_least(1);
  app.add_option("--d-model", gpu.d_model, "CUDA model width")->capture_default_str()->check(positive);
  app.add_option("--heads", gpu.heads, "CUDA heads (must divide --d-model)")->capture_default_str()->check(positive);
  app.add_option("--layers", gpu.layers, "CUDA layers")->capture_default_str()->check(positive);
  app.add_option("--seq-len", gpu.seq, "CUDA sequence length")->capture_default_str()->check(positive);
  app.add_option("--batch", gpu.batch, "CUDA batch")->capture_default_str()->check(positive);
  app.add_option("--vocab", gpu.vocab, "vocabulary (both devices)")->capture_default_str()->check(positive);
  app.add_option("--cpu-model", cpu_model,
                 "CPU model preset (bench/torch_cpu_step.py --config has the same): small = d_model 128, heads 4, "
                 "layers 2, seq 64, batch 8; medium = 256, 4, 4, 128, 16; a --cpu-* size flag overrides its field")
      ->capture_default_str()
      ->check(CLI::IsMember({"small", "medium"}));
  app.add_option("--cpu-d-model", cpu.d_model, "CPU model width (default: the --cpu-model preset's)")->check(positive);
  app.add_option("--cpu-heads", cpu.heads, "CPU heads (default: the --cpu-model preset's)")->check(positive);
  app.add_option("--cpu-layers", cpu.layers, "CPU layers (default: the --cpu-model preset's)")->check(positive);
  app.add_option("--cpu-seq-len", cpu.seq, "CPU sequence length (default: the --cpu-model preset's)")->check(positive);
  app.add_option("--cpu-batch", cpu.batch, "CPU batch (default: the --cpu-model preset's)")->check(positive);
  app.add_option("--warmup", warmup, "untimed steps (>= 0)")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--iters", iters, "timed steps, median reported (>= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--profile-steps", profile_steps, "steps of the per-op-kind breakdown (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--peak-tflops", peak_tflops, "dense bf16 peak for MFU when the GPU is not in the built-in table")
      ->check(cli::real_range(1e-3, 1e6));
  app.add_option("--csv", csv_path, "summary CSV")->capture_default_str();
  app.add_option("--breakdown-csv", breakdown_path, "per-op-kind CSV")->capture_default_str();
  app.add_flag("--floor", floor,
               "CUDA, fused step with the chunked classifier: also time every GEMM, the attention and a device copy "
               "alone and print the step against the sum of its parts (GEMMs, attention, other ops' bytes at copy "
               "speed)");
  app.add_option("--floor-csv", floor_path, "CSV of the --floor parts")->capture_default_str();
  app.add_option("--kernel-trace", kernel_trace,
                 "CUDA: after timing, trace this many more steps' kernels with CUPTI and print each kernel's time a "
                 "step and the time the GPU ran none (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  app.add_option("--kernel-trace-top", kernel_trace_top, "kernels listed by --kernel-trace")
      ->capture_default_str()
      ->check(cli::at_least(1));
  app.add_option("--kernel-trace-json", kernel_trace_json,
                 "write the --kernel-trace steps' kernels to this file as Chrome trace events (open in "
                 "ui.perfetto.dev or chrome://tracing: a row per CUDA stream)");
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  return cli::run_program(app, common, argc, argv, [&] {
    // The preset fills every CPU size field that no --cpu-* flag set.
    const Size& preset = kCpuModels.at(cpu_model);
    const std::pair<const char*, int64_t Size::*> fields[] = {{"--cpu-d-model", &Size::d_model},
                                                              {"--cpu-heads", &Size::heads},
                                                              {"--cpu-layers", &Size::layers},
                                                              {"--cpu-seq-len", &Size::seq},
                                                              {"--cpu-batch", &Size::batch}};
    for (const auto& [flag, field] : fields)
      if (app.count(flag) == 0) cpu.*field = preset.*field;
    cpu.vocab = gpu.vocab;
    std::vector<Device> devs;
    if (devices != "cuda") devs.push_back(Device::CPU);
    if (devices == "cuda" || (devices == "auto" && cuda_available())) devs.push_back(Device::CUDA);
    if (devices == "cuda") cli::resolve_device("cuda", "--device");  // "no CUDA GPU": a usage error
    for (Device dev : devs) {
      const Size& s = dev == Device::CUDA ? gpu : cpu;
      const bool on_gpu = dev == Device::CUDA;
      if (s.d_model % s.heads != 0)
        cli::usage_error(on_gpu ? "--heads" : "--cpu-heads", s.heads, ": must divide ",
                         on_gpu ? "--d-model " : "--cpu-d-model ", s.d_model, " (head width = d_model / heads)");
      if (precision_name_arg != "auto") try {
          check_precision_supported(parse_precision(precision_name_arg), dev, "bench_train --precision");
        } catch (const Error& e) {  // a flag value this machine cannot run: a usage error
          cli::usage_error("--precision", precision_name_arg, ": ", e.what());
        }
    }
    if (recompute_gelu && kernels == "unfused")
      cli::usage_error("--recompute-gelu", "recomputes the GELU of fused mode's GEMM epilogue, which --kernels unfused "
                                           "does not run (with --kernels both only the fused step recomputes it)");
    for (Device dev : devs)
      if (recompute_gelu && (dev == Device::CUDA ? gpu : cpu).d_model % 2 != 0)
        cli::usage_error("--recompute-gelu",
                         "needs an even model width (the GELU epilogue takes 4 x d_model % 8 == 0)");
    if (floor) {
      if (kernels == "unfused") cli::usage_error("--floor", "describes the fused step: use --kernels fused or both");
      if (classifier != "chunked")
        cli::usage_error("--floor", "describes the step with the chunked classifier, not --classifier composed");
      if (std::find(devs.begin(), devs.end(), Device::CUDA) == devs.end())
        cli::usage_error("--floor", "times the CUDA step: needs --device cuda (or auto with a CUDA GPU)");
    }
    if (kernel_trace > 0) {
      if (!bench::kernel_trace_available())
        cli::usage_error("--kernel-trace", "needs CUPTI (CUDA's profiling library), which this build did not find");
      if (std::find(devs.begin(), devs.end(), Device::CUDA) == devs.end())
        cli::usage_error("--kernel-trace", "traces the CUDA step: needs --device cuda (or auto with a CUDA GPU)");
    }
    if (!kernel_trace_json.empty() && kernel_trace == 0)
      cli::usage_error("--kernel-trace-json", "writes the steps --kernel-trace traces: add --kernel-trace N");
    std::ofstream trace_json;  // opened now: a path that cannot be written fails before the run
    std::vector<std::pair<std::string, bench::KernelTraceResult>> traces;
    if (!kernel_trace_json.empty()) {
      trace_json.open(kernel_trace_json);
      HG_CHECK(trace_json.good(), "--kernel-trace-json", "cannot open ", kernel_trace_json, " for writing");
    }
    if (tf32) set_allow_tf32(true);
    cli::apply_gemm_flags(gemm);

    bench::Csv csv(csv_path, "device,gpu,precision,mode,graph,tf32,d_model,heads,layers,seq,batch,vocab,median_ms,"
                             "min_ms,tokens_per_s,peak_mem_mib,peak_requested_mib,model_tflop_per_step,mfu");
    bench::Csv kinds(breakdown_path, "device,precision,mode,kind,ms_per_step,calls_per_step,share_of_profiled_step");
    for (Device dev : devs) {
      const Size& s = dev == Device::CUDA ? gpu : cpu;
      const Precision precision =
          precision_name_arg == "auto" ? default_precision(dev) : parse_precision(precision_name_arg);
      const std::string gpu_name = dev == Device::CUDA ? gpu::device_name() : "";
      const double flops = model_flops_per_step(s, 4 * s.d_model);
      const double peak = dev == Device::CUDA ? (peak_tflops > 0 ? peak_tflops : bf16_peak_tflops(gpu_name)) : 0;
      std::printf("\n== %s%s%s, %s%s: d_model %lld, heads %lld, layers %lld, seq %lld, batch %lld, vocab %lld ==\n",
                  device_name(dev), gpu_name.empty() ? "" : " ", gpu_name.c_str(), precision_name(precision),
                  tf32 ? " (tf32 on)" : "", (long long)s.d_model, (long long)s.heads, (long long)s.layers,
                  (long long)s.seq, (long long)s.batch, (long long)s.vocab);
      std::printf("fused mode's classifier: %s", classifier.c_str());
      if (classifier == "chunked")
        std::printf(", %lld rows per chunk",
                    (long long)(classifier_chunk_rows > 0
                                    ? classifier_chunk_rows
                                    : default_classifier_chunk_rows(
                                          s.vocab, precision == Precision::BF16 ? DType::BF16 : DType::F32, dev)));
      std::printf("; recomputed in the backward: %s\n",
                  recompute_gelu ? (recompute_layernorm ? "gelu(pre), LayerNorm outputs" : "gelu(pre)")
                                 : (recompute_layernorm ? "LayerNorm outputs" : "nothing"));
      std::printf("model FLOPs per step %.3f TFLOP (6 N tokens + 12 L T d tokens)%s\n", flops / 1e12,
                  peak > 0 ? "" : (dev == Device::CUDA ? "; MFU n/a: unknown GPU, pass --peak-tflops" : ""));
      const std::vector<KernelMode> modes = modes_for(kernels);
      std::map<KernelMode, Result> results;
      for (KernelMode mode : modes) {
        RunSettings rs;
        rs.device = dev;
        rs.mode = mode;
        rs.precision = precision;
        rs.attention = parse_attention_impl(attention);
        rs.use_graph = !no_graph;
        rs.chunked_classifier = classifier == "chunked";
        rs.chunk_rows = classifier_chunk_rows;
        rs.recompute_gelu = recompute_gelu;
        rs.recompute_layernorm = recompute_layernorm;
        rs.weight_grads_beside = !serial_weight_grads;
        rs.size = s;
        rs.warmup = warmup, rs.iters = iters, rs.profile_steps = profile_steps;
        rs.kernel_trace = dev == Device::CUDA ? kernel_trace : 0;
        results[mode] = run(rs);
      }
      const double tokens = static_cast<double>(s.batch * s.seq);
      for (KernelMode mode : modes) {
        const Result& r = results[mode];
        const double tflops = flops / (r.timing.median_ms * 1e-3) / 1e12;
        const double mfu = peak > 0 ? tflops / peak : 0;
        std::printf("%-8s step %9.2f ms (min %9.2f)  %10.0f tokens/s  peak %8.1f MiB  %7.1f TFLOP/s",
                    kernel_mode_name(mode), r.timing.median_ms, r.timing.min_ms, tokens / (r.timing.median_ms * 1e-3),
                    r.peak_mib, tflops);
        if (peak > 0) std::printf("  MFU %5.1f%% of %.0f", 100 * mfu, peak);
        if (dev == Device::CUDA)
          std::printf("\n         peak memory requested by tensors %.1f MiB", r.peak_requested_mib);
        std::printf("\n         CUDA graph %s\n", r.graph_note.c_str());
        if (r.trace_steps > 0) report_kernel_trace(r, kernel_trace_top, r.timing.median_ms);
        if (r.trace_steps > 0 && trace_json.is_open())
          traces.emplace_back(std::string(kernel_mode_name(mode)) + " step, " + std::to_string(r.trace_steps) +
                                  " steps, batch " + std::to_string(s.batch),
                              r.trace);
        csv.row(device_name(dev), gpu_name, precision_name(precision), kernel_mode_name(mode), r.graph ? 1 : 0,
                tf32 ? 1 : 0, s.d_model, s.heads, s.layers, s.seq, s.batch, s.vocab, r.timing.median_ms,
                r.timing.min_ms, tokens / (r.timing.median_ms * 1e-3), r.peak_mib, r.peak_requested_mib, flops / 1e12,
                mfu);
      }
      if (dev == Device::CUDA && gemm_algorithms() == GemmAlgorithms::Measured) report_gemm_choices();
      if (floor && dev == Device::CUDA)
        run_floor(s, precision, classifier_chunk_rows, results, warmup, iters, floor_path);
      if (profile_steps <= 0) continue;
      // Breakdown side by side, kinds in the first mode's order.
      std::printf("%-14s", "op kind");
      for (KernelMode mode : modes) std::printf(" %10s ms", kernel_mode_name(mode));
      std::printf("\n");
      std::vector<std::string> order;
      for (KernelMode mode : modes)
        for (const prof::Entry& e : results[mode].breakdown)
          if (std::find(order.begin(), order.end(), e.kind) == order.end()) order.push_back(e.kind);
      for (const std::string& kind : order) {
        std::printf("%-14s", kind.c_str());
        for (KernelMode mode : modes) {
          double ms = 0;
          for (const prof::Entry& e : results[mode].breakdown)
            if (e.kind == kind) ms = e.total_ms;
          std::printf(" %13.3f", ms);
        }
        std::printf("\n");
      }
      std::printf("%-14s", "total");
      for (KernelMode mode : modes) std::printf(" %13.3f", results[mode].profiled_step_ms);
      std::printf("  (profiled: every op synchronized, no graph)\n");
      for (KernelMode mode : modes)
        for (const prof::Entry& e : results[mode].breakdown)
          kinds.row(device_name(dev), precision_name(precision), kernel_mode_name(mode), e.kind, e.total_ms, e.calls,
                    e.total_ms / results[mode].profiled_step_ms);
    }
    std::printf("\nwrote %s and %s", csv_path.c_str(), breakdown_path.c_str());
    if (trace_json.is_open()) {
      bench::write_chrome_trace(trace_json, traces);
      trace_json.flush();
      HG_CHECK(trace_json.good(), "--kernel-trace-json", "cannot write to ", kernel_trace_json);
      std::printf(" and %s", kernel_trace_json.c_str());
    }
    std::printf("\n");
    return cli::kExitOk;
  });
}
