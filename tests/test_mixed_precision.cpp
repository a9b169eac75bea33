// Mixed precision (docs/mixed_precision.md): the Precision policy, bf16 in
// the CUDA primitive passes, a bf16 DecoderLM against the fp32 one, and
// TrainStep (the step as one call, its non-finite stop).
//
// Bounds (and why):
// - bf16 map / zip: inputs are bf16 values; the GPU widens them to float,
//   computes in float and rounds once, so the result is the float result
//   rounded to bf16: |gpu - ref| <= 2^-8 |ref| (one bf16 ulp, round to
//   nearest is half of that; the float math adds a few float ulp) + 1e-30.
// - bf16 reduce: float accumulation of bf16 values. bf16 -> f32 Sum is the
//   f32 bound of test_cuda_backend (1e-5 * sum|x|); bf16 -> bf16 adds the
//   final rounding, 2^-8 |ref|.
// - bf16 model vs fp32 model (same weights, same batch, GPU): every
//   activation is rounded to bf16 (relative 2^-9) and every GEMM reads bf16
//   operands, so logits carry ~0.5% relative error; the mean loss agrees to
//   1e-2 relative and each parameter gradient to a relative norm of 0.1
//   (errors of a few rounding steps per layer; a wrong transpose, dtype or
//   missing term gives O(1)).
// - one AdamW step from identical weights: Adam's first update is
//   lr * g / (|g| + eps) per element, at most lr in size, so the bf16 and
//   fp32 parameters differ by at most 2 lr (plus the identical decay term).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "core/tensor_functions.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

AdamWOptions clipped() {
  AdamWOptions o;
  o.max_grad_norm = 1.0;
  return o;
}

DecoderLMConfig small_config(Precision precision) {
  DecoderLMConfig c;
  c.vocab_size = 96;
  c.max_seq_len = 24;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_layers = 2;
  c.seed = 7;
  c.precision = precision;
  return c;
}

// A (B, T) batch of token ids and next-token targets drawn from `seed`.
std::pair<Tensor, Tensor> random_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed, Device dev) {
  Generator g(seed);
  std::vector<double> ids(static_cast<size_t>(b * t)), targets(ids.size());
  for (double& v : ids) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(vocab));
  for (double& v : targets) v = static_cast<double>(g.next_u64() % static_cast<uint64_t>(vocab));
  return {Tensor::from_vector(ids, {b, t}, DType::F32, dev), Tensor::from_vector(targets, {b, t}, DType::F32, dev)};
}

double rel_norm_diff(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector(), w = want.to_vector();
  REQUIRE(g.size() == w.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// loss and every parameter gradient of one forward/backward.
struct LossAndGrads {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
};

LossAndGrads loss_and_grads(DecoderLM& model, const Tensor& ids, const Tensor& targets) {
  model.zero_grad();
  const Tensor logits = model.forward(ids);
  CrossEntropySaved saved;
  const Tensor loss = cross_entropy_forward(logits, targets, -100, &saved);
  model.backward(cross_entropy_backward(saved));
  LossAndGrads r;
  r.loss = loss.item();
  for (auto& [name, p] : model.named_parameters()) r.grads.emplace_back(name, p->grad.to(Device::CPU));
  return r;
}

}  // namespace

TEST_CASE("Precision: names parse both ways, bad names throw, the CPU defaults to and requires fp32", "[precision]") {
  CHECK(parse_precision("fp32") == Precision::FP32);
  CHECK(parse_precision("bf16") == Precision::BF16);
  CHECK(std::string(precision_name(Precision::FP32)) == "fp32");
  CHECK(std::string(precision_name(Precision::BF16)) == "bf16");
  CHECK(contains(thrown_message([&] { parse_precision("fp16"); }), "allowed: fp32, bf16"));
  CHECK(contains(thrown_message([&] { parse_precision("BF16"); }), "unknown precision 'BF16'"));
  CHECK(default_precision(Device::CPU) == Precision::FP32);
  CHECK(activation_dtype(Precision::BF16) == DType::BF16);
  CHECK_NOTHROW(check_precision_supported(Precision::FP32, Device::CPU, "test"));
  CHECK(contains(thrown_message([&] { check_precision_supported(Precision::BF16, Device::CPU, "test"); }),
                 "runs only on CUDA"));
}

TEST_CASE("bf16 arithmetic on the CPU is refused with a message naming the fix", "[precision]") {
  const Tensor a = Tensor::ones({3}, DType::BF16), b = Tensor::ones({3}, DType::BF16);
  CHECK(contains(thrown_message([&] { add(a, b); }), "bf16 arithmetic runs only on CUDA"));
  CHECK(contains(thrown_message([&] { sum(a, 0); }), "bf16 arithmetic runs only on CUDA"));
  CHECK(contains(thrown_message([&] { gelu(a); }), "bf16 arithmetic runs only on CUDA"));
}

TEST_CASE("DecoderLM and TrainStep in bf16 precision on the CPU throw instead of running", "[precision]") {
  DecoderLM model(small_config(Precision::BF16));
  const Tensor ids = random_batch(2, 8, 96, 1, Device::CPU).first;
  CHECK(contains(thrown_message([&] { model.forward(ids); }), "the CPU trains in fp32"));
  AdamW opt(model.parameters(), clipped());
  CHECK(contains(thrown_message([&] { TrainStep step(model, opt); }), "bf16 precision runs only on CUDA"));
}

TEST_CASE("TrainStep: one fp32 step equals the hand-written step bit for bit", "[precision]") {
  DecoderLM a(small_config(Precision::FP32)), b(small_config(Precision::FP32));
  AdamW opt_a(a.parameters(), clipped()), opt_b(b.parameters(), clipped());
  TrainStep step(a, opt_a);
  for (uint64_t seed : {3u, 4u}) {
    const auto batch = random_batch(3, 10, 96, seed, Device::CPU);
    const Tensor& ids = batch.first;
    const Tensor& targets = batch.second;
    const StepResult r = step.run(ids, targets);

    b.zero_grad();
    CrossEntropySaved saved;
    const double loss = cross_entropy_forward(b.forward(ids), targets, -100, &saved).item();
    b.backward(cross_entropy_backward(saved));
    opt_b.step();
    const double norm = opt_b.last_grad_norm();

    CHECK(r.step == static_cast<int64_t>(seed) - 2);
    CHECK(r.loss == loss);
    CHECK(r.grad_norm == norm);
    const auto pa = a.parameters(), pb = b.parameters();
    for (size_t i = 0; i < pa.size(); ++i) CHECK(pa[i]->value.to_vector() == pb[i]->value.to_vector());
  }
}

TEST_CASE("TrainStep: a non-finite loss stops the run naming the step; parameters stay as they were", "[precision]") {
  DecoderLM model(small_config(Precision::FP32));
  AdamW opt(model.parameters(), clipped());
  TrainStep step(model, opt);
  const auto batch = random_batch(2, 8, 96, 5, Device::CPU);
  const Tensor& ids = batch.first;
  const Tensor& targets = batch.second;
  step.run(ids, targets);  // step 1 is finite
  model.head.bias.value.set({3}, std::numeric_limits<double>::infinity());
  std::vector<std::vector<double>> before;
  for (Parameter* p : model.parameters()) before.push_back(p->value.to_vector());
  try {
    step.run(ids, targets);
    FAIL("a non-finite step did not throw");
  } catch (const NonFiniteError& e) {
    CHECK(contains(std::string(e.what()), "step 2"));
    CHECK(contains(std::string(e.what()), "parameters are unchanged"));
  }
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i]->value.to_vector() == before[i]);
  CHECK(opt.steps() == 1);
}

TEST_CASE("CUDA bf16 map / zip / reduce: f32 math on bf16 values, one rounding", "[precision][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(11);
  // Odd sizes: no vector path, ragged grid tails.
  const Tensor x32 = Tensor::randn({37, 129}, gen).to(DType::BF16).to(DType::F32);  // bf16-exact values
  const Tensor y32 = Tensor::rand({1, 129}, gen, DType::F32, Device::CPU, 0.5, 2.0).to(DType::BF16).to(DType::F32);
  const Tensor x = x32.to(DType::BF16).to(Device::CUDA), y = y32.to(DType::BF16).to(Device::CUDA);
  // |got - want| <= 2^-8 |want| + floor; the floor covers values that are
  // sums of cancelling terms (GeluGrad near its zero, row sums), where float
  // evaluation order alone moves the result by a few float ulp of the terms.
  auto check_rounded = [](const Tensor& got_bf16, const Tensor& want_f32, double floor = 1e-6) {
    REQUIRE(got_bf16.dtype() == DType::BF16);
    const auto g = got_bf16.to_vector(), w = want_f32.to_vector();
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(g[i] - w[i]) - std::ldexp(std::abs(w[i]), -8));
    CHECK(worst <= floor);
  };
  for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Gelu, UnaryOp::GeluGrad, UnaryOp::Square}) {
    INFO(unary_op_name(op));
    check_rounded(map(op, x), map(op, x32));
  }
  check_rounded(add(x, y), add(x32, y32));  // broadcast (37, 129) + (1, 129)
  check_rounded(mul(x, y), mul(x32, y32));
  check_rounded(div(x, y), div(x32, y32));

  for (int dim : {0, 1}) {
    INFO("dim " << dim);
    Shape kept = x.shape();
    kept[dim] = 1;
    Tensor s32 = Tensor::empty(kept, DType::F32, Device::CUDA);
    cuda_backend().reduce(ReduceOp::Sum, x, dim, s32);  // bf16 in, f32 out
    const Tensor want = sum(x32.to(DType::F64), dim, true);
    const Tensor abs_sum = sum(map(UnaryOp::Abs, x32.to(DType::F64)), dim, true);
    const auto g = s32.to_vector(), w = want.to_vector(), a = abs_sum.to_vector();
    for (size_t i = 0; i < g.size(); ++i) CHECK(std::abs(g[i] - w[i]) <= 1e-5 * a[i]);
    check_rounded(sum(x, dim, true), sum(x32, dim, true), 1e-5 * 129 * 4);
    CHECK(max(x, dim, true).to_vector() == max(x32, dim, true).to_vector());  // picks an element: exact
  }
  Tensor wrong = Tensor::empty({37, 1}, DType::F64, Device::CUDA);
  CHECK(contains(thrown_message([&] { cuda_backend().reduce(ReduceOp::Sum, x, 1, wrong); }), "only bf16 input"));
}

TEST_CASE("CUDA bf16 DecoderLM: loss and every gradient agree with the fp32 model (fused and unfused)",
          "[precision][cuda]") {
  HG_REQUIRE_GPU();
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    INFO(kernel_mode_name(mode));
    KernelModeScope scope(mode);
    DecoderLM f32(small_config(Precision::FP32)), b16(small_config(Precision::BF16));
    f32.to(Device::CUDA);
    b16.to(Device::CUDA);
    const auto batch = random_batch(3, 24, 96, 9, Device::CUDA);
    const Tensor& ids = batch.first;
    const Tensor& targets = batch.second;
    const LossAndGrads want = loss_and_grads(f32, ids, targets);
    const LossAndGrads got = loss_and_grads(b16, ids, targets);
    CHECK(std::abs(got.loss - want.loss) <= 1e-2 * std::abs(want.loss));
    for (size_t i = 0; i < want.grads.size(); ++i) {
      INFO(want.grads[i].first);
      CHECK(got.grads[i].second.dtype() == DType::F32);  // master gradients stay f32
      CHECK(rel_norm_diff(got.grads[i].second, want.grads[i].second) <= 0.1);
    }
  }
}

TEST_CASE("CUDA bf16 DecoderLM: the move to the GPU makes every Linear's bf16 copies in one buffer",
          "[precision][cuda]") {
  HG_REQUIRE_GPU();
  DecoderLM model(small_config(Precision::BF16));
  model.to(Device::CUDA);
  const Tensor& first = model.layers[0]->attn.qkv.weight.compute;
  REQUIRE(first.defined());
  for (Linear* l : {&model.layers[0]->attn.qkv, &model.layers[1]->ffn.fc2, &model.head})
    for (Parameter* p : {&l->weight, &l->bias}) {
      REQUIRE(p->compute.defined());
      CHECK(p->compute.dtype() == DType::BF16);
      CHECK(p->compute.shares_storage_with(first));
      CHECK(&bf16_copy(*p) == &p->compute);  // used as it is, not made again
      CHECK(p->compute.to_vector() == p->value.to(DType::BF16).to_vector());
    }
  CHECK_FALSE(model.ln_f.gamma.compute.defined());  // f32 parameters of the fused kernels have none
  CHECK_FALSE(model.embed.token.compute.defined());
}

TEST_CASE("CUDA TrainStep: one bf16 step vs one fp32 step on the same batch", "[precision][cuda]") {
  HG_REQUIRE_GPU();
  DecoderLM f32(small_config(Precision::FP32)), b16(small_config(Precision::BF16));
  f32.to(Device::CUDA);
  b16.to(Device::CUDA);
  AdamWOptions o = clipped();
  o.lr = 1e-3;
  AdamW opt32(f32.parameters(), o), opt16(b16.parameters(), o);
  TrainStep s32(f32, opt32), s16(b16, opt16);
  CHECK(s16.precision() == Precision::BF16);
  const auto batch = random_batch(4, 24, 96, 13, Device::CUDA);
  const Tensor& ids = batch.first;
  const Tensor& targets = batch.second;
  const StepResult want = s32.run(ids, targets), got = s16.run(ids, targets);
  CHECK(std::abs(got.loss - want.loss) <= 1e-2 * std::abs(want.loss));
  CHECK(std::abs(got.grad_norm - want.grad_norm) <= 0.1 * want.grad_norm);
  const auto p32 = f32.named_parameters(), p16 = b16.named_parameters();
  for (size_t i = 0; i < p32.size(); ++i) {
    INFO(p32[i].first);
    CHECK(p16[i].second->value.dtype() == DType::F32);  // master weights stay f32
    CHECK(rel_norm_diff(p16[i].second->grad, p32[i].second->grad) <= 0.1);
    CHECK(test::max_abs_diff(p16[i].second->value.to(Device::CPU), p32[i].second->value.to(Device::CPU)) <=
          2 * o.lr * 1.001);
    // The bf16 compute copy, where one exists, is the rounded master weight.
    if (p16[i].second->compute.defined())
      CHECK(p16[i].second->compute.to_vector() == p16[i].second->value.to(DType::BF16).to_vector());
  }
}
