// bench_ddp: data-parallel DecoderLM training steps, one rank per GPU (or per
// CPU process), launched as `mpirun -np N build/bench/bench_ddp --config
// bench|gpt2s`. Same per-rank batch as bench_train's configs. Each rank
// times (1) the data-parallel step (gradient buckets reduced during the
// backward, AdamW with clipping, or ZeRO-1) and (2) its step without any
// communication (the one-GPU step), both models/train_step.hpp's TrainStep;
// rank 0 prints tokens/s of all ranks, the
// scaling over one rank's step, and the communication: time of the
// collectives, the part exposed after the backward, and the share hidden
// behind it. docs/distributed.md.
//
// --bucket-mb, --grad-dtype, --zero, --zero-gather and --sparse-embedding-grad
// take lists (--bucket-mb 10,25,50 --grad-dtype fp32,bf16 --zero 0,1
// --zero-gather step,forward --sparse-embedding-grad off,on):
// each combination is measured on the one model of the process (its
// initialisation takes seconds at gpt2s), whose parameters and gradients are
// re-bucketed for each, and rank 0 prints a table of
// all of them at the end. "compute" in the table is the step time the
// exposed communication does not explain, over the step alone: the backward
// (and, with --zero-gather forward, the forward) running slower while the
// collectives share the GPU with it.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/bench_util.hpp"
#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/data_parallel.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"

using namespace hg;

namespace {

using Size = bench::ModelSize;

Size preset(const std::string& name, Device dev) {
  if (name == "gpt2s") return {768, 12, 12, 1024, 8, 50304};
  if (dev == Device::CPU) return {128, 4, 2, 64, 8, 256};  // bench_train's CPU size
  return {512, 8, 6, 256, 32, 256};                        // bench_train's GPU size
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_ddp: data-parallel training step (run under mpirun -np N; one rank per GPU)", "bench_ddp"};
  std::string device = "auto", config = "bench", precision_arg = "auto", csv_path = "bench_ddp.csv";
  int warmup = 3, iters = 10;
  cli::DataParallelFlags dpf;
  dpf.force = true;
  cli::DataParallelSweep sweep;
  cli::CommonFlags common;
  app.add_option("--device", device, "auto, cpu, cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--config", config, "bench (bench_train's default size) or gpt2s (GPT-2 small, T 1024, B 8)")
      ->check(CLI::IsMember({"bench", "gpt2s"}))
      ->capture_default_str();
  app.add_option("--precision", precision_arg, "auto, fp32, bf16")->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  app.add_option("--warmup", warmup, "untimed steps")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--iters", iters, "timed steps (median)")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--csv", csv_path, "summary CSV (rank 0)")->capture_default_str();
  cli::add_data_parallel_flags(app, dpf, &sweep);
  cli::add_common_flags(app, common);
  const int code = cli::run_program(app, common, argc, argv, [&] {
    const std::vector<cli::DataParallelFlags> runs = sweep.combinations(dpf);  // checks the lists first
    const Device dev = cli::resolve_device(device);
    const dist::World& w = cli::start_world(dev, dpf);
    const Precision precision = precision_arg == "auto" ? default_precision(dev) : parse_precision(precision_arg);
    check_precision_supported(precision, dev, "bench_ddp --precision");
    const Size s = preset(config, dev);
    const double tokens = static_cast<double>(s.batch * s.seq);
    std::unique_ptr<bench::Csv> csv;
    if (w.rank == 0)
      csv = std::make_unique<bench::Csv>(csv_path, "config,device,precision,ranks,zero,bucket_mb,grad_dtype,alone_ms,"
                                                   "ddp_ms,slowest_ms,tokens_per_s,scaling,comm_ms,exposed_ms,"
                                                   "hidden_share,zero_gather,compute_slowdown,sparse_embedding");
    std::string table;
    DecoderLM model(bench::decoder_config(s, precision));
    model.to(dev);
    // The initial values (the same seed on every rank), restored before each
    // combination: the step alone lets the ranks' parameters drift apart.
    std::vector<Tensor> initial;
    for (Parameter* p : model.parameters()) initial.push_back(p->value.clone());
    // Two batches per rank, different on every rank (its shard).
    std::vector<Tensor> ids, targets;
    bench::random_batches(s, 2, 2 + static_cast<uint64_t>(w.rank), dev, ids, targets);
    for (const cli::DataParallelFlags& run : runs) {
      const std::vector<Parameter*> params = model.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        params[i]->value.copy_(initial[i]);
        refresh_compute_copy(*params[i]);
      }
      // Its own buckets: the parameters' gradients (ZeRO-1: and values) become views of them.
      cli::DataParallel dp(model, dev, run, cli::StepRows{s.batch * s.seq, 1});
      AdamWOptions adamw;
      adamw.max_grad_norm = 1.0;
      const std::unique_ptr<Optimizer> opt = dp.make_optimizer(adamw);
      // (1) data parallel (models/train_step.hpp with the reducer as its hook),
      // then the check that every rank holds the same parameters.
      TrainStepOptions reduced;
      reduced.data_parallel = &dp;
      TrainStep ddp_step(model, *opt, reduced);
      for (int i = 0; i < warmup; ++i) ddp_step.run(ids[i % 2], targets[i % 2], 1.0 / w.size);
      dp.take_total_stats();
      const bench::Timing ddp =
          bench::time_op(dev, 2, 0, iters, [&](int i) { ddp_step.run(ids[i], targets[i], 1.0 / w.size); });
      const dist::CommStats cs = dp.take_total_stats();
      dp.check_sync(warmup + iters);  // also waits for ZeRO-1's last all-gathers
      // (2) this rank alone: the same plain step with no collective at all (the
      // reducer ignores a backward outside its steps; the ranks' parameters
      // drift apart from here on). ZeRO-1 updates only reduced gradients, so
      // the alone step runs an unsharded AdamW (its moments cost memory only here).
      std::unique_ptr<Optimizer> alone_opt;
      if (dp.sharded()) alone_opt = std::make_unique<AdamW>(model.parameters(), adamw);
      TrainStepOptions plain;
      // As the data-parallel step runs: not captured, nothing beside the
      // forward and backward (TrainStep::work_beside), so that the scaling
      // compares the same work with and without the collectives.
      plain.use_graph = false;
      plain.weight_grads_beside = false;
      plain.clear_grads_beside = false;
      TrainStep alone_step(model, alone_opt ? *alone_opt : *opt, plain);
      const bench::Timing alone =
          bench::time_op(dev, 2, warmup, iters, [&](int i) { alone_step.run(ids[i], targets[i]); });
      // The slowest rank sets the pace: max over ranks of the medians.
      double m[2] = {ddp.median_ms, alone.median_ms};
      const std::vector<uint64_t> all =
          dist::all_gather(static_cast<uint64_t>(ddp.median_ms * 1e6), "gather of the timings");
      const double slowest = static_cast<double>(*std::max_element(all.begin(), all.end())) / 1e6;
      if (w.rank != 0) continue;
      const double busy = cs.busy_ms / iters, exposed = cs.exposed_ms / iters;
      std::printf("== bench_ddp %s on %s%s%s, %s, %d rank(s): d_model %lld, heads %lld, layers %lld, seq %lld, "
                  "batch %lld per rank, vocab %lld ==\n",
                  config.c_str(), device_name(dev), dev == Device::CUDA ? " " : "",
                  dev == Device::CUDA ? gpu::device_name() : "", precision_name(precision), w.size,
                  (long long)s.d_model, (long long)s.heads, (long long)s.layers, (long long)s.seq, (long long)s.batch,
                  (long long)s.vocab);
      std::printf("%s\n", dp.describe().c_str());
      std::printf("one rank alone (no communication): %9.2f ms/step  %10.0f tokens/s\n", m[1], tokens / (m[1] * 1e-3));
      std::printf("data parallel, rank 0:             %9.2f ms/step  (slowest rank %.2f ms)\n", m[0], slowest);
      std::printf("all ranks:                                        %10.0f tokens/s  scaling %.3fx over one rank "
                  "alone (ideal %dx)\n",
                  w.size * tokens / (slowest * 1e-3), w.size * m[1] / slowest, w.size);
      const double hidden = busy > 0 ? 1.0 - exposed / busy : 0.0;
      // Rank 0's step beyond its step alone that exposed communication does not explain.
      const double slowdown = (m[0] - exposed - m[1]) / m[1];
      std::printf("communication per step: %.3f ms of collectives, %.3f ms exposed (the compute stream waited), %.1f%% "
                  "hidden (%.1f collectives/step); compute %+.1f%% over the step alone\n",
                  busy, exposed, 100 * hidden, double(cs.collectives) / iters, 100 * slowdown);
      const std::string gather = run.zero == 1 ? run.zero_gather_mode() : "-";
      csv->row(config, device_name(dev), precision_name(precision), w.size, run.zero, run.bucket_mb, run.grad_dtype,
               m[1], m[0], slowest, w.size * tokens / (slowest * 1e-3), w.size * m[1] / slowest, busy, exposed, hidden,
               gather, slowdown, dp.sparse_embedding() ? "on" : "off");
      char line[208];
      std::snprintf(
          line, sizeof line, "%4d  %-7s  %9g  %-5s  %7zu  %8.2f  %8.2f  %7.3fx  %8.3f  %8.3f  %6.1f%%  %+6.1f%%  %s\n",
          run.zero, gather.c_str(), run.bucket_mb, run.grad_dtype.c_str(), dp.bucket_count(), m[1], slowest,
          w.size * m[1] / slowest, busy, exposed, 100 * hidden, 100 * slowdown, dp.sparse_embedding() ? "on" : "off");
      table += line;
    }
    if (w.rank != 0) return cli::kExitOk;
    std::printf("== bench_ddp %s summary, %d rank(s) (ms per step) ==\n", config.c_str(), w.size);
    std::printf("%4s  %-7s  %9s  %-5s  %7s  %8s  %8s  %8s  %8s  %8s  %7s  %7s  %s\n", "zero", "gather", "bucket_mb",
                "dtype", "buckets", "alone", "slowest", "scaling", "comm", "exposed", "hidden", "compute",
                "sparse_emb");
    std::printf("%s", table.c_str());
    return cli::kExitOk;
  });
  if (dist::world().distributed() && code != cli::kExitOk) dist::abort_world("bench_ddp", "", code);
  dist::finalize_world();
  return code;
}
