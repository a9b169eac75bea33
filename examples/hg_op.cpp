// hg_op: runs one handgrad op forward and backward on .npy inputs and writes
// .npy outputs, so any result can be compared against NumPy or PyTorch.
//
//   hg_op layernorm --x x.npy --gamma g.npy --beta b.npy --dy dy.npy --out DIR
//                   [--eps 1e-5] [--device cpu|cuda] [--unfused]
//       writes DIR/{y, mean, rstd, dx, dgamma, dbeta}.npy
//
// Each op is one CLI11 subcommand, set up by its own add_<op>_command().
// Inputs keep the dtype of their file (float32 or float64); the op checks
// that they agree and throws hg::Error naming the shapes if not (exit 1;
// a bad command line exits 2, see examples/common/cli.hpp).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "core/kernel_mode.hpp"
#include "core/npy.hpp"
#include "core/tensor.hpp"
#include "examples/common/cli.hpp"
#include "ops/attention.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"

using namespace hg;

namespace {

// What a subcommand runs once the command line is parsed.
using Command = std::function<void()>;

// The output directory is made (and checked writable) before any work.
void prepare_output_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    cli::usage_error("--out", dir, ": cannot create the directory (", ec ? ec.message() : "a file is in the way", ")");
  if (::access(dir.c_str(), W_OK) != 0) cli::usage_error("--out", dir, ": the directory is not writable");
}

Tensor load_input(const std::string& path, Device device) { return load_npy(path).to(device); }

void write_output(const std::filesystem::path& dir, const char* name, const Tensor& t) {
  const std::filesystem::path path = dir / (std::string(name) + ".npy");
  save_npy(path.string(), t);  // throws when the write fails
  spdlog::info("  wrote {} {}", path.string(), t.describe());
}

// ---- layernorm ---------------------------------------------------------------

struct LayerNormArgs {
  std::string x, gamma, beta, dy, out;
  double eps = 1e-5;
  std::string device = "cpu";
  bool unfused = false;
};

void run_layernorm(const LayerNormArgs& a) {
  const Device device = cli::resolve_device(a.device);
  prepare_output_dir(a.out);
  const Tensor x = load_input(a.x, device);
  const Tensor gamma = load_input(a.gamma, device);
  const Tensor beta = load_input(a.beta, device);
  const Tensor dy = load_input(a.dy, device);

  KernelModeScope mode(a.unfused ? KernelMode::Unfused : KernelMode::Fused);
  LayerNormSaved saved;
  const Tensor y = layernorm_forward(x, gamma, beta, a.eps, &saved);
  const LayerNormGrads g = layernorm_backward(dy, x, gamma, saved);

  spdlog::info("hg_op layernorm: x {}, eps {}, {}, {} path", shape_str(x.shape()), a.eps, device_name(device),
               a.unfused ? "unfused" : "fused");
  write_output(a.out, "y", y);
  write_output(a.out, "mean", saved.mean);
  write_output(a.out, "rstd", saved.rstd);
  write_output(a.out, "dx", g.dx);
  write_output(a.out, "dgamma", g.dgamma);
  write_output(a.out, "dbeta", g.dbeta);
}

void add_layernorm_command(CLI::App& app, Command& command) {
  auto args = std::make_shared<LayerNormArgs>();
  CLI::App* sub = app.add_subcommand("layernorm", "LayerNorm over the last dim: y, mean, rstd, dx, dgamma, dbeta");
  sub->add_option("--x", args->x, "input x (..., D)")->required()->check(CLI::ExistingFile);
  sub->add_option("--gamma", args->gamma, "gamma (D,)")->required()->check(CLI::ExistingFile);
  sub->add_option("--beta", args->beta, "beta (D,)")->required()->check(CLI::ExistingFile);
  sub->add_option("--dy", args->dy, "upstream gradient, shaped like x")->required()->check(CLI::ExistingFile);
  sub->add_option("--out", args->out, "output directory (created if missing)")->required();
  sub->add_option("--eps", args->eps, "epsilon (finite, > 0)")->check(cli::real_range(1e-30, 1e30));
  sub->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--unfused", args->unfused, "use the unfused (primitive backend) path");
  sub->callback([args, &command] { command = [args] { run_layernorm(*args); }; });
}

// ---- softmax -------------------------------------------------------------------
//   hg_op softmax --x x.npy [--mask m.npy] [--causal] [--scale s] --dy dy.npy --out DIR
//                 [--device cpu|cuda] [--unfused] [--bf16]
//       writes DIR/{y, dx}.npy. A 4-D x is attention scores (B, H, Tq, Tk); any
//       other x takes the plain softmax over its last dim (no mask/causal/scale).

struct SoftmaxArgs {
  std::string x, mask, dy, out;
  bool causal = false;
  double scale = 1.0;
  std::string device = "cpu";
  bool unfused = false;
  bool bf16 = false;
};

void run_softmax(const SoftmaxArgs& a) {
  const Device device = cli::resolve_device(a.device);
  prepare_output_dir(a.out);
  Tensor x = load_input(a.x, device);
  Tensor dy = load_input(a.dy, device);
  if (a.bf16) {  // bf16 storage (CUDA only); the mask stays float32
    x = x.to(DType::BF16);
    dy = dy.to(DType::BF16);
  }
  SoftmaxOptions options;
  if (!a.mask.empty()) options.mask = load_input(a.mask, device);
  options.causal = a.causal;
  options.scale = a.scale;
  const bool attention = x.ndim() == 4 || options.mask.defined() || a.causal || a.scale != 1.0;

  KernelModeScope mode(a.unfused ? KernelMode::Unfused : KernelMode::Fused);
  const Tensor y = attention ? attention_softmax_forward(x, options) : softmax_forward(x);
  const Tensor dx = softmax_backward(dy, y, a.scale);

  spdlog::info("hg_op softmax: x {}{}, mask {}, causal {}, scale {}, {}, {} path", shape_str(x.shape()),
               a.bf16 ? " bf16" : "", options.mask.defined() ? shape_str(options.mask.shape()) : "none",
               a.causal ? 1 : 0, a.scale, device_name(device), a.unfused ? "unfused" : "fused");
  // .npy holds float32/float64: bf16 results are widened (exactly) to float32.
  write_output(a.out, "y", a.bf16 ? y.to(DType::F32) : y);
  write_output(a.out, "dx", a.bf16 ? dx.to(DType::F32) : dx);
}

void add_softmax_command(CLI::App& app, Command& command) {
  auto args = std::make_shared<SoftmaxArgs>();
  CLI::App* sub = app.add_subcommand("softmax", "softmax over the last dim / attention softmax: y, dx");
  sub->add_option("--x", args->x, "scores (B, H, Tq, Tk), or any tensor for the plain softmax")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--mask", args->mask, "additive mask (B, 1, 1, Tk) or (B, 1, Tq, Tk); <= -1e9 masks a key")
      ->check(CLI::ExistingFile);
  sub->add_flag("--causal", args->causal, "query q sees keys k <= q + (Tk - Tq)");
  sub->add_option("--scale", args->scale, "multiplies x before the mask (default 1)")
      ->check(cli::real_range(-1e30, 1e30));
  sub->add_option("--dy", args->dy, "upstream gradient, shaped like x")->required()->check(CLI::ExistingFile);
  sub->add_option("--out", args->out, "output directory (created if missing)")->required();
  sub->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--unfused", args->unfused, "use the unfused (primitive backend) path");
  sub->add_flag("--bf16", args->bf16, "store x, y, dy, dx as bf16 (CUDA only)");
  sub->callback([args, &command] { command = [args] { run_softmax(*args); }; });
}

// ---- attention ------------------------------------------------------------------
//   hg_op attention --q q.npy --k k.npy --v v.npy --dout do.npy [--mask m.npy] [--causal]
//                   [--scale s] --out DIR [--device cpu|cuda] [--unfused] [--bf16]
//       writes DIR/{o, lse, dq, dk, dv}.npy (ops/attention.hpp).

struct AttentionArgs {
  std::string q, k, v, dout, mask, out;
  bool causal = false;
  double scale = 0;  // 0: 1 / sqrt(dh)
  std::string device = "cpu";
  bool unfused = false;
  bool bf16 = false;
};

void run_attention(const AttentionArgs& a) {
  const Device device = cli::resolve_device(a.device);
  prepare_output_dir(a.out);
  auto input = [&](const std::string& path) {
    const Tensor t = load_input(path, device);
    return a.bf16 ? t.to(DType::BF16) : t;  // bf16 storage (CUDA only); the mask stays float32
  };
  const Tensor q = input(a.q), k = input(a.k), v = input(a.v), dout = input(a.dout);
  AttentionOptions options;
  if (!a.mask.empty()) options.mask = load_input(a.mask, device);
  options.causal = a.causal;
  if (a.scale != 0) options.scale = a.scale;

  KernelModeScope mode(a.unfused ? KernelMode::Unfused : KernelMode::Fused);
  AttentionSaved saved;
  const Tensor o = attention_forward(q, k, v, options, &saved);
  const AttentionGrads g = attention_backward(dout, saved);
  spdlog::info("hg_op attention: q {}, k {}{}, mask {}, causal {}, scale {}, {}, {} path", shape_str(q.shape()),
               shape_str(k.shape()), a.bf16 ? " bf16" : "",
               options.mask.defined() ? shape_str(options.mask.shape()) : "none", a.causal ? 1 : 0, saved.scale,
               device_name(device), a.unfused ? "unfused" : "fused");
  auto widened = [&](const Tensor& t) { return t.dtype() == DType::BF16 ? t.to(DType::F32) : t; };
  write_output(a.out, "o", widened(o));
  write_output(a.out, "lse", saved.lse);
  write_output(a.out, "dq", widened(g.dq));
  write_output(a.out, "dk", widened(g.dk));
  write_output(a.out, "dv", widened(g.dv));
}

void add_attention_command(CLI::App& app, Command& command) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* sub = app.add_subcommand("attention", "scaled dot-product attention: o, lse, dq, dk, dv");
  sub->add_option("--q", args->q, "queries (B, H, Tq, dh)")->required()->check(CLI::ExistingFile);
  sub->add_option("--k", args->k, "keys (B, H, Tk, dh)")->required()->check(CLI::ExistingFile);
  sub->add_option("--v", args->v, "values (B, H, Tk, dh)")->required()->check(CLI::ExistingFile);
  sub->add_option("--dout", args->dout, "upstream gradient, shaped like q")->required()->check(CLI::ExistingFile);
  sub->add_option("--mask", args->mask, "additive key-padding mask (B, 1, 1, Tk); <= -1e9 removes a key")
      ->check(CLI::ExistingFile);
  sub->add_flag("--causal", args->causal, "query i sees keys j <= i + (Tk - Tq)");
  sub->add_option("--scale", args->scale, "logit scale (default 1 / sqrt(dh))")->check(cli::real_range(-1e30, 1e30));
  sub->add_option("--out", args->out, "output directory (created if missing)")->required();
  sub->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--unfused", args->unfused, "GEMM + softmax + GEMM on the primitive backend");
  sub->add_flag("--bf16", args->bf16, "store q, k, v, dout and the outputs as bf16 (CUDA only)");
  sub->callback([args, &command] { command = [args] { run_attention(*args); }; });
}

// ---- further ops: add_<op>_command() above this line, one call in main() ----

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hg_op: run one handgrad op forward and backward on .npy files", "hg_op"};
  app.require_subcommand(0, 1);
  app.fallthrough();  // inherited by the ops: the common flags work after the op's name too
  cli::CommonFlags common;
  cli::add_common_flags(app, common);
  Command command;
  add_layernorm_command(app, command);
  add_softmax_command(app, command);
  add_attention_command(app, command);
  // Not inherited (set after the ops): words no op takes are kept, so the
  // message below can name them.
  app.allow_extras();
  return cli::run_program(app, common, argc, argv, [&] {
    const char* ops = "layernorm, softmax, attention";
    const std::vector<std::string> extra = app.remaining();
    if (!extra.empty() && extra[0].rfind("-", 0) == 0)
      cli::usage_error(extra[0] + ":", "unknown flag (hg_op --help, hg_op OP --help)");
    if (!extra.empty()) cli::usage_error(extra[0] + ":", "not an op (allowed: ", ops, ")");
    if (!command) cli::usage_error("hg_op", "needs an op: ", ops, " (hg_op OP --help)");
    command();
    return cli::kExitOk;
  });
}
