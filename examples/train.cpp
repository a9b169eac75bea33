// train: trains a handgrad DecoderLM, the project's main job.
//
//   train                      built-in synthetic translation task (no download)
//   train --data FILE          language model on any text file (--tokenizer bytes|bpe)
//   train --task translate --pairs FILE.tsv
//                              translation of parallel text (subword vocabulary, BLEU;
//                              docs/translation.md)
//
// Every flag: train --help. Same seed, same device, same mode -> the same
// loss curve. --unfused swaps every fused kernel for its primitive version.
// Exit codes: 0 done, 1 runtime error, 2 usage error, 130/143 stopped by
// SIGINT/SIGTERM after finishing the step and saving (examples/common/cli.hpp).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/cpu_gemm.hpp"
#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/logging.hpp"
#include "core/math_mode.hpp"
#include "core/optim.hpp"
#include "core/parallel.hpp"
#include "core/precision.hpp"
#include "core/profiler.hpp"
#include "core/tensor.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/watchdog.hpp"
#include "dist/world.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/data_parallel.hpp"
#include "examples/common/flag_json.hpp"
#include "examples/common/gemm_flags.hpp"
#include "examples/common/host_memory.hpp"
#include "examples/common/lr_schedule.hpp"
#include "examples/common/plot.hpp"
#include "examples/common/progress.hpp"
#include "examples/common/run_record.hpp"
#include "examples/common/step_log.hpp"
#include "examples/common/text_corpus.hpp"
#include "examples/translation/translate_run.hpp"
#include "examples/translation/translation_checkpoint.hpp"
#include "examples/translation_task.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "models/training_memory.hpp"
#include "ops/cross_entropy.hpp"

using namespace hg;
using hg::cli::usage_error;
using hg::examples::Batch;
using hg::examples::Example;
using hg::examples::kIgnore;
using hg::examples::TranslationTask;

namespace {

constexpr const char* kLogHeader = "step,loss,lr,ms,tokens_per_s,eval_loss,eval_token_acc";

struct Options {
  std::string data, task = "synthetic";
  std::string tokenizer;  // "": the task's own (validate resolves it)
  int vocab_size = 0;     // 0: the tokenizer's default (validate resolves it)
  bool eval_only = false;
  translation::TranslateOptions tr;
  bool unfused = false;
  std::string precision = "auto";  // auto, fp32, bf16
  std::string attention = "auto";  // auto, flash, softmax
  bool recompute_gelu = false, recompute_layernorm = false;
  bool tf32 = false;
  cli::GemmFlags gemm;  // --gemm-algorithms, --gemm-algorithm-file
  bool no_graph = false;
  std::string device = "auto";
  int64_t d_model = 64, heads = 4, layers = 2, seq_len = 64, batch = 32;
  double lr = 3e-3, dropout = 0.0, weight_decay = 0.01, clip = 1.0;
  int64_t steps = 1200, warmup = 60, seed = 0;
  std::string lr_schedule = "cosine";  // after the warm-up: cosine, linear, constant
  int64_t grad_accum = 1;              // micro-batches of --batch per optimizer step
  int words = 24, min_len = 4, max_len = 10, held_out = 500;
  int64_t eval_every = 200, print_every = 0;
  int64_t profile_steps = 0;  // steps timed per op kind (from the run's 11th), 0: none
  int sample_bytes = 300;
  std::string checkpoint, log_csv = "train_log.csv", plot = "train_loss.png";
  bool resume = false, extend_schedule = false;
  cli::LrSchedule schedule;  // from --lr/--warmup/--steps, or the checkpoint's (resolve_schedule)
  cli::RunRecord record;     // written beside every checkpoint (run_record)
  cli::DataParallelFlags dp;
  cli::CommonFlags common;
};

// Linear warm-up, then --lr-schedule (examples/common/lr_schedule.hpp).
double learning_rate(const Options& o, int64_t step) { return o.schedule.at(step); }

std::vector<double> to_double(const std::vector<int32_t>& v) { return std::vector<double>(v.begin(), v.end()); }

// ---- stopping on SIGINT / SIGTERM ---------------------------------------------------
// The handler only records the signal; the loop stops after the current step.
// A second signal takes the default action (an impatient Ctrl-C still kills).
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}

// Long loops outside a training step (building a batch, replaying the data
// stream on --resume) check the flag and unwind with this.
struct Stopped {
  int signal;
};
void stop_if_signalled() {
  if (g_stop_signal != 0) throw Stopped{g_stop_signal};
}

// ---- failure injection for the data-parallel tests ------------------------------------
// HG_FAULT=kill:RANK:STEP, hang:RANK:STEP or perturb:RANK:STEP: that rank
// dies (SIGKILL), hangs, or nudges one parameter just before that step;
// tests/cli/train_ddp.sh checks that every rank stops with a clear message,
// the last checkpoint stays intact, and the parameter check sees the nudge.
void maybe_inject_fault(int64_t step, DecoderLM& model, cli::DataParallel* dp) {
  const char* spec = std::getenv("HG_FAULT");
  if (!spec) return;
  char kind[8] = "";
  int rank = -1;
  long long at = -1;
  if (std::sscanf(spec, "%7[a-z]:%d:%lld", kind, &rank, &at) != 3 || rank != dist::world().rank || at != step) return;
  std::fprintf(stderr, "train: HG_FAULT: rank %d %s before step %lld\n", rank, kind, at);
  std::fflush(stderr);
  if (std::strcmp(kind, "kill") == 0) std::raise(SIGKILL);
  if (std::strcmp(kind, "perturb") == 0) {
    if (dp) dp->settle();  // no all-gather still under way may overwrite the nudge
    model.ln_f.gamma.value.fill_(1.001);
  }
  if (std::strcmp(kind, "hang") == 0)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// ---- language model data (--data) -------------------------------------------
// Windows of seq + 1 tokens drawn uniformly from `tokens` (examples/common/text_corpus.hpp).
Batch text_batch(const std::vector<int32_t>& tokens, int64_t b, int64_t seq, Generator& g, bool stoppable) {
  Batch out;
  out.batch = b;
  out.seq = seq;
  const uint64_t starts = tokens.size() - static_cast<uint64_t>(seq);  // windows of seq + 1 tokens
  for (int64_t i = 0; i < b; ++i) {
    if (stoppable && i % 4096 == 0) stop_if_signalled();
    const size_t s = g.next_u64() % starts;
    for (int64_t p = 0; p < seq; ++p) {
      out.inputs.push_back(tokens[s + p]);
      out.targets.push_back(tokens[s + p + 1]);
    }
  }
  return out;
}

// ---- the training step ------------------------------------------------------------------
// One optimizer step on one batch (models/train_step.hpp: the library's step,
// CUDA graph included where it can be captured); returns this rank's loss
// (the caller sums the ranks'). weight: this rank's share of the global
// batch's loss terms, for the data-parallel reduction.
double train_step(TrainStep& step, const Batch& b, double weight) {
  const Tensor ids = Tensor::from_vector(b.inputs, {b.batch, b.seq}, DType::F32);
  const Tensor targets = Tensor::from_vector(b.targets, {b.batch, b.seq}, DType::F32);
  return step.run(ids, targets, weight).loss;
}

// Logits of a batch in eval mode, on the host: (B, T, V) row-major.
std::vector<double> eval_logits(DecoderLM& model, const std::vector<double>& inputs, int64_t b, int64_t t, Device dev) {
  model.eval();
  const Tensor logits = model.forward(Tensor::from_vector(inputs, {b, t}, DType::F32, dev));
  model.train();
  return logits.to_vector();
}

int32_t argmax_row(const double* row, int64_t v) { return static_cast<int32_t>(std::max_element(row, row + v) - row); }

// ---- translation metrics -----------------------------------------------------------
struct TranslationScore {
  double loss = 0, token_acc = 0;                // teacher forced, on held-out target positions
  double greedy_token_acc = 0, exact_match = 0;  // free-running greedy decoding
  std::vector<std::string> shown;                // a few decoded examples
};

double teacher_forced(DecoderLM& model, const TranslationTask& task, const std::vector<Example>& held_out, Device dev,
                      double* loss_out) {
  int64_t correct = 0, total = 0;
  double loss_sum = 0;
  const int64_t v = task.vocab_size();
  for (size_t from = 0; from < held_out.size(); from += 128) {
    const std::vector<Example> chunk(held_out.begin() + from, held_out.begin() + std::min(held_out.size(), from + 128));
    const Batch b = task.make_batch(chunk);
    const std::vector<double> logits = eval_logits(model, b.inputs, b.batch, b.seq, dev);
    for (int64_t i = 0; i < b.batch * b.seq; ++i) {
      if (b.targets[i] == kIgnore) continue;
      const double* row = &logits[i * v];
      const double m = *std::max_element(row, row + v);
      double s = 0;
      for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
      loss_sum += m + std::log(s) - row[static_cast<int64_t>(b.targets[i])];
      correct += argmax_row(row, v) == static_cast<int32_t>(b.targets[i]);
      ++total;
    }
  }
  if (loss_out) *loss_out = loss_sum / std::max<int64_t>(1, total);
  return static_cast<double>(correct) / std::max<int64_t>(1, total);
}

// Greedy decoding, batched over held-out sentences of equal length (equal
// prompt length, so the batch moves in lockstep with no padding).
TranslationScore evaluate_translation(DecoderLM& model, const TranslationTask& task,
                                      const std::vector<Example>& held_out, Device dev) {
  TranslationScore score;
  score.token_acc = teacher_forced(model, task, held_out, dev, &score.loss);
  std::map<size_t, std::vector<const Example*>> by_len;
  for (const Example& e : held_out) by_len[e.source.size()].push_back(&e);
  int64_t tok_correct = 0, tok_total = 0, exact = 0;
  const int64_t v = task.vocab_size();
  for (auto& [n, group] : by_len) {
    const int64_t b = static_cast<int64_t>(group.size());
    std::vector<std::vector<int32_t>> lines;
    for (const Example* e : group) lines.push_back(task.prompt(*e));
    const int64_t answer_len = static_cast<int64_t>(n) + 1;
    for (int64_t k = 0; k < answer_len; ++k) {
      const int64_t t = static_cast<int64_t>(lines[0].size());
      std::vector<double> inputs;
      for (const auto& l : lines) inputs.insert(inputs.end(), l.begin(), l.end());
      const std::vector<double> logits = eval_logits(model, inputs, b, t, dev);
      for (int64_t i = 0; i < b; ++i) lines[i].push_back(argmax_row(&logits[(i * t + t - 1) * v], v));
    }
    for (int64_t i = 0; i < b; ++i) {
      const std::vector<int32_t> want = task.answer(*group[i]);
      const std::vector<int32_t> got(lines[i].end() - answer_len, lines[i].end());
      int64_t ok = 0;
      for (int64_t j = 0; j < answer_len; ++j) ok += got[j] == want[j];
      tok_correct += ok;
      tok_total += answer_len;
      exact += ok == answer_len;
      if (score.shown.size() < 3 && i == 0)
        score.shown.push_back(task.render(task.prompt(*group[i])) + "  ->  " + task.render(got) +
                              (ok == answer_len ? "  (exact)" : "  (want " + task.render(want) + ")"));
    }
  }
  score.greedy_token_acc = static_cast<double>(tok_correct) / std::max<int64_t>(1, tok_total);
  score.exact_match = static_cast<double>(exact) / std::max<size_t>(1, held_out.size());
  return score;
}

// ---- language model sample ----------------------------------------------------------
// Continues `prompt` token by token (temperature sampling) until the
// continuation decodes to at least `bytes` bytes or has that many tokens.
std::string sample_text(DecoderLM& model, const cli::TextTokenizer& tokenizer, const std::string& prompt, int bytes,
                        int64_t max_seq, Device dev, Generator& g, double temperature = 0.8) {
  std::vector<int32_t> tokens = tokenizer.encode(prompt);
  const int64_t v = tokenizer.vocab_size();
  std::vector<int32_t> out;
  std::string text;
  while (static_cast<int>(text.size()) < bytes && static_cast<int>(out.size()) < bytes) {
    const int64_t t = std::min<int64_t>(max_seq, static_cast<int64_t>(tokens.size()));
    const std::vector<int32_t> ctx(tokens.end() - t, tokens.end());
    const std::vector<double> logits = eval_logits(model, to_double(ctx), 1, t, dev);
    const double* row = &logits[(t - 1) * v];
    const double m = *std::max_element(row, row + v);
    std::vector<double> p(static_cast<size_t>(v));
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += p[j] = std::exp((row[j] - m) / temperature);
    double u = g.uniform() * s;
    int32_t pick = static_cast<int32_t>(v - 1);
    for (int64_t j = 0; j < v; ++j) {
      if ((u -= p[j]) < 0) {
        pick = static_cast<int32_t>(j);
        break;
      }
    }
    tokens.push_back(pick);
    out.push_back(pick);
    text = tokenizer.decode(out);
  }
  return text;
}

// ---- 1. flags --------------------------------------------------------------------------
void add_flags(CLI::App& app, Options& o) {
  using cli::at_least;
  using cli::real_range;
  auto* data =
      app.add_option("--data", o.data, "train a language model on this text file instead of the translation task")
          ->check(CLI::ExistingFile);
  app.add_option("--task", o.task, "synthetic (built-in) or translate (parallel text from --pairs)")
      ->check(CLI::IsMember({"synthetic", "translate"}))
      ->excludes(data)
      ->capture_default_str();
  app.add_option("--pairs", o.tr.pairs, "translate: source<TAB>target lines (train, and valid/test unless given)")
      ->check(CLI::ExistingFile);
  app.add_option("--valid", o.tr.valid, "translate: validation pairs (default: cut from --pairs)")
      ->check(CLI::ExistingFile);
  app.add_option("--test", o.tr.test, "translate: test pairs (default: cut from --pairs)")->check(CLI::ExistingFile);
  app.add_option("--valid-pairs", o.tr.valid_pairs, "translate: pairs cut from --pairs for validation (at most 10%)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--test-pairs", o.tr.test_pairs, "translate: pairs cut from --pairs for the test (at most 10%)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer,
                 "--data: bytes (default; 256 ids) or bpe (SentencePiece, trained on the training part); "
                 "translate: bpe (default) or unigram")
      ->check(CLI::IsMember({"bytes", "bpe", "unigram"}));
  app.add_option("--vocab-size", o.vocab_size,
                 "subword vocabulary size, an upper bound (--tokenizer bpe: default 2048; translate: default 8000)")
      ->check(CLI::Range(16, 1000000));
  app.add_option("--beam", o.tr.beam, "translate: beam width for BLEU (1: greedy)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--bleu-sentences", o.tr.bleu_sentences,
                 "translate: valid pairs translated at each evaluation (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  auto* fused = app.add_flag("--fused", "fused kernels (default)");
  app.add_flag("--unfused", o.unfused, "kernels composed from primitive map/zip/reduce passes")->excludes(fused);
  app.add_option("--device", o.device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--precision", o.precision, "auto (bf16 on GPUs with sm_80+, fp32 on the CPU), fp32, bf16 (CUDA)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--tf32", o.tf32, "let fp32 GEMMs use TF32 tensor cores (off: exact FP32)");
  cli::add_gemm_flags(app, o.gemm);
  app.add_flag("--no-graph", o.no_graph, "launch every kernel each step instead of replaying a CUDA graph");
  app.add_option("--attention", o.attention, "fused-mode attention core: auto (flash on CUDA), flash, softmax")
      ->check(CLI::IsMember({"auto", "flash", "softmax"}))
      ->capture_default_str();
  app.add_flag("--recompute-gelu", o.recompute_gelu,
               "fused mode: each MLP recomputes gelu(pre) in its backward instead of keeping it (less memory)");
  app.add_flag("--recompute-layernorm", o.recompute_layernorm,
               "each layer's qkv projection and fc1 recompute their input, LN1's / LN2's output, in the backward "
               "instead of keeping it (less memory)");
  app.add_option("--d-model", o.d_model, "model width")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}))
      ->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads (must divide --d-model)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  app.add_option("--layers", o.layers, "transformer layers")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "sequence length (--data mode; the task sets its own)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak AdamW learning rate")->check(real_range(1e-12, 10))->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->check(real_range(0, 10))
      ->capture_default_str();
  app.add_option("--clip", o.clip, "gradient-norm clip (0: none)")->check(real_range(0, 1e6))->capture_default_str();
  app.add_option("--steps", o.steps, "total training steps")->check(at_least(1))->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear warm-up steps")->check(at_least(0))->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "after the warm-up: cosine or linear decay to 10% of --lr at --steps, or constant --lr")
      ->check(CLI::IsMember(cli::lr_kind_names()))
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum,
                 "micro-batches of --batch per optimizer step, their gradients accumulated (a step trains on "
                 "grad-accum x --batch sequences; activations of one micro-batch at a time)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--dropout", o.dropout, "dropout probability")->check(real_range(0, 0.99))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for init, data and dropout")->check(at_least(0))->capture_default_str();
  app.add_option("--words", o.words, "task: vocabulary size of each language")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--min-len", o.min_len, "task: shortest sentence")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--max-len", o.max_len, "task: longest sentence")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--held-out", o.held_out, "task: held-out sentences for the metrics")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between held-out evaluations (0: only at the end)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--print-every", o.print_every, "steps between progress lines when not a terminal (0: auto)")
      ->check(at_least(0));
  app.add_option("--profile-steps", o.profile_steps,
                 "time this many steps (from the run's 11th) per op kind, every op synchronized, and print the "
                 "breakdown (those steps are left out of ms/step)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}))
      ->capture_default_str();
  auto* checkpoint = app.add_option(
      "--checkpoint", o.checkpoint,
      "save the model here (and the optimizer state to PATH.optim) at each evaluation, at the end and when stopped");
  auto* resume = app.add_flag("--resume", o.resume,
                              "load --checkpoint and PATH.optim and continue from the saved step, with the flags "
                              "recorded in PATH.json")
                     ->needs(checkpoint);
  app.add_flag("--eval-only", o.eval_only,
               "load --checkpoint (and the flags recorded in PATH.json), print its held-out metrics and exit; trains "
               "nothing and writes no file")
      ->needs(checkpoint)
      ->excludes(resume);
  app.add_flag("--extend-schedule", o.extend_schedule,
               "with --resume and a --steps other than the checkpoint's run: continue the learning rate from where it "
               "is, decaying to 10% of --lr at the new --steps (constant: flat; without it such a change is refused)")
      ->needs(resume);
  app.add_option("--log-csv", o.log_csv,
                 "per-step CSV log (flushed every step; a resumed run continues it; '' for none)")
      ->capture_default_str();
  app.add_option("--plot", o.plot, "loss curve, .png or .svg, of the whole run ('' for none)")->capture_default_str();
  cli::add_data_parallel_flags(app, o.dp);
  cli::add_common_flags(app, o.common);
  cli::add_json_config(app);
}

// ---- 2. validate: everything that can be checked before any work ------------------------
// --task translate: BLEU next to the loss plot, in PLOT-stem_bleu.png/.svg.
std::string bleu_plot_path(const std::string& plot) {
  const size_t dot = plot.rfind('.');
  return plot.substr(0, dot) + "_bleu" + plot.substr(dot);
}

// Number of distinct sentences of the task (capped: only compared with --held-out).
int64_t distinct_sentences(const Options& o) {
  int64_t total = 0;
  for (int n = o.min_len; n <= o.max_len && total < (int64_t{1} << 40); ++n) {
    int64_t count = 1;
    for (int i = 0; i < n && count < (int64_t{1} << 40); ++i) count *= o.words;
    total += count;
  }
  return total;
}

// --tokenizer and --vocab-size: what each task takes, and their defaults.
void resolve_tokenizer(Options& o) {
  const bool data = !o.data.empty();
  if (!data && o.task != "translate") {
    if (!o.tokenizer.empty())
      usage_error("--tokenizer", o.tokenizer,
                  ": the synthetic task has its own vocabulary; --tokenizer goes with --data (bytes, bpe) or "
                  "--task translate (bpe, unigram)");
    if (o.vocab_size != 0)
      usage_error("--vocab-size", o.vocab_size,
                  ": the synthetic task has its own vocabulary (--words sets it); --vocab-size goes with "
                  "--tokenizer bpe or --task translate");
    return;
  }
  if (o.tokenizer.empty()) o.tokenizer = data ? "bytes" : "bpe";
  if (data && o.tokenizer == "unigram") usage_error("--tokenizer", o.tokenizer, ": --data takes bytes or bpe");
  if (!data && o.tokenizer == "bytes")
    usage_error("--tokenizer", o.tokenizer, ": --task translate takes bpe or unigram (a subword vocabulary)");
  if (o.tokenizer == "bytes") {
    if (o.vocab_size != 0)
      usage_error("--vocab-size", o.vocab_size,
                  ": the bytes tokenizer has 256 ids; --vocab-size goes with --tokenizer bpe");
    return;
  }
  if (!cli::SubwordTokenizer::available())
    usage_error("--tokenizer", o.tokenizer,
                ": this train was built without SentencePiece (apt-get install libsentencepiece-dev, then "
                "reconfigure)");
  if (o.vocab_size == 0) o.vocab_size = data ? 2048 : 8000;
  if (data && o.vocab_size < cli::TextTokenizer::kMinBpeVocab)
    usage_error("--vocab-size", o.vocab_size, ": --tokenizer bpe needs at least ", cli::TextTokenizer::kMinBpeVocab,
                " (5 special ids, '\\n' and the 256 byte pieces come first)");
  o.tr.tokenizer_type = o.tokenizer;
  o.tr.vocab_size = o.vocab_size;
}

void validate(Options& o) {
  if (o.batch * o.grad_accum > (int64_t{1} << 20))
    usage_error("--grad-accum", o.grad_accum, ": --batch ", o.batch, " x --grad-accum ", o.grad_accum, " = ",
                o.batch * o.grad_accum, " sequences per step; at most 1048576 (lower --grad-accum or --batch)");
  if (o.d_model % o.heads != 0)
    usage_error("--heads", o.heads, ": must divide --d-model ", o.d_model, " (head width = d_model / heads)");
  // What --recompute-gelu recomputes exists only where GELU runs in fc1's GEMM epilogue.
  if (o.recompute_gelu && o.unfused)
    usage_error("--recompute-gelu", "recomputes the GELU of fused mode's GEMM epilogue, which --unfused does not run "
                                    "(--recompute-layernorm works in both modes)");
  if (o.recompute_gelu && o.d_model % 2 != 0)
    usage_error("--recompute-gelu", "needs an even --d-model (the GELU epilogue takes 4 x d_model % 8 == 0), got ",
                o.d_model);
  if (o.task == "translate") {
    if (!translation::SubwordTokenizer::available())
      usage_error("--task", o.task,
                  ": this train was built without SentencePiece (apt-get install "
                  "libsentencepiece-dev, then reconfigure)");
    if (o.tr.pairs.empty()) usage_error("--task", o.task, ": needs --pairs FILE.tsv (source<TAB>target lines)");
  } else if (!o.tr.pairs.empty() || !o.tr.valid.empty() || !o.tr.test.empty()) {
    usage_error("--pairs", o.tr.pairs, ": --pairs/--valid/--test need --task translate");
  } else if (o.data.empty()) {
    if (o.max_len < o.min_len) usage_error("--max-len", o.max_len, ": must be >= --min-len ", o.min_len);
    const int64_t distinct = distinct_sentences(o);
    if (o.held_out >= distinct)
      usage_error("--held-out", o.held_out, ": must be < ", distinct,
                  ", the number of distinct sentences with --words ", o.words, ", --min-len ", o.min_len,
                  " and --max-len ", o.max_len, " (held-out sentences never appear in training)");
  }
  resolve_tokenizer(o);
  if (o.eval_only) {  // writes nothing: no output path to check
    if (!std::ifstream(o.checkpoint))
      usage_error("--checkpoint", o.checkpoint, ": --eval-only needs an existing checkpoint, and there is none");
    return;
  }
  const auto ends_with = [](const std::string& s, const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  // A bad --plot is refused on every build, so a run without plots fails as one with them would.
  if (!o.plot.empty() && !ends_with(o.plot, ".png") && !ends_with(o.plot, ".svg"))
    usage_error("--plot", o.plot, ": the name must end in .png or .svg");
  cli::check_writable(o.log_csv, "--log-csv");
  cli::check_writable(o.plot, "--plot");
  if (o.task == "translate" && !o.plot.empty()) cli::check_writable(bleu_plot_path(o.plot), "--plot");
  if (!o.plot.empty() && !cli::plots_available()) {
    spdlog::warn("--plot {} skipped: {}", o.plot, cli::plots_unavailable_reason());
    o.plot.clear();
  }
  if (!o.checkpoint.empty()) {
    cli::check_writable(o.checkpoint, "--checkpoint");
    cli::check_writable(o.checkpoint + ".optim", "--checkpoint");
    cli::check_writable(cli::schedule_path(o.checkpoint), "--checkpoint");
    cli::check_writable(cli::run_record_path(o.checkpoint), "--checkpoint");
    if (o.tokenizer == "bpe" && !o.data.empty()) cli::check_writable(cli::tokenizer_path(o.checkpoint), "--checkpoint");
    if (o.resume && !std::ifstream(o.checkpoint))
      usage_error("--checkpoint", o.checkpoint, ": --resume needs an existing checkpoint, and there is none");
  }
}

// ---- 3. data --------------------------------------------------------------------------------
struct Data {
  bool lm = false;
  TranslationTask task;
  std::unique_ptr<translation::ParallelTask> parallel;  // --task translate
  cli::TextCorpus text;                                 // --data: token ids of both parts
  cli::TextTokenizer tokenizer;                         // --data
  std::vector<Example> held_out;
  Generator gen;
  int64_t batch = 0, seq_len = 0;  // batch: per rank
  int rank = 0, world = 1;
  double weight = 1;  // the last batch's share of the global batch's target tokens
  // Whether a signal may cut a batch short (throwing Stopped). Not under data
  // parallelism: there every rank must finish the same steps, and a signal
  // stops them all after a step.
  bool stoppable = true;

  // Data parallel: every rank draws the same global batch of world x batch
  // sequences from the one seeded stream and trains on its rows
  // [rank * batch, (rank + 1) * batch): disjoint shards, and the same stream
  // as one process with the global batch.
  Batch next() {
    Batch g = next_global();
    if (world == 1) return g;
    const auto counted = [](const std::vector<double>& t, size_t from, size_t to) {
      return std::count_if(t.begin() + from, t.begin() + to, [](double v) { return v != kIgnore; });
    };
    const size_t row = static_cast<size_t>(g.seq), from = static_cast<size_t>(rank * batch) * row,
                 to = from + static_cast<size_t>(batch) * row;
    const auto all = counted(g.targets, 0, g.targets.size());
    weight = all > 0 ? static_cast<double>(counted(g.targets, from, to)) / static_cast<double>(all) : 1.0 / world;
    Batch b;
    b.batch = batch;
    b.seq = g.seq;
    b.inputs.assign(g.inputs.begin() + from, g.inputs.begin() + to);
    b.targets.assign(g.targets.begin() + from, g.targets.begin() + to);
    return b;
  }

 private:
  Batch next_global() {
    const int64_t n = batch * world;
    if (lm) return text_batch(text.train, n, seq_len, gen, stoppable);
    if (parallel) return parallel->train_batch(n, gen);
    std::vector<Example> ex;
    for (int64_t i = 0; i < n; ++i) {
      if (stoppable && i % 4096 == 0) stop_if_signalled();
      ex.push_back(task.train_sample(gen));
    }
    return task.make_batch(ex);
  }
};

// The tokenizer of a new --data run: bpe trained on the training part only.
cli::TextTokenizer train_bpe_or_bytes(const Options& o, const cli::TextSplit& split) {
  if (o.tokenizer == "bpe") {
    const int64_t bad = cli::invalid_utf8_bytes(split.train) + cli::invalid_utf8_bytes(split.held_out);
    if (bad > 0)
      spdlog::warn("--data {}: {} byte(s) are not UTF-8; --tokenizer bpe reads each as U+FFFD (bytes keeps them)",
                   o.data, bad);
  }
  try {
    return cli::train_tokenizer(o.tokenizer, split, o.vocab_size);
  } catch (const Error& e) {
    // SentencePiece needs a piece for every character it keeps, beside the fixed ones.
    if (std::string(e.what()).find("required_chars") != std::string::npos)
      usage_error("--vocab-size", o.vocab_size, ": too small for the characters of ", o.data, ": ", e.what());
    throw;
  }
}

std::unique_ptr<Data> build_data(Options& o) {
  auto d = std::unique_ptr<Data>(new Data{!o.data.empty(),
                                          TranslationTask(o.words, o.min_len, o.max_len),
                                          {},
                                          {},
                                          {},
                                          {},
                                          Generator(static_cast<uint64_t>(o.seed) * 1000003 + 17),
                                          o.batch * o.grad_accum,
                                          0});
  const bool from_checkpoint = o.resume || o.eval_only;  // the vocabulary it was trained with
  if (d->lm) {
    const cli::TextSplit split = cli::split_text_file(o.data, o.seq_len);
    d->tokenizer = from_checkpoint ? cli::TextTokenizer::load(o.checkpoint, o.tokenizer) : train_bpe_or_bytes(o, split);
    d->text = cli::tokenize_split(split, d->tokenizer, o.seq_len, o.data);
  } else if (o.task == "translate") {
    d->parallel = translation::build_parallel_task(o.tr, o.seq_len, static_cast<uint64_t>(o.seed),
                                                   from_checkpoint ? o.checkpoint : "");
  } else {
    Generator held_gen(99);  // the held-out set does not depend on --seed
    d->held_out = d->task.make_held_out(o.held_out, held_gen);
    o.seq_len = d->task.seq_len();
  }
  d->seq_len = o.seq_len;
  d->rank = dist::world().rank;
  d->world = dist::world().size;
  d->stoppable = d->world == 1;
  return d;
}

// ---- 4. model --------------------------------------------------------------------------------
DecoderLMConfig model_config(const Options& o, const Data& data, Precision precision) {
  DecoderLMConfig cfg;
  cfg.vocab_size = data.lm ? data.tokenizer.vocab_size() : data.task.vocab_size();
  if (data.parallel) cfg.vocab_size = data.parallel->vocab_size();
  cfg.max_seq_len = o.seq_len;
  cfg.d_model = o.d_model;
  cfg.n_heads = o.heads;
  cfg.n_layers = o.layers;
  cfg.dropout = o.dropout;
  cfg.seed = static_cast<uint64_t>(o.seed);
  cfg.precision = precision;
  cfg.attention = parse_attention_impl(o.attention);
  cfg.recompute_gelu = o.recompute_gelu;
  cfg.recompute_layernorm = o.recompute_layernorm;
  return cfg;
}

// Refuses a configuration whose training step cannot fit in the host's
// available memory, before anything is allocated: past it the OS would swap
// or kill the run partway. (On CUDA the model and activations live on the
// GPU; its free memory is not checked here.)
void check_memory_fits(const Options& o, const DecoderLMConfig& cfg, Device dev) {
  if (dev != Device::CPU) return;
  const int64_t available = cli::host_memory_available();
  if (available < 0) return;
  const TrainingMemory m = estimate_training_memory(cfg, o.batch, o.seq_len);
  if (m.total_bytes() <= static_cast<double>(available)) return;
  const double room = static_cast<double>(available) - m.weight_bytes;
  const int64_t fits = room > 0 ? static_cast<int64_t>(room / m.per_sequence_bytes) : 0;
  const std::string flag = fits > 0 ? "--batch" : "--d-model";
  usage_error(flag, fits > 0 ? o.batch : o.d_model, ": a training step needs about ",
              cli::format_bytes(m.total_bytes()), " (", m.parameters, " parameters with gradients and AdamW state ",
              cli::format_bytes(m.weight_bytes), ", activations and logits of ", o.batch, " x ", o.seq_len, " tokens ",
              cli::format_bytes(m.activation_bytes()), ") but the host has ", cli::format_bytes(double(available)),
              " available (MemAvailable); ",
              fits > 0 ? "--batch " + std::to_string(fits) + " or less would fit"
                       : std::string("the model alone does not fit: lower --d-model or --layers"));
}

// ---- 5. resume -------------------------------------------------------------------------------
// Loads the model and the optimizer state (moments and step count), refuses a
// pair from different steps, and replays the data stream so the resumed run
// sees the batches it would have seen. Returns the step to start from.
// `model_step`: what DecoderLM::load returned (the model is loaded before it
// moves to the device and the optimizer is built on its parameters).
int64_t maybe_resume(const Options& o, int64_t model_step, Optimizer& opt, Data& data) {
  if (!o.resume) return 0;
  const std::string optim = o.checkpoint + ".optim";
  opt.load_state(optim);
  if (model_step >= 0 && model_step != opt.steps() && std::ifstream(optim + ".next")) {
    // A save stopped between its two renames (see save_checkpoint): finish it.
    opt.load_state(optim + ".next");
    if (opt.steps() == model_step) {
      dist::barrier("barrier before completing the interrupted save");  // every rank has read it
      if (dist::world().rank == 0)
        HG_CHECK(std::rename((optim + ".next").c_str(), optim.c_str()) == 0, "train", "cannot rename ", optim, ".next");
      spdlog::warn("{}: completed a checkpoint save that was interrupted (step {})", o.checkpoint, model_step);
    } else {
      opt.load_state(optim);
    }
  }
  const int64_t step = opt.steps();
  if (model_step < 0)
    spdlog::warn("{} holds no step record (written by an older train); cannot check that it matches {}", o.checkpoint,
                 optim);
  else if (model_step != step)
    fail("train", "--checkpoint ", o.checkpoint, " is from step ", model_step, " but ", optim, " is from step ", step,
         ": they were not saved together; refusing to resume from the pair");
  if (step >= o.steps)
    usage_error("--steps", o.steps, ": the checkpoint ", o.checkpoint, " is already at step ", step,
                "; pass --steps > ", step, " and --extend-schedule to train further");
  for (int64_t s = 0; s < step; ++s) {
    stop_if_signalled();
    data.next();
  }
  return step;
}

// The schedule a run follows: the flags' for a new run; for a resumed run the
// one saved with the checkpoint, so the learning rate continues where it was.
// A different --lr or --warmup is refused, a different --steps too unless
// --extend-schedule says how to continue. start: the first step to run.
cli::LrSchedule resolve_schedule(const Options& o, int64_t start) {
  cli::LrSchedule asked;
  asked.lr = o.lr, asked.warmup = o.warmup, asked.steps = o.steps, asked.kind = cli::parse_lr_kind(o.lr_schedule);
  if (!o.resume) return asked;
  const std::string path = cli::schedule_path(o.checkpoint);
  const std::optional<cli::LrSchedule> saved = cli::load_schedule(o.checkpoint);
  if (!saved) {
    spdlog::warn("{} does not exist (the checkpoint was written by an older train): the learning-rate schedule "
                 "comes from --lr, --warmup and --steps",
                 path);
    return asked;
  }
  const auto jump = [&](const cli::LrSchedule& other) {
    if (other.at(start) == saved->at(start))
      return std::string("(the schedule after step ") + std::to_string(start) + " would change)";
    return fmt::format("(the learning rate of step {} would jump from {:.3g} to {:.3g})", start + 1, saved->at(start),
                       other.at(start));
  };
  if (o.lr != saved->lr)
    usage_error("--lr", o.lr, ": the checkpoint's run used --lr ", saved->lr, " (", path, "); resume with it ",
                jump(asked));
  if (asked.kind != saved->kind)
    usage_error("--lr-schedule", o.lr_schedule, ": the checkpoint's run used --lr-schedule ",
                cli::lr_kind_name(saved->kind), " (", path, "); resume with it ", jump(asked));
  if (o.warmup != saved->warmup)
    usage_error("--warmup", o.warmup, ": the checkpoint's run used --warmup ", saved->warmup, " (", path,
                "); resume with it ", jump(asked));
  if (o.steps == saved->steps) {
    if (o.extend_schedule)
      spdlog::info("--extend-schedule: --steps {} is the checkpoint's own; nothing to extend", o.steps);
    return *saved;
  }
  const cli::LrSchedule longer = saved->extended(start, o.steps);
  if (!o.extend_schedule)
    usage_error("--steps", o.steps, ": the checkpoint's schedule ends at step ", saved->steps, " (", path, ") ",
                jump(asked), "; add --extend-schedule to go on from ", fmt::format("{:.3g}", saved->at(start)), " to ",
                fmt::format("{:.3g}", longer.at(o.steps - 1)), " at step ", o.steps, ", or resume with --steps ",
                saved->steps);
  spdlog::info("--extend-schedule: learning rate {:.3g} at step {}, decaying to {:.3g} at step {}", longer.at(start),
               start + 1, longer.at(o.steps - 1), o.steps);
  return longer;
}

// ---- 6. the training loop ----------------------------------------------------------------------
struct History {
  std::vector<double> steps, losses, eval_steps, eval_losses, eval_bleu;
  double tokens = 0, seconds = 0;  // this run's steps after its first
  std::vector<double> step_ms;     // this run's steps after its first (which pays one-time costs)
  double last_loss = NAN;
  int64_t start_step = 0, end_step = 0;
  int stop_signal = 0;
  // --profile-steps: per-kind totals and the wall time (batch to loss) of the profiled steps.
  std::vector<prof::Entry> profile;
  int64_t profiled_steps = 0;
  double profiled_ms = 0;
  std::string graph_note;  // whether the steps replayed a CUDA graph (TrainStep::graph_note)
};

constexpr int kLmEvalBatches = 4;  // --data: batches of the held-out part per evaluation

struct EvalPoint {
  double loss = 0, token_acc = 0, bleu = NAN;
};

// --data: loss and next-token accuracy on the same kLmEvalBatches batches of
// windows from the held-out part at every evaluation. The logits come to the
// host (for the argmax) a few sequences at a time, at most 2^24 values.
EvalPoint evaluate_lm(DecoderLM& model, const Data& data, const Options& o, Device dev) {
  Generator val_gen(4242);
  const int64_t v = model.config().vocab_size;
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(o.batch, (int64_t{1} << 24) / (o.seq_len * v)));
  double loss_sum = 0;
  int64_t correct = 0, total = 0;
  for (int k = 0; k < kLmEvalBatches; ++k) {
    const Batch b = text_batch(data.text.held_out, o.batch, o.seq_len, val_gen, false);
    for (int64_t r = 0; r < b.batch; r += rows) {
      const int64_t n = std::min(rows, b.batch - r), from = r * b.seq, to = (r + n) * b.seq;
      const std::vector<double> inputs(b.inputs.begin() + from, b.inputs.begin() + to),
          targets(b.targets.begin() + from, b.targets.begin() + to);
      model.eval();
      const Tensor logits = model.forward(Tensor::from_vector(inputs, {n, b.seq}, DType::F32, dev));
      model.train();
      const double mean =
          cross_entropy_forward(logits, Tensor::from_vector(targets, {n, b.seq}, DType::F32, dev), kIgnore, nullptr)
              .item();
      loss_sum += mean * static_cast<double>(n * b.seq);
      const std::vector<double> host = logits.to_vector();
      for (int64_t i = 0; i < n * b.seq; ++i)
        correct += argmax_row(&host[static_cast<size_t>(i * v)], v) == static_cast<int32_t>(targets[i]);
      total += n * b.seq;
    }
  }
  EvalPoint p;
  p.loss = loss_sum / static_cast<double>(total);
  p.token_acc = static_cast<double>(correct) / static_cast<double>(total);
  return p;
}

EvalPoint evaluate(DecoderLM& model, const Data& data, const Options& o, Device dev) {
  EvalPoint p;
  if (data.lm) {
    p = evaluate_lm(model, data, o, dev);
  } else if (data.parallel) {
    const translation::TranslateEval e = translation::evaluate_valid(model, *data.parallel, o.tr, dev);
    p.loss = e.loss;
    p.bleu = e.bleu.bleu;
  } else {
    p.token_acc = teacher_forced(model, data.task, data.held_out, dev, &p.loss);
  }
  return p;
}

std::string fmt_g(double v, int precision = 9) {
  std::ostringstream os;
  os.precision(precision);
  os << v;
  return os.str();
}

// Plot history from the rows a resumed run kept (steps before this run).
void load_history(const cli::StepLog& log, History& h) {
  for (const auto& f : log.kept_rows()) {
    if (f.size() < 2) continue;
    h.steps.push_back(std::atof(f[0].c_str()));
    h.losses.push_back(std::atof(f[1].c_str()));
    if (f.size() >= 6 && !f[5].empty()) {
      h.eval_steps.push_back(std::atof(f[0].c_str()));
      h.eval_losses.push_back(std::atof(f[5].c_str()));
      h.eval_bleu.push_back(f.size() >= 8 && !f[7].empty() ? std::atof(f[7].c_str()) : NAN);
    }
  }
}

// Both files are first written in full (each durable: temp, fsync, rename)
// under a ".next" name, then renamed into place one after the other. A crash
// before the renames leaves the previous pair; a crash between them leaves
// PATH new and PATH.optim old, with the new state still in PATH.optim.next,
// which maybe_resume then completes. Both files carry the step.
// Data parallel: rank 0 alone writes, after ZeRO-1's collective gather of
// the optimizer state (every rank calls this).
void save_checkpoint(const Options& o, DecoderLM& model, Optimizer& opt, cli::DataParallel* dp) {
  if (o.checkpoint.empty()) return;
  if (dp) dp->settle();  // ZeRO-1: the last step's all-gathers have landed
  const std::string optim = o.checkpoint + ".optim";
  const bool writer = dist::world().rank == 0;
  if (dp && dp->sharded()) opt.save_state(optim + ".next");
  if (!writer) return;
  model.save(o.checkpoint + ".next", opt.steps());
  if (!(dp && dp->sharded())) opt.save_state(optim + ".next");
  cli::save_run_record(o.checkpoint, o.record);  // the flags and shape that rebuild the model
  for (const std::string& path : {o.checkpoint, optim})
    HG_CHECK(std::rename((path + ".next").c_str(), path.c_str()) == 0, "train", "cannot rename ", path, ".next to ",
             path, ": ", std::strerror(errno));
}

History train_loop(const Options& o, DecoderLM& model, Optimizer& opt, TrainStep& train, Data& data, Device dev,
                   int64_t start_step, cli::DataParallel* dp) {
  History h;
  h.start_step = h.end_step = start_step;
  const bool rank0 = dist::world().rank == 0;  // the one rank that logs, evaluates and writes files
  std::optional<cli::StepLog> log;             // none for --log-csv '' (and on ranks other than 0)
  if (!o.log_csv.empty() && rank0) {
    log.emplace(o.log_csv, data.parallel ? std::string(kLogHeader) + ",valid_bleu" : kLogHeader,
                o.resume ? start_step : -1);
    load_history(*log, h);
  }
  const int64_t print_every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 20);
  std::optional<cli::Progress> progress;
  if (rank0) progress.emplace("step", o.steps, start_step, "tok", print_every);
  int stop_signal = 0;

  // --profile-steps: steps from the 11th of this run (after one-time costs).
  const int64_t profile_from = start_step + 10, profile_to = profile_from + o.profile_steps;
  if (o.profile_steps > 0) prof::reset();
  for (int64_t step = start_step; step < o.steps && stop_signal == 0; ++step) {
    const double lr = learning_rate(o, step);
    opt.set_lr(lr);
    const bool profiled = step >= profile_from && step < profile_to;
    prof::enable(profiled);  // only around the batch and the step, never an evaluation
    const auto t_batch = std::chrono::steady_clock::now();
    Batch b;
    {
      HG_PROFILE("batch", Device::CPU);  // host: sampling, padding, framing
      try {
        b = data.next();
      } catch (const Stopped& s) {  // signalled while a large batch was built: stop before its step
        stop_signal = s.signal;
        break;
      }
    }
    maybe_inject_fault(step + 1, model, dp);
    dist::set_watch_step(step + 1);
    const auto t0 = std::chrono::steady_clock::now();
    double loss = train_step(train, b, data.weight);
    const auto t1 = std::chrono::steady_clock::now();
    prof::enable(false);
    stop_signal = g_stop_signal;
    if (dp) {
      // One host all-reduce: the global loss, and whether any rank was
      // signalled (every rank must stop after the same step).
      double v[2] = {data.weight * loss, stop_signal != 0 ? static_cast<double>(stop_signal) : 0.0};
      dist::all_reduce_sum(v, 2, "all-reduce of the loss");
      loss = v[0];
      if (v[1] != 0 && stop_signal == 0) stop_signal = SIGTERM;
      if (o.dp.check_sync) dp->check_sync(step + 1);
    }
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double tokens = static_cast<double>(b.batch * b.seq * data.world);  // every rank's
    if (profiled) {
      ++h.profiled_steps;
      h.profiled_ms += std::chrono::duration<double, std::milli>(t1 - t_batch).count();
    } else if (step > start_step) {
      h.step_ms.push_back(ms);
      h.tokens += tokens;
      h.seconds += ms * 1e-3;
    }
    h.last_loss = loss;
    h.end_step = step + 1;
    h.steps.push_back(double(step + 1));
    h.losses.push_back(loss);
    char detail[64];
    std::snprintf(detail, sizeof detail, "loss %.4f  lr %.2e", loss, lr);
    if (progress) progress->update(step + 1, tokens, detail);

    std::string row = std::to_string(step + 1) + ',' + fmt_g(loss) + ',' + fmt_g(lr) + ',' + fmt_g(ms) + ',' +
                      fmt_g(tokens / (ms * 1e-3));
    const bool eval_now = (o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.steps;
    if (eval_now && dp && !o.dp.check_sync) dp->check_sync(step + 1);
    if (eval_now && rank0) {
      const EvalPoint p = evaluate(model, data, o, dev);
      char acc[64] = "";
      if (data.parallel) std::snprintf(acc, sizeof acc, ", valid BLEU %.2f", p.bleu);
      else std::snprintf(acc, sizeof acc, ", token accuracy %.2f%%", 100 * p.token_acc);
      spdlog::info("  eval @ step {}: held-out loss {:.4f}{}", step + 1, p.loss, acc);
      h.eval_steps.push_back(double(step + 1));
      h.eval_losses.push_back(p.loss);
      h.eval_bleu.push_back(p.bleu);
      row += ',' + fmt_g(p.loss) + ',' + (data.parallel ? std::string() : fmt_g(p.token_acc));
      if (data.parallel) row += ',' + fmt_g(p.bleu, 4);
    } else {
      row += data.parallel ? ",,," : ",,";
    }
    // The row before the checkpoint: a crash between the two leaves a log
    // that reaches past the checkpoint, which a resume cuts back.
    if (log) log->row(row);
    if (eval_now) save_checkpoint(o, model, opt, dp);
  }
  if (progress) progress->finish();
  h.graph_note = train.graph_note();
  if (h.profiled_steps > 0) h.profile = prof::entries();
  h.stop_signal = stop_signal;
  if (h.stop_signal != 0) {
    spdlog::warn("stopped by {} after step {}", h.stop_signal == SIGINT ? "SIGINT" : "SIGTERM", h.end_step);
    if (!o.checkpoint.empty()) {
      save_checkpoint(o, model, opt, dp);
      spdlog::warn("saved {} (+ .optim) at step {}; continue with --resume", o.checkpoint, h.end_step);
    }
  }
  return h;
}

// ---- 7. outputs: plot and summary --------------------------------------------------------------
void write_loss_plot(const Options& o, const History& h) {
  if (o.plot.empty()) return;
  cli::PlotSpec spec;
  spec.title = o.task == "translate" ? "train: translation of " + o.tr.pairs
               : o.data.empty()      ? "train: synthetic translation"
                                     : "train: language model on " + o.data + " (" + o.tokenizer + " tokens)";
  spec.x_label = "step";
  spec.y_label = "cross-entropy loss";
  spec.log_y = true;
  spec.series.push_back({"train loss (per step)", h.steps, h.losses, false});
  spec.series.push_back({"held-out loss", h.eval_steps, h.eval_losses, true});
  cli::write_plot(o.plot, spec);
  if (o.task == "translate") {
    cli::PlotSpec bleu;
    bleu.title = spec.title;
    bleu.x_label = "step";
    bleu.y_label = "valid BLEU";
    bleu.series.push_back(
        {"valid BLEU (" + std::string(o.tr.beam <= 1 ? "greedy" : "beam") + ")", h.eval_steps, h.eval_bleu, true});
    cli::write_plot(bleu_plot_path(o.plot), bleu);
  }
}

// --profile-steps: ms per step of each op kind (every op synchronized, so
// a kind's time is its host and device time together), and what the steps
// spent outside every op scope (module glue, zero_grad, reading the loss).
void print_profile(const History& h) {
  if (h.profiled_steps == 0) return;
  const double n = static_cast<double>(h.profiled_steps);
  std::printf("profile of %lld steps (every op synchronized), ms per step:", static_cast<long long>(h.profiled_steps));
  double in_ops = 0;
  for (const prof::Entry& e : h.profile) {
    std::printf(" %s %.3f (%.0f calls)%s", e.kind.c_str(), e.total_ms / n, static_cast<double>(e.calls) / n,
                &e == &h.profile.back() ? "" : ",");
    in_ops += e.total_ms / n;
  }
  std::printf("\n  in op scopes %.3f + outside them %.3f = %.3f ms per profiled step\n", in_ops,
              h.profiled_ms / n - in_ops, h.profiled_ms / n);
}

// The held-out metrics, for the summary and for --eval-only.
void print_held_out(const Options& o, DecoderLM& model, Data& data, Device dev) {
  if (data.lm) {
    const EvalPoint p = evaluate(model, data, o, dev);
    std::printf("held-out (last 10%% of %s, %d batches of %lld x %lld %s tokens): loss %.4f, token accuracy %.2f%%\n",
                o.data.c_str(), kLmEvalBatches, static_cast<long long>(o.batch), static_cast<long long>(o.seq_len),
                data.tokenizer.kind(), p.loss, 100 * p.token_acc);
  } else if (data.parallel) {
    translation::report_test(model, *data.parallel, o.tr, dev);
  } else {
    const TranslationScore s = evaluate_translation(model, data.task, data.held_out, dev);
    std::printf("held-out (%zu unseen sentences): loss %.4f, token accuracy %.2f%% (teacher forced)\n",
                data.held_out.size(), s.loss, 100 * s.token_acc);
    std::printf("greedy decoding: token accuracy %.2f%%, exact match %.2f%%\n", 100 * s.greedy_token_acc,
                100 * s.exact_match);
    for (const std::string& line : s.shown) std::printf("  %s\n", line.c_str());
  }
}

void print_summary(const Options& o, DecoderLM& model, Data& data, Device dev, History& h, double wall_s) {
  // Median: robust to the odd slow step on a shared machine.
  std::sort(h.step_ms.begin(), h.step_ms.end());
  const double median_ms = h.step_ms.empty() ? NAN : h.step_ms[h.step_ms.size() / 2];
  std::printf("\n==== summary ====\n");
  if (h.stop_signal != 0)
    std::printf("stopped early at step %lld of %lld (final evaluation skipped)\n", static_cast<long long>(h.end_step),
                static_cast<long long>(o.steps));
  // Translation batches are padded to their longest line: tokens/s counts
  // the padded positions processed, over the timed steps.
  const double tokens_per_s =
      data.parallel ? h.tokens / h.seconds
                    : static_cast<double>(o.batch * o.grad_accum * o.seq_len * data.world) / (median_ms * 1e-3);
  std::printf("steps %lld, wall %.1f s, %.2f ms/step (median of steps 2..N), %.0f tokens/s\n",
              static_cast<long long>(h.end_step - h.start_step), wall_s, median_ms, tokens_per_s);
  if (dev == Device::CUDA) std::printf("CUDA graph %s\n", h.graph_note.c_str());
  print_profile(h);
  std::printf("final train loss %.4f\n", h.last_loss);
  if (dev == Device::CUDA)
    std::printf("peak GPU memory %.1f MiB\n", static_cast<double>(gpu::memory_stats().peak_in_use) / (1 << 20));
  if (h.stop_signal == 0) {
    print_held_out(o, model, data, dev);
    if (data.lm) {
      Generator sample_gen(static_cast<uint64_t>(o.seed) + 5);
      const std::string& prompt = data.text.prompt;
      std::printf(
          "sample (prompt in [brackets], temperature 0.8):\n[%s]%s\n", cli::printable_text(prompt).c_str(),
          cli::printable_text(sample_text(model, data.tokenizer, prompt, o.sample_bytes, o.seq_len, dev, sample_gen))
              .c_str());
    }
  }
  std::printf("log: %s%s%s%s\n", o.log_csv.empty() ? "none" : o.log_csv.c_str(),
              o.plot.empty() ? "" : ", plot: ", o.plot.c_str(),
              o.plot.empty() || !data.parallel ? "" : (" + " + bleu_plot_path(o.plot)).c_str());
  if (!o.checkpoint.empty()) std::printf("checkpoint: %s\n", o.checkpoint.c_str());
  std::fflush(stdout);
}

// Communication of the data-parallel steps, per step of this run.
void print_comm_summary(cli::DataParallel& dp, const History& h) {
  const dist::CommStats s = dp.take_total_stats();
  const int64_t n = std::max<int64_t>(1, dp.reduced_steps());
  const double step_ms = h.seconds > 0 ? h.seconds * 1e3 / static_cast<double>(h.step_ms.size()) : NAN;
  const bool cuda = gpu::nccl::initialized();
  std::printf("communication: %.3f ms/step %s, %.3f ms/step exposed (%s), %.1f collectives/step; mean step %.2f ms\n",
              s.busy_ms / n, cuda ? "on the NCCL stream" : "in MPI calls", s.exposed_ms / n,
              cuda ? "after the backward's last kernel" : "waiting after the backward", double(s.collectives) / n,
              step_ms);
  if (cuda && s.busy_ms > 0)
    std::printf("all-reduce hidden behind the backward: %.1f%%\n", 100.0 * (1.0 - s.exposed_ms / s.busy_ms));
  std::fflush(stdout);
}

// What runs, on what: the first lines of every run.
void print_header(const Options& o, const Data& data, DecoderLM& model, Device dev, Precision precision) {
  std::string what = "synthetic translation (" + data.task.describe() + ")";
  if (data.lm)
    what = fmt::format("language model on {} ({} tokenizer, {} ids; {} training and {} held-out tokens)", o.data,
                       data.tokenizer.kind(), data.tokenizer.vocab_size(), data.text.train.size(),
                       data.text.held_out.size());
  if (data.parallel) what = "translation of " + o.tr.pairs + " (" + data.parallel->describe() + ")";
  spdlog::info("handgrad train: {}", what);
  spdlog::info("device {}{}{}, kernels {}, {} parameters (d_model {}, heads {}, layers {}, seq {}, batch {})",
               device_name(dev), dev == Device::CUDA ? " " : "", dev == Device::CUDA ? gpu::device_name() : "",
               kernel_mode_name(kernel_mode()), model.num_parameters(), o.d_model, o.heads, o.layers, o.seq_len,
               o.batch);
  spdlog::info("precision {}{}", precision_name(precision), o.tf32 ? ", tf32 GEMMs" : "");
  if (o.recompute_gelu || o.recompute_layernorm)
    spdlog::info("recomputed in the backward: {}{}{}", o.recompute_gelu ? "gelu(pre)" : "",
                 o.recompute_gelu && o.recompute_layernorm ? ", " : "",
                 o.recompute_layernorm ? "LayerNorm outputs" : "");
  if (dev == Device::CPU) spdlog::info("cpu: {} thread(s), GEMM level {}", num_threads(), cpu::gemm_level());
  if (o.grad_accum > 1) spdlog::info("gradient accumulation: {} micro-batches of {} per step", o.grad_accum, o.batch);
}

// ---- 8. the run record (CHECKPOINT.json) and --eval-only ---------------------------------------
// Flags that say how and where this invocation runs: never taken from a record.
// clang-format off
const std::set<std::string> kPerInvocation{
    "checkpoint", "resume", "eval-only", "extend-schedule", "device", "precision", "tf32", "gemm-algorithms",
    "gemm-algorithm-file", "no-graph", "fused", "unfused", "attention", "recompute-gelu", "recompute-layernorm",
    "threads", "log-level", "quiet", "print-every", "profile-steps", "ddp", "zero", "grad-dtype", "bucket-mb", "comm-timeout",
    "check-sync", "beam", "bleu-sentences", "sparse-embedding-grad", "zero-gather"};
// clang-format on
// Taken from the record when not given, but free to change: resolve_schedule
// checks the schedule's three against CHECKPOINT.schedule, and --batch is per
// rank (a checkpoint resumes on another number of ranks with the global batch
// kept: mpirun -np 2 --batch 8, then one process with --batch 16), as
// --grad-accum splits the same batch into micro-batches.
const std::set<std::string> kChangeable{"lr",         "warmup",  "steps", "batch",
                                        "grad-accum", "log-csv", "plot",  "eval-every"};

cli::RunRecord make_run_record(CLI::App& app, const Options& o, const DecoderLMConfig& cfg) {
  cli::RunRecord r;
  r.flags = cli::flag_values(app);
  r.task = o.data.empty() ? o.task : "data";
  r.tokenizer = o.data.empty() ? o.task : o.tokenizer;
  r.model = cfg;
  return r;
}

// --eval-only: the held-out metrics of the checkpoint; nothing is written.
int eval_only(const Options& o, DecoderLM& model, Data& data, Device dev, int64_t step) {
  if (dist::world().size > 1)
    usage_error("--eval-only", "", "runs in one process (not under mpirun: nothing is trained to share)");
  spdlog::info("eval-only: {} at step {} (trains nothing, writes no file)", o.checkpoint, step);
  if (data.parallel) {
    const EvalPoint p = evaluate(model, data, o, dev);
    std::printf("valid: loss %.4f, BLEU %.2f (%s)\n", p.loss, p.bleu, o.tr.beam <= 1 ? "greedy" : "beam");
  }
  print_held_out(o, model, data, dev);
  std::fflush(stdout);
  return cli::kExitOk;
}

int run(Options& o, CLI::App& app) {
  // From here on SIGINT / SIGTERM stop the run at the next check: between
  // steps, or inside the loops that build batches and replay the data.
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // --resume, --eval-only: the configuration recorded beside the checkpoint.
  const std::optional<cli::RunRecord> recorded =
      (o.resume || o.eval_only) && std::ifstream(o.checkpoint)  // else validate says why
          ? cli::take_run_record(app, o.checkpoint, kPerInvocation, kChangeable)
          : std::nullopt;
  validate(o);
  const Device dev = cli::resolve_device(o.device);
  set_kernel_mode(o.unfused ? KernelMode::Unfused : KernelMode::Fused);
  const Precision precision = o.precision == "auto" ? default_precision(dev) : parse_precision(o.precision);
  try {
    check_precision_supported(precision, dev, "train --precision");
  } catch (const Error& e) {  // a flag value this machine cannot run: a usage error
    cli::usage_error("--precision", o.precision, ": ", e.what());
  }
  set_allow_tf32(o.tf32);
  cli::apply_gemm_flags(o.gemm);
  // Data parallel (mpirun -np N, or --ddp / --zero 1 with one rank): before any GPU work.
  const dist::World& world = cli::start_world(dev, o.dp);
  const bool use_dp = world.distributed() || o.dp.force || o.dp.zero == 1;
  if (world.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 alone logs progress

  const std::unique_ptr<Data> data = build_data(o);
  const DecoderLMConfig cfg = model_config(o, *data, precision);
  if (recorded) cli::check_run_record(*recorded, make_run_record(app, o, cfg), o.checkpoint);
  if (!o.eval_only) check_memory_fits(o, cfg, dev);
  const auto model = std::make_unique<DecoderLM>(cfg);
  const int64_t model_step = o.resume || o.eval_only ? model->load(o.checkpoint) : -1;
  // The vocabulary (and shape), once: a resumed run reuses the file.
  if (!o.checkpoint.empty() && !o.resume && !o.eval_only && world.rank == 0) {
    if (data->parallel)
      translation::save_translation_info(o.checkpoint, {data->parallel->tokenizer().model_bytes(), model->config()});
    if (data->lm) data->tokenizer.save(o.checkpoint);
  }
  model->to(dev);
  print_header(o, *data, *model, dev, precision);
  if (o.eval_only) return eval_only(o, *model, *data, dev, model_step);
  AdamWOptions adam;
  adam.lr = o.lr;
  adam.weight_decay = o.weight_decay;
  adam.max_grad_norm = o.clip;  // clipped inside the optimizer's step (ZeRO-1: by the global norm)
  std::unique_ptr<cli::DataParallel> dp;
  if (use_dp)
    dp = std::make_unique<cli::DataParallel>(*model, dev, o.dp,
                                             cli::StepRows{o.batch * o.grad_accum * o.seq_len, o.grad_accum});
  const std::unique_ptr<Optimizer> opt =
      dp ? dp->make_optimizer(adam) : std::make_unique<AdamW>(model->parameters(), adam);
  TrainStepOptions step_options;
  step_options.ignore_index = kIgnore;
  step_options.data_parallel = dp.get();
  step_options.use_graph = !o.no_graph;
  step_options.grad_accum = o.grad_accum;
  TrainStep step(*model, *opt, step_options);
  const int64_t start_step = maybe_resume(o, model_step, *opt, *data);
  o.schedule = resolve_schedule(o, start_step);
  if (!o.checkpoint.empty() && world.rank == 0) cli::save_schedule(o.checkpoint, o.schedule);
  o.record = make_run_record(app, o, cfg);
  if (dp) dp->check_sync(start_step);  // same seed or same checkpoint: identical on every rank

  if (o.resume) spdlog::info("resumed from {} (+ .optim) at step {}", o.checkpoint, start_step);
  if (dp)
    spdlog::info("data parallel: {}; global batch {} = {} x {}", dp->describe(), o.batch * o.grad_accum * world.size,
                 world.size, o.batch * o.grad_accum);
  if (dev == Device::CUDA) spdlog::info("CUDA graph {}", step.graph_note());

  const auto run_start = std::chrono::steady_clock::now();
  History history = train_loop(o, *model, *opt, step, *data, dev, start_step, dp.get());
  if (dp) dp->settle();  // the model is read below (summary) with its final values
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();

  // A plot that cannot be written is an error (exit 1), but the summary of
  // the run still comes first.
  if (world.rank != 0) return history.stop_signal != 0 ? 128 + history.stop_signal : cli::kExitOk;
  bool plot_failed = false;
  try {
    write_loss_plot(o, history);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    plot_failed = true;
    o.plot.clear();
  }
  print_summary(o, *model, *data, dev, history, wall_s);
  if (dp) print_comm_summary(*dp, history);
  if (history.stop_signal != 0) return 128 + history.stop_signal;
  return plot_failed ? cli::kExitRuntime : cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"train: trains a handgrad DecoderLM (built-in synthetic translation task, or --data FILE)", "train"};
  add_flags(app, o);
  const int code = cli::run_program(app, o.common, argc, argv, [&] {
    try {
      return run(o, app);
    } catch (const Stopped& s) {  // before the first step: nothing to save
      spdlog::warn("stopped by {} before training started", s.signal == SIGINT ? "SIGINT" : "SIGTERM");
      return 128 + s.signal;
    }
  });
  // A rank that failed takes every rank down (its message is out): no rank
  // waits forever in a collective this one will never join.
  if (dist::world().distributed() && code != cli::kExitOk && code < 128) dist::abort_world("train", "", code);
  dist::finalize_world();
  return code;
}
