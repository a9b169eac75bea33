// generate: continues a text prompt with a model trained by
// `train --data FILE --checkpoint CK`, as nanoGPT's sample.py does.
//
//   generate --checkpoint ck --prompt "Once upon a time" --max-new-tokens 200
//   generate --checkpoint ck --prompt "def " --temperature 0.8 --top-k 40 --seed 7 --samples 3
//   generate --checkpoint ck --prompt "The" --temperature 0          greedy
//
// Reads CK (the weights), CK.json (the run record: the model's shape and the
// tokenizer kind) and, for a bpe vocabulary, CK.tokenizer. Decodes with the
// key/value cache (models/generation.hpp, docs/generation.md). stdout carries
// the text only (each sample: the prompt and its continuation; samples
// separated by a line of dashes); the status line and tokens/s go to stderr.
// Exit codes as every program (examples/common/cli.hpp).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/kernel_mode.hpp"
#include "core/precision.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/run_record.hpp"
#include "examples/common/text_tokenizer.hpp"
#include "models/decoder_lm.hpp"
#include "models/generation.hpp"

using namespace hg;

namespace {

struct Options {
  std::string checkpoint, prompt = "\n", device = "auto", kernels = "fused", precision = "auto";
  int64_t max_new_tokens = 256, samples = 1;
  GenerateOptions generation;
  cli::CommonFlags common;
};

// The record's task must be `train --data`: the other tasks have no text tokenizer here.
void check_task(const Options& o, const cli::RunRecord& record) {
  if (record.task == "translate")
    cli::usage_error("--checkpoint", o.checkpoint,
                     ": a train --task translate checkpoint; the translate program translates with it "
                     "(generate continues text with models of train --data FILE)");
  if (record.task != "data")
    cli::usage_error("--checkpoint", o.checkpoint, ": a checkpoint of train's ", record.task,
                     " task, which has no text tokenizer; generate continues text with models of train --data FILE");
}

Precision precision_of(const Options& o, Device dev) {
  if (o.precision == "auto") return default_precision(dev);
  const Precision p = parse_precision(o.precision);
  try {
    check_precision_supported(p, dev, "generate");
  } catch (const Error& e) {  // a flag value this machine cannot run: a usage error
    cli::usage_error("--precision", o.precision, ": ", e.what());
  }
  return p;
}

int run(Options& o) {
  if (o.generation.sampling.top_p <= 0)
    cli::usage_error("--top-p", o.generation.sampling.top_p, ": must lie in (0, 1] (1: no limit)");
  const Device dev = cli::resolve_device(o.device);
  const Precision precision = precision_of(o, dev);
  set_kernel_mode(o.kernels == "unfused" ? KernelMode::Unfused : KernelMode::Fused);
  const std::string record_path = cli::run_record_path(o.checkpoint);
  if (!std::ifstream(record_path))
    fail("generate", record_path,
         " does not exist: the model's shape and tokenizer come from the run record that train --checkpoint writes "
         "beside the checkpoint (a checkpoint of an older train has none)");
  const cli::RunRecord record = cli::load_run_record(o.checkpoint);
  check_task(o, record);
  const cli::TextTokenizer tokenizer = cli::TextTokenizer::load(o.checkpoint, record.tokenizer);
  DecoderLMConfig config = record.model;
  config.dropout = 0.0;
  config.precision = precision;
  HG_CHECK(tokenizer.vocab_size() <= config.vocab_size, "generate", o.checkpoint, ": its ", tokenizer.kind(),
           " tokenizer has ", tokenizer.vocab_size(), " ids but the model only ", config.vocab_size);
  const std::vector<int32_t> ids = tokenizer.encode(o.prompt);
  if (ids.empty()) cli::usage_error("--prompt", "''", ": encodes to no tokens; give at least one character");
  DecoderLM model(config);
  model.load(o.checkpoint);
  model.to(dev);
  model.eval();
  const int64_t t = static_cast<int64_t>(ids.size());
  if (!o.common.quiet) {
    std::fprintf(stderr, "generate: %s (%lld parameters, %s tokenizer of %lld ids, context %lld), %s, %s, %s kernels\n",
                 o.checkpoint.c_str(), static_cast<long long>(model.num_parameters()), tokenizer.kind(),
                 static_cast<long long>(tokenizer.vocab_size()), static_cast<long long>(config.max_seq_len),
                 device_name(dev), precision_name(config.precision), o.kernels.c_str());
    if (t > config.max_seq_len)
      std::fprintf(stderr, "generate: the prompt has %lld tokens; the model sees its last %lld (its context)\n",
                   static_cast<long long>(t), static_cast<long long>(config.max_seq_len));
  }
  // One row per sample, each the whole prompt; the rows draw from one generator in turn.
  std::vector<double> rows;
  for (int64_t s = 0; s < o.samples; ++s) rows.insert(rows.end(), ids.begin(), ids.end());
  o.generation.max_new_tokens = o.max_new_tokens;
  const auto start = std::chrono::steady_clock::now();
  const Tensor out = generate(model, Tensor::from_vector(rows, {o.samples, t}), o.generation);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<double> all = out.to_vector();
  const int64_t width = out.size(1);
  for (int64_t s = 0; s < o.samples; ++s) {
    if (s > 0) std::printf("\n---------------\n");
    std::vector<int32_t> row(all.begin() + s * width, all.begin() + (s + 1) * width);
    const std::string text = tokenizer.decode(row);
    std::fwrite(text.data(), 1, text.size(), stdout);  // all of it: a byte model may write a NUL
  }
  std::printf("\n");
  std::fflush(stdout);
  const double made = static_cast<double>(o.samples * o.max_new_tokens);
  if (!o.common.quiet)
    std::fprintf(stderr, "generate: %lld new tokens x %lld samples in %.3f s: %.1f tokens/s (prompt of %lld tokens)\n",
                 static_cast<long long>(o.max_new_tokens), static_cast<long long>(o.samples), seconds,
                 seconds > 0 ? made / seconds : 0.0, static_cast<long long>(t));
  return cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  SamplingOptions& s = o.generation.sampling;
  CLI::App app{"generate: continues a prompt with a train --data checkpoint (key/value cache decoding)", "generate"};
  app.add_option("--checkpoint", o.checkpoint, "the model (CK) written by train --data FILE; CK.json next to it")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--prompt", o.prompt, "the text to continue")->capture_default_str();
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--temperature", s.temperature, "softmax temperature; 0: greedy (the most likely token)")
      ->capture_default_str()
      ->check(cli::real_range(0, 100));
  app.add_option("--top-k", s.top_k, "draw from the k most likely tokens only (0: no limit)")
      ->capture_default_str()
      ->check(cli::at_least(0));
  app.add_option("--top-p", s.top_p,
                 "draw from the fewest most likely tokens whose probabilities reach p (1: no limit)")
      ->capture_default_str()
      ->check(cli::real_range(0, 1));  // 0 is refused in run(): the range is (0, 1]
  app.add_option("--seed", o.generation.seed, "seed of the draws: the same seed gives the same text")
      ->capture_default_str();
  app.add_option("--samples", o.samples, "continuations of the prompt, generated as one batch")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--device", o.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--kernels", o.kernels, "fused or unfused (composed from primitive passes)")
      ->check(CLI::IsMember({"fused", "unfused"}))
      ->capture_default_str();
  app.add_option("--precision", o.precision, "auto (bf16 on GPUs with bf16 tensor cores, else fp32), fp32, bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  cli::add_common_flags(app, o.common);
  return cli::run_program(app, o.common, argc, argv, [&] { return run(o); });
}
