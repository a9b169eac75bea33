// CUDA graphs (gpu::Graph, core/cuda_runtime.hpp) and the caching
// allocator's graph pools: a replay equals plain launches bit for bit (the
// same kernels on the same values), blocks a graph uses are never handed to
// allocations outside it, a capture broken by a host read leaves no trace,
// and TrainStep's graph mode falls back to plain steps with identical results.
// That replayed steps clear the last step's gradients: test_zero_grad.cpp.
#include <array>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/indexing.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "core/tensor_functions.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

// The work under test: allocations, a GEMM, maps, a broadcast zip, a reduction.
Tensor work(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor h = add(gelu(matmul(x, w)), b);
  return sum(mul(h, h), 0);
}

}  // namespace

TEST_CASE("gpu::Graph: replays equal plain launches bit for bit, on new inputs copied in", "[graph][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(21);
  const Tensor w = Tensor::randn({33, 65}, gen, DType::F32, Device::CUDA);
  const Tensor b = Tensor::randn({65}, gen, DType::F32, Device::CUDA);
  std::vector<Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(Tensor::randn({17, 33}, gen, DType::F32, Device::CUDA));
  std::vector<std::vector<double>> want;
  for (const Tensor& x : inputs) want.push_back(work(x, w, b).to_vector());  // plain launches (also warms cuBLAS)

  Tensor x_in = inputs[0].clone();
  gpu::Graph graph;
  graph.begin_capture();
  void* temp_block = nullptr;
  Tensor out;
  {
    const Tensor temp = matmul(x_in, w);  // released inside the capture: the pool keeps its block
    temp_block = temp.raw_data();
    out = sum(mul(add(gelu(temp), b), add(gelu(temp), b)), 0);
  }
  graph.end_capture();
  REQUIRE(graph.ready());
  for (size_t i = 0; i < inputs.size(); ++i) {
    x_in.copy_(inputs[i]);
    graph.replay();
    CHECK(out.to_vector() == want[i]);
  }

  // While the graph lives, no allocation outside it receives the block it
  // reuses on every replay; writing to those allocations cannot disturb it.
  std::vector<Tensor> others;
  for (int i = 0; i < 64; ++i) {
    others.push_back(Tensor::empty({17, 65}, DType::F32, Device::CUDA));
    CHECK(others.back().raw_data() != temp_block);
  }
  x_in.copy_(inputs[1]);
  graph.replay();
  for (Tensor& t : others) t.fill_(7.0);
  CHECK(out.to_vector() == want[1]);
}

TEST_CASE("gpu::Graph: a host read inside the capture fails and leaves the allocator usable", "[graph][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(22);
  const Tensor x = Tensor::randn({9, 9}, gen, DType::F32, Device::CUDA);
  gpu::Graph graph;
  graph.begin_capture();
  bool threw = false;
  try {
    const Tensor y = exp(x);
    (void)sum_all(y).item();  // a copy to the host: not capturable
    graph.end_capture();
  } catch (const Error&) {
    threw = true;
    graph.abort_capture();
  }
  CHECK(threw);
  CHECK_FALSE(graph.ready());
  CHECK(contains(thrown_message([&] { graph.replay(); }), "nothing captured"));
  // Plain work afterwards runs normally.
  CHECK(exp(x).to_vector() == exp(x).to_vector());
  CHECK(std::isfinite(sum_all(exp(x)).item()));
}

TEST_CASE("gpu::Graph: a destroyed graph's blocks return to the shared cache", "[graph][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(23);
  const Tensor x = Tensor::randn({1000, 50}, gen, DType::F32, Device::CUDA);
  (void)exp(exp(x)).to_vector();  // warm the cache with these sizes
  {
    gpu::Graph graph;
    graph.begin_capture();
    { const Tensor y = exp(exp(x)); }
    graph.end_capture();
    graph.replay();
  }
  const int64_t mallocs = gpu::memory_stats().device_mallocs;
  for (int i = 0; i < 4; ++i) (void)exp(exp(x)).to_vector();
  CHECK(gpu::memory_stats().device_mallocs == mallocs);
}

// A memset captured into a graph is replayed as a kernel that writes the same
// zeros (cuda/graph_memset_nodes.hpp): a GEMM with K = 0 clears its output
// with a memset, here 17 x 65 floats (4420 bytes) starting 260 bytes into a
// buffer, so neither end is 16-byte aligned; the rows around it stay as they were.
TEST_CASE("gpu::Graph: a captured memset clears the same bytes on every replay", "[graph][cuda]") {
  HG_REQUIRE_GPU();
  const Tensor a = Tensor::empty({17, 0}, DType::F32, Device::CUDA);
  const Tensor b = Tensor::empty({0, 65}, DType::F32, Device::CUDA);
  Tensor buffer = Tensor::empty({19, 65}, DType::F32, Device::CUDA);
  Tensor out = buffer.slice(1, 18);
  gpu::Graph graph;
  graph.begin_capture();
  backend_for(Device::CUDA).gemm(a, b, out, GemmArgs{});
  graph.end_capture();
  for (double fill : {7.0, -3.5}) {
    buffer.fill_(fill);
    graph.replay();
    const std::vector<double> got = buffer.to_vector();
    int64_t wrong = 0, first_wrong = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool inside = i >= 65 && i < 18 * 65;
      if (got[i] != (inside ? 0.0 : fill) && wrong++ == 0) first_wrong = static_cast<int64_t>(i);
    }
    INFO("filled with " << fill << "; first wrong element " << first_wrong);
    CHECK(wrong == 0);
  }
}

// gpu::Beside: the second stream starts after the work queued before it, the
// handgrad stream continues after join() with it done, one Beside at a time,
// and a capture takes the second stream's work into its graph.
TEST_CASE("gpu::Beside: work on the second stream is ordered by its fork and its join, captured too", "[graph][cuda]") {
  HG_REQUIRE_GPU();
  const int64_t n = int64_t(1) << 22;  // 16 MiB: long enough for an unordered read to see the old value
  Tensor a = Tensor::zeros({n}, DType::F32, Device::CUDA), b = Tensor::zeros({n}, DType::F32, Device::CUDA);
  a.fill_(2.0);
  {
    gpu::Beside beside([&] { b.copy_(a); });  // after the fill: copies 2
    beside.join();
  }
  a.copy_(add(a, b));  // after the join: 2 + 2
  CHECK(hg::test::max_abs_diff(a, Tensor::full({n}, 4.0, DType::F32, Device::CUDA)) == 0);

  {
    gpu::Beside open([] {});
    CHECK(contains(thrown_message([] { gpu::Beside second([] {}); }), "another Beside is still open"));
    open.join();
  }

  gpu::Graph graph;
  graph.begin_capture();
  {
    gpu::Beside beside([&] { b.fill_(0.0); });
    a.fill_(1.0);
    beside.join();
    a.copy_(add(a, b));
  }
  graph.end_capture();
  a.fill_(5.0);
  b.fill_(7.0);
  graph.replay();
  CHECK(hg::test::max_abs_diff(a, Tensor::full({n}, 1.0, DType::F32, Device::CUDA)) == 0);
  CHECK(hg::test::max_abs_diff(b, Tensor::zeros({n}, DType::F32, Device::CUDA)) == 0);
}

TEST_CASE("gather / scatter-add with ids checked on the device equal the host-checked ops bit for bit",
          "[graph][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(31);
  // Odd sizes, many repeats per row; the last: a batch of GPT-2's
  // vocabulary, skewed like text (every third position one row), over
  // several tiles of the sort.
  for (const auto& [v, n, d] :
       {std::array<int64_t, 3>{1, 1037, 45}, {7, 1037, 45}, {300, 1037, 45}, {5000, 1037, 45}, {50304, 40000, 5}}) {
    INFO("V " << v << " N " << n);
    std::vector<double> id_values(static_cast<size_t>(n));
    for (size_t p = 0; p < id_values.size(); ++p)
      id_values[p] = p % 3 == 0 ? 220 % v : static_cast<double>(gen.next_u64() % static_cast<uint64_t>(v));
    const Tensor ids = Tensor::from_vector(id_values, {n}, DType::F32, Device::CUDA);
    const Tensor table = Tensor::randn({v, d}, gen, DType::F32, Device::CUDA);
    const Tensor grad = Tensor::randn({n, d}, gen, DType::F32, Device::CUDA);
    CHECK(gather_rows(table, ids, IdCheck::Device).to_vector() == gather_rows(table, ids).to_vector());
    Tensor host_checked = Tensor::randn({v, d}, gen, DType::F32, Device::CUDA);
    Tensor device_checked = host_checked.clone();
    scatter_add_rows(grad, ids, host_checked);
    scatter_add_rows(grad, ids, device_checked, IdCheck::Device);
    CHECK(device_checked.to_vector() == host_checked.to_vector());
  }
  // An id naming no row: a NaN row from the gather, left out by the scatter.
  const Tensor table = Tensor::ones({4, 3}, DType::F32, Device::CUDA);
  const Tensor ids = Tensor::from_vector({1, 9, 2.5, 3}, {4}, DType::F32, Device::CUDA);
  const std::vector<double> rows = gather_rows(table, ids, IdCheck::Device).to_vector();
  CHECK(rows[0] == 1.0);
  CHECK(std::isnan(rows[3]));
  CHECK(std::isnan(rows[6]));
  CHECK(rows[9] == 1.0);
  Tensor acc = Tensor::zeros({4, 3}, DType::F32, Device::CUDA);
  scatter_add_rows(Tensor::ones({4, 3}, DType::F32, Device::CUDA), ids, acc, IdCheck::Device);
  CHECK(acc.to_vector() == std::vector<double>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1});
  CHECK(contains(thrown_message([&] { gather_rows(table, ids); }), "not an integer in [0, 4)"));
}

namespace {

// Six steps of two copies of the model c (vocabulary 64, 16 tokens), one
// replaying a CUDA graph after the warm-up steps, one plain: losses,
// gradient norms and parameters bit for bit equal; a bad id still refused.
void check_replay_equals_plain(const DecoderLMConfig& c, const TrainStepOptions& graph_on) {
  DecoderLM a(c), b(c);
  a.to(Device::CUDA);
  b.to(Device::CUDA);
  AdamWOptions o;
  o.max_grad_norm = 1.0;
  AdamW oa(a.parameters(), o), ob(b.parameters(), o);
  TrainStepOptions graph_off = graph_on;
  graph_off.use_graph = false;
  TrainStep sa(a, oa, graph_on), sb(b, ob, graph_off);
  Generator gen(5);
  for (int step = 0; step < 6; ++step) {
    std::vector<double> ids(2 * 16), targets(ids.size());
    for (double& v : ids) v = static_cast<double>(gen.next_u64() % 64);
    for (double& v : targets) v = static_cast<double>(gen.next_u64() % 64);
    targets[3] = -100;  // an ignored position: the count of rows changes per batch
    const Tensor i = Tensor::from_vector(ids, {2, 16}, DType::F32, Device::CUDA);
    const Tensor t = Tensor::from_vector(targets, {2, 16}, DType::F32, Device::CUDA);
    oa.set_lr(1e-3 * (step + 1));  // a schedule: the replay must read the new lr
    ob.set_lr(1e-3 * (step + 1));
    const StepResult ra = sa.run(i, t), rb = sb.run(i, t);
    CHECK(ra.loss == rb.loss);
    CHECK(ra.grad_norm == rb.grad_norm);
  }
  INFO(sa.graph_note());
  CHECK(sa.graph_active());  // captured after the two warm-up steps, replayed for steps 3..6
  CHECK(oa.steps() == ob.steps());
  const auto pa = a.parameters(), pb = b.parameters();
  for (size_t k = 0; k < pa.size(); ++k) CHECK(pa[k]->value.to_vector() == pb[k]->value.to_vector());
  // A bad id is still refused with a message before anything is copied in.
  const Tensor bad = Tensor::full({2, 16}, 64.0, DType::F32, Device::CUDA);
  const Tensor t0 = Tensor::zeros({2, 16}, DType::F32, Device::CUDA);
  CHECK(contains(thrown_message([&] { sa.run(bad, t0); }), "not an integer in [0, 64)"));
}

}  // namespace

TEST_CASE("TrainStep: steps replayed from a CUDA graph equal plain steps bit for bit (fp32 and bf16)",
          "[graph][cuda]") {
  HG_REQUIRE_GPU();
  // The head and loss as the chunked classifier (one chunk; 5-row chunks,
  // the last of 2 rows) and composed (logits, cross-entropy).
  struct Classifier {
    bool chunked;
    int64_t chunk_rows;
  };
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    for (Classifier classifier : {Classifier{true, 0}, Classifier{true, 5}, Classifier{false, 0}}) {
      INFO(precision_name(precision) << (classifier.chunked ? " chunked classifier, rows per chunk "
                                                            : " composed classifier ")
                                     << classifier.chunk_rows);
      DecoderLMConfig c;
      c.vocab_size = 64;
      c.max_seq_len = 16;
      c.d_model = 64;  // head dim 32: the fused attention kernels run inside the captured step
      c.n_heads = 2;
      c.n_layers = 2;
      c.seed = 3;
      c.precision = precision;
      TrainStepOptions graph_on;
      graph_on.chunked_classifier = classifier.chunked;
      graph_on.classifier_chunk_rows = classifier.chunk_rows;
      check_replay_equals_plain(c, graph_on);
    }
  }
}

// Head dim 128 in BF16: on a compute capability 9.0 GPU the attention
// forward is the wgmma kernel (cuda/attention_wgmma.cu), whose TMA tensor
// maps are encoded at capture and held by value in the graph.
TEST_CASE("TrainStep: a BF16 step at head dim 128 replayed from a CUDA graph equals plain steps bit for bit",
          "[graph][cuda]") {
  HG_REQUIRE_GPU();
  DecoderLMConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.d_model = 256;
  c.n_heads = 2;
  c.n_layers = 2;
  c.seed = 4;
  c.precision = Precision::BF16;
  check_replay_equals_plain(c, TrainStepOptions{});
}
