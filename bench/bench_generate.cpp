// bench_generate: text generation speed (models/generation.hpp), tokens/s of
// decoding with the key/value cache against recomputing the whole context
// for every token, per device, precision and kernel mode, over a few prompt
// and generation lengths. Greedy picks (the sampling is host work either
// way); random weights (the speed does not depend on them). Each number is
// the median of --iters whole generate() calls after --warmup; every step
// copies its logits to the host, so the clock sees finished work.
//
//   cache tok/s       B * new tokens / time of generate() with the cache
//                     (one prefill of the prompt, then one token a step)
//   recompute tok/s   the same with kv_cache = false: every token prefills
//                     the whole context again (nanoGPT's loop, with the LM
//                     head on the last position only)
//   prefill ms        generate() of one token with the cache: the prompt's forward
//   decode ms/token   (cache time - prefill ms) / (new tokens - 1)
// docs/generation.md records the numbers.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/precision.hpp"
#include "examples/common/cli.hpp"
#include "models/decoder_lm.hpp"
#include "models/generation.hpp"

using namespace hg;

namespace {

using Size = bench::ModelSize;  // seq: the context (max_seq_len); batch: prompts per generate() call

struct Case {
  int64_t prompt, new_tokens;
};

std::vector<Precision> precisions_for(const std::string& name, Device dev) {
  if (name == "auto") return {default_precision(dev)};
  if (name == "both")
    return dev == Device::CUDA ? std::vector<Precision>{Precision::FP32, Precision::BF16}
                               : std::vector<Precision>{Precision::FP32};
  const Precision p = parse_precision(name);
  try {
    check_precision_supported(p, dev, "bench_generate --precision");
  } catch (const Error& e) {  // a flag value this machine cannot run: a usage error
    cli::usage_error("--precision", name, ": ", e.what());
  }
  return {p};
}

std::vector<KernelMode> modes_for(const std::string& kernels) {
  if (kernels == "fused") return {KernelMode::Fused};
  if (kernels == "unfused") return {KernelMode::Unfused};
  return {KernelMode::Fused, KernelMode::Unfused};
}

// Median ms of generate() for `new_tokens` tokens after a random prompt.
double generate_ms(DecoderLM& model, Device dev, const Size& s, const Case& c, int64_t new_tokens, bool kv_cache,
                   int warmup, int iters) {
  std::vector<double> ids(static_cast<size_t>(s.batch * c.prompt));
  Generator g(5);
  for (double& v : ids) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(s.vocab));
  const Tensor prompt = Tensor::from_vector(ids, {s.batch, c.prompt});
  GenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling.temperature = 0;
  o.kv_cache = kv_cache;
  return bench::time_op(dev, 1, warmup, iters, [&](int) { generate(model, prompt, o); }).median_ms;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_generate: tokens/s of DecoderLM text generation, key/value cache against recomputing the "
               "context for every token",
               "bench_generate"};
  std::string devices = "auto", precision = "auto", kernels = "both", csv_path = "bench_generate.csv";
  std::vector<int64_t> gpu_prompts{16, 256}, gpu_new{64, 256}, cpu_prompts{16, 64}, cpu_new{32, 128};
  Size gpu{768, 12, 12, 1024, 1, 50304};  // GPT-2 small
  Size cpu{128, 4, 2, 256, 1, 256};
  int warmup = 1, iters = 3;
  app.add_option("--device", devices, "auto (cpu, plus cuda when present), cpu, cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", precision, "auto (bf16 on GPUs with sm_80+, fp32 on the CPU), fp32, bf16, both")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "both"}));
  app.add_option("--kernels", kernels, "both, fused or unfused")->check(CLI::IsMember({"both", "fused", "unfused"}));
  const CLI::Validator positive = cli::at_least(1);
  app.add_option("--d-model", gpu.d_model, "CUDA model width")->capture_default_str()->check(positive);
  app.add_option("--heads", gpu.heads, "CUDA heads (must divide --d-model)")->capture_default_str()->check(positive);
  app.add_option("--layers", gpu.layers, "CUDA layers")->capture_default_str()->check(positive);
  app.add_option("--context", gpu.seq, "CUDA max_seq_len")->capture_default_str()->check(positive);
  app.add_option("--batch", gpu.batch, "CUDA prompts per generate() call")->capture_default_str()->check(positive);
  app.add_option("--prompts", gpu_prompts, "CUDA prompt lengths, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(positive);
  app.add_option("--new-tokens", gpu_new, "CUDA generation lengths, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(positive);
  app.add_option("--cpu-d-model", cpu.d_model, "CPU model width")->capture_default_str()->check(positive);
  app.add_option("--cpu-heads", cpu.heads, "CPU heads")->capture_default_str()->check(positive);
  app.add_option("--cpu-layers", cpu.layers, "CPU layers")->capture_default_str()->check(positive);
  app.add_option("--cpu-context", cpu.seq, "CPU max_seq_len")->capture_default_str()->check(positive);
  app.add_option("--cpu-batch", cpu.batch, "CPU prompts per generate() call")->capture_default_str()->check(positive);
  app.add_option("--cpu-prompts", cpu_prompts, "CPU prompt lengths, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(positive);
  app.add_option("--cpu-new-tokens", cpu_new, "CPU generation lengths, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(positive);
  app.add_option("--vocab", gpu.vocab, "CUDA vocabulary")->capture_default_str()->check(positive);
  app.add_option("--cpu-vocab", cpu.vocab, "CPU vocabulary")->capture_default_str()->check(positive);
  app.add_option("--warmup", warmup, "untimed generate() calls (>= 0)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--iters", iters, "timed generate() calls, median reported (>= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--csv", csv_path, "results CSV")->capture_default_str();
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  return cli::run_program(app, common, argc, argv, [&] {
    std::vector<Device> devs;
    if (devices == "cuda") cli::resolve_device("cuda", "--device");  // "no CUDA GPU": a usage error
    if (devices != "cuda") devs.push_back(Device::CPU);
    if (devices == "cuda" || (devices == "auto" && cuda_available())) devs.push_back(Device::CUDA);
    struct Plan {
      Device dev;
      Size size;
      std::vector<Case> cases;
      std::vector<Precision> precisions;
    };
    std::vector<Plan> plans;
    for (Device dev : devs) {
      const bool on_gpu = dev == Device::CUDA;
      const Size& s = on_gpu ? gpu : cpu;
      if (s.d_model % s.heads != 0)
        cli::usage_error(on_gpu ? "--heads" : "--cpu-heads", s.heads, ": must divide ",
                         on_gpu ? "--d-model " : "--cpu-d-model ", s.d_model, " (head width = d_model / heads)");
      Plan plan{dev, s, {}, precisions_for(precision, dev)};
      for (int64_t p : on_gpu ? gpu_prompts : cpu_prompts)
        for (int64_t n : on_gpu ? gpu_new : cpu_new) {
          if (p + n > s.seq)  // past the context the cache is prefilled again every token: not this measurement
            spdlog::warn("{}: prompt {} + {} new tokens pass the context of {}: skipped", device_name(dev), p, n,
                         s.seq);
          else plan.cases.push_back({p, n});
        }
      if (plan.cases.empty())
        cli::usage_error(on_gpu ? "--prompts" : "--cpu-prompts", "and new tokens: no pair fits the context of ", s.seq,
                         " (", on_gpu ? "--context" : "--cpu-context", ")");
      plans.push_back(plan);
    }
    cli::check_writable(csv_path, "--csv");
    bench::Csv csv(csv_path, "device,gpu,precision,mode,d_model,heads,layers,vocab,context,batch,prompt,new_tokens,"
                             "cache_tokens_per_s,recompute_tokens_per_s,speedup,cache_ms,recompute_ms,prefill_ms,"
                             "decode_ms_per_token");
    for (const Plan& plan : plans) {
      const Size& s = plan.size;
      const std::string gpu_name = plan.dev == Device::CUDA ? gpu::device_name() : "";
      for (Precision p : plan.precisions)
        for (KernelMode mode : modes_for(kernels)) {
          KernelModeScope scope(mode);
          DecoderLM model(bench::decoder_config(s, p));
          model.eval();
          model.to(plan.dev);
          std::printf("\n== %s%s%s, %s, %s: d_model %lld, heads %lld, layers %lld, vocab %lld, context %lld, batch "
                      "%lld ==\n",
                      device_name(plan.dev), gpu_name.empty() ? "" : " ", gpu_name.c_str(), precision_name(p),
                      kernel_mode_name(mode), (long long)s.d_model, (long long)s.heads, (long long)s.layers,
                      (long long)s.vocab, (long long)s.seq, (long long)s.batch);
          std::printf("%7s %7s %14s %16s %8s %11s %17s\n", "prompt", "new", "cache tok/s", "recompute tok/s", "speedup",
                      "prefill ms", "decode ms/token");
          for (const Case& c : plan.cases) {
            const double cache_ms = generate_ms(model, plan.dev, s, c, c.new_tokens, true, warmup, iters);
            const double recompute_ms = generate_ms(model, plan.dev, s, c, c.new_tokens, false, warmup, iters);
            const double prefill_ms = generate_ms(model, plan.dev, s, c, 1, true, warmup, iters);
            const double tokens = static_cast<double>(s.batch * c.new_tokens);
            const double cache_tps = tokens / (cache_ms * 1e-3), recompute_tps = tokens / (recompute_ms * 1e-3);
            const double decode =
                c.new_tokens > 1 ? (cache_ms - prefill_ms) / static_cast<double>(c.new_tokens - 1) : 0.0;
            std::printf("%7lld %7lld %14.1f %16.1f %7.2fx %11.2f %17.3f\n", (long long)c.prompt,
                        (long long)c.new_tokens, cache_tps, recompute_tps, cache_tps / recompute_tps, prefill_ms,
                        decode);
            std::fflush(stdout);
            csv.row(device_name(plan.dev), gpu_name, precision_name(p), kernel_mode_name(mode), s.d_model, s.heads,
                    s.layers, s.vocab, s.seq, s.batch, c.prompt, c.new_tokens, cache_tps, recompute_tps,
                    cache_tps / recompute_tps, cache_ms, recompute_ms, prefill_ms, decode);
          }
        }
    }
    std::printf("\nwrote %s\n", csv_path.c_str());
    return cli::kExitOk;
  });
}
