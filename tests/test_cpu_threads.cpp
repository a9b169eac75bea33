// The CPU backend on several threads gives bitwise the same results as on
// one: every op cuts its work by the problem's shape, never by the thread
// count (core/parallel.hpp). Each op runs at 1, 2, 3 and 8 threads on shapes
// large enough to be cut into many pieces, plus odd sizes.
#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "core/backend.hpp"
#include "core/cpu_gemm.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "core/streaming_stores.hpp"
#include "core/tensor_functions.hpp"
#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::BinaryOp;
using hg::DType;
using hg::ReduceOp;
using hg::Shape;
using hg::Tensor;
using hg::UnaryOp;

// Restores the thread count a test changed.
struct ThreadScope {
  int saved = hg::num_threads();
  ~ThreadScope() { hg::set_num_threads(saved); }
};

// Runs op at 1 thread, then at each other count, and compares every output.
void check_thread_independent(const std::function<std::vector<Tensor>()>& op) {
  ThreadScope scope;
  hg::set_num_threads(1);
  const std::vector<Tensor> want = op();
  for (int n : {2, 3, 8}) {
    hg::set_num_threads(n);
    const std::vector<Tensor> got = op();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("threads " << n << ", output " << i);
      CHECK(hg::test::same_bytes(got[i], want[i]));
    }
  }
}

Tensor randn(const Shape& s, uint64_t seed, DType dtype = DType::F32, double mean = 0, double std = 1) {
  hg::Generator g(seed);
  return Tensor::randn(s, g, dtype, hg::Device::CPU, mean, std);
}

}  // namespace

TEST_CASE("randn and rand draw on several threads the numbers of one call after another", "[threads]") {
  // 100003 draws: several pieces of the fill and a remainder; a generator
  // already advanced, so the draws start at a counter that is not 0.
  const int64_t n = 100003;
  const auto draws = [&](bool normal) {
    hg::Generator g(11);
    g.uniform();
    Tensor t = normal ? Tensor::randn({n}, g, DType::F64, hg::Device::CPU, 0.5, 2.0)
                      : Tensor::rand({n}, g, DType::F64, hg::Device::CPU, -1.0, 3.0);
    return std::make_pair(t, g.counter());
  };
  for (const bool normal : {true, false}) {
    INFO((normal ? "randn" : "rand"));
    hg::Generator one_by_one(11);
    one_by_one.uniform();
    std::vector<double> want(static_cast<size_t>(n));
    for (double& v : want) v = normal ? 0.5 + 2.0 * one_by_one.normal() : -1.0 + 4.0 * one_by_one.uniform();
    check_thread_independent([&] {
      const auto [t, counter] = draws(normal);
      CHECK(t.to_vector() == want);
      CHECK(counter == one_by_one.counter());  // the generator continues where the calls would leave it
      return std::vector<Tensor>{t};
    });
  }
}

TEST_CASE("set_num_threads takes effect and rejects bad counts", "[threads]") {
  ThreadScope scope;
  hg::set_num_threads(3);
  CHECK(hg::num_threads() == 3);
  CHECK_THROWS_AS(hg::set_num_threads(0), hg::Error);
  CHECK(hg::num_threads() == 3);
}

TEST_CASE("parallel_for runs every task once, nests, and passes exceptions on", "[threads]") {
  ThreadScope scope;
  hg::set_num_threads(4);
  const int64_t tasks = 1000, work = hg::kSerialWork;  // enough work to use the pool
  std::vector<int> hits(static_cast<size_t>(tasks), 0);
  hg::parallel_for(tasks, work, [&](int64_t t) { ++hits[static_cast<size_t>(t)]; });
  CHECK(std::count(hits.begin(), hits.end(), 1) == tasks);
  // A task's own parallel_for runs serially on that thread, still complete.
  std::vector<int64_t> sums(8, 0);
  hg::parallel_for(
      8, work, [&](int64_t t) { hg::parallel_for(100, work, [&](int64_t u) { sums[static_cast<size_t>(t)] += u; }); });
  CHECK(std::count(sums.begin(), sums.end(), 4950) == 8);
  // An exception in any task reaches the caller; the pool keeps working.
  CHECK_THROWS_AS(hg::parallel_for(tasks, work,
                                   [&](int64_t t) {
                                     if (t == 777) hg::fail("test", "task ", t);
                                   }),
                  hg::Error);
  std::fill(hits.begin(), hits.end(), 0);
  hg::parallel_for(tasks, work, [&](int64_t t) { ++hits[static_cast<size_t>(t)]; });
  CHECK(std::count(hits.begin(), hits.end(), 1) == tasks);
}

TEST_CASE("matmul is bitwise the same at any thread count", "[threads]") {
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  // Forward, weight-gradient (k long, m x n small) and batched shapes; one
  // thread runs each product whole, more threads in tiles (core/cpu_matmul.cpp),
  // so the tile rule's cases are here: tiles of 192 columns and a remainder
  // (1000), a width of three units and a remainder (150), halved widths and
  // heights of a weight gradient (128 x 128, k 512).
  const std::vector<Case> cases = {{{300, 70}, {70, 257}, false, false},  {{2048, 64}, {2048, 96}, true, false},
                                   {{200, 96}, {96, 1000}, false, false}, {{70, 300}, {150, 300}, false, true},
                                   {{512, 128}, {512, 128}, true, false}, {{129, 64}, {200, 64}, false, true},
                                   {{64, 129}, {200, 64}, true, true},    {{12, 65, 33}, {12, 33, 70}, false, false}};
  const std::string saved_level = hg::cpu::gemm_level();
  for (const std::string& level : hg::cpu::gemm_levels())  // every GEMM level this CPU runs
    for (DType dt : {DType::F32, DType::F64})
      for (const Case& c : cases) {
        INFO("GEMM level " << level);
        hg::cpu::set_gemm_level(level);
        const Tensor a = randn(c.a, 1, dt), b = randn(c.b, 2, dt);
        check_thread_independent([&] {
          const Tensor out = hg::matmul(a, b, c.ta, c.tb);
          Tensor acc = out.clone();
          hg::cpu_backend().matmul(a, b, acc, c.ta, c.tb, true);
          return std::vector<Tensor>{out, acc};
        });
      }
  hg::cpu::set_gemm_level(saved_level);
}

TEST_CASE("maps, zips and reductions are bitwise the same at any thread count", "[threads]") {
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor x = randn({333, 517}, 3, dt), y = randn({333, 517}, 4, dt), row = randn({517}, 5, dt);
    check_thread_independent([&] {
      std::vector<Tensor> out;
      for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::GeluGrad, UnaryOp::Tanh, UnaryOp::Sigmoid}) {
        out.push_back(Tensor::empty(x.shape(), dt));
        hg::cpu_backend().map(op, x, out.back());
      }
      for (const Tensor* b : {&y, &row}) {
        out.push_back(Tensor::empty(x.shape(), dt));
        hg::cpu_backend().zip(BinaryOp::Mul, x, *b, out.back());
      }
      const Tensor flat = x.reshape({333 * 517});
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean}) {
        for (int dim : {0, 1}) {
          Shape s = x.shape();
          s[static_cast<size_t>(dim)] = 1;
          out.push_back(Tensor::empty(s, dt));
          hg::cpu_backend().reduce(op, x, dim, out.back());
        }
        out.push_back(Tensor::empty({1}, dt));
        hg::cpu_backend().reduce(op, flat, 0, out.back());  // one long run: cut in pieces
      }
      return out;
    });
  }
}

TEST_CASE("fused LayerNorm is bitwise the same at any thread count", "[threads][layernorm]") {
  for (DType dt : {DType::F32, DType::F64})
    for (const Shape& s : std::vector<Shape>{{1000, 77}, {64, 4097}, {3, 5}}) {
      const Tensor x = randn(s, 6, dt, 3.0, 2.0), dy = randn(s, 7, dt);
      const Tensor gamma = randn({s[1]}, 8, dt, 1.0), beta = randn({s[1]}, 9, dt);
      check_thread_independent([&] {
        hg::LayerNormSaved saved;
        const Tensor yv = hg::layernorm_forward(x, gamma, beta, 1e-5, &saved);
        const hg::LayerNormGrads g = hg::layernorm_backward(dy, x, gamma, saved);
        return std::vector<Tensor>{yv, saved.mean, saved.rstd, g.dx, g.dgamma, g.dbeta};
      });
    }
}

// Streaming stores change only how y reaches memory (core/streaming_stores.hpp):
// threshold 0 streams every output, the largest value none. Odd widths put
// row starts at every 4-byte alignment (rows not 16-byte aligned, and the
// partial tail vectors, keep normal stores); 4097 and 1024 give long rows.
TEST_CASE("fused LayerNorm forward writes the same bits with streaming stores", "[threads][layernorm]") {
  const int64_t saved_threshold = hg::streaming_store_bytes();
  ThreadScope scope;
  for (const Shape& s : std::vector<Shape>{{1000, 77}, {64, 4097}, {300, 1024}, {3, 5}, {7, 16}}) {
    INFO("shape " << s[0] << "x" << s[1]);
    const Tensor x = randn(s, 16, DType::F32, 3.0, 2.0);
    const Tensor gamma = randn({s[1]}, 17, DType::F32, 1.0), beta = randn({s[1]}, 18, DType::F32);
    auto forward = [&] {
      hg::LayerNormSaved saved;
      const Tensor yv = hg::layernorm_forward(x, gamma, beta, 1e-5, &saved);
      return std::vector<Tensor>{yv, saved.mean, saved.rstd};
    };
    hg::set_streaming_store_bytes(std::numeric_limits<int64_t>::max());
    hg::set_num_threads(1);
    const std::vector<Tensor> want = forward();
    hg::set_streaming_store_bytes(0);
    for (int n : {1, 3}) {
      hg::set_num_threads(n);
      const std::vector<Tensor> got = forward();
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("threads " << n << ", output " << i);
        CHECK(hg::test::same_bytes(got[i], want[i]));
      }
    }
  }
  hg::set_streaming_store_bytes(saved_threshold);
  CHECK_THROWS_AS(hg::set_streaming_store_bytes(-1), hg::Error);
  CHECK(hg::streaming_store_bytes() == saved_threshold);
}

TEST_CASE("fused softmax is bitwise the same at any thread count", "[threads][softmax]") {
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor scores = randn({4, 3, 65, 130}, 10, dt, 0, 3);
    const Tensor dy = randn(scores.shape(), 11, dt);
    Tensor mask = randn({4, 1, 1, 130}, 12, dt);
    check_thread_independent([&] {
      hg::SoftmaxOptions o;
      o.mask = mask;
      o.causal = true;
      o.scale = 0.125;
      const Tensor yv = hg::attention_softmax_forward(scores, o);
      return std::vector<Tensor>{yv, hg::softmax_backward(dy, yv, 0.125), hg::softmax_forward(scores)};
    });
  }
}

TEST_CASE("adamw_multi and sum_of_squares are bitwise the same at any thread count", "[threads][optim]") {
  for (DType dt : {DType::F32, DType::F64}) {
    std::vector<Tensor> p, g, m, v;
    for (int64_t n : {int64_t(1), int64_t(50001), int64_t(17), int64_t(16384)}) {
      p.push_back(randn({n}, 20 + static_cast<uint64_t>(n), dt));
      g.push_back(randn({n}, 30 + static_cast<uint64_t>(n), dt, 0, 0.5));
      m.push_back(randn({n}, 40 + static_cast<uint64_t>(n), dt, 0, 0.1));
      v.push_back(randn({n}, 50 + static_cast<uint64_t>(n), dt, 1, 0.1));
    }
    hg::AdamWConfig config;
    config.weight_decay = 0.1;
    config.max_grad_norm = 1.0;  // the norm is ~ 0.5 sqrt(66403): clipped
    check_thread_independent([&] {
      std::vector<Tensor> out;
      for (const auto* list : {&p, &m, &v})
        for (const Tensor& t : *list) out.push_back(t.clone());
      hg::AdamWGroup group{
          {out.begin(), out.begin() + 4}, g, {out.begin() + 4, out.begin() + 8}, {out.begin() + 8, out.end()}, {}};
      Tensor state = Tensor::zeros({hg::kAdamWStateSize}, DType::F64);
      state.data<double>()[hg::kAdamWLr] = 1e-3;
      hg::cpu_backend().adamw_multi(group, config, state);
      out.push_back(state);
      out.push_back(Tensor::zeros({1}, DType::F64));
      hg::cpu_backend().sum_of_squares(g, out.back());
      return out;
    });
  }
}

TEST_CASE("fused cross-entropy is bitwise the same at any thread count", "[threads][cross_entropy]") {
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor logits = randn({700, 53}, 60, dt, 2, 3);
    std::vector<double> t(700);
    for (size_t i = 0; i < t.size(); ++i) t[i] = i % 7 == 3 ? -100 : static_cast<double>((i * 31) % 53);
    const Tensor targets = Tensor::from_vector(t, {700});
    check_thread_independent([&] {
      hg::CrossEntropySaved saved;
      const Tensor loss = hg::cross_entropy_forward(logits, targets, -100, &saved);
      return std::vector<Tensor>{loss, hg::cross_entropy_backward(saved)};
    });
  }
}

TEST_CASE("CPU flash attention is bitwise the same at any thread count", "[threads][attention]") {
  for (DType dt : {DType::F32, DType::F64}) {
    // 3 x 2 heads, 70 queries (two query tiles), 90 keys, head dim 16.
    const Tensor q = randn({3, 2, 70, 16}, 70, dt), k = randn({3, 2, 90, 16}, 71, dt);
    const Tensor v = randn({3, 2, 90, 16}, 72, dt), dout = randn({3, 2, 70, 16}, 73, dt);
    hg::AttentionOptions o;
    o.causal = true;
    o.mask = randn({3, 1, 1, 90}, 74, dt);
    check_thread_independent([&] {
      hg::AttentionSaved saved;
      const Tensor out = hg::attention_forward(q, k, v, o, &saved);
      const hg::AttentionGrads g = hg::attention_backward(dout, saved);
      return std::vector<Tensor>{out, saved.lse, g.dq, g.dk, g.dv};
    });
  }
}
