// TrainStep (models/train_step.hpp), the one training step of train,
// bench_train, bench_ddp and the Python bindings: against the step train
// wrote by hand before it (clip_grad_norm outside AdamW), with a
// data-parallel hook, with SGD, with host or device batches, its profiling
// scopes and its input checks. Graph replay vs plain steps: test_cuda_graph.cpp;
// the reducer of dist/ as the hook: test_dist.cpp.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/profiler.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "models/weight_grads_beside.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/catch.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

DecoderLMConfig tiny_config() {
  DecoderLMConfig c;
  c.vocab_size = 40;
  c.max_seq_len = 12;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.seed = 5;
  return c;
}

struct Batch {
  Tensor ids, targets;
};

// Random ids and targets with a few ignored positions, as train's
// translation batches have (the number of counted rows varies per batch).
Batch make_batch(uint64_t seed, Device dev = Device::CPU, int64_t b = 3, int64_t t = 12) {
  Generator g(seed);
  std::vector<double> ids(static_cast<size_t>(b * t)), targets(ids.size());
  for (double& v : ids) v = static_cast<double>(g.next_u64() % 40);
  for (double& v : targets) v = static_cast<double>(g.next_u64() % 40);
  for (size_t i = seed % 5; i < targets.size(); i += 7) targets[i] = -100;
  return {Tensor::from_vector(ids, {b, t}, DType::F32, dev), Tensor::from_vector(targets, {b, t}, DType::F32, dev)};
}

AdamWOptions adamw(double clip) {
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.01;
  o.max_grad_norm = clip;
  return o;
}

// The step examples/train.cpp ran before it used TrainStep: cross-entropy
// forward/backward, the global clip outside the optimizer, then AdamW.
double hand_written_step(DecoderLM& m, Optimizer& opt, const Batch& b, double clip) {
  m.zero_grad();
  CrossEntropySaved saved;
  const Tensor loss = cross_entropy_forward(m.forward(b.ids), b.targets, -100, &saved);
  m.backward(cross_entropy_backward(saved));
  if (clip > 0) clip_grad_norm(m.parameters(), clip);
  opt.step();
  return loss.item();
}

bool params_equal(DecoderLM& a, DecoderLM& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i]->value.to_vector() != pb[i]->value.to_vector()) return false;
  return true;
}

std::vector<std::vector<double>> snapshot(DecoderLM& m, bool grads) {
  std::vector<std::vector<double>> out;
  for (Parameter* p : m.parameters()) out.push_back((grads ? p->grad : p->value).to_vector());
  return out;
}

bool all_zero(const std::vector<std::vector<double>>& xs) {
  for (const auto& x : xs)
    for (double v : x)
      if (v != 0) return false;
  return true;
}

// Records the calls and what the model looked like at each of them.
struct RecordingHook : DataParallelHook {
  DecoderLM& model;
  Optimizer& opt;
  std::vector<std::string> calls;
  std::vector<double> weights;
  bool grads_zero_at_begin = true, grads_set_at_end = true, no_update_at_end = true;
  std::vector<std::vector<double>> values_at_begin;
  bool zero_the_grads = false;  // stands in for a reduction that changes the gradients

  RecordingHook(DecoderLM& m, Optimizer& o) : model(m), opt(o) {}
  void begin_step(double weight) override {
    calls.push_back("begin " + std::to_string(opt.steps()));
    weights.push_back(weight);
    grads_zero_at_begin = grads_zero_at_begin && all_zero(snapshot(model, true));
    values_at_begin = snapshot(model, false);
  }
  void end_backward() override {
    calls.push_back("end " + std::to_string(opt.steps()));
    grads_set_at_end = grads_set_at_end && !all_zero(snapshot(model, true));
    no_update_at_end = no_update_at_end && snapshot(model, false) == values_at_begin;
    if (zero_the_grads)
      for (Parameter* p : model.parameters()) p->grad.fill_(0.0);
  }
};

}  // namespace

TEST_CASE("TrainStep on the CPU: the losses of train's former hand-written step", "[train_step]") {
  // Once with no clipping in effect (clip far above the norm) and once
  // clipping at 1.0 (checked: the norms here exceed it): AdamW scales each gradient by
  // max_norm / norm inside its update, in float as clip_grad_norm's separate
  // pass did, after the same sum of squares, so the losses and parameters
  // are bitwise those of the former step.
  for (double clip : {1e6, 1.0}) {
    INFO("clip " << clip);
    DecoderLM a(tiny_config()), b(tiny_config());
    AdamW opt_a(a.parameters(), adamw(clip)), opt_b(b.parameters(), adamw(0));
    TrainStep step(a, opt_a);
    bool clipped = false;
    for (uint64_t s = 0; s < 5; ++s) {
      const Batch batch = make_batch(10 + s);
      opt_a.set_lr(1e-3 * static_cast<double>(s + 1));  // the caller's schedule
      opt_b.set_lr(1e-3 * static_cast<double>(s + 1));
      const StepResult r = step.run(batch.ids, batch.targets);
      const double want = hand_written_step(b, opt_b, batch, clip);
      CHECK(r.step == static_cast<int64_t>(s + 1));
      clipped = clipped || r.grad_norm > clip;
      CHECK(r.loss == want);
    }
    CHECK(clipped == (clip < 100));  // the second pass did clip
    CHECK(params_equal(a, b));
  }
}

TEST_CASE("TrainStep calls the data-parallel hook around the backward, before the update, with the weight",
          "[train_step]") {
  DecoderLM a(tiny_config()), b(tiny_config());
  AdamW opt_a(a.parameters(), adamw(1.0)), opt_b(b.parameters(), adamw(1.0));
  RecordingHook hook(a, opt_a);
  TrainStepOptions with_hook;
  with_hook.data_parallel = &hook;
  TrainStep sa(a, opt_a, with_hook), sb(b, opt_b);
  CHECK(contains(sa.graph_note(), "off"));
  const std::vector<double> weights = {1.0, 0.5, 0.25};
  for (size_t s = 0; s < weights.size(); ++s) {
    const Batch batch = make_batch(20 + s);
    const StepResult ra = sa.run(batch.ids, batch.targets, weights[s]);
    const StepResult rb = sb.run(batch.ids, batch.targets);
    // A hook that reduces nothing leaves the step exactly the plain one.
    CHECK(ra.loss == rb.loss);
    CHECK(ra.grad_norm == rb.grad_norm);
  }
  CHECK(params_equal(a, b));
  CHECK(hook.calls == std::vector<std::string>{"begin 0", "end 0", "begin 1", "end 1", "begin 2", "end 2"});
  CHECK(hook.weights == weights);
  CHECK(hook.grads_zero_at_begin);  // zero_grad ran before begin_step
  CHECK(hook.grads_set_at_end);     // the backward ran before end_backward
  CHECK(hook.no_update_at_end);     // and the optimizer after it

  // The optimizer reads the gradients as the hook left them: zeroed ones
  // give a zero norm and (no weight decay) no update.
  AdamWOptions no_decay = adamw(1.0);
  no_decay.weight_decay = 0;
  AdamW opt_c(a.parameters(), no_decay);
  RecordingHook zeroing(a, opt_c);
  zeroing.zero_the_grads = true;
  TrainStepOptions zeroing_options;
  zeroing_options.data_parallel = &zeroing;
  TrainStep sc(a, opt_c, zeroing_options);
  const auto before = snapshot(a, false);
  const StepResult r = sc.run(make_batch(30).ids, make_batch(30).targets);
  CHECK(r.grad_norm == 0);
  CHECK(snapshot(a, false) == before);
}

TEST_CASE("TrainStep with SGD: the hand-written SGD step bit for bit; no gradient norm measured", "[train_step]") {
  DecoderLM a(tiny_config()), b(tiny_config());
  SGD opt_a(a.parameters(), SGDOptions{0.05, 0.9, 0.01}), opt_b(b.parameters(), SGDOptions{0.05, 0.9, 0.01});
  TrainStep step(a, opt_a);
  CHECK(opt_a.capturable() == false);
  for (uint64_t s = 0; s < 3; ++s) {
    const Batch batch = make_batch(40 + s);
    const StepResult r = step.run(batch.ids, batch.targets);
    CHECK(r.loss == hand_written_step(b, opt_b, batch, 0));
    CHECK(std::isnan(r.grad_norm));
  }
  CHECK(params_equal(a, b));
  CHECK(opt_a.steps() == 3);
}

TEST_CASE("TrainStep: StepResult::step and the non-finite message continue the optimizer's count", "[train_step]") {
  DecoderLM m(tiny_config());
  AdamW opt(m.parameters(), adamw(1.0));
  const Batch batch = make_batch(50);
  {
    TrainStep first(m, opt);
    first.run(batch.ids, batch.targets);
    first.run(batch.ids, batch.targets);
  }
  TrainStep resumed(m, opt);  // as after --resume: a new step, the optimizer at step 2
  CHECK(resumed.run(batch.ids, batch.targets).step == 3);
  m.head.bias.value.set({1}, std::nan(""));
  const std::string message = thrown_message([&] { resumed.run(batch.ids, batch.targets); });
  CHECK(contains(message, "step 4: loss nan"));
  CHECK(contains(message, "parameters are unchanged"));
  CHECK(opt.steps() == 3);
}

TEST_CASE("TrainStep: profiling scopes of the step (optimizer, and the classifier or cross_entropy)", "[train_step]") {
  // Fused mode runs the chunked classifier (its GEMMs and row pass one
  // kind); without it the head is a Linear and the loss cross_entropy.
  for (bool chunked : {true, false}) {
    INFO("chunked_classifier " << chunked);
    DecoderLM m(tiny_config());
    AdamW opt(m.parameters(), adamw(1.0));
    TrainStepOptions options;
    options.chunked_classifier = chunked;
    TrainStep step(m, opt, options);
    const Batch batch = make_batch(60);
    prof::reset();
    prof::enable(true);
    step.run(batch.ids, batch.targets);
    prof::enable(false);
    std::vector<std::string> kinds;
    for (const prof::Entry& e : prof::entries()) kinds.push_back(e.kind);
    prof::reset();
    const char* loss_kind = chunked ? "classifier" : "cross_entropy";
    const char* absent = chunked ? "cross_entropy" : "classifier";
    for (const char* kind : {"embedding", "layernorm", "linear", loss_kind, "optimizer"}) {
      INFO(kind);
      CHECK(std::find(kinds.begin(), kinds.end(), kind) != kinds.end());
    }
    CHECK(std::find(kinds.begin(), kinds.end(), absent) == kinds.end());
  }
}

TEST_CASE("TrainStep: bad batches and weights are refused before anything runs", "[train_step]") {
  DecoderLM m(tiny_config());
  AdamW opt(m.parameters(), adamw(1.0));
  TrainStep step(m, opt);
  const Batch good = make_batch(70);
  CHECK(contains(thrown_message([&] { step.run(good.ids.to(DType::F64), good.targets); }),
                 "ids are Tensor(3, 12) f64 cpu; expected F32"));
  CHECK(contains(thrown_message([&] { step.run(good.ids, good.targets, 1.5); }), "weight 1.5 must be a share"));
  CHECK(contains(thrown_message([&] { step.run(good.ids, good.targets.reshape({36})); }), "must both be (B, T)"));
  const Tensor bad_targets = Tensor::full({3, 12}, 40.0, DType::F32);
  CHECK(contains(thrown_message([&] { step.run(good.ids, bad_targets); }), "target 40 at flat position 0"));
  CHECK(opt.steps() == 0);
}

// The captured step reads nothing of a batch on the host: a GPU batch is
// counted on the GPU, and only a bad one is read back to name its value.
TEST_CASE("CUDA TrainStep: a bad batch on the GPU is refused before the captured step runs", "[train_step][cuda]") {
  HG_REQUIRE_GPU();
  DecoderLM m(tiny_config());
  m.to(Device::CUDA);
  AdamW opt(m.parameters(), adamw(1.0));
  TrainStep step(m, opt);
  for (uint64_t s = 0; s < 3; ++s) {
    const Batch b = make_batch(90 + s, Device::CUDA);
    step.run(b.ids, b.targets);
  }
  REQUIRE(step.graph_active());
  const std::vector<double> before = m.parameters()[0]->value.to_vector();
  const int64_t steps = opt.steps();
  const Batch good = make_batch(95, Device::CUDA);
  auto with = [](const Tensor& t, int64_t at, double value) {
    std::vector<double> v = t.to_vector();
    v[static_cast<size_t>(at)] = value;
    return Tensor::from_vector(v, t.shape(), DType::F32, Device::CUDA);
  };
  CHECK(contains(thrown_message([&] { step.run(with(good.ids, 5, 40), good.targets); }),
                 "id 40 at flat position 5 of ids (3, 12) is not an integer in [0, 40)"));
  CHECK(contains(thrown_message([&] { step.run(with(good.ids, 7, 2.5), good.targets); }), "id 2.5 at flat position 7"));
  CHECK(contains(thrown_message([&] { step.run(good.ids, with(good.targets, 9, -1)); }),
                 "target -1 at flat position 9 is neither a class in [0, 40) nor ignore_index -100"));
  CHECK(opt.steps() == steps);
  CHECK(m.parameters()[0]->value.to_vector() == before);
  step.run(good.ids, good.targets);  // a good batch still replays the graph
  CHECK(opt.steps() == steps + 1);
  CHECK(step.graph_active());
}

TEST_CASE("CUDA TrainStep: host batches equal device batches; another shape runs plain, bitwise",
          "[train_step][cuda]") {
  HG_REQUIRE_GPU();
  DecoderLM a(tiny_config()), b(tiny_config());
  a.to(Device::CUDA);
  b.to(Device::CUDA);
  AdamW oa(a.parameters(), adamw(1.0)), ob(b.parameters(), adamw(1.0));
  TrainStepOptions plain;
  plain.use_graph = false;
  TrainStep sa(a, oa), sb(b, ob, plain);  // sa: host batches, graph on; sb: device batches, plain
  for (uint64_t s = 0; s < 7; ++s) {
    // Step 6 has a shorter sequence: the captured graph cannot replay it.
    const int64_t t = s == 5 ? 8 : 12;
    const Batch host = make_batch(80 + s, Device::CPU, 3, t), dev = make_batch(80 + s, Device::CUDA, 3, t);
    const StepResult ra = sa.run(host.ids, host.targets), rb = sb.run(dev.ids, dev.targets);
    CHECK(ra.loss == rb.loss);
    CHECK(ra.grad_norm == rb.grad_norm);
  }
  INFO(sa.graph_note());
  CHECK(sa.graph_active());
  CHECK(contains(sa.graph_note(), "for batches of shape (3, 12)"));
  CHECK(params_equal(a, b));
}

TEST_CASE("WeightGradsBeside: one scope at a time; without one, run() leaves the work to the caller", "[train_step]") {
  bool ran = false;
  CHECK_FALSE(WeightGradsBeside::run([&] { ran = true; }, {}));
  CHECK_FALSE(ran);
  {
    WeightGradsBeside scope;
    CHECK(contains(thrown_message([] { WeightGradsBeside second; }), "another scope is open"));
    scope.finish();  // nothing queued: a no-op
  }
  WeightGradsBeside again;  // the first one closed
}

TEST_CASE("CUDA WeightGradsBeside: the operands of queued work stay alive until it is joined", "[train_step][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(7);
  const int64_t n = 4096;
  const Tensor b = Tensor::randn({n, n}, gen, DType::BF16, Device::CUDA);
  Tensor want = Tensor::zeros({n, n}, DType::F32, Device::CUDA), got = want.clone();
  GemmArgs add;
  add.accumulate = true;
  constexpr int kProducts = 8;  // ~1.5 ms of work beside: the handgrad stream runs ahead meanwhile
  WeightGradsBeside scope;
  const void* a_memory = nullptr;
  {
    const Tensor a = Tensor::randn({n, n}, gen, DType::BF16, Device::CUDA);
    a_memory = a.raw_data();
    for (int i = 0; i < kProducts; ++i) cuda_backend().gemm(a, b, want, add);  // in line, for reference
    REQUIRE(WeightGradsBeside::run(
        [&] {
          for (int i = 0; i < kProducts; ++i) cuda_backend().gemm(a, b, got, add);
        },
        {a}));
  }  // the caller's handle of a is gone: only the scope keeps its memory from the allocator
  // Tensors of a's size, all alive at once, so every free block that could
  // serve them is taken: a's among them, were it free, zeroed under the GEMMs.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) {
    others.push_back(Tensor::zeros({n, n}, DType::BF16, Device::CUDA));
    CHECK(others.back().raw_data() != a_memory);  // not handed out before the join
  }
  scope.finish();
  CHECK(hg::test::max_abs_diff(got, want) == 0.0);
}

// Both kinds of work beside (the clearing beside the forward, the weight
// gradients beside the backward, with the recomputed inputs of their GEMMs)
// against the step with neither, as bench_ddp's one-GPU step runs it.
TEST_CASE("CUDA TrainStep: the work beside the forward and backward equals it in line, bit for bit",
          "[train_step][cuda]") {
  HG_REQUIRE_GPU();
  for (const Precision precision : {Precision::FP32, Precision::BF16})
    for (const bool graph : {true, false})
      for (const int64_t accum : {int64_t(1), int64_t(3)})
        for (const bool recompute : {false, true}) {
          INFO(precision_name(precision) << (graph ? ", graph" : ", plain") << ", grad_accum " << accum
                                         << (recompute ? ", recomputed GELU and LayerNorm outputs" : ""));
          DecoderLMConfig c = tiny_config();
          c.precision = precision;
          c.recompute_gelu = c.recompute_layernorm = recompute;
          DecoderLM a(c), b(c);
          a.to(Device::CUDA);
          b.to(Device::CUDA);
          AdamW oa(a.parameters(), adamw(1.0)), ob(b.parameters(), adamw(1.0));
          TrainStepOptions beside, in_line;
          beside.use_graph = in_line.use_graph = graph;
          beside.grad_accum = in_line.grad_accum = accum;
          in_line.weight_grads_beside = false;
          in_line.clear_grads_beside = false;
          TrainStep sa(a, oa, beside), sb(b, ob, in_line);
          for (uint64_t s = 0; s < 5; ++s) {
            const Batch batch = make_batch(120 + s, Device::CUDA);
            const StepResult ra = sa.run(batch.ids, batch.targets), rb = sb.run(batch.ids, batch.targets);
            CHECK(ra.loss == rb.loss);
            CHECK(ra.grad_norm == rb.grad_norm);
          }
          CHECK(sa.graph_active() == (graph && accum == 1));
          CHECK(params_equal(a, b));
        }
}

namespace {

// Relative L2 distance of two models' parameters (all of them together).
double params_rel_diff(DecoderLM& a, DecoderLM& b) {
  double diff = 0, norm = 0;
  const auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i]->value.to_vector(), vb = pb[i]->value.to_vector();
    for (size_t k = 0; k < va.size(); ++k) {
      diff += (va[k] - vb[k]) * (va[k] - vb[k]);
      norm += vb[k] * vb[k];
    }
  }
  return std::sqrt(diff / norm);
}

// The chunked classifier against the composed head + cross-entropy, both in
// TrainStep, on `dev` in `precision`, SGD with momentum (its update is
// continuous in the gradient, so rounding differences stay rounding-sized
// over the steps; AdamW's first update is lr * sign(g) and can flip on a
// gradient that is zero up to rounding). Returns the largest relative loss
// difference over 4 steps; the parameters' relative distance lands in *params.
double chunked_vs_composed(Device dev, Precision precision, int64_t chunk_rows, double* params) {
  DecoderLMConfig c = tiny_config();
  c.precision = precision;
  DecoderLM a(c), b(c);
  a.to(dev);
  b.to(dev);
  SGD opt_a(a.parameters(), SGDOptions{0.05, 0.9, 0.01}), opt_b(b.parameters(), SGDOptions{0.05, 0.9, 0.01});
  TrainStepOptions chunked, composed;
  chunked.classifier_chunk_rows = chunk_rows;
  composed.chunked_classifier = false;
  TrainStep sa(a, opt_a, chunked), sb(b, opt_b, composed);
  double worst = 0;
  for (uint64_t s = 0; s < 4; ++s) {
    const Batch batch = make_batch(90 + s, dev);
    const StepResult ra = sa.run(batch.ids, batch.targets), rb = sb.run(batch.ids, batch.targets);
    worst = std::max(worst, std::abs(ra.loss - rb.loss) / std::abs(rb.loss));
  }
  *params = params_rel_diff(a, b);
  return worst;
}

}  // namespace

TEST_CASE("TrainStep: the chunked classifier gives the composed step's losses (CPU)", "[train_step][classifier]") {
  // 36 rows in chunks of 5 (the last holds 1): the logits of a chunk and
  // the dW / db sums over chunks round differently from the whole-batch
  // GEMMs, at float32's 1e-7 level; 1e-5 over 4 steps leaves margin and
  // fails a missing chunk, a wrong 1/n or a lost bias gradient (O(1e-2) and up).
  double params = 0;
  CHECK(chunked_vs_composed(Device::CPU, Precision::FP32, 5, &params) <= 1e-5);
  CHECK(params <= 1e-5);
  // One chunk (the default at this vocabulary) runs the composed step's
  // GEMMs and row pass on the same operands: the same bits.
  CHECK(chunked_vs_composed(Device::CPU, Precision::FP32, 0, &params) == 0.0);
  CHECK(params == 0.0);
}

TEST_CASE("TrainStep: unfused mode composes the head and cross-entropy whatever chunked_classifier says",
          "[train_step][classifier]") {
  KernelModeScope unfused(KernelMode::Unfused);
  DecoderLM a(tiny_config()), b(tiny_config());
  AdamW opt_a(a.parameters(), adamw(1.0)), opt_b(b.parameters(), adamw(1.0));
  TrainStepOptions composed;
  composed.chunked_classifier = false;
  TrainStep sa(a, opt_a), sb(b, opt_b, composed);
  prof::reset();
  prof::enable(true);
  for (uint64_t s = 0; s < 2; ++s) {
    const Batch batch = make_batch(100 + s);
    CHECK(sa.run(batch.ids, batch.targets).loss == sb.run(batch.ids, batch.targets).loss);
  }
  prof::enable(false);
  for (const prof::Entry& e : prof::entries()) CHECK(e.kind != "classifier");
  prof::reset();
  CHECK(params_equal(a, b));
}

TEST_CASE("TrainStep: a NaN reaching the chunked classifier stops the step, parameters unchanged",
          "[train_step][classifier]") {
  DecoderLM m(tiny_config());
  AdamW opt(m.parameters(), adamw(1.0));
  TrainStepOptions options;
  options.classifier_chunk_rows = 7;
  TrainStep step(m, opt, options);
  const Batch batch = make_batch(110);
  step.run(batch.ids, batch.targets);
  m.ln_f.gamma.value.set({3}, std::nan(""));  // every feature row carries it into the logits
  std::vector<Tensor> before;
  for (Parameter* p : m.parameters()) before.push_back(p->value.clone());
  CHECK(contains(thrown_message([&] { step.run(batch.ids, batch.targets); }), "step 2: loss nan"));
  const auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(hg::test::same_bytes(params[i]->value, before[i]));  // NaN too
  CHECK(contains(thrown_message([&] {
                   TrainStepOptions bad;
                   bad.classifier_chunk_rows = -1;
                   TrainStep s(m, opt, bad);
                 }),
                 "classifier_chunk_rows must be >= 0"));
}

TEST_CASE("CUDA TrainStep: the chunked classifier gives the composed step's losses (fp32, bf16)",
          "[train_step][classifier][cuda]") {
  HG_REQUIRE_GPU();
  // fp32: as on the CPU (cuBLASLt's exact-FP32 GEMMs, float row sums).
  // bf16: both forms round the logits, dlogits and GEMM outputs to bf16 the
  // same way; a chunk's GEMM may pick another algorithm than the whole
  // batch's and round a logit one bf16 ulp apart (2^-8 relative, ~0.01 in
  // a row loss, averaged over 30 counted rows): 1e-3 relative.
  double params = 0;
  CHECK(chunked_vs_composed(Device::CUDA, Precision::FP32, 5, &params) <= 1e-5);
  CHECK(params <= 1e-5);
  CHECK(chunked_vs_composed(Device::CUDA, Precision::BF16, 5, &params) <= 1e-3);
  CHECK(params <= 1e-3);
  CHECK(chunked_vs_composed(Device::CUDA, Precision::BF16, 0, &params) <= 1e-3);
  CHECK(params <= 1e-3);
}

namespace {

// B rows whose leading positions are ignored in uneven numbers (the
// synthetic task masks each sentence's source), so micro-batches of 2 rows
// count 0, 9, 19 and 7 of their 24 targets: weighting each micro-batch's
// mean loss equally, or by 1 / grad_accum twice, cannot pass for the step
// over the whole batch.
Batch uneven_batch(uint64_t seed, Device dev, int64_t b = 8, int64_t t = 12) {
  Batch batch = make_batch(seed, Device::CPU, b, t);
  std::vector<double> targets = batch.targets.to_vector();
  const int64_t ignored[] = {12, 12, 6, 9, 1, 4, 7, 10};
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t p = 0; p < t; ++p) {
      double& v = targets[static_cast<size_t>(r * t + p)];
      if (p < ignored[r % 8]) v = -100;
      else if (v == -100) v = static_cast<double>((r + p) % 40);  // make_batch's own ignored positions count here
    }
  }
  return {batch.ids.to(dev), Tensor::from_vector(targets, {b, t}, DType::F32, dev)};
}

double grads_rel_diff(DecoderLM& a, DecoderLM& b) {
  double diff = 0, norm = 0;
  const auto ga = snapshot(a, true), gb = snapshot(b, true);
  for (size_t i = 0; i < ga.size(); ++i)
    for (size_t k = 0; k < ga[i].size(); ++k) {
      diff += (ga[i][k] - gb[i][k]) * (ga[i][k] - gb[i][k]);
      norm += gb[i][k] * gb[i][k];
    }
  return std::sqrt(diff / norm);
}

struct AccumDiff {
  double grads = 0;      // step 1 (same parameters): relative L2 distance of every gradient
  double grad_norm = 0;  // step 1: relative difference of the pre-clip norms
  double loss = 0;       // largest relative loss difference over the steps
  double params = 0;     // relative distance of the parameters after the steps (meaningful with SGD, below)
  bool clipped = false;  // some step's norm exceeded the clip (so clipping ran on both)
};

// grad_accum micro-batches of 8 / grad_accum rows against one step over the
// 8 rows, 5 steps, both TrainSteps in `options` (use_graph too), AdamW
// clipping at 1.0 or SGD with momentum (sgd). Dropout 0 (tiny_config).
// AdamW's parameters are not comparable at rounding level: the key bias's
// gradient is zero in exact arithmetic (a constant added to every score of
// a query), so it is rounding noise (~1e-9), which AdamW's m / sqrt(v) turns
// into steps of up to lr in either direction; SGD's update is linear in the
// gradient and keeps the parameters within rounding.
AccumDiff accumulated_vs_whole(Device dev, Precision precision, int64_t grad_accum, TrainStepOptions options,
                               bool sgd = false, std::string* accum_graph_note = nullptr) {
  DecoderLMConfig c = tiny_config();
  c.precision = precision;
  DecoderLM a(c), b(c);
  a.to(dev);
  b.to(dev);
  std::unique_ptr<Optimizer> oa, ob;
  if (sgd) {
    oa = std::make_unique<SGD>(a.parameters(), SGDOptions{0.05, 0.9, 0.01});
    ob = std::make_unique<SGD>(b.parameters(), SGDOptions{0.05, 0.9, 0.01});
  } else {
    oa = std::make_unique<AdamW>(a.parameters(), adamw(1.0));
    ob = std::make_unique<AdamW>(b.parameters(), adamw(1.0));
  }
  TrainStepOptions accum = options;
  accum.grad_accum = grad_accum;
  TrainStep sa(a, *oa, accum), sb(b, *ob, options);
  AccumDiff d;
  for (uint64_t s = 0; s < 5; ++s) {
    const Batch batch = uneven_batch(120 + s, dev);
    const StepResult ra = sa.run(batch.ids, batch.targets), rb = sb.run(batch.ids, batch.targets);
    REQUIRE(ra.step == rb.step);
    if (s == 0) {
      d.grads = grads_rel_diff(a, b);
      d.grad_norm = sgd ? 0 : std::abs(ra.grad_norm - rb.grad_norm) / rb.grad_norm;
    }
    d.clipped = d.clipped || rb.grad_norm > 1.0;
    d.loss = std::max(d.loss, std::abs(ra.loss - rb.loss) / std::abs(rb.loss));
  }
  d.params = params_rel_diff(a, b);
  if (accum_graph_note) *accum_graph_note = sa.graph_note();
  return d;
}

}  // namespace

TEST_CASE("TrainStep gradient accumulation: 4 micro-batches of 2 = one batch of 8 (CPU, fp32, ignored targets)",
          "[train_step][grad_accum]") {
  // Each micro-batch's loss gradient is scaled by its share of the step's
  // counted targets, so every target's term weighs 1 / (all counted) as in
  // the whole batch; what differs is float32 rounding: the GEMMs sum 2 rows
  // at a time instead of 8 (dW, the classifier's dW) and the shares'
  // products round once more, ~1e-7 relative per gradient. AdamW divides by
  // sqrt(v), which moves the key bias (gradient zero up to rounding) by up to
  // lr either way, so the parameters are compared after SGD steps; the
  // losses of both optimizers stay within 1e-5 (measured: 4e-7). The planted
  // bugs seen to fail: each micro-batch weighted 1 / grad_accum (relative
  // gradient error 0.49 with 2 micro-batches) and the shares divided by
  // grad_accum again (0.5 with 2, 0.75 with 4).
  struct Form {
    const char* name;
    bool chunked;
    KernelMode mode;
  };
  for (const Form& f :
       {Form{"chunked classifier", true, KernelMode::Fused}, Form{"head + cross-entropy", false, KernelMode::Fused},
        Form{"unfused", true, KernelMode::Unfused}}) {
    INFO(f.name);
    KernelModeScope mode(f.mode);
    TrainStepOptions options;
    options.chunked_classifier = f.chunked;
    for (int64_t n : {2, 4, 8}) {
      INFO("grad_accum " << n);
      const AccumDiff d = accumulated_vs_whole(Device::CPU, Precision::FP32, n, options);
      CHECK(d.grads <= 1e-6);
      CHECK(d.grad_norm <= 1e-6);
      CHECK(d.loss <= 1e-5);
      CHECK(d.clipped);
      const AccumDiff sgd = accumulated_vs_whole(Device::CPU, Precision::FP32, n, options, true);
      CHECK(sgd.loss <= 1e-5);
      CHECK(sgd.params <= 1e-5);
    }
  }
}

TEST_CASE("TrainStep gradient accumulation: the data-parallel hook is called once a step, around the last micro-batch",
          "[train_step][grad_accum]") {
  DecoderLM a(tiny_config()), b(tiny_config());
  AdamW opt_a(a.parameters(), adamw(1.0)), opt_b(b.parameters(), adamw(1.0));
  RecordingHook hook(a, opt_a);
  TrainStepOptions with_hook, plain;
  with_hook.data_parallel = &hook;
  with_hook.grad_accum = plain.grad_accum = 4;
  TrainStep sa(a, opt_a, with_hook), sb(b, opt_b, plain);
  const std::vector<double> weights = {1.0, 0.25};
  for (size_t s = 0; s < weights.size(); ++s) {
    const Batch batch = uneven_batch(130 + s, Device::CPU);
    const StepResult ra = sa.run(batch.ids, batch.targets, weights[s]);
    const StepResult rb = sb.run(batch.ids, batch.targets);
    CHECK(ra.loss == rb.loss);  // a hook that reduces nothing changes nothing
    CHECK(ra.grad_norm == rb.grad_norm);
  }
  CHECK(params_equal(a, b));
  CHECK(hook.calls == std::vector<std::string>{"begin 0", "end 0", "begin 1", "end 1"});
  CHECK(hook.weights == weights);
  CHECK(!hook.grads_zero_at_begin);  // the earlier micro-batches' gradients are in when the reduction begins
  CHECK(hook.no_update_at_end);
}

TEST_CASE("TrainStep gradient accumulation: the loss is the mean over every counted target; all ignored gives 0",
          "[train_step][grad_accum]") {
  DecoderLM m(tiny_config());
  SGD opt(m.parameters(), SGDOptions{0.0, 0.0, 0.0});  // lr 0: the parameters stay, each step sees the same model
  TrainStepOptions accum;
  accum.grad_accum = 4;
  TrainStep step(m, opt, accum);
  const Batch batch = uneven_batch(140, Device::CPU);
  // The mean over the 8 rows' counted targets, from the composed loss of the whole batch.
  const double want = cross_entropy_forward(m.forward(batch.ids), batch.targets, -100, nullptr).item();
  CHECK(std::abs(step.run(batch.ids, batch.targets).loss - want) <= 1e-6 * want);
  const Tensor none = Tensor::full({8, 12}, -100.0, DType::F32);
  const StepResult r = step.run(batch.ids, none);
  CHECK(r.loss == 0.0);
  for (const auto& g : snapshot(m, true))
    for (double v : g) REQUIRE(v == 0.0);
}

TEST_CASE("TrainStep gradient accumulation: bad grad_accum and batches that do not split are refused",
          "[train_step][grad_accum]") {
  DecoderLM m(tiny_config());
  AdamW opt(m.parameters(), adamw(1.0));
  for (int64_t bad : {0, -1}) {
    TrainStepOptions o;
    o.grad_accum = bad;
    CHECK(contains(thrown_message([&] { TrainStep s(m, opt, o); }),
                   "grad_accum must be >= 1 (1: no accumulation), got " + std::to_string(bad)));
  }
  TrainStepOptions o;
  o.grad_accum = 2;
  TrainStep step(m, opt, o);
  const Batch three = make_batch(150);  // 3 rows
  CHECK(contains(thrown_message([&] { step.run(three.ids, three.targets); }),
                 "a batch of 3 rows does not split into 2 micro-batches of equal size"));
  o.grad_accum = 16;
  TrainStep more(m, opt, o);
  const Batch eight = uneven_batch(151, Device::CPU);  // fewer rows than micro-batches
  CHECK(contains(thrown_message([&] { more.run(eight.ids, eight.targets); }), "a batch of 8 rows does not split"));
  CHECK(opt.steps() == 0);
}

TEST_CASE("CUDA TrainStep gradient accumulation = the whole batch (fp32, bf16; the whole batch's graph replayed)",
          "[train_step][grad_accum][cuda]") {
  HG_REQUIRE_GPU();
  // fp32: as on the CPU (cuBLASLt's exact-FP32 GEMMs). The step over the
  // whole batch is captured and replayed (use_graph, no accumulation); the
  // accumulated one runs plain and says why.
  TrainStepOptions options;
  std::string note;
  const AccumDiff f32 = accumulated_vs_whole(Device::CUDA, Precision::FP32, 4, options, false, &note);
  CHECK(contains(note, "off: gradient accumulation"));
  CHECK(f32.grads <= 1e-6);
  CHECK(f32.grad_norm <= 1e-6);
  CHECK(f32.loss <= 1e-5);
  CHECK(f32.clipped);
  const AccumDiff f32_sgd = accumulated_vs_whole(Device::CUDA, Precision::FP32, 4, options, true);
  CHECK(f32_sgd.loss <= 1e-5);
  CHECK(f32_sgd.params <= 1e-5);
  // bf16 activations: a GEMM of 2 rows may pick another algorithm than one
  // of 8 and round a logit or activation one bf16 ulp apart (2^-8
  // relative), as the chunked classifier's chunks do: 1e-3 relative, SGD
  // (AdamW's first update is lr * sign(g) and can flip on a gradient that
  // is zero up to rounding). The gradients stay f32 and add in f32.
  for (bool chunked : {true, false}) {
    INFO("chunked classifier " << chunked);
    options.chunked_classifier = chunked;
    const AccumDiff bf16 = accumulated_vs_whole(Device::CUDA, Precision::BF16, 4, options, true);
    CHECK(bf16.grads <= 1e-2);
    CHECK(bf16.loss <= 1e-3);
    CHECK(bf16.params <= 1e-3);
  }
}
