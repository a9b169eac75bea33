// The token embedding's gradient reduced by its rows (dist/sparse_rows.hpp),
// run as `mpirun -np 2 test_sparse_rows_ranks` and as one process (CTest
// registers both where MPI was found): the gathered and scatter-added rows
// against the dense all-reduce of the same gradients, bitwise the same on
// every rank, and a whole data-parallel step of 2 ranks x batch 8 against one
// process with batch 16. CPU through MPI; the [cuda] cases through NCCL, one
// GPU per rank (one process: NCCL with one rank).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/indexing.hpp"
#include "core/optim.hpp"
#include "dist/collectives.hpp"
#include "dist/grad_reducer.hpp"
#include "dist/sparse_rows.hpp"
#include "dist/world.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/data_parallel.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/catch.hpp"
#include "tests/mpi/ranks.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::cuda_ranks_available;
using hg::test::ranks;

namespace {

// ---- the rows alone: sparse against the dense all-reduce ----

constexpr int64_t kVocab = 50, kWidth = 13;

// Rank r's rows, the same wherever they are made: 23 on rank 0, 17 on rank 1
// (unequal counts: the gathered buffer is padded), ids repeating within and
// across ranks, some rows of the table named by no rank.
struct RankRows {
  std::vector<double> ids, dy;
};
RankRows rank_rows(int rank) {
  const int64_t n = rank == 0 ? 23 : 17 + 3 * (rank - 1);
  Generator g(700 + static_cast<uint64_t>(rank));
  RankRows r;
  for (int64_t i = 0; i < n; ++i) r.ids.push_back(static_cast<double>(g.next_u64() % (kVocab - 10)));
  r.ids[1] = r.ids[0];  // a repeat within the rank
  r.ids[2] = 7;         // and across ranks
  r.dy = Tensor::randn({n, kWidth}, g).to_vector();
  return r;
}
double rank_weight(int rank) { return rank == 0 ? 0.3 : 0.7; }

struct Reduced {
  std::vector<double> dense, sparse;
};

Reduced reduce_rows(Device dev) {
  const int rank = ranks().rank;
  const RankRows mine = rank_rows(rank);
  const int64_t n = static_cast<int64_t>(mine.ids.size());
  const Tensor ids = Tensor::from_vector(mine.ids, {n}, DType::F32, dev);
  const Tensor dy = Tensor::from_vector(mine.dy, {n, kWidth}, DType::F32, dev);
  dist::Collectives comm(dev);
  Reduced out;
  {  // the dense path: the local scatter, all-reduced with the rank's weight
    Parameter p{Tensor::zeros({kVocab, kWidth}, DType::F32, dev), Tensor::zeros({kVocab, kWidth}, DType::F32, dev),
                Tensor()};
    scatter_add_rows(dy, ids, p.grad);
    dist::GradReducer reducer(comm, {&p}, dist::ReducerOptions{});
    reducer.begin_step(rank_weight(rank));
    reducer.grads_ready({&p});
    reducer.finish();
    out.dense = p.grad.to_vector();
  }
  Parameter q{Tensor::zeros({kVocab, kWidth}, DType::F32, dev), Tensor::zeros({kVocab, kWidth}, DType::F32, dev),
              Tensor()};
  dist::SparseRowsReducer sparse(comm, &q);
  REQUIRE_FALSE(sparse.take(ids, dy));  // outside a step the caller scatters
  sparse.begin_step(rank_weight(rank));
  REQUIRE(sparse.take(ids, dy));
  sparse.start();
  sparse.finish();
  out.sparse = q.grad.to_vector();
  return out;
}

// Within 1e-6 x sum_r |w_r dy_r| per element (fp32 sums of a few terms in
// another order), zero where no rank has a row, and bitwise equal on every rank.
void sparse_rows_match_dense(Device dev) {
  const Reduced got = reduce_rows(dev);
  std::vector<double> abs_terms(static_cast<size_t>(kVocab * kWidth), 0.0);
  for (int r = 0; r < ranks().size; ++r) {
    const RankRows rows = rank_rows(r);
    for (size_t i = 0; i < rows.ids.size(); ++i)
      for (int64_t c = 0; c < kWidth; ++c)
        abs_terms[static_cast<size_t>(rows.ids[i]) * kWidth + c] +=
            std::abs(rank_weight(r) * rows.dy[i * kWidth + static_cast<size_t>(c)]);
  }
  size_t nonzero = 0;
  for (size_t e = 0; e < abs_terms.size(); ++e) {
    INFO("rank " << ranks().rank << ", row " << e / kWidth << ", column " << e % kWidth << ": sparse " << got.sparse[e]
                 << ", dense " << got.dense[e]);
    REQUIRE(std::abs(got.sparse[e] - got.dense[e]) <= 1e-6 * abs_terms[e]);
    nonzero += got.sparse[e] != 0;
  }
  REQUIRE(nonzero > abs_terms.size() / 4);  // the rows did arrive
  // Bitwise across ranks: rank 0 compares every rank's table with its own.
  const std::vector<float> mine(got.sparse.begin(), got.sparse.end());
  const std::vector<float> all = dist::gather_to(0, mine.data(), mine.size(), "gather of the sparse gradients");
  uint64_t same = 1;
  if (ranks().rank == 0)
    for (int r = 1; r < ranks().size; ++r)
      same &= std::equal(mine.begin(), mine.end(), all.begin() + static_cast<int64_t>(r * mine.size()));
  dist::broadcast(&same, sizeof same, 0, "broadcast of the comparison");
  INFO("every rank's sparse gradient bitwise equal to rank 0's");
  REQUIRE(same == 1);
}

// ---- a whole data-parallel step: 2 ranks x batch 8 = 1 process x batch 16 ----

constexpr int64_t kRows = 16, kSeq = 9, kLmVocab = 37;

std::unique_ptr<DecoderLM> tiny_model(Device dev) {
  DecoderLMConfig c;
  c.vocab_size = kLmVocab;
  c.max_seq_len = kSeq;
  c.d_model = 24;
  c.n_heads = 3;
  c.n_layers = 2;
  c.seed = 5;
  auto m = std::make_unique<DecoderLM>(c);
  m->to(dev);
  return m;
}

// Rows [from, to) of a global batch, uneven ignored targets so the ranks' weights differ from 1/2.
struct Shard {
  Tensor ids, targets;
  double weight;
};
Shard shard(uint64_t seed, int64_t from, int64_t to, Device dev) {
  Generator g(seed);
  std::vector<double> ids, targets;
  for (int64_t i = 0; i < kRows * kSeq; ++i) {
    ids.push_back(static_cast<double>(g.next_u64() % kLmVocab));
    targets.push_back(i < kRows * kSeq / 3 && i % 4 == 0 ? -100.0 : static_cast<double>(g.next_u64() % kLmVocab));
  }
  const auto counted = [&](int64_t a, int64_t z) {
    return static_cast<double>(
        std::count_if(targets.begin() + a * kSeq, targets.begin() + z * kSeq, [](double t) { return t != -100; }));
  };
  const auto cut = [&](const std::vector<double>& v) {
    return Tensor::from_vector(std::vector<double>(v.begin() + from * kSeq, v.begin() + to * kSeq), {to - from, kSeq},
                               DType::F32, dev);
  };
  return {cut(ids), cut(targets), counted(from, to) / counted(0, kRows)};
}

double grad_norm(DecoderLM& m) {
  double sumsq = 0;
  for (Parameter* p : m.parameters())
    for (double g : p->grad.to_vector()) sumsq += g * g;
  return std::sqrt(sumsq);
}

void step_matches_whole_batch(Device dev) {
  auto whole = tiny_model(dev), ddp = tiny_model(dev);
  cli::DataParallelFlags f;
  f.bucket_mb = 0.004;  // several buckets
  f.sparse_embedding_grad = "on";
  cli::DataParallel dp(*ddp, dev, f, cli::StepRows{kRows / 2 * kSeq, 1});
  REQUIRE(dp.sparse_embedding());
  SGD opt(ddp->parameters(), SGDOptions{0.0, 0.0, 0.0});  // lr 0: each batch compared at the same point
  TrainStepOptions o;
  o.data_parallel = &dp;
  TrainStep step(*ddp, opt, o);
  const int64_t per = kRows / ranks().size;
  for (uint64_t seed : {1, 2}) {
    const Shard all = shard(seed, 0, kRows, dev);
    whole->zero_grad();
    CrossEntropySaved saved;
    cross_entropy_forward(whole->forward(all.ids), all.targets, -100, &saved);
    whole->backward(cross_entropy_backward(saved));
    const Shard mine = shard(seed, ranks().rank * per, (ranks().rank + 1) * per, dev);
    step.run(mine.ids, mine.targets, mine.weight);
    const double expected = grad_norm(*whole), got = grad_norm(*ddp);
    INFO("rank " << ranks().rank << ", batch " << seed << ": pre-clip gradient norm " << got << ", one process "
                 << expected);
    REQUIRE(std::abs(got - expected) <= 1e-5 * expected);
    const std::vector<double> g = whole->embed.token.grad.to_vector(), h = ddp->embed.token.grad.to_vector();
    double scale = 0, diff = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      scale = std::max(scale, std::abs(g[j]));
      diff = std::max(diff, std::abs(g[j] - h[j]));
    }
    INFO("token embedding gradient: largest difference " << diff << " of largest element " << scale);
    REQUIRE(diff <= 1e-5 * scale);
  }
  REQUIRE(dp.reduced_steps() == 2);
}

}  // namespace

TEST_CASE("sparse embedding gradient = dense all-reduce within 1e-6 x sum |terms|, bitwise across ranks (CPU)") {
  INFO(ranks().size << " rank(s)");
  sparse_rows_match_dense(Device::CPU);
}

TEST_CASE("sparse embedding gradient = dense all-reduce, bitwise across ranks (NCCL)", "[cuda]") {
  HG_REQUIRE_GPU();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  sparse_rows_match_dense(Device::CUDA);
}

TEST_CASE("data-parallel step with the sparse embedding gradient = one process with the whole batch (CPU)") {
  step_matches_whole_batch(Device::CPU);
}

TEST_CASE("data-parallel step with the sparse embedding gradient = whole batch (NCCL)", "[cuda]") {
  HG_REQUIRE_GPU();
  if (!cuda_ranks_available()) HG_SKIP("SKIPPED: needs NCCL and one GPU per rank on this host");
  step_matches_whole_batch(Device::CUDA);
}

TEST_CASE("--sparse-embedding-grad: auto weighs the bytes, on refuses ZeRO-1 and accumulation, bad values named") {
  // GPT-2 small on 2 ranks: 8192 rows a rank gather 50 MB, the fp32 table is 155 MB (bf16: 77 MB).
  REQUIRE(dist::sparse_rows_pay(8 * 1024, 2, 50304, 768, DType::F32));
  REQUIRE(dist::sparse_rows_pay(8 * 1024, 2, 50304, 768, DType::BF16));
  REQUIRE_FALSE(dist::sparse_rows_pay(4 * 8 * 1024, 2, 50304, 768, DType::F32));  // batch 32: the table is smaller
  REQUIRE_FALSE(dist::sparse_rows_pay(0, 2, 50304, 768, DType::F32));
  REQUIRE_FALSE(dist::sparse_rows_pay(72, 2, 37, 24, DType::F32));  // the tiny model: dense
  REQUIRE(dist::parse_sparse_rows("on") == dist::SparseRows::On);
  REQUIRE_THROWS_WITH(dist::parse_sparse_rows("yes"), Catch::Contains("'yes' is not one of auto, on, off"));

  auto model = tiny_model(Device::CPU);
  cli::DataParallelFlags f;
  f.sparse_embedding_grad = "on";
  f.zero = 1;
  REQUIRE_THROWS_WITH(cli::DataParallel(*model, Device::CPU, f, cli::StepRows{72, 1}),
                      Catch::Contains("--sparse-embedding-grad on: not with --zero 1 (ZeRO-1 reduce-scatters the "
                                      "table's gradient with the other buckets); use auto or off"));
  f.zero = 0;
  REQUIRE_THROWS_WITH(cli::DataParallel(*model, Device::CPU, f, cli::StepRows{72, 2}),
                      Catch::Contains("--sparse-embedding-grad on: not with --grad-accum 2"));
  f.sparse_embedding_grad = "auto";  // accumulation, ZeRO-1 or one rank: dense
  REQUIRE_FALSE(cli::DataParallel(*model, Device::CPU, f, cli::StepRows{1, 2}).sparse_embedding());
  f.sparse_embedding_grad = "off";
  REQUIRE_FALSE(cli::DataParallel(*model, Device::CPU, f, cli::StepRows{1, 1}).sparse_embedding());
  f.sparse_embedding_grad = "auto";
  REQUIRE(cli::DataParallel(*model, Device::CPU, f, cli::StepRows{1, 1}).sparse_embedding() == ranks().distributed());
}
