// Data parallelism in one process (dist/): the bucket layout, a reduced step
// against the plain step, ZeRO-1 against AdamW and its checkpoint format,
// the collectives of one rank (NCCL on the GPU), the parameter hash. The
// several-rank behaviour runs under mpirun in tests/cli/train_ddp.sh.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.hpp"
#include "core/optim.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/collectives.hpp"
#include "dist/grad_reducer.hpp"
#include "dist/param_sync.hpp"
#include "dist/sharded_adamw.hpp"
#include "dist/world.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/catch.hpp"
#include "tests/reducer_hook.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::ReducerHook;

namespace {

std::unique_ptr<DecoderLM> tiny_model(Device dev, Precision precision = Precision::FP32) {
  DecoderLMConfig c;
  c.precision = precision;
  c.vocab_size = 37;
  c.max_seq_len = 9;
  c.d_model = 24;
  c.n_heads = 3;
  c.n_layers = 2;
  c.seed = 11;
  if (precision == Precision::BF16) {  // the width of test_train_step's bf16 cases
    c.d_model = 32;
    c.n_heads = 4;
  }
  auto m = std::make_unique<DecoderLM>(c);
  m->to(dev);
  return m;
}

struct Batch {
  Tensor ids, targets;
};

Batch batch(Device dev, uint64_t seed) {
  Generator g(seed);
  std::vector<double> ids(5 * 9), targets(5 * 9);
  for (double& v : ids) v = static_cast<double>(g.next_u64() % 37);
  for (double& v : targets) v = static_cast<double>(g.next_u64() % 37);
  targets[3] = -100;  // an ignored position
  return {Tensor::from_vector(ids, {5, 9}, DType::F32, dev), Tensor::from_vector(targets, {5, 9}, DType::F32, dev)};
}

void forward_backward(DecoderLM& m, const Batch& b) {
  m.zero_grad();
  CrossEntropySaved saved;
  cross_entropy_forward(m.forward(b.ids), b.targets, -100, &saved);
  m.backward(cross_entropy_backward(saved));
}

std::vector<Parameter*> backward_order(DecoderLM& m) {
  std::vector<Parameter*> ps = m.parameters();
  std::reverse(ps.begin(), ps.end());
  return ps;
}

void require_bitwise(DecoderLM& a, DecoderLM& b, bool grads) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].second->value.to_vector() == pb[i].second->value.to_vector());
    if (grads) REQUIRE(pa[i].second->grad.to_vector() == pb[i].second->grad.to_vector());
  }
}

// One rank: the reduced step (hook, buckets, premul 1) is the plain step, bit for bit.
void reduced_step_matches_plain(Device dev) {
  dist::init_world();
  auto plain = tiny_model(dev), ddp = tiny_model(dev);
  AdamW opt_plain(plain->parameters(), {});
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 4096;  // several buckets
  dist::GradReducer reducer(comm, backward_order(*ddp), ro);
  REQUIRE(reducer.buckets().size() > 3);
  ddp->set_grads_ready_hook([&](const std::vector<Parameter*>& ps) { reducer.grads_ready(ps); });
  AdamW opt_ddp(ddp->parameters(), {});
  for (uint64_t s = 0; s < 3; ++s) {
    const Batch b = batch(dev, s);
    forward_backward(*plain, b);
    opt_plain.step();
    reducer.begin_step(1.0);
    forward_backward(*ddp, b);
    for (const auto& bk : reducer.buckets()) REQUIRE(bk.started);  // the hook started every bucket in the backward
    reducer.finish();
    opt_ddp.step();
  }
  require_bitwise(*plain, *ddp, true);
  // premul scales the reduced gradient: 0.5 is exact.
  const Batch b = batch(dev, 9);
  forward_backward(*plain, b);
  reducer.begin_step(0.5);
  forward_backward(*ddp, b);
  reducer.finish();
  const std::vector<double> g = plain->head.weight.grad.to_vector(), h = ddp->head.weight.grad.to_vector();
  for (size_t i = 0; i < g.size(); ++i) REQUIRE(h[i] == 0.5 * g[i]);
  ddp->set_grads_ready_hook(nullptr);
}

// One rank: ZeRO-1 is AdamW (no clipping: bitwise), and its checkpoint loads into a plain AdamW.
void sharded_matches_adamw(Device dev) {
  dist::init_world();
  auto plain = tiny_model(dev), zero = tiny_model(dev);
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  AdamW opt_plain(plain->parameters(), o);
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 8192;
  ro.sharded = true;
  dist::GradReducer reducer(comm, backward_order(*zero), ro);
  dist::ShardedAdamW opt_zero(reducer, comm, zero->parameters(), o);
  zero->set_grads_ready_hook([&](const std::vector<Parameter*>& ps) { reducer.grads_ready(ps); });
  for (uint64_t s = 0; s < 3; ++s) {
    const Batch b = batch(dev, s);
    forward_backward(*plain, b);
    opt_plain.step();
    reducer.begin_step(1.0);
    forward_backward(*zero, b);
    reducer.finish();
    opt_zero.step();
  }
  require_bitwise(*plain, *zero, false);
  const std::string dir = (std::filesystem::temp_directory_path() / "hg_test_dist").string();
  std::filesystem::create_directories(dir);
  opt_zero.save_state(dir + "/zero.optim");
  opt_plain.save_state(dir + "/plain.optim");
  AdamW reread(plain->parameters(), o);
  reread.load_state(dir + "/zero.optim");  // the unsharded format
  const auto a = reread.named_state(), p = opt_plain.named_state();
  REQUIRE(reread.steps() == 3);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i].second->to_vector() == p[i].second->to_vector());
  opt_zero.load_state(dir + "/plain.optim");  // and back
  REQUIRE(opt_zero.steps() == 3);
  std::filesystem::remove_all(dir);
  zero->set_grads_ready_hook(nullptr);
}

// One rank, bf16 reduction: every reduced gradient is its weighted value
// rounded to bf16 once (and widened back), in both layouts.
void bf16_reduction_rounds_once(Device dev) {
  dist::init_world();
  dist::Collectives comm(dev);
  for (bool sharded : {false, true}) {
    Generator g(5);
    Parameter a{Tensor::zeros({300}, DType::F32, dev), Tensor::randn({300}, g, DType::F32, dev), Tensor()};
    Parameter b{Tensor::zeros({7}, DType::F32, dev), Tensor::randn({7}, g, DType::F32, dev), Tensor()};
    const std::vector<double> ga = a.grad.to_vector(), gb = b.grad.to_vector();
    dist::ReducerOptions ro;
    ro.bucket_bytes = 1024;
    ro.sharded = sharded;
    ro.grad_dtype = DType::BF16;
    dist::GradReducer reducer(comm, {&a, &b}, ro);
    REQUIRE(reducer.buckets().size() == 2);
    reducer.begin_step(0.3);
    reducer.grads_ready({&a, &b});
    reducer.finish();
    const auto rounded = [](double x) { return double(bf16_to_float(float_to_bf16(0.3f * static_cast<float>(x)))); };
    for (const auto& [p, g0] : {std::pair{&a, ga}, std::pair{&b, gb}}) {
      const dist::GradReducer::Bucket& bk = reducer.buckets()[p == &a ? 0 : 1];
      const std::vector<double> got = (sharded ? bk.shard_grads : bk.grads).to_vector();
      size_t changed = 0;
      for (size_t i = 0; i < g0.size(); ++i) {
        REQUIRE(got[i] == rounded(g0[i]));
        changed += got[i] != static_cast<double>(0.3f * static_cast<float>(g0[i]));
      }
      REQUIRE(changed > 0);  // bf16 rounding happened
    }
  }
}

// One rank through TrainStep: AdamW with the reducer as the hook (clipping
// in effect), and ZeRO-1 (a non-AdamW optimizer), each equal bit for bit to
// TrainStep's plain AdamW step. ZeRO-1 runs unclipped: it sums the squares
// over its bucket shards, in another order than AdamW over the parameters,
// so its norm (and a clip scale made from it) may differ in the last bit.
// grad_accum 5: micro-batches of one row each, the reduction once a step.
// forward_waits (ZeRO-1): the step leaves the parameter all-gathers to the
// next forward, which waits for each module's buckets (DecoderLM's
// values-needed hook): still bitwise AdamW.
void train_step_with_reducer_matches_plain(Device dev, bool sharded, int64_t grad_accum = 1,
                                           bool forward_waits = false) {
  dist::init_world();
  auto plain = tiny_model(dev), ddp = tiny_model(dev);
  AdamWOptions o;
  o.lr = 3e-3;
  o.max_grad_norm = sharded ? 0 : 0.5;
  AdamW opt_plain(plain->parameters(), o);
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 4096;
  ro.sharded = sharded;
  ro.forward_waits = forward_waits;
  dist::GradReducer reducer(comm, backward_order(*ddp), ro);
  ddp->set_grads_ready_hook([&](const std::vector<Parameter*>& ps) { reducer.grads_ready(ps); });
  if (forward_waits) ddp->set_values_needed_hook([&](Module& m) { reducer.values_needed(m.parameters()); });
  std::unique_ptr<Optimizer> opt_ddp;
  if (sharded) opt_ddp = std::make_unique<dist::ShardedAdamW>(reducer, comm, ddp->parameters(), o);
  else opt_ddp = std::make_unique<AdamW>(ddp->parameters(), o);
  ReducerHook hook(reducer);
  TrainStepOptions with_hook, alone;
  with_hook.data_parallel = &hook;
  with_hook.grad_accum = alone.grad_accum = grad_accum;
  TrainStep step_plain(*plain, opt_plain, alone), step_ddp(*ddp, *opt_ddp, with_hook);
  REQUIRE(contains(step_ddp.graph_note(), "off"));
  for (uint64_t s = 0; s < 4; ++s) {
    const Batch b = batch(dev, s);
    const StepResult rp = step_plain.run(b.ids, b.targets), rd = step_ddp.run(b.ids, b.targets, 1.0);
    REQUIRE(rp.loss == rd.loss);
    if (sharded) {
      REQUIRE(std::abs(rp.grad_norm - rd.grad_norm) <= 1e-12 * rp.grad_norm);  // f64 sums, another order
    } else {
      REQUIRE(rp.grad_norm > o.max_grad_norm);  // clipped
      REQUIRE(rp.grad_norm == rd.grad_norm);
    }
    REQUIRE(reducer.gathers_outstanding() == (forward_waits ? reducer.buckets().size() : 0));
  }
  REQUIRE(reducer.steps() == 4);  // one reduction a step, whatever grad_accum
  reducer.finish_gather();
  require_bitwise(*plain, *ddp, false);
  ddp->set_grads_ready_hook(nullptr);
  ddp->set_values_needed_hook(nullptr);
}

// One rank through TrainStep, ZeRO-1: the all-gathers waited for module by
// module in the next forward equal them waited for in the step, bit for bit
// (losses, norms, parameters). Under bf16 precision (CUDA) the GEMMs read the
// parameters' bf16 compute copies, which each bucket's wait must refresh from
// the gathered values (a stale copy changes the next loss).
void zero1_forward_waits_match_step_waits(Device dev, Precision precision) {
  dist::init_world();
  dist::Collectives comm(dev);
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  struct Run {
    std::unique_ptr<DecoderLM> model;
    std::unique_ptr<dist::GradReducer> reducer;
    std::unique_ptr<dist::ShardedAdamW> opt;
    std::unique_ptr<ReducerHook> hook;
    std::unique_ptr<TrainStep> step;
  };
  const auto make = [&](bool forward_waits) {
    Run r;
    r.model = tiny_model(dev, precision);
    dist::ReducerOptions ro;
    ro.bucket_bytes = 4096;
    ro.sharded = true;
    ro.forward_waits = forward_waits;
    r.reducer = std::make_unique<dist::GradReducer>(comm, backward_order(*r.model), ro);
    dist::GradReducer* reducer = r.reducer.get();
    r.model->set_grads_ready_hook([reducer](const std::vector<Parameter*>& ps) { reducer->grads_ready(ps); });
    if (forward_waits)
      r.model->set_values_needed_hook([reducer](Module& m) { reducer->values_needed(m.parameters()); });
    r.opt = std::make_unique<dist::ShardedAdamW>(*r.reducer, comm, r.model->parameters(), o);
    r.hook = std::make_unique<ReducerHook>(*r.reducer);
    TrainStepOptions so;
    so.data_parallel = r.hook.get();
    r.step = std::make_unique<TrainStep>(*r.model, *r.opt, so);
    return r;
  };
  Run waited = make(false), overlapped = make(true);
  for (uint64_t s = 0; s < 4; ++s) {
    const Batch b = batch(dev, s);
    const StepResult rw = waited.step->run(b.ids, b.targets), ro = overlapped.step->run(b.ids, b.targets);
    INFO("step " << s + 1);
    REQUIRE(rw.loss == ro.loss);
    REQUIRE(rw.grad_norm == ro.grad_norm);
    REQUIRE(overlapped.reducer->gathers_outstanding() == overlapped.reducer->buckets().size());
  }
  overlapped.reducer->finish_gather();
  require_bitwise(*waited.model, *overlapped.model, false);
  if (precision == Precision::BF16)
    for (Parameter* p : overlapped.model->parameters())
      if (p->compute.defined()) REQUIRE(p->compute.to_vector() == p->value.to(DType::BF16).to_vector());
  for (Run* r : {&waited, &overlapped}) {
    r->model->set_grads_ready_hook(nullptr);
    r->model->set_values_needed_hook(nullptr);
  }
}

}  // namespace

TEST_CASE("TrainStep with the reducer as its hook, one rank = TrainStep alone, bitwise (CPU; AdamW and ZeRO-1)") {
  train_step_with_reducer_matches_plain(Device::CPU, false);
  train_step_with_reducer_matches_plain(Device::CPU, true);
}

TEST_CASE("ZeRO-1 of one rank, all-gathers waited for in the next forward: = AdamW, = waited in the step (CPU)") {
  train_step_with_reducer_matches_plain(Device::CPU, true, 1, /*forward_waits=*/true);
  train_step_with_reducer_matches_plain(Device::CPU, true, 5, /*forward_waits=*/true);
  zero1_forward_waits_match_step_waits(Device::CPU, Precision::FP32);
}

TEST_CASE("[cuda] ZeRO-1 of one rank, all-gathers waited for in the next forward = waited in the step (NCCL)") {
  HG_REQUIRE_GPU();
  train_step_with_reducer_matches_plain(Device::CUDA, true, 1, /*forward_waits=*/true);
  zero1_forward_waits_match_step_waits(Device::CUDA, Precision::FP32);
  zero1_forward_waits_match_step_waits(Device::CUDA, Precision::BF16);
}

TEST_CASE("GradReducer: waiting for one bucket's all-gather refreshes that bucket's bf16 compute copies only") {
  dist::init_world();
  dist::Collectives comm(Device::CPU);
  Parameter a{Tensor::zeros({300}), Tensor::zeros({300}), Tensor()};
  Parameter b{Tensor::zeros({7}), Tensor::zeros({7}), Tensor()};
  dist::ReducerOptions ro;
  ro.bucket_bytes = 1024;
  ro.sharded = true;
  ro.forward_waits = true;
  dist::GradReducer reducer(comm, {&a, &b}, ro);
  REQUIRE(reducer.buckets().size() == 2);
  for (Parameter* p : {&a, &b}) {
    p->compute = Tensor::zeros(p->value.shape(), DType::BF16);  // a stale copy
    p->value.fill_(1.0 + std::ldexp(1.0, -9));                  // not a bf16 value: the copy rounds it
  }
  const std::vector<double> rounded(7, static_cast<double>(bf16_to_float(float_to_bf16(1.0f + 0x1p-9f))));
  reducer.start_gather(0);
  reducer.start_gather(1);
  REQUIRE_THROWS_WITH(reducer.start_gather(1), Catch::Contains("previous gather was not waited for"));
  REQUIRE(reducer.gathers_outstanding() == 2);
  reducer.values_needed({&b});
  REQUIRE(reducer.gathers_outstanding() == 1);
  REQUIRE(b.compute.to_vector() == rounded);
  REQUIRE(a.compute.to_vector() == std::vector<double>(300, 0.0));  // its bucket not waited for yet
  Parameter other{Tensor::zeros({2}), Tensor::zeros({2}), Tensor()};
  REQUIRE_THROWS_WITH(reducer.values_needed({&other}), Catch::Contains("does not hold"));
  reducer.finish_gather();
  REQUIRE(reducer.gathers_outstanding() == 0);
  REQUIRE(a.compute.to_vector() == std::vector<double>(300, rounded[0]));
  reducer.values_needed({&other});  // nothing outstanding: returns at once
  dist::ReducerOptions unsharded;
  unsharded.forward_waits = true;
  REQUIRE_THROWS_WITH(dist::GradReducer(comm, {&other}, unsharded), Catch::Contains("sharded (ZeRO-1) layout only"));
}

TEST_CASE("TrainStep with the reducer and gradient accumulation: one reduction a step, = TrainStep alone (CPU)") {
  train_step_with_reducer_matches_plain(Device::CPU, false, 5);
  train_step_with_reducer_matches_plain(Device::CPU, true, 5);
}

TEST_CASE("[cuda] TrainStep with the reducer as its hook, one rank = TrainStep alone, bitwise (AdamW and ZeRO-1)") {
  HG_REQUIRE_GPU();
  train_step_with_reducer_matches_plain(Device::CUDA, false);
  train_step_with_reducer_matches_plain(Device::CUDA, true);
  train_step_with_reducer_matches_plain(Device::CUDA, false, 5);
  train_step_with_reducer_matches_plain(Device::CUDA, true, 5);
}

TEST_CASE("GradReducer: gradients become aligned views of buckets filled in backward order") {
  dist::init_world();
  auto m = tiny_model(Device::CPU);
  for (Parameter* p : m->parameters()) p->grad.fill_(0.25);
  dist::Collectives comm(Device::CPU);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 4096;
  dist::GradReducer reducer(comm, backward_order(*m), ro);
  REQUIRE(reducer.buckets().front().params.front() == &m->head.bias);  // the head's gradients are final first
  size_t held = 0;
  for (const auto& b : reducer.buckets()) {
    REQUIRE(b.grads.numel() % 64 == 0);
    for (size_t i = 0; i < b.params.size(); ++i) {
      REQUIRE(b.offsets[i] % 64 == 0);
      REQUIRE(b.params[i]->grad.shares_storage_with(b.grads));
      REQUIRE(b.params[i]->grad.to_vector() == std::vector<double>(b.params[i]->grad.numel(), 0.25));
      // A bucket closes once over 4096 bytes: only its first parameter may exceed it alone.
      if (i > 0) REQUIRE(b.offsets[i] * 4 <= 4096);
    }
    held += b.params.size();
  }
  REQUIRE(held == m->parameters().size());
}

TEST_CASE("GradReducer: bad parameters and misuse are errors") {
  dist::init_world();
  dist::Collectives comm(Device::CPU);
  Parameter f64{Tensor::zeros({3}, DType::F64), Tensor::zeros({3}, DType::F64), Tensor()};
  REQUIRE_THROWS_AS(dist::GradReducer(comm, {&f64}, {}), Error);
  Parameter p{Tensor::zeros({3}), Tensor::zeros({3}), Tensor()};
  REQUIRE_THROWS_AS(dist::GradReducer(comm, {&p, &p}, {}), Error);
  dist::ReducerOptions f64_wire;
  f64_wire.grad_dtype = DType::F64;
  REQUIRE_THROWS_WITH(dist::GradReducer(comm, {&p}, f64_wire), Catch::Contains("reduced in f32 or bf16, not f64"));
  dist::GradReducer r(comm, {&p}, {});
  REQUIRE_THROWS_AS(r.finish(), Error);  // no step begun
  r.begin_step(1);
  REQUIRE_THROWS_AS(r.begin_step(1), Error);  // the last one not finished
  r.grads_ready({&p});
  REQUIRE_THROWS_AS(r.grads_ready({&p}), Error);  // final twice
  r.finish();
  Parameter other{Tensor::zeros({2}), Tensor::zeros({2}), Tensor()};
  r.begin_step(1);
  REQUIRE_THROWS_AS(r.grads_ready({&other}), Error);  // not held
}

TEST_CASE("data-parallel step of one rank = the plain step, bitwise (CPU)") { reduced_step_matches_plain(Device::CPU); }

TEST_CASE("ZeRO-1 of one rank = AdamW, bitwise, and its checkpoint is AdamW's (CPU)") {
  sharded_matches_adamw(Device::CPU);
}

TEST_CASE("bf16 gradient reduction of one rank: the weighted gradient rounded to bf16 once (CPU)") {
  bf16_reduction_rounds_once(Device::CPU);
}

TEST_CASE("[cuda] bf16 gradient reduction of one rank: rounded to bf16 once (NCCL when built)") {
  HG_REQUIRE_GPU();
  bf16_reduction_rounds_once(Device::CUDA);
}

TEST_CASE("parameter hash: equal for equal models, changed by one element") {
  dist::init_world();
  auto a = tiny_model(Device::CPU), b = tiny_model(Device::CPU);
  REQUIRE(dist::hash_parameters(a->parameters()) == dist::hash_parameters(b->parameters()));
  REQUIRE(dist::check_parameters_in_sync(a->parameters(), 0) == dist::hash_parameters(a->parameters()));
  b->ln_f.gamma.value.set({5}, 1.0000001);
  REQUIRE(dist::hash_parameters(a->parameters()) != dist::hash_parameters(b->parameters()));
}

TEST_CASE("[cuda] data-parallel step of one rank = the plain step, bitwise (NCCL when built)") {
  HG_REQUIRE_GPU();
  reduced_step_matches_plain(Device::CUDA);
}

TEST_CASE("[cuda] ZeRO-1 of one rank = AdamW, bitwise (NCCL reduce-scatter / all-gather when built)") {
  HG_REQUIRE_GPU();
  sharded_matches_adamw(Device::CUDA);
}

TEST_CASE("[cuda] NCCL collectives of one rank: premul sum, reduce-scatter, all-gather, f64, timing") {
  HG_REQUIRE_GPU();
  if (!gpu::nccl::built_with_nccl()) HG_SKIP("this build has no NCCL");
  dist::init_world();
  dist::Collectives comm(Device::CUDA);
  REQUIRE(gpu::nccl::initialized());
  (void)comm.take_stats();  // NCCL timing is per process: drop what earlier cases' collectives left (29 on the H200)
  Generator g(3);
  Tensor x = Tensor::randn({1000}, g, DType::F32, Device::CUDA);
  const std::vector<double> x0 = x.to_vector();
  comm.all_reduce_sum(x, 0.25);
  Tensor out = Tensor::zeros({1000}, DType::F32, Device::CUDA);
  comm.reduce_scatter_sum(x, out, 2.0);
  comm.all_gather(out);
  Tensor sq = Tensor::full({2}, 1.5, DType::F64, Device::CUDA);
  comm.wait("test");
  const std::vector<double> y = out.to_vector();
  for (size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == static_cast<double>(static_cast<float>(x0[i] * 0.25) * 2.0f));
  comm.all_reduce_sum_f64(sq, "test");
  REQUIRE(sq.to_vector() == std::vector<double>{1.5, 1.5});
  const dist::CommStats s = comm.take_stats();
  REQUIRE(s.collectives == 4);
  REQUIRE(s.busy_ms > 0);
}
