// Clearing gradients: Backend::zero_multi (one launch for the whole list on
// CUDA, cuda/multi_tensor_zero.cu; a fill per tensor on the CPU) sets every
// element of every listed tensor to +0 in any dtype, size and offset and
// touches nothing else, also when replayed from a CUDA graph; zero_grads
// (Module and Optimizer zero_grad) reaches every parameter on every device;
// and a training step's gradients never carry over into the next step,
// plain or replayed from a graph.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"
#include "tests/catch.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

// A 1-D tensor of random values from which the tests cut the pieces to
// clear; every element outside them must keep its value.
struct Arena {
  Tensor data;
  std::vector<bool> listed;
  std::vector<double> before;

  Arena(int64_t n, DType dtype, Device device, uint64_t seed) : listed(static_cast<size_t>(n), false) {
    Generator gen(seed);
    data = Tensor::randn({n}, gen, DType::F32, device).to(dtype);
  }
  // Elements [begin, end), filled with NaN: the garbage a step leaves behind.
  Tensor piece(int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) listed[static_cast<size_t>(i)] = true;
    Tensor t = data.slice(begin, end);
    if (end > begin) t.fill_(std::nan(""));
    return t;
  }
  void snapshot() { before = data.to_vector(); }
  // Listed elements +0 (not -0, not NaN), all others as before.
  void check() const {
    const std::vector<double> after = data.to_vector();
    int64_t not_zero = 0, changed = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      if (listed[i]) not_zero += after[i] == 0.0 && !std::signbit(after[i]) ? 0 : 1;
      else changed += after[i] == before[i] ? 0 : 1;
    }
    INFO(dtype_name(data.dtype()) << " arena of " << after.size() << " elements");
    CHECK(not_zero == 0);
    CHECK(changed == 0);
  }
};

// Pieces of odd sizes (one past the 64 KiB a CUDA block clears, empty ones
// too) at every alignment a slice can have, in f32, bf16 and f64 arenas
// cleared in one call; a gap of 1 to 3 elements guards each side of each.
void check_mixed_pieces(Device device) {
  const std::vector<int64_t> sizes = {1, 3, 1025, 70001, 0, 2, 16385, 7, 1};
  std::vector<Arena> arenas;
  std::vector<Tensor> pieces;
  uint64_t seed = 11;
  for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
    for (int64_t start : {0, 1, 3}) {
      int64_t n = start + 3;
      for (int64_t s : sizes) n += s + 3;
      arenas.emplace_back(n, dtype, device, seed++);
    }
  }
  for (size_t a = 0; a < arenas.size(); ++a) {
    int64_t at = static_cast<int64_t>(a % 3 == 0 ? 0 : a % 3 == 1 ? 1 : 3);
    for (size_t k = 0; k < sizes.size(); ++k) {
      pieces.push_back(arenas[a].piece(at, at + sizes[k]));
      at += sizes[k] + 1 + static_cast<int64_t>(k % 3);
    }
  }
  for (Arena& a : arenas) a.snapshot();
  backend_for(device).zero_multi(pieces);
  for (const Arena& a : arenas) a.check();
}

// More tensors than one CUDA launch takes (192): 450 small pieces, the last
// of them in the last launch.
void check_many_pieces(Device device) {
  Arena arena(450 * 14, DType::F32, device, 3);
  std::vector<Tensor> pieces;
  for (int64_t i = 0; i < 450; ++i) pieces.push_back(arena.piece(i * 14 + 1, i * 14 + 1 + 1 + (i * 7) % 13));
  arena.snapshot();
  backend_for(device).zero_multi(pieces);
  arena.check();
}

std::vector<std::vector<double>> grads_of(Module& m) {
  std::vector<std::vector<double>> out;
  for (Parameter* p : m.parameters()) out.push_back(p->grad.to_vector());
  return out;
}

// Elements of the params' grads that are not +0.
int64_t not_zero(const std::vector<Parameter*>& params) {
  int64_t n = 0;
  for (Parameter* p : params)
    for (double v : p->grad.to_vector()) n += v == 0.0 && !std::signbit(v) ? 0 : 1;
  return n;
}

DecoderLMConfig tiny_config(Precision precision) {
  DecoderLMConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.d_model = 64;  // head dim 32: the fused attention kernels run on CUDA
  c.n_heads = 2;
  c.n_layers = 2;
  c.seed = 9;
  c.precision = precision;
  return c;
}

// Five steps at lr 0 on one batch: the parameters never change, so every
// step must see the first step's loss, norm and gradients bit for bit. A
// gradient not cleared before a step would hold two steps' sums. On CUDA the
// steps after the two warm-up steps are a captured graph and its replays.
void check_steps_start_from_zero(Device device, Precision precision) {
  DecoderLM model(tiny_config(precision));
  model.to(device);
  AdamWOptions o;
  o.lr = 0.0;
  o.max_grad_norm = 1.0;
  AdamW opt(model.parameters(), o);
  TrainStep step(model, opt, TrainStepOptions{});
  Generator gen(4);
  std::vector<double> ids(2 * 16), targets(ids.size());
  for (double& v : ids) v = static_cast<double>(gen.next_u64() % 64);
  for (double& v : targets) v = static_cast<double>(gen.next_u64() % 64);
  const Tensor i = Tensor::from_vector(ids, {2, 16}, DType::F32, device);
  const Tensor t = Tensor::from_vector(targets, {2, 16}, DType::F32, device);
  const StepResult first = step.run(i, t);
  const std::vector<std::vector<double>> first_grads = grads_of(model);
  for (int k = 2; k <= 5; ++k) {
    INFO("step " << k << ", graph " << step.graph_note());
    const StepResult r = step.run(i, t);
    CHECK(r.loss == first.loss);
    CHECK(r.grad_norm == first.grad_norm);
    const std::vector<std::vector<double>> grads = grads_of(model);
    int64_t changed = 0;  // parameters whose gradient differs from the first step's
    for (size_t p = 0; p < grads.size(); ++p) changed += grads[p] == first_grads[p] ? 0 : 1;
    CHECK(changed == 0);
  }
  if (device == Device::CUDA) {
    INFO(step.graph_note());
    CHECK(step.graph_active());
  }
}

}  // namespace

TEST_CASE("zero_multi on the CPU clears the listed tensors of any dtype, size and offset, and nothing else") {
  check_mixed_pieces(Device::CPU);
  check_many_pieces(Device::CPU);
  backend_for(Device::CPU).zero_multi({});  // nothing to do
  CHECK(contains(thrown_message([] { backend_for(Device::CPU).zero_multi({Tensor()}); }), "Backend::zero_multi"));
}

TEST_CASE("zero_grads clears every grad of a module and an optimizer; an undefined grad is named") {
  DecoderLM model(tiny_config(Precision::FP32));
  std::vector<Parameter*> params = model.parameters();
  for (Parameter* p : params) p->grad.fill_(std::nan(""));
  model.zero_grad();
  CHECK(not_zero(params) == 0);
  for (Parameter* p : params) p->grad.fill_(5.0);
  SGD sgd(params, {});
  sgd.zero_grad();
  CHECK(not_zero(params) == 0);
  params.back()->grad = Tensor();
  CHECK(contains(thrown_message([&] { model.zero_grad(); }), "Module::zero_grad"));
}

TEST_CASE("TrainStep: at lr 0 every step has the first step's gradients (nothing carried over), CPU") {
  check_steps_start_from_zero(Device::CPU, Precision::FP32);
}

TEST_CASE("zero_multi on CUDA clears f32, bf16 and f64 tensors of any size and offset in one call, nothing else",
          "[cuda]") {
  HG_REQUIRE_GPU();
  check_mixed_pieces(Device::CUDA);
  check_many_pieces(Device::CUDA);
  backend_for(Device::CUDA).zero_multi({});
  const Tensor on_host = Tensor::ones({3});
  CHECK(contains(thrown_message([&] { backend_for(Device::CUDA).zero_multi({on_host}); }), "cuda zero_multi"));
}

TEST_CASE("zero_multi on CUDA called first inside a graph capture clears the pieces at every replay", "[cuda]") {
  HG_REQUIRE_GPU();
  Arena arena(3 * 70001, DType::F32, Device::CUDA, 5);
  const std::vector<Tensor> pieces = {arena.piece(1, 70001), arena.piece(70003, 70004),
                                      arena.piece(140003, 3 * 70001 - 2)};
  gpu::Graph graph;
  graph.begin_capture();
  backend_for(Device::CUDA).zero_multi(pieces);  // first call for these tensors: nothing may be uploaded
  graph.end_capture();
  REQUIRE(graph.ready());
  for (int replay = 0; replay < 2; ++replay) {
    for (const Tensor& p : pieces) Tensor(p).fill_(std::nan(""));
    arena.snapshot();
    graph.replay();
    arena.check();
  }
}

TEST_CASE("zero_grads clears CUDA and CPU grads of one parameter list", "[cuda]") {
  HG_REQUIRE_GPU();
  DecoderLM on_gpu(tiny_config(Precision::BF16)), on_cpu(tiny_config(Precision::FP32));
  on_gpu.to(Device::CUDA);
  std::vector<Parameter*> params = on_gpu.parameters();
  for (Parameter* p : on_cpu.parameters()) params.push_back(p);
  for (Parameter* p : params) p->grad.fill_(std::nan(""));
  zero_grads(params, "test");
  CHECK(not_zero(params) == 0);
}

TEST_CASE("TrainStep: at lr 0 every step has the first step's gradients (nothing carried over), CUDA graph",
          "[graph][cuda]") {
  HG_REQUIRE_GPU();
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    INFO(precision_name(precision));
    check_steps_start_from_zero(Device::CUDA, precision);
  }
}
