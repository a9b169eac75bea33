// train: trains a handgrad DecoderLM, the project's main job.
//
//   train                      built-in synthetic translation task (no download)
//   train --data FILE          byte-level language model on any text file
//
// Every flag: train --help. Same seed, same device, same mode -> the same
// loss curve. --unfused swaps every fused kernel for its primitive version.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/logging.hpp"
#include "core/math_mode.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "core/profiler.hpp"
#include "core/tensor.hpp"
#include "examples/png_plot.hpp"
#include "examples/translation_task.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"

using namespace hg;
using hg::examples::Batch;
using hg::examples::Example;
using hg::examples::kIgnore;
using hg::examples::TranslationTask;

namespace {

struct Options {
  std::string data;
  bool unfused = false;
  std::string precision = "auto";  // auto, fp32, bf16
  bool tf32 = false;
  std::string device = "auto";
  int64_t d_model = 64, heads = 4, layers = 2, seq_len = 64, batch = 32;
  double lr = 3e-3, dropout = 0.0, weight_decay = 0.01, clip = 1.0;
  int64_t steps = 1200, warmup = 60, seed = 0;
  int words = 24, min_len = 4, max_len = 10, held_out = 500;
  int64_t eval_every = 200, print_every = 0;
  int sample_bytes = 300;
  std::string checkpoint, log_csv = "train_log.csv", plot = "train_loss.png", log_level;
  bool resume = false;
};

// Linear warm-up, then cosine decay to 10% of the peak.
double learning_rate(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const double t = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t))));
}

std::vector<double> to_double(const std::vector<int32_t>& v) { return std::vector<double>(v.begin(), v.end()); }

// ---- byte-level language model data -----------------------------------------
struct TextData {
  std::string train, val;
  static TextData load(const std::string& path, int64_t seq) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("train", "cannot open --data file '", path, "'");
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    const int64_t need = 2 * (seq + 1);
    if (static_cast<int64_t>(text.size()) < need)
      fail("train", "--data file '", path, "' has ", text.size(), " bytes; seq-len ", seq, " needs at least ", need);
    // Last 10% (at least one window) held out for validation.
    const size_t val_size = std::max<size_t>(static_cast<size_t>(seq + 1), text.size() / 10);
    return {text.substr(0, text.size() - val_size), text.substr(text.size() - val_size)};
  }
};

Batch text_batch(const std::string& text, int64_t b, int64_t seq, Generator& g) {
  Batch out;
  out.batch = b;
  out.seq = seq;
  const uint64_t starts = text.size() - static_cast<uint64_t>(seq);  // windows of seq + 1 bytes
  for (int64_t i = 0; i < b; ++i) {
    const size_t s = g.next_u64() % starts;
    for (int64_t p = 0; p < seq; ++p) {
      out.inputs.push_back(static_cast<unsigned char>(text[s + p]));
      out.targets.push_back(static_cast<unsigned char>(text[s + p + 1]));
    }
  }
  return out;
}

// ---- the training step -----------------------------------------------------------
struct Trainer {
  DecoderLM& model;
  Optimizer& opt;
  Device device;
  double clip;

  // One step; returns the loss (reading it synchronizes the device).
  double step(const Batch& b) {
    const Tensor ids = Tensor::from_vector(b.inputs, {b.batch, b.seq}, DType::F32, device);
    const Tensor targets = Tensor::from_vector(b.targets, {b.batch, b.seq}, DType::F32, device);
    model.zero_grad();
    const Tensor logits = model.forward(ids);
    CrossEntropySaved saved;
    Tensor loss;
    {
      HG_PROFILE("cross_entropy", device);
      loss = cross_entropy_forward(logits, targets, kIgnore, &saved);
    }
    Tensor dlogits;
    {
      HG_PROFILE("cross_entropy", device);
      dlogits = cross_entropy_backward(saved);
    }
    model.backward(dlogits);
    {
      HG_PROFILE("optimizer", device);
      if (clip > 0) clip_grad_norm(model.parameters(), clip);
      opt.step();
    }
    return loss.item();
  }
};

// Logits of a batch in eval mode, on the host: (B, T, V) row-major.
std::vector<double> eval_logits(DecoderLM& model, const std::vector<double>& inputs, int64_t b, int64_t t, Device dev) {
  model.eval();
  const Tensor logits = model.forward(Tensor::from_vector(inputs, {b, t}, DType::F32, dev));
  model.train();
  return logits.to_vector();
}

int32_t argmax_row(const double* row, int64_t v) {
  return static_cast<int32_t>(std::max_element(row, row + v) - row);
}

// ---- translation metrics -----------------------------------------------------------
struct TranslationScore {
  double loss = 0, token_acc = 0;       // teacher forced, on held-out target positions
  double greedy_token_acc = 0, exact_match = 0;  // free-running greedy decoding
  std::vector<std::string> shown;       // a few decoded examples
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
TranslationScore evaluate_translation(DecoderLM& model, const TranslationTask& task, const std::vector<Example>& held_out,
                                      Device dev) {
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

// ---- byte LM sample ---------------------------------------------------------------------
std::string sample_text(DecoderLM& model, const std::string& prompt, int n, int64_t max_seq, Device dev, Generator& g,
                        double temperature = 0.8) {
  std::vector<int32_t> tokens;
  for (unsigned char c : prompt) tokens.push_back(c);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int64_t t = std::min<int64_t>(max_seq, static_cast<int64_t>(tokens.size()));
    const std::vector<int32_t> ctx(tokens.end() - t, tokens.end());
    const std::vector<double> logits = eval_logits(model, to_double(ctx), 1, t, dev);
    const double* row = &logits[(t - 1) * 256];
    const double m = *std::max_element(row, row + 256);
    std::vector<double> p(256);
    double s = 0;
    for (int j = 0; j < 256; ++j) s += p[j] = std::exp((row[j] - m) / temperature);
    double u = g.uniform() * s;
    int pick = 255;
    for (int j = 0; j < 256; ++j) {
      if ((u -= p[j]) < 0) { pick = j; break; }
    }
    tokens.push_back(pick);
    out.push_back(static_cast<char>(pick));
  }
  return out;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += (c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? std::string(1, c) : std::string("?");
  return out;
}

void progress(bool tty, int64_t step, int64_t steps, double loss, double ms, double tok_s, double lr) {
  const int width = 24;
  const int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(1, steps));
  std::printf("%s[%s%s] step %5lld/%lld  loss %.4f  %7.1f ms/step  %9.0f tok/s  lr %.2e%s", tty ? "\r" : "",
              std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
              static_cast<long long>(step + 1), static_cast<long long>(steps), loss, ms, tok_s, lr, tty ? "" : "\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"train: trains a handgrad DecoderLM (built-in synthetic translation task, or --data FILE)"};
  bool fused_flag = false;
  app.add_option("--data", o.data, "train a byte-level LM on this text file instead of the translation task");
  auto* f_fused = app.add_flag("--fused", fused_flag, "fused kernels (default)");
  app.add_flag("--unfused", o.unfused, "kernels composed from primitive map/zip/reduce passes")->excludes(f_fused);
  app.add_option("--device", o.device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--d-model", o.d_model, "model width")->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")->capture_default_str();
  app.add_option("--layers", o.layers, "transformer layers")->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "sequence length (--data mode; the task sets its own)")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  app.add_option("--lr", o.lr, "peak AdamW learning rate")->capture_default_str();
  app.add_option("--steps", o.steps, "total training steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str();
  app.add_option("--seed", o.seed, "seed for init, data and dropout")->capture_default_str();
  app.add_option("--words", o.words, "task: vocabulary size of each language")->capture_default_str();
  app.add_option("--min-len", o.min_len, "task: shortest sentence")->capture_default_str();
  app.add_option("--max-len", o.max_len, "task: longest sentence")->capture_default_str();
  app.add_option("--held-out", o.held_out, "task: held-out sentences for the metrics")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between held-out evaluations (0: only at the end)")
      ->capture_default_str();
  app.add_option("--print-every", o.print_every, "steps between progress lines when not a terminal (0: auto)");
  app.add_option("--checkpoint", o.checkpoint, "save the model here (and the optimizer state to PATH.optim) at each evaluation and at the end");
  app.add_flag("--resume", o.resume, "load --checkpoint and PATH.optim and continue from the saved step");
  app.add_option("--log-csv", o.log_csv, "per-step CSV log")->capture_default_str();
  app.add_option("--plot", o.plot, "PNG loss curve")->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error, off");
  app.add_option("--precision", o.precision, "auto (bf16 on GPUs with sm_80+, fp32 on the CPU), fp32, bf16 (CUDA)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--tf32", o.tf32, "let fp32 GEMMs use TF32 tensor cores (off: exact FP32)");
  CLI11_PARSE(app, argc, argv);

  try {
    init_logging(o.log_level);
    HG_CHECK(o.steps > 0 && o.batch > 0 && o.seq_len > 1 && o.lr > 0 && o.warmup >= 0, "train",
             "need steps > 0, batch > 0, seq-len > 1, lr > 0, warmup >= 0");
    HG_CHECK(o.words >= 1 && o.min_len >= 1 && o.max_len >= o.min_len, "train", "bad task sizes: words ", o.words,
             " min-len ", o.min_len, " max-len ", o.max_len);
    HG_CHECK(!o.resume || !o.checkpoint.empty(), "train", "--resume needs --checkpoint PATH");
    const Device dev = o.device == "cuda" ? Device::CUDA
                       : o.device == "cpu" ? Device::CPU
                                           : (cuda_available() ? Device::CUDA : Device::CPU);
    HG_CHECK(dev == Device::CPU || cuda_available(), "train", "--device cuda but no CUDA GPU is available");
    set_kernel_mode(o.unfused ? KernelMode::Unfused : KernelMode::Fused);
    const Precision precision = o.precision == "auto" ? default_precision(dev) : parse_precision(o.precision);
    check_precision_supported(precision, dev, "train --precision");
    if (o.tf32) set_allow_tf32(true);

    // ---- data ----
    const bool lm = !o.data.empty();
    TranslationTask task(o.words, o.min_len, o.max_len);
    TextData text;
    std::vector<Example> held_out;
    Generator data_gen(static_cast<uint64_t>(o.seed) * 1000003 + 17);
    if (lm) {
      text = TextData::load(o.data, o.seq_len);
    } else {
      Generator held_gen(99);  // the held-out set does not depend on --seed
      held_out = task.make_held_out(o.held_out, held_gen);
      o.seq_len = task.seq_len();
    }
    auto next_batch = [&]() {
      if (lm) return text_batch(text.train, o.batch, o.seq_len, data_gen);
      std::vector<Example> ex;
      for (int64_t i = 0; i < o.batch; ++i) ex.push_back(task.train_sample(data_gen));
      return task.make_batch(ex);
    };

    // ---- model ----
    DecoderLMConfig cfg;
    cfg.vocab_size = lm ? 256 : task.vocab_size();
    cfg.max_seq_len = o.seq_len;
    cfg.d_model = o.d_model;
    cfg.n_heads = o.heads;
    cfg.n_layers = o.layers;
    cfg.dropout = o.dropout;
    cfg.seed = static_cast<uint64_t>(o.seed);
    cfg.precision = precision;
    DecoderLM model(cfg);
    if (o.resume) model.load(o.checkpoint);
    model.to(dev);
    AdamWOptions adam;
    adam.lr = o.lr;
    adam.weight_decay = o.weight_decay;
    AdamW opt(model.parameters(), adam);
    int64_t start_step = 0;
    if (o.resume) {
      // Moments and step count: the resumed run continues the same trajectory.
      opt.load_state(o.checkpoint + ".optim");
      start_step = opt.steps();
      // Replay the data stream so a resumed run sees the batches it would have seen.
      for (int64_t s = 0; s < start_step; ++s) next_batch();
    }
    Trainer trainer{model, opt, dev, o.clip};

    std::printf("handgrad train: %s\n", lm ? ("byte-level LM on " + o.data).c_str() : ("synthetic translation (" + task.describe() + ")").c_str());
    std::printf("device %s%s%s, kernels %s, %lld parameters (d_model %lld, heads %lld, layers %lld, seq %lld, batch %lld)\n",
                device_name(dev), dev == Device::CUDA ? " " : "", dev == Device::CUDA ? gpu::device_name() : "",
                kernel_mode_name(kernel_mode()), static_cast<long long>(model.num_parameters()),
                static_cast<long long>(o.d_model), static_cast<long long>(o.heads), static_cast<long long>(o.layers),
                static_cast<long long>(o.seq_len), static_cast<long long>(o.batch));
    std::printf("precision %s%s\n", precision_name(precision), o.tf32 ? ", tf32 GEMMs" : "");
    if (o.resume) std::printf("resumed from %s (+ .optim) at step %lld\n", o.checkpoint.c_str(), static_cast<long long>(start_step));

    std::ofstream csv(o.log_csv, o.resume ? std::ios::app : std::ios::trunc);
    csv.precision(9);
    if (!o.resume) csv << "step,loss,lr,ms,tokens_per_s,eval_loss,eval_token_acc\n";
    const bool tty = isatty(fileno(stdout));
    const int64_t print_every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 20);
    std::vector<double> xs, losses, eval_xs, eval_losses;
    std::vector<double> step_ms;  // steps after the first (which pays one-time costs)
    double last_loss = NAN;
    const auto save_checkpoint = [&] {
      if (o.checkpoint.empty()) return;
      // Each file is written atomically (temp + rename); the step count lives in the optimizer state.
      model.save(o.checkpoint);
      opt.save_state(o.checkpoint + ".optim");
    };
    auto evaluate = [&](int64_t step_done) {
      double eval_loss = 0, acc = 0;
      if (lm) {
        Generator val_gen(4242);
        double sum = 0;
        for (int k = 0; k < 4; ++k) {
          const Batch b = text_batch(text.val, o.batch, o.seq_len, val_gen);
          model.eval();
          const Tensor logits = model.forward(Tensor::from_vector(b.inputs, {b.batch, b.seq}, DType::F32, dev));
          model.train();
          sum += cross_entropy_forward(logits, Tensor::from_vector(b.targets, {b.batch, b.seq}, DType::F32, dev), kIgnore,
                                       nullptr).item();
        }
        eval_loss = sum / 4;
      } else {
        acc = teacher_forced(model, task, held_out, dev, &eval_loss);
      }
      if (tty) std::printf("\n");
      std::printf("  eval @ step %lld: held-out loss %.4f%s\n", static_cast<long long>(step_done), eval_loss,
                  lm ? "" : (", token accuracy " + std::to_string(100 * acc).substr(0, 5) + "%").c_str());
      eval_xs.push_back(static_cast<double>(step_done));
      eval_losses.push_back(eval_loss);
      save_checkpoint();
      return std::make_pair(eval_loss, acc);
    };

    const auto run_start = std::chrono::steady_clock::now();
    for (int64_t step = start_step; step < o.steps; ++step) {
      const double lr = learning_rate(o, step);
      opt.set_lr(lr);
      const Batch b = next_batch();
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = trainer.step(b);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      HG_CHECK(std::isfinite(loss), "train", "loss became ", loss, " at step ", step + 1);
      if (step > start_step) step_ms.push_back(ms);
      last_loss = loss;
      const double tok_s = static_cast<double>(b.batch * b.seq) / (ms * 1e-3);
      xs.push_back(static_cast<double>(step + 1));
      losses.push_back(loss);
      csv << step + 1 << ',' << loss << ',' << lr << ',' << ms << ',' << tok_s;
      const bool eval_now = (o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.steps;
      if (tty || (step + 1) % print_every == 0 || step + 1 == o.steps) progress(tty, step, o.steps, loss, ms, tok_s, lr);
      if (eval_now) {
        const auto [el, acc] = evaluate(step + 1);
        csv << ',' << el << ',' << (lm ? std::string() : std::to_string(acc));
      } else {
        csv << ",,";
      }
      csv << '\n';
    }
    csv.flush();
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    // Median: robust to the odd slow step on a shared machine.
    std::sort(step_ms.begin(), step_ms.end());
    const double avg_ms = step_ms.empty() ? NAN : step_ms[step_ms.size() / 2];

    if (!o.plot.empty()) {
      plot::Series train_curve{xs, losses, {31, 119, 180}};
      plot::Series eval_curve{eval_xs, eval_losses, {214, 39, 40}};
      if (!plot::line_plot(o.plot, {train_curve, eval_curve}, /*log_y=*/true)) spdlog::warn("could not write {}", o.plot);
    }

    std::printf("\n==== summary ====\n");
    std::printf("steps %lld, wall %.1f s, %.2f ms/step (median of steps 2..N), %.0f tokens/s\n",
                static_cast<long long>(o.steps - start_step), wall_s, avg_ms,
                static_cast<double>(o.batch * o.seq_len) / (avg_ms * 1e-3));
    std::printf("final train loss %.4f\n", last_loss);
    if (dev == Device::CUDA)
      std::printf("peak GPU memory %.1f MiB\n", static_cast<double>(gpu::memory_stats().peak_in_use) / (1 << 20));
    if (lm) {
      Generator sample_gen(static_cast<uint64_t>(o.seed) + 5);
      const std::string prompt = text.val.substr(0, std::min<size_t>(32, text.val.size()));
      std::printf("sample (prompt in [brackets], temperature 0.8):\n[%s]%s\n", printable(prompt).c_str(),
                  printable(sample_text(model, prompt, o.sample_bytes, o.seq_len, dev, sample_gen)).c_str());
    } else {
      const TranslationScore s = evaluate_translation(model, task, held_out, dev);
      std::printf("held-out (%zu unseen sentences): loss %.4f, token accuracy %.2f%% (teacher forced)\n",
                  held_out.size(), s.loss, 100 * s.token_acc);
      std::printf("greedy decoding: token accuracy %.2f%%, exact match %.2f%%\n", 100 * s.greedy_token_acc,
                  100 * s.exact_match);
      for (const std::string& line : s.shown) std::printf("  %s\n", line.c_str());
    }
    std::printf("log: %s%s%s\n", o.log_csv.c_str(), o.plot.empty() ? "" : ", plot: ", o.plot.c_str());
    if (!o.checkpoint.empty()) std::printf("checkpoint: %s\n", o.checkpoint.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ntrain: error: %s\n", e.what());
    return 1;
  }
}
