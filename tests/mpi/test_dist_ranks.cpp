// Data parallelism with several ranks, run as `mpirun -np 2 test_dist_ranks`
// (tests/CMakeLists.txt registers it where MPI was found): the reduced
// gradients against one process with the whole batch, a ZeRO-1 resume on
// two ranks against the uninterrupted run, and the bf16 reduction against
// the fp32 one. CPU through MPI; the [cuda] cases through NCCL, one GPU per
// rank, where the host has a GPU for every rank.
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "core/cuda_runtime.hpp"
#include "core/optim.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/collectives.hpp"
#include "dist/grad_reducer.hpp"
#include "dist/sharded_adamw.hpp"
#include "dist/watchdog.hpp"
#include "dist/world.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/catch.hpp"
#include "tests/mpi/ranks.hpp"
#include "tests/reducer_hook.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::cuda_ranks_available;
using hg::test::ranks;
using hg::test::ReducerHook;

namespace {

constexpr int64_t kRows = 16, kSeq = 9, kVocab = 37;

// Started as one process (a test runner that runs every program alone), the
// cases skip visibly; under mpirun they need exactly 2 ranks.
#define HG_REQUIRE_TWO_RANKS()                                                                  \
  do {                                                                                          \
    if (ranks().size == 1) HG_SKIP("SKIPPED: one process; these cases run under mpirun -np 2"); \
    INFO("run under mpirun -np 2 (CTest test_dist_ranks does)");                                \
    REQUIRE(ranks().size == 2);                                                                 \
  } while (0)

std::unique_ptr<DecoderLM> tiny_model(Device dev, uint64_t seed = 11) {
  DecoderLMConfig c;
  c.vocab_size = kVocab;
  c.max_seq_len = kSeq;
  c.d_model = 24;
  c.n_heads = 3;
  c.n_layers = 2;
  c.seed = seed;
  auto m = std::make_unique<DecoderLM>(c);
  m->to(dev);
  return m;
}

// A global batch of kRows sequences, the same on every rank. The ignored
// targets are spread unevenly (more in the first half), so the ranks' token
// shares differ from 1/2 and the reduction must weigh by tokens.
struct GlobalBatch {
  std::vector<double> ids, targets;
};

GlobalBatch global_batch(uint64_t seed) {
  Generator g(seed);
  GlobalBatch b;
  for (int64_t i = 0; i < kRows * kSeq; ++i) {
    b.ids.push_back(static_cast<double>(g.next_u64() % kVocab));
    b.targets.push_back(static_cast<double>(g.next_u64() % kVocab));
  }
  for (int64_t row = 0; row < kRows / 2; ++row) b.targets[row * kSeq + row % kSeq] = -100;
  b.targets[kRows / 2 * kSeq + 4] = -100;
  return b;
}

struct Shard {
  Tensor ids, targets;
  double weight;  // this shard's share of the global batch's target tokens
};

// Rows [from, to) of the global batch.
Shard shard(const GlobalBatch& b, int64_t from, int64_t to, Device dev) {
  const auto cut = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + from * kSeq, v.begin() + to * kSeq);
  };
  const auto counted = [&](int64_t a, int64_t z) {
    return std::count_if(b.targets.begin() + a * kSeq, b.targets.begin() + z * kSeq,
                         [](double t) { return t != -100; });
  };
  return {Tensor::from_vector(cut(b.ids), {to - from, kSeq}, DType::F32, dev),
          Tensor::from_vector(cut(b.targets), {to - from, kSeq}, DType::F32, dev),
          static_cast<double>(counted(from, to)) / static_cast<double>(counted(0, kRows))};
}

// This rank's part of the global batch.
Shard my_shard(const GlobalBatch& b, Device dev) {
  const int64_t per = kRows / ranks().size;
  return shard(b, ranks().rank * per, (ranks().rank + 1) * per, dev);
}

double forward_backward(DecoderLM& m, const Shard& s) {
  m.zero_grad();
  CrossEntropySaved saved;
  const double loss = cross_entropy_forward(m.forward(s.ids), s.targets, -100, &saved).item();
  m.backward(cross_entropy_backward(saved));
  return loss;
}

std::vector<Parameter*> backward_order(DecoderLM& m) {
  std::vector<Parameter*> ps = m.parameters();
  std::reverse(ps.begin(), ps.end());
  return ps;
}

double grad_norm(DecoderLM& m) {
  double sumsq = 0;
  for (Parameter* p : m.parameters())
    for (double g : p->grad.to_vector()) sumsq += g * g;
  return std::sqrt(sumsq);
}

// The pre-clip norm and every gradient of `ddp` within a relative 1e-5 of
// `whole`'s (the sums run in another order: not bitwise).
void require_same_gradients(DecoderLM& whole, DecoderLM& ddp, uint64_t seed) {
  const double expected = grad_norm(whole), got = grad_norm(ddp);
  INFO("rank " << ranks().rank << ", batch " << seed << ": pre-clip gradient norm " << got << ", one process "
               << expected);
  REQUIRE(std::abs(got - expected) <= 1e-5 * expected);
  const auto pw = whole.named_parameters(), pd = ddp.named_parameters();
  for (size_t i = 0; i < pw.size(); ++i) {
    INFO(pw[i].first);
    const std::vector<double> g = pw[i].second->grad.to_vector(), h = pd[i].second->grad.to_vector();
    double scale = 0, diff = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      scale = std::max(scale, std::abs(g[j]));
      diff = std::max(diff, std::abs(g[j] - h[j]));
    }
    REQUIRE(diff <= 1e-5 * scale);
  }
}

// Each rank's batch-8 gradient, weighed by its tokens and reduced, is the
// gradient of one process over the batch of 16.
void reduced_gradient_matches_whole_batch(Device dev) {
  auto whole = tiny_model(dev), ddp = tiny_model(dev);
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 4096;  // several buckets, reduced during the backward
  dist::GradReducer reducer(comm, backward_order(*ddp), ro);
  ddp->set_grads_ready_hook([&](const std::vector<Parameter*>& ps) { reducer.grads_ready(ps); });
  for (uint64_t seed : {1, 2}) {
    const GlobalBatch b = global_batch(seed);
    forward_backward(*whole, shard(b, 0, kRows, dev));
    const Shard mine = my_shard(b, dev);
    reducer.begin_step(mine.weight);
    forward_backward(*ddp, mine);
    reducer.finish();
    require_same_gradients(*whole, *ddp, seed);
  }
  ddp->set_grads_ready_hook(nullptr);
}

// Each rank's 8 rows as 2 micro-batches of 4 through TrainStep (gradient
// accumulation; each micro-batch weighed by its share of the rank's tokens,
// the rank's sum by its share of the global batch's, reduced once after the
// second micro-batch): the gradient of one process over the 16 rows.
void accumulated_and_reduced_matches_whole_batch(Device dev, bool sharded) {
  auto whole = tiny_model(dev), ddp = tiny_model(dev);
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 4096;
  ro.sharded = sharded;
  dist::GradReducer reducer(comm, backward_order(*ddp), ro);
  ddp->set_grads_ready_hook([&](const std::vector<Parameter*>& ps) { reducer.grads_ready(ps); });
  ReducerHook hook(reducer);
  // lr 0: the parameters stay, so each batch's gradients are compared at the same point.
  SGD opt(ddp->parameters(), SGDOptions{0.0, 0.0, 0.0});
  TrainStepOptions o;
  o.data_parallel = &hook;
  o.grad_accum = 2;
  TrainStep step(*ddp, opt, o);
  for (uint64_t seed : {1, 2}) {
    const GlobalBatch b = global_batch(seed);
    forward_backward(*whole, shard(b, 0, kRows, dev));
    const Shard mine = my_shard(b, dev);
    step.run(mine.ids, mine.targets, mine.weight);
    if (!sharded) require_same_gradients(*whole, *ddp, seed);
  }
  REQUIRE(reducer.steps() == 2);  // once a step, not once a micro-batch
  if (sharded) {                  // rank r holds the reduced part r of each bucket: compare those parts
    const std::vector<Parameter*> mine = ddp->parameters(), theirs = whole->parameters();
    for (const dist::GradReducer::Bucket& bk : reducer.buckets()) {
      const std::vector<double> got = bk.shard_grads.to_vector();
      std::vector<double> want(static_cast<size_t>(bk.grads.numel()), 0.0);  // the padding stays 0
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const auto k = std::find(mine.begin(), mine.end(), bk.params[j]) - mine.begin();
        const std::vector<double> g = theirs[static_cast<size_t>(k)]->grad.to_vector();
        std::copy(g.begin(), g.end(), want.begin() + bk.offsets[j]);
      }
      const size_t from = static_cast<size_t>(ranks().rank) * got.size();
      double scale = 0, diff = 0;
      for (size_t e = 0; e < got.size(); ++e) {
        scale = std::max(scale, std::abs(want[from + e]));
        diff = std::max(diff, std::abs(want[from + e] - got[e]));
      }
      REQUIRE(diff <= 1e-5 * scale);
    }
  }
  ddp->set_grads_ready_hook(nullptr);
}

// A ZeRO-1 model on every rank: its reducer (sharded) and optimizer. With
// forward_waits the step leaves the parameter all-gathers running and the
// next forward waits for each module's buckets (as cli::DataParallel wires
// it); `outstanding` records, at each module of the forward, how many
// buckets' gathers were still outstanding before its wait.
struct ZeroRun {
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<dist::Collectives> comm;
  std::unique_ptr<dist::GradReducer> reducer;
  std::unique_ptr<dist::ShardedAdamW> opt;
  std::vector<size_t> outstanding;

  ZeroRun(Device dev, const std::string& resume_from, bool forward_waits = false) {
    model = tiny_model(Device::CPU, resume_from.empty() ? 11 : 99);  // a resumed run's own seed is overwritten
    if (!resume_from.empty()) model->load(resume_from);
    model->to(dev);
    comm = std::make_unique<dist::Collectives>(dev);
    dist::ReducerOptions ro;
    ro.bucket_bytes = 8192;
    ro.sharded = true;
    ro.forward_waits = forward_waits;
    reducer = std::make_unique<dist::GradReducer>(*comm, backward_order(*model), ro);
    AdamWOptions o;
    o.lr = 3e-3;
    o.weight_decay = 0.1;
    o.max_grad_norm = 1.0;
    opt = std::make_unique<dist::ShardedAdamW>(*reducer, *comm, model->parameters(), o);
    if (!resume_from.empty()) opt->load_state(resume_from + ".optim");
    model->set_grads_ready_hook([this](const std::vector<Parameter*>& ps) { reducer->grads_ready(ps); });
    if (forward_waits)
      model->set_values_needed_hook([this](Module& m) {
        outstanding.push_back(reducer->gathers_outstanding());
        reducer->values_needed(m.parameters());
      });
  }
  ~ZeroRun() {
    if (!model) return;  // moved out
    model->set_grads_ready_hook(nullptr);
    model->set_values_needed_hook(nullptr);
  }

  // One step on global batch `seed`; returns this rank's weighted loss.
  double local_step(uint64_t seed, Device dev) {
    const Shard mine = my_shard(global_batch(seed), dev);
    reducer->begin_step(mine.weight);
    const double loss = mine.weight * forward_backward(*model, mine);
    reducer->finish();
    opt->step();
    return loss;
  }
  // The same, returning the global loss.
  double step(uint64_t seed, Device dev) {
    double loss = local_step(seed, dev);
    dist::all_reduce_sum(&loss, 1, "all-reduce of the loss");
    return loss;
  }
};

// ZeRO-1 on 2 ranks, checkpointed after step 3 and resumed on 2 ranks, gives
// the uninterrupted run's losses and parameters bit for bit: every rank gets
// its own part of the moments back.
void zero1_resume_on_two_ranks(Device dev) {
  constexpr int kSteps = 6, kCut = 3;
  ZeroRun whole(dev, "");
  std::vector<double> expected;
  for (int s = 0; s < kSteps; ++s) expected.push_back(whole.step(100 + s, dev));

  // One directory for every rank: rank 0's process id names it.
  uint64_t id = static_cast<uint64_t>(::getpid());
  dist::broadcast(&id, sizeof id, 0, "broadcast of the checkpoint name");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("hg_test_dist_ranks_" + std::to_string(id));
  if (ranks().rank == 0) std::filesystem::create_directories(dir);
  const std::string ck = (dir / "zero.ck").string();
  std::vector<double> got;
  {
    ZeroRun first(dev, "");
    for (int s = 0; s < kCut; ++s) got.push_back(first.step(100 + s, dev));
    if (ranks().rank == 0) first.model->save(ck, kCut);
    first.opt->save_state(ck + ".optim");  // collective: rank 0 gathers and writes
    dist::barrier("checkpoint written");
  }
  ZeroRun resumed(dev, ck);
  REQUIRE(resumed.opt->steps() == kCut);
  for (int s = kCut; s < kSteps; ++s) got.push_back(resumed.step(100 + s, dev));
  dist::barrier("checkpoint read by every rank");
  if (ranks().rank == 0) std::filesystem::remove_all(dir);

  for (int s = 0; s < kSteps; ++s) {
    INFO("rank " << ranks().rank << ", step " << s + 1);
    REQUIRE(got[s] == expected[s]);
  }
  const auto pw = whole.model->named_parameters(), pr = resumed.model->named_parameters();
  for (size_t i = 0; i < pw.size(); ++i) {
    INFO("rank " << ranks().rank << ", " << pw[i].first);
    REQUIRE(pw[i].second->value.to_vector() == pr[i].second->value.to_vector());
  }
}

// ZeRO-1 whose parameter all-gathers overlap the next forward (each module
// waits for its own buckets) against ZeRO-1 whose step waits for them: the
// same losses on every step and the same parameters, bit for bit, on both
// ranks. The overlapped run must really leave the gathers to the forward:
// all of them outstanding after the step, the embedding (gathered first) met
// with every one outstanding, the first layer with some still outstanding
// (waits per bucket, not all at once), none left after the forward. The two
// runs take turns only between whole runs and the overlapped one makes no
// blocking MPI call between its steps (no loss all-reduce): MPI moves a
// nonblocking gather only inside MPI calls, so a forward that skipped a wait
// would read the other rank's part of the values from the step before.
void zero1_gathers_overlap_forward(Device dev) {
  constexpr int kSteps = 4;
  std::vector<double> expected;
  std::unique_ptr<DecoderLM> waited_model;
  {
    ZeroRun waited(dev, "");
    for (int s = 0; s < kSteps; ++s) {
      expected.push_back(waited.local_step(100 + s, dev));
      REQUIRE(waited.reducer->gathers_outstanding() == 0);
    }
    waited.model->set_grads_ready_hook(nullptr);
    waited_model = std::move(waited.model);
  }
  ZeroRun overlapped(dev, "", /*forward_waits=*/true);
  const size_t buckets = overlapped.reducer->buckets().size();
  REQUIRE(buckets > 3);
  for (int s = 0; s < kSteps; ++s) {
    INFO("rank " << ranks().rank << ", step " << s + 1);
    overlapped.outstanding.clear();
    const double got = overlapped.local_step(100 + s, dev);
    REQUIRE(got == expected[s]);
    REQUIRE(overlapped.reducer->gathers_outstanding() == buckets);  // the step left them to the next forward
    const std::vector<size_t>& seen = overlapped.outstanding;       // this step's forward: after the last step's update
    REQUIRE(seen.size() == 2 + overlapped.model->layers.size() + 1);  // embed, layers, ln_f, head
    REQUIRE(std::is_sorted(seen.rbegin(), seen.rend()));              // fewer and fewer outstanding
    if (s == 0) {
      REQUIRE(seen.front() == 0);  // the first forward follows no update
    } else {
      REQUIRE(seen.front() == buckets);
      REQUIRE(seen[1] > 0);
      REQUIRE(seen[1] < buckets);
    }
  }
  overlapped.reducer->finish_gather();
  const auto pw = waited_model->named_parameters(), po = overlapped.model->named_parameters();
  for (size_t i = 0; i < pw.size(); ++i) {
    INFO("rank " << ranks().rank << ", " << pw[i].first);
    REQUIRE(pw[i].second->value.to_vector() == po[i].second->value.to_vector());
  }
}

// ---- the bf16 reduction against the fp32 one ----

// Rank r's gradient: the same on every rank that asks (each rank also needs its peers').
constexpr int64_t kSizes[] = {1000, 37, 4096, 5000, 1};
Tensor rank_grad(int rank, size_t i, Device dev) {
  Generator g(1000 * static_cast<uint64_t>(rank) + i);
  std::vector<double> v = Tensor::randn({kSizes[i]}, g).to_vector();
  if (i == 2)
    for (double& x : v) x *= 1e-3;  // one small-valued tensor
  return Tensor::from_vector(v, {kSizes[i]}, DType::F32, dev);
}
double rank_weight(int rank) { return rank == 0 ? 0.3 : 0.7; }

// The reduced values of one reducer, bucket by bucket (this rank's part of each, sharded), with
// sum_r |fl(w_r g_r)| at the same elements: the scale of the bf16 bound.
struct Reduced {
  std::vector<double> values, abs_terms;
};

Reduced reduce_once(Device dev, DType grad_dtype, bool sharded) {
  std::vector<Parameter> params;
  for (size_t i = 0; i < std::size(kSizes); ++i)
    params.push_back(Parameter{Tensor::zeros({kSizes[i]}, DType::F32, dev), rank_grad(ranks().rank, i, dev), Tensor()});
  std::vector<Parameter*> order;
  for (Parameter& p : params) order.push_back(&p);
  dist::Collectives comm(dev);
  dist::ReducerOptions ro;
  ro.bucket_bytes = 8192;
  ro.sharded = sharded;
  ro.grad_dtype = grad_dtype;
  dist::GradReducer reducer(comm, order, ro);
  REQUIRE(reducer.buckets().size() > 2);
  reducer.begin_step(rank_weight(ranks().rank));
  reducer.grads_ready(order);
  reducer.finish();
  Reduced out;
  for (const dist::GradReducer::Bucket& b : reducer.buckets()) {
    std::vector<double> abs_terms(static_cast<size_t>(b.grads.numel()), 0.0);
    for (size_t j = 0; j < b.params.size(); ++j) {
      const size_t i = static_cast<size_t>(b.params[j] - params.data());
      for (int r = 0; r < ranks().size; ++r) {
        const std::vector<double> g = rank_grad(r, i, Device::CPU).to_vector();
        const float w = static_cast<float>(rank_weight(r));
        for (size_t e = 0; e < g.size(); ++e) abs_terms[b.offsets[j] + e] += std::abs(w * static_cast<float>(g[e]));
      }
    }
    const std::vector<double> v = (sharded ? b.shard_grads : b.grads).to_vector();
    const size_t from = sharded ? static_cast<size_t>(ranks().rank) * v.size() : 0;
    out.values.insert(out.values.end(), v.begin(), v.end());
    out.abs_terms.insert(out.abs_terms.end(), abs_terms.begin() + from, abs_terms.begin() + from + v.size());
  }
  return out;
}

// The bound of docs/distributed.md for 2 ranks: each weighted gradient
// rounded to bf16 (u = 2^-8 relative), their float sum rounded to bf16 again
// (u), against fp32's one rounding (2^-24): |bf16 - fp32| <= (2u + u^2 +
// 3 * 2^-24) (|a| + |b|) per element, below (2^-7 + 2^-15) (|a| + |b|).
void bf16_reduction_within_bound(Device dev, bool sharded) {
  const Reduced f32 = reduce_once(dev, DType::F32, sharded), bf16 = reduce_once(dev, DType::BF16, sharded);
  REQUIRE(f32.values.size() == bf16.values.size());
  const double bound = std::ldexp(1.0, -7) + std::ldexp(1.0, -15);
  double worst = 0, diff2 = 0, norm2 = 0;
  size_t rounded = 0;
  for (size_t e = 0; e < f32.values.size(); ++e) {
    const double d = std::abs(bf16.values[e] - f32.values[e]);
    INFO("rank " << ranks().rank << ", element " << e << ": bf16 " << bf16.values[e] << ", fp32 " << f32.values[e]);
    REQUIRE(d <= bound * f32.abs_terms[e]);
    if (f32.abs_terms[e] > 0) worst = std::max(worst, d / f32.abs_terms[e]);
    rounded += d > 0;
    diff2 += d * d;
    norm2 += f32.values[e] * f32.values[e];
  }
  REQUIRE(rounded > f32.values.size() / 2);  // the values did travel in bf16
  WARN("rank " << ranks().rank << (sharded ? ", reduce-scatter" : ", all-reduce") << ": bf16 vs fp32 reduction, worst "
               << worst << " x (|a| + |b|) (bound " << bound << "), relative L2 difference "
               << std::sqrt(diff2 / norm2));
}

}  // namespace

TEST_CASE("bf16 gradient reduction vs fp32 on 2 ranks: within (2^-7 + 2^-15) (|a| + |b|) per element (CPU, MPI)") {
  HG_REQUIRE_TWO_RANKS();
  bf16_reduction_within_bound(Device::CPU, false);
  bf16_reduction_within_bound(Device::CPU, true);
}

TEST_CASE("[cuda] bf16 gradient reduction vs fp32 on 2 ranks: within (2^-7 + 2^-15) (|a| + |b|) per element (NCCL)") {
  HG_REQUIRE_GPU();
  HG_REQUIRE_TWO_RANKS();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  bf16_reduction_within_bound(Device::CUDA, false);
  bf16_reduction_within_bound(Device::CUDA, true);
}

TEST_CASE("2 ranks x batch 8 = 1 process x batch 16: pre-clip gradient norm and gradients (CPU, MPI)") {
  HG_REQUIRE_TWO_RANKS();
  reduced_gradient_matches_whole_batch(Device::CPU);
}

TEST_CASE("2 ranks x 2 micro-batches of 4 = 1 process x batch 16: gradients, one reduction a step (CPU, MPI)") {
  HG_REQUIRE_TWO_RANKS();
  accumulated_and_reduced_matches_whole_batch(Device::CPU, false);
  accumulated_and_reduced_matches_whole_batch(Device::CPU, true);
}

TEST_CASE("ZeRO-1 on 2 ranks, checkpointed and resumed on 2 ranks = uninterrupted (CPU, MPI)") {
  HG_REQUIRE_TWO_RANKS();
  zero1_resume_on_two_ranks(Device::CPU);
}

TEST_CASE("ZeRO-1 on 2 ranks, all-gathers waited for module by module in the next forward = in the step (CPU, MPI)") {
  HG_REQUIRE_TWO_RANKS();
  zero1_gathers_overlap_forward(Device::CPU);
}

TEST_CASE("[cuda] ZeRO-1 on 2 ranks, all-gathers waited for module by module in the next forward = in the step "
          "(NCCL)") {
  HG_REQUIRE_GPU();
  HG_REQUIRE_TWO_RANKS();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  zero1_gathers_overlap_forward(Device::CUDA);
}

TEST_CASE("[cuda] 2 ranks x batch 8 = 1 process x batch 16: pre-clip gradient norm and gradients (NCCL)") {
  HG_REQUIRE_GPU();
  HG_REQUIRE_TWO_RANKS();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  reduced_gradient_matches_whole_batch(Device::CUDA);
}

TEST_CASE("[cuda] 2 ranks x 2 micro-batches of 4 = 1 process x batch 16: gradients, one reduction a step (NCCL)") {
  HG_REQUIRE_GPU();
  HG_REQUIRE_TWO_RANKS();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  accumulated_and_reduced_matches_whole_batch(Device::CUDA, false);
  accumulated_and_reduced_matches_whole_batch(Device::CUDA, true);
}

TEST_CASE("[cuda] ZeRO-1 on 2 ranks, checkpointed and resumed on 2 ranks = uninterrupted (NCCL)") {
  HG_REQUIRE_GPU();
  HG_REQUIRE_TWO_RANKS();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  zero1_resume_on_two_ranks(Device::CUDA);
}
