// Determinism: the same seed gives bitwise-identical outputs and gradients for
// every op (primitive map/zip/reduce/matmul and their backwards, layernorm,
// softmax, attention softmax, cross-entropy) and for full DecoderLM training
// steps (forward, loss, backward, AdamW), in fused and unfused mode, on CPU and
// on CUDA -- twice in one process, in other orders and counts of calls, and
// across two processes (the test re-runs its own executable in a hidden child
// mode that writes every digest to a file).
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/tensor_functions.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "tests/layernorm_outputs.hpp"
#include "tests/test_util.hpp"

using namespace hg;
namespace fs = std::filesystem;

namespace {

// name -> FNV-1a 64 of (shape, dtype, raw bytes) of one result.
using Digest = std::map<std::string, uint64_t>;

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

struct Recorder {
  Digest digest;
  void add(const std::string& name, const Tensor& t) {
    REQUIRE(digest.count(name) == 0);
    const Tensor host = t.to(Device::CPU);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t d : host.shape()) h = fnv(h, &d, sizeof d);
    const int code = static_cast<int>(host.dtype());
    h = fnv(h, &code, sizeof code);
    digest[name] = fnv(h, host.raw_data(), host.nbytes());
  }
  void add(const std::string& name, double v) { add(name, Tensor::full({}, v, DType::F64)); }
};

Tensor random_ids(const Shape& shape, int64_t vocab, Generator& g) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(static_cast<int64_t>(g.uniform() * vocab) % vocab);
  return t;
}

void primitives(Recorder& r, Device dev) {
  Generator g(101);
  const Tensor x = Tensor::randn({5, 37}, g, DType::F32, dev);
  const Tensor pos = add_scalar(map(UnaryOp::Abs, x), 0.1);
  const Tensor row = Tensor::randn({37}, g, DType::F32, dev);
  const Tensor col = Tensor::randn({5, 1}, g, DType::F32, dev);
  const Tensor dout = Tensor::randn({5, 37}, g, DType::F32, dev);

  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Square, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Gelu,
                     UnaryOp::GeluGrad, UnaryOp::Tanh, UnaryOp::Sigmoid}) {
    const Tensor out = map(op, x);
    r.add(std::string("map.") + unary_op_name(op), out);
  }
  for (UnaryOp op : {UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Reciprocal})
    r.add(std::string("map.") + unary_op_name(op), map(op, pos));
  for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::Tanh})
    r.add(std::string("map_backward.") + unary_op_name(op), map_backward(op, dout, x, map(op, x)));
  r.add("map_backward.Log", map_backward(UnaryOp::Log, dout, pos, map(UnaryOp::Log, pos)));

  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min}) {
    r.add(std::string("zip.row.") + binary_op_name(op), zip(op, x, row));
    r.add(std::string("zip.col.") + binary_op_name(op), zip(op, col, x));
  }
  const auto [da, db] = add_backward(dout, x.shape(), row.shape());
  r.add("add_backward.a", da);
  r.add("add_backward.b", db);
  const auto [ma, mb] = mul_backward(dout, x, col);
  r.add("mul_backward.a", ma);
  r.add("mul_backward.b", mb);
  const auto [qa, qb] = div_backward(dout, x, add_scalar(map(UnaryOp::Abs, col), 0.5));
  r.add("div_backward.a", qa);
  r.add("div_backward.b", qb);

  for (int dim : {0, 1, -1}) {
    for (bool keep : {false, true}) {
      const std::string tag = std::to_string(dim) + (keep ? "k" : "");
      r.add("sum." + tag, sum(x, dim, keep));
      r.add("mean." + tag, mean(x, dim, keep));
      const Tensor mx = max(x, dim, keep);
      r.add("max." + tag, mx);
      const Tensor d = Tensor::randn(mx.shape(), g, DType::F32, dev);
      r.add("sum_backward." + tag, sum_backward(d, x.shape(), dim, keep));
      r.add("mean_backward." + tag, mean_backward(d, x.shape(), dim, keep));
      r.add("max_backward." + tag, max_backward(d, x, mx, dim, keep));
    }
  }
  r.add("sum_all", sum_all(x));

  // Batched and shared-weight matmuls with every transpose; k = 67 spans several tiles.
  const Tensor a = Tensor::randn({3, 9, 67}, g, DType::F32, dev);
  const Tensor b = Tensor::randn({3, 67, 13}, g, DType::F32, dev);
  const Tensor w = Tensor::randn({13, 67}, g, DType::F32, dev);
  const Tensor d = Tensor::randn({3, 9, 13}, g, DType::F32, dev);
  r.add("matmul.batched", matmul(a, b));
  r.add("matmul.shared_bT", matmul(a, w, false, true));
  r.add("matmul.aT", matmul(transpose(a, 1, 2), b, true, false));
  const auto [ga, gb] = matmul_backward(d, a, b);
  r.add("matmul_backward.a", ga);
  r.add("matmul_backward.b", gb);
  const auto [gw_a, gw_b] = matmul_backward(d, a, w, false, true);
  r.add("matmul_backward.shared.a", gw_a);
  r.add("matmul_backward.shared.b", gw_b);
  r.add("transpose", transpose(a, 0, 2));
}

void normalisation_and_losses(Recorder& r, Device dev) {
  Generator g(202);
  // LayerNorm: D = 1000 (several CUDA blocks per row, partial dgamma sums) and D = 3.
  for (int64_t D : {int64_t{3}, int64_t{1000}}) {
    const std::string tag = "D" + std::to_string(D);
    const Tensor x = add_scalar(Tensor::randn({2, 7, D}, g, DType::F32, dev), 5.0);
    const Tensor gamma = Tensor::randn({D}, g, DType::F32, dev);
    const Tensor beta = Tensor::randn({D}, g, DType::F32, dev);
    const Tensor dy = Tensor::randn({2, 7, D}, g, DType::F32, dev);
    const hg::test::LayerNormOutputs ln = hg::test::layernorm_forward_backward(x, gamma, beta, dy, 1e-5);
    r.add("layernorm.y." + tag, ln.y);
    r.add("layernorm.mean." + tag, ln.mean);
    r.add("layernorm.rstd." + tag, ln.rstd);
    r.add("layernorm.dx." + tag, ln.dx);
    r.add("layernorm.dgamma." + tag, ln.dgamma);
    r.add("layernorm.dbeta." + tag, ln.dbeta);
  }

  const Tensor s = Tensor::randn({6, 300}, g, DType::F32, dev);
  const Tensor y = softmax_forward(s);
  r.add("softmax.y", y);
  r.add("softmax.dx", softmax_backward(Tensor::randn({6, 300}, g, DType::F32, dev), y));

  // Attention form: padding mask (one batch fully masked) + causal + scale.
  const Tensor scores = Tensor::randn({2, 3, 5, 7}, g, DType::F32, dev);
  Tensor mask = Tensor::zeros({2, 1, 1, 7});
  mask.set({0, 0, 0, 6}, -INFINITY);
  for (int64_t k = 0; k < 7; ++k) mask.set({1, 0, 0, k}, -INFINITY);
  SoftmaxOptions opt;
  opt.mask = mask.to(dev);
  opt.causal = true;
  opt.scale = 0.37;
  const Tensor p = attention_softmax_forward(scores, opt);
  r.add("attention_softmax.y", p);
  r.add("attention_softmax.dx", softmax_backward(Tensor::randn(p.shape(), g, DType::F32, dev), p, opt.scale));

  const Tensor logits = Tensor::randn({12, 257}, g, DType::F32, dev);
  Tensor targets = random_ids({12}, 257, g);
  targets.set({3}, -100);
  CrossEntropySaved saved;
  r.add("cross_entropy.loss", cross_entropy_forward(logits, targets.to(dev), -100, &saved));
  r.add("cross_entropy.dlogits", cross_entropy_backward(saved, 0.5));
}

void training_steps(Recorder& r, Device dev) {
  DecoderLMConfig c;
  c.vocab_size = 13;
  c.max_seq_len = 8;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 2;
  c.dropout = 0.1;  // the dropout masks must repeat too
  c.seed = 7;
  DecoderLM model(c);
  model.to(dev);
  AdamWOptions ao;
  ao.lr = 1e-2;
  AdamW opt(model.parameters(), ao);
  Generator g(303);
  const Tensor ids = random_ids({3, 8}, c.vocab_size, g).to(dev);
  Tensor targets = random_ids({3, 8}, c.vocab_size, g);
  targets.set({1, 4}, -100);
  targets = targets.to(dev);
  for (int step = 0; step < 2; ++step) {
    const std::string tag = "step" + std::to_string(step) + ".";
    model.zero_grad();
    const Tensor logits = model.forward(ids);
    CrossEntropySaved saved;
    r.add(tag + "logits", logits);
    r.add(tag + "loss", cross_entropy_forward(logits, targets, -100, &saved));
    r.add(tag + "dembedded", model.backward(cross_entropy_backward(saved)));
    for (auto& [name, p] : model.named_parameters()) r.add(tag + "grad." + name, p->grad);
    opt.step();
    for (auto& [name, p] : model.named_parameters()) r.add(tag + "param." + name, p->value);
  }
}

Digest run_everything(Device dev, KernelMode mode) {
  KernelModeScope scope(mode);
  Recorder r;
  primitives(r, dev);
  normalisation_and_losses(r, dev);
  training_steps(r, dev);
  return r.digest;
}

std::vector<std::pair<Device, KernelMode>> configs() {
  std::vector<std::pair<Device, KernelMode>> out = {{Device::CPU, KernelMode::Fused},
                                                    {Device::CPU, KernelMode::Unfused}};
  if (cuda_available()) {
    out.emplace_back(Device::CUDA, KernelMode::Fused);
    out.emplace_back(Device::CUDA, KernelMode::Unfused);
  }
  return out;
}

std::string config_name(Device dev, KernelMode mode) {
  return std::string(device_name(dev)) + "/" + kernel_mode_name(mode);
}

void require_equal(const Digest& a, const Digest& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  int differing = 0;
  for (const auto& [name, h] : a) {
    const auto it = b.find(name);
    INFO(what << ": " << name);
    REQUIRE(it != b.end());
    if (it->second != h) {
      ++differing;
      UNSCOPED_INFO(what << ": " << name << " differs");
    }
  }
  REQUIRE(differing == 0);
}

void check_twice_in_process(Device dev) {
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    const Digest first = run_everything(dev, mode);
    REQUIRE(first.size() > 150);  // every op above really recorded
    const Digest second = run_everything(dev, mode);
    require_equal(first, second, config_name(dev, mode));
  }
}

// One call of each op on other (odd) shapes, results dropped: between the
// sections of run B below it shifts every op's call count by one.
void one_call_each(Device dev) {
  Generator g(404);
  const Tensor x = Tensor::randn({3, 5}, g, DType::F32, dev);
  const Tensor d = Tensor::randn({3, 5}, g, DType::F32, dev);
  const Tensor gamma = Tensor::randn({5}, g, DType::F32, dev), beta = Tensor::randn({5}, g, DType::F32, dev);
  LayerNormSaved ln;
  layernorm_forward(x, gamma, beta, 1e-5, &ln);
  layernorm_backward(d, x, gamma, ln);
  softmax_backward(d, softmax_forward(x));
  const Tensor s4 = x.reshape({1, 1, 3, 5});
  attention_softmax_forward(s4, SoftmaxOptions{Tensor(), true, 0.5});
  CrossEntropySaved ce;
  cross_entropy_forward(x, Tensor::from_vector({0, 4, 2}, {3}).to(dev), -100, &ce);
  cross_entropy_backward(ce);
  matmul(x, d, false, true);
  sum(map(UnaryOp::Exp, x), 1, false);
}

// The same sections in other orders and counts, with the kernel mode
// switching between calls: run A calls each section once per mode; run B
// calls them in reverse, repeats some back to back, alternates modes and
// puts one extra call of every op between some of them. Every call of a
// section must give run A's bits. Repeating one identical sequence (above)
// cannot see state carried from one call into the next (a cache, memory
// reused without being written, a buffer that alternates) when the state
// repeats with the sequence; e.g. a result that differs on every other call
// of an op called an even number of times per sequence. Run B catches that
// (checked by planting exactly that in layernorm_forward).
void check_interleavings(Device dev) {
  using Section = void (*)(Recorder&, Device);
  const std::vector<std::pair<std::string, Section>> sections = {
      {"primitives", primitives}, {"normalisation", normalisation_and_losses}, {"training", training_steps}};
  const auto run_section = [&](size_t i, KernelMode mode) {
    KernelModeScope scope(mode);
    Recorder r;
    sections[i].second(r, dev);
    return r.digest;
  };
  const auto key = [&](size_t i, KernelMode mode) { return sections[i].first + "/" + kernel_mode_name(mode); };
  std::map<std::string, Digest> run_a;
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
    for (size_t i = 0; i < sections.size(); ++i) run_a[key(i, mode)] = run_section(i, mode);
  const KernelMode F = KernelMode::Fused, U = KernelMode::Unfused;
  const std::vector<std::pair<size_t, KernelMode>> run_b = {{2, U}, {1, F}, {1, F}, {0, U}, {2, F}, {1, U},
                                                            {0, F}, {0, F}, {2, U}, {1, F}, {2, F}};
  for (size_t k = 0; k < run_b.size(); ++k) {
    const auto [i, mode] = run_b[k];
    if (k % 3 == 1) one_call_each(dev);
    require_equal(run_a[key(i, mode)], run_section(i, mode), std::string(device_name(dev)) + " run B " + key(i, mode));
  }
}

}  // namespace

TEST_CASE("determinism: results do not depend on the calls before them (order, count, mode)", "[determinism]") {
  check_interleavings(Device::CPU);
}

TEST_CASE("determinism: CUDA results do not depend on the calls before them (order, count, mode)",
          "[determinism][cuda]") {
  HG_REQUIRE_GPU();
  check_interleavings(Device::CUDA);
}

TEST_CASE("determinism: every CPU op and training step is bitwise repeatable in one process", "[determinism]") {
  check_twice_in_process(Device::CPU);
}

TEST_CASE("determinism: every CUDA op and training step is bitwise repeatable in one process", "[determinism][cuda]") {
  HG_REQUIRE_GPU();
  check_twice_in_process(Device::CUDA);
}

// Child mode: run by the test below as a separate process; writes "config name hash" lines.
TEST_CASE("determinism child: write every digest to $HG_DETERMINISM_OUT", "[.][determinism-child]") {
  const char* out_path = std::getenv("HG_DETERMINISM_OUT");
  if (!out_path) return;
  std::ofstream out(out_path);
  for (const auto& [dev, mode] : configs())
    for (const auto& [name, h] : run_everything(dev, mode))
      out << config_name(dev, mode) << ' ' << name << ' ' << h << '\n';
  REQUIRE(out.good());
}

TEST_CASE("determinism: a second process computes bitwise-identical results (CPU, and CUDA where present)",
          "[determinism][multiprocess]") {
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const fs::path out = fs::temp_directory_path() / ("hg_determinism_" + std::to_string(::getpid()) + ".txt");
  const std::string cmd = "HG_DETERMINISM_OUT='" + out.string() + "' '" + exe.string() + "' '[determinism-child]' > '" +
                          out.string() + ".log' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);

  std::map<std::string, Digest> child;
  std::ifstream in(out);
  std::string config, name;
  uint64_t h = 0;
  while (in >> config >> name >> h) child[config][name] = h;
  fs::remove(out);
  fs::remove(out.string() + ".log");

  const auto cfgs = configs();
  REQUIRE(child.size() == cfgs.size());
  hg::test::cuda_paths_run("the cross-process determinism check");
  for (const auto& [dev, mode] : cfgs) {
    const std::string cname = config_name(dev, mode);
    require_equal(run_everything(dev, mode), child[cname], "other process, " + cname);
  }
}
