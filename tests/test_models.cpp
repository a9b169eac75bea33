// Modules of the Transformer, cross-entropy and whole-model agreement.
//
// Gradient checks run in float64 against central finite differences
// (h = 1e-6: truncation ~h^2 and round-off ~1e-16/h both far below the 1e-6
// bound). float32 agreement bounds are stated where they are used.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/indexing.hpp"
#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"
#include "models/attention.hpp"
#include "models/decoder_lm.hpp"
#include "models/dropout.hpp"
#include "models/embedding.hpp"
#include "models/feedforward.hpp"
#include "models/gelu.hpp"
#include "models/training_memory.hpp"
#include "models/transformer_layer.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::numerical_grad;
using hg::test::rel_error;
using hg::test::weighted_sum;

namespace {

constexpr double kGradTol = 1e-6;

// Finite differences of `loss` w.r.t. up to max_coords coordinates of a
// float64 CPU tensor (all of them when it is small), compared with `analytic`.
// Floor 1e-9: a gradient that is zero in exact arithmetic leaves only FD noise.
double fd_rel_error(const std::function<double()>& loss, Tensor& x, const Tensor& analytic, int64_t max_coords,
                    Generator& g, double h = 1e-6) {
  return hg::test::sampled_fd_rel_error(loss, x, analytic, max_coords, g, h, 1e-9);
}

// Every parameter of m against finite differences; grads must already hold
// the analytic gradient of loss() (zero_grad, forward, backward).
void check_parameters(Module& m, const std::function<double()>& loss, int64_t max_coords = 400) {
  Generator g(7);
  // Snapshot the grads first: loss() re-runs forward, which may not touch
  // grads, but a snapshot keeps the check independent of that.
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& [name, p] : m.named_parameters()) grads.emplace_back(name, p->grad.clone());
  size_t k = 0;
  for (auto& [name, p] : m.named_parameters()) {
    const double err = fd_rel_error(loss, p->value, grads[k++].second, max_coords, g);
    INFO("parameter " << name << " " << shape_str(p->value.shape()) << " rel error " << err);
    CHECK(err < kGradTol);
  }
}

Tensor random_ids(const Shape& shape, int64_t vocab, Generator& g) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = static_cast<double>(g.next_u64() % static_cast<uint64_t>(vocab));
  return Tensor::from_vector(v, shape, DType::F32);
}

// Module-level check: loss = sum(forward(x) * w).
template <class M, class Fwd>
void check_module(M& m, Tensor x, Fwd forward, int64_t max_coords = 400) {
  Generator g(11);
  Tensor y = forward(m, x);
  const Tensor w = Tensor::randn(y.shape(), g, DType::F64);
  m.zero_grad();
  y = forward(m, x);
  const Tensor dx = m.backward(w);
  auto loss = [&] { return weighted_sum(forward(m, x), w); };
  Generator pick(3);
  const double ex = fd_rel_error(loss, x, dx, max_coords, pick);
  INFO("input rel error " << ex);
  CHECK(ex < kGradTol);
  check_parameters(m, loss, max_coords);
}

}  // namespace

// DecoderLM steps and their comparison.
namespace {

DecoderLMConfig tiny_config() {
  DecoderLMConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 6;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 2;
  c.seed = 3;
  return c;
}

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;  // on the host
  Tensor dembedded;
};

// One forward + backward of a DecoderLM on a fixed batch, in the current kernel mode.
StepResult lm_step(DecoderLM& model, const Tensor& ids, const Tensor& targets) {
  StepResult r;
  model.zero_grad();
  CrossEntropySaved saved;
  const Tensor logits = model.forward(ids);
  r.loss = cross_entropy_forward(logits, targets, -100, &saved).item();
  r.dembedded = model.backward(cross_entropy_backward(saved)).to(Device::CPU);
  for (auto& [name, p] : model.named_parameters()) r.grads.emplace_back(name, p->grad.to(Device::CPU));
  return r;
}

void fixed_batch(const DecoderLMConfig& c, int64_t b, int64_t t, Tensor* ids, Tensor* targets) {
  Generator g(21);
  *ids = random_ids({b, t}, c.vocab_size, g);
  *targets = random_ids({b, t}, c.vocab_size, g);
  targets->set({0, 0}, -100);  // some ignored positions
  targets->set({1, 2}, -100);
}

void compare_steps(const StepResult& a, const StepResult& b, double loss_tol, double grad_tol) {
  CHECK(std::abs(a.loss - b.loss) <= loss_tol * std::abs(a.loss));
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const double err = rel_error(a.grads[i].second.to(DType::F64), b.grads[i].second.to(DType::F64));
    INFO("grad of " << a.grads[i].first << " rel error " << err);
    CHECK(err < grad_tol);
  }
  CHECK(rel_error(a.dembedded.to(DType::F64), b.dembedded.to(DType::F64)) < grad_tol);
}

}  // namespace

// ---------------------------------------------------------------------------
TEST_CASE("Embedding: forward picks rows plus positions, grads match finite differences", "[models]") {
  Generator g(1);
  Embedding emb(7, 6, 4, g);
  emb.to(DType::F64);
  // Repeated ids in the batch: their gradient rows must accumulate.
  const Tensor ids = Tensor::from_vector({3, 1, 3, 0, 6, 1, 1, 2, 5, 3}, {2, 5}, DType::F32);
  const Tensor out = emb.forward(ids);
  REQUIRE(out.shape() == Shape({2, 5, 4}));
  CHECK(out.at({1, 3, 2}) == emb.token.value.at({5, 2}) + emb.position.value.at({3, 2}));
  const Tensor w = Tensor::randn(out.shape(), g, DType::F64);
  emb.zero_grad();
  emb.forward(ids);
  emb.backward(w);
  check_parameters(emb, [&] { return weighted_sum(emb.forward(ids), w); });
  // Rows of positions beyond T = 5 get exactly zero gradient.
  for (int64_t j = 0; j < 4; ++j) CHECK(emb.position.grad.at({5, j}) == 0.0);
}

TEST_CASE("Embedding: a second backward without zero_grad accumulates into both tables", "[models]") {
  Generator g(2);
  Embedding emb(7, 6, 4, g);
  emb.to(DType::F64);
  const Tensor ids = Tensor::from_vector({3, 1, 3, 0, 6, 1, 1, 2}, {2, 4}, DType::F32);
  const Tensor w = Tensor::randn({2, 4, 4}, g, DType::F64);
  emb.zero_grad();
  emb.forward(ids);
  emb.backward(w);
  const std::vector<double> token_once = emb.token.grad.to_vector(), position_once = emb.position.grad.to_vector();
  emb.forward(ids);
  emb.backward(w);
  const std::vector<double> token_twice = emb.token.grad.to_vector(), position_twice = emb.position.grad.to_vector();
  // Repeated ids sum in another order the second time: equal to rounding.
  for (size_t i = 0; i < token_once.size(); ++i) CHECK(token_twice[i] == Approx(2 * token_once[i]).epsilon(1e-14));
  for (size_t i = 0; i < position_once.size(); ++i) CHECK(position_twice[i] == 2 * position_once[i]);
}

TEST_CASE("Embedding: bad ids and lengths throw hg::Error", "[models]") {
  Generator g(1);
  Embedding emb(5, 4, 3, g);
  CHECK_THROWS_AS(emb.forward(Tensor::from_vector({0, 5}, {1, 2})), Error);    // id == vocab
  CHECK_THROWS_AS(emb.forward(Tensor::from_vector({0, -1}, {1, 2})), Error);   // negative
  CHECK_THROWS_AS(emb.forward(Tensor::from_vector({0, 1.5}, {1, 2})), Error);  // not an integer
  CHECK_THROWS_AS(emb.forward(Tensor::zeros({1, 5})), Error);                  // T > max_positions
  CHECK_THROWS_AS(emb.forward(Tensor::zeros({4})), Error);                     // not (B, T)
  CHECK_THROWS_AS(emb.backward(Tensor::zeros({1, 2, 3})), Error);              // before forward
  emb.forward(Tensor::zeros({1, 2}));
  CHECK_THROWS_AS(emb.backward(Tensor::zeros({1, 3, 3})), Error);  // wrong dy shape
}

TEST_CASE("Dropout: mask statistics, same mask in backward, identity in eval", "[models]") {
  Dropout drop(0.3, 42);
  const Tensor x = Tensor::ones({100, 100});
  const Tensor y = drop.forward(x);
  int64_t zeros = 0;
  for (double v : y.to_vector()) {
    if (v == 0) ++zeros;
    else CHECK(std::abs(v - 1.0 / 0.7) < 1e-6);
  }
  // 10000 Bernoulli(0.3) draws: sd 0.0046, so 0.03 is a > 6-sigma bound.
  CHECK(std::abs(static_cast<double>(zeros) / 1e4 - 0.3) < 0.03);
  const Tensor dy = Tensor::ones({100, 100});
  CHECK(rel_error(drop.backward(dy), y) == 0.0);  // backward applies the very same mask

  // Finite differences with the mask replayed by reseeding.
  Generator g(2);
  Tensor x64 = Tensor::randn({3, 7}, g, DType::F64);
  const Tensor w = Tensor::randn({3, 7}, g, DType::F64);
  drop.reseed(5);
  drop.forward(x64);
  const Tensor dx = drop.backward(w);
  auto loss = [&] {
    drop.reseed(5);
    return weighted_sum(drop.forward(x64), w);
  };
  Generator pick(1);
  CHECK(fd_rel_error(loss, x64, dx, 100, pick) < kGradTol);

  drop.eval();
  CHECK(drop.forward(x64).shares_storage_with(x64));
  CHECK_THROWS_AS(Dropout(1.0), Error);
  CHECK_THROWS_AS(Dropout(-0.1), Error);
  CHECK_THROWS_AS(Dropout(NAN), Error);
}

TEST_CASE("Dropout: same seed gives the same mask", "[models]") {
  Dropout a(0.5, 9), b(0.5, 9), c(0.5, 10);
  const Tensor x = Tensor::ones({64});
  const Tensor ya = a.forward(x), yb = b.forward(x), yc = c.forward(x);
  CHECK(ya.to_vector() == yb.to_vector());
  CHECK(ya.to_vector() != yc.to_vector());
}

// The mask a host loop over the generator makes: what Dropout drew before
// its mask moved into Backend::dropout_mask, and what the op must still give.
std::vector<double> host_loop_mask(uint64_t seed, uint64_t counter, int64_t n, double p) {
  Generator g;
  g.set_state(seed, counter);
  std::vector<double> m(static_cast<size_t>(n));
  for (double& v : m) v = g.uniform() >= p ? 1.0 / (1.0 - p) : 0.0;
  return m;
}

TEST_CASE("Backend::dropout_mask is the Generator's stream element by element, in every dtype", "[models][dropout]") {
  const int64_t n = 100003;  // odd: ragged thread chunks
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    INFO(dtype_name(dt));
    Tensor out = Tensor::empty({n}, dt);
    cpu_backend().dropout_mask(out, 77, 12345, 0.1);
    // from_vector converts 1 / 0.9 to the dtype as the op must.
    CHECK(out.to_vector() == Tensor::from_vector(host_loop_mask(77, 12345, n, 0.1), {n}, dt).to_vector());
  }
  Tensor out = Tensor::empty({4});
  CHECK_THROWS_WITH(cpu_backend().dropout_mask(out, 1, 0, 1.0), Catch::Contains("p must be in [0, 1), got 1"));
}

TEST_CASE("Dropout: consecutive masks continue one stream, as the host loop did", "[models][dropout]") {
  Dropout drop(0.25, 1234);
  const Tensor x = Tensor::ones({37, 53});
  drop.forward(x);
  const std::vector<double> first = drop.mask().to_vector();
  drop.forward(x);
  const std::vector<double> second = drop.mask().to_vector();
  auto as_f32 = [](const std::vector<double>& m) { return Tensor::from_vector(m, {37, 53}).to_vector(); };
  CHECK(first == as_f32(host_loop_mask(1234, 0, 37 * 53, 0.25)));
  CHECK(second == as_f32(host_loop_mask(1234, 37 * 53, 37 * 53, 0.25)));
  CHECK(first != second);
}

TEST_CASE("CUDA Dropout: the device-drawn mask equals the CPU mask bit for bit (f32, bf16)",
          "[models][dropout][cuda]") {
  HG_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    Dropout cpu(0.1, 99), gpu(0.1, 99);
    const Tensor x = Tensor::ones({64, 33, 40});
    for (int k = 0; k < 2; ++k) {  // the second mask checks the stream position too
      cpu.forward(x);
      gpu.forward(x.to(dt).to(Device::CUDA));
      REQUIRE(gpu.mask().dtype() == dt);
      CHECK(gpu.mask().to(Device::CPU).to_vector() == cpu.mask().to(dt).to_vector());
    }
  }
}

TEST_CASE("GELU module: grads match finite differences", "[models]") {
  Generator g(3);
  GELU gelu_module;
  Tensor x = Tensor::randn({4, 9}, g, DType::F64, Device::CPU, 0.0, 2.0);
  check_module(gelu_module, x, [](GELU& m, const Tensor& in) { return m.forward(in); });
}

TEST_CASE("MultiHeadAttention: grads match finite differences, no mask", "[models]") {
  Generator g(4);
  MultiHeadAttention attn(8, 2, g);
  attn.to(DType::F64);
  Tensor x = Tensor::randn({2, 5, 8}, g, DType::F64);
  check_module(attn, x, [](MultiHeadAttention& m, const Tensor& in) { return m.forward(in); });
}

TEST_CASE("MultiHeadAttention: grads match finite differences with a key padding mask", "[models]") {
  Generator g(5);
  MultiHeadAttention attn(12, 3, g);
  attn.to(DType::F64);
  Tensor x = Tensor::randn({2, 6, 12}, g, DType::F64);
  // Batch 0 keeps every key; batch 1 masks its last two keys.
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1e9, -1e9}, {2, 1, 1, 6}, DType::F64);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    check_module(attn, x, [&](MultiHeadAttention& m, const Tensor& in) { return m.forward(in, mask); });
  }
}

TEST_CASE("MultiHeadAttention: edge sizes (T = 1, head width 1) vs finite differences", "[models]") {
  Generator g(14);
  MultiHeadAttention one_token(6, 2, g);
  one_token.to(DType::F64);
  Tensor x1 = Tensor::randn({3, 1, 6}, g, DType::F64);
  check_module(one_token, x1, [](MultiHeadAttention& m, const Tensor& in) { return m.forward(in); });
  MultiHeadAttention narrow_heads(4, 4, g);  // dh = 1
  narrow_heads.to(DType::F64);
  Tensor x2 = Tensor::randn({1, 7, 4}, g, DType::F64);
  check_module(narrow_heads, x2, [](MultiHeadAttention& m, const Tensor& in) { return m.forward(in); });
}

TEST_CASE("MultiHeadAttention: causal and padding masks hide what they should", "[models]") {
  Generator g(6);
  MultiHeadAttention attn(8, 2, g);
  Tensor x = Tensor::randn({1, 6, 8}, g);
  const Tensor y = attn.forward(x);
  Tensor x2 = x.clone();
  for (int64_t j = 0; j < 8; ++j) x2.set({0, 5, j}, 100.0);  // change only the last token
  const Tensor y2 = attn.forward(x2);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t j = 0; j < 8; ++j) CHECK(y.at({0, t, j}) == y2.at({0, t, j}));
  bool last_changed = false;
  for (int64_t j = 0; j < 8; ++j) last_changed |= y.at({0, 5, j}) != y2.at({0, 5, j});
  CHECK(last_changed);

  // With key 2 padded out, changing token 2 only changes query 2's own row... which
  // is still masked for itself; every other query must be unaffected.
  const Tensor mask = Tensor::from_vector({0, 0, -INFINITY, 0, 0, 0}, {1, 1, 1, 6});
  const Tensor m1 = attn.forward(x, mask);
  Tensor x3 = x.clone();
  for (int64_t j = 0; j < 8; ++j) x3.set({0, 2, j}, -50.0);
  const Tensor m2 = attn.forward(x3, mask);
  for (int64_t t : {0, 1, 3, 4, 5})
    for (int64_t j = 0; j < 8; ++j) CHECK(std::abs(m1.at({0, t, j}) - m2.at({0, t, j})) < 1e-6);
  CHECK(test::all_finite(m1));

  CHECK_THROWS_AS(attn.forward(Tensor::zeros({1, 6, 7})), Error);        // wrong width
  CHECK_THROWS_AS(attn.forward(x, Tensor::zeros({1, 1, 1, 5})), Error);  // mask length
  CHECK_THROWS_AS(MultiHeadAttention(10, 3, g), Error);                  // d % heads != 0
}

TEST_CASE("FeedForward: grads match finite differences", "[models]") {
  Generator g(7);
  FeedForward ffn(6, 24, g);
  ffn.to(DType::F64);
  Tensor x = Tensor::randn({2, 3, 6}, g, DType::F64);
  check_module(ffn, x, [](FeedForward& m, const Tensor& in) { return m.forward(in); });
}

TEST_CASE("FeedForward recompute_gelu: grads match finite differences and the kept-input backward", "[models]") {
  KernelModeScope scope(KernelMode::Fused);
  Generator g_kept(7), g(7);  // one seed: the same initial weights
  FeedForward kept(6, 24, g_kept), recomputed(6, 24, g);
  kept.to(DType::F64);
  recomputed.to(DType::F64);
  recomputed.set_recompute_gelu(true);
  REQUIRE(recomputed.fc1.gelu_fusable());
  Tensor x = Tensor::randn({2, 3, 6}, g, DType::F64);
  check_module(recomputed, x, [](FeedForward& m, const Tensor& in) { return m.forward(in); });
  // The same float64 arithmetic on the same pre-activation: equal gradients.
  const Tensor w = Tensor::randn({2, 3, 6}, g, DType::F64);
  kept.zero_grad();
  recomputed.zero_grad();
  kept.forward(x);
  recomputed.forward(x);
  CHECK(rel_error(kept.backward(w), recomputed.backward(w)) < 1e-14);
  CHECK(rel_error(kept.fc2.weight.grad, recomputed.fc2.weight.grad) < 1e-14);
  CHECK(rel_error(kept.fc1.weight.grad, recomputed.fc1.weight.grad) < 1e-14);
  // Dropping the input without a way to recompute it is refused.
  recomputed.forward(x);
  CHECK_THROWS_WITH(recomputed.fc2.forget_input(nullptr), Catch::Contains("needs the function"));
}

TEST_CASE("TransformerLayer: grads match finite differences, fused and unfused", "[models]") {
  Generator g(8);
  TransformerLayer layer(8, 2, 16, g);
  layer.to(DType::F64);
  Tensor x = Tensor::randn({2, 4, 8}, g, DType::F64);
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, -1e9}, {2, 1, 1, 4}, DType::F64);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    check_module(
        layer, x, [&](TransformerLayer& m, const Tensor& in) { return m.forward(in, mask); }, 200);
  }
}

// ---------------------------------------------------------------------------
// Recomputed LayerNorm outputs (TransformerLayer::set_recompute_layernorm).
TEST_CASE("Linear forget_input with a recompute function: called once by the backward, dropped by a new forward",
          "[models]") {
  Generator g(31);
  Linear lin(5, 4, g);
  lin.to(DType::F64);
  const Tensor x = Tensor::randn({3, 5}, g, DType::F64), dy = Tensor::randn({3, 4}, g, DType::F64);
  lin.zero_grad();
  lin.forward(x);
  const Tensor dx_kept = lin.backward(dy), dw_kept = lin.weight.grad.clone();
  int calls = 0;
  auto same_x = [&] {
    ++calls;
    return x.clone();  // other storage, the same values
  };
  lin.zero_grad();
  lin.forward(x);
  lin.forget_input(same_x);
  CHECK_FALSE(lin.holds_input());
  CHECK(test::same_bytes(lin.backward(dy), dx_kept));
  CHECK(test::same_bytes(lin.weight.grad, dw_kept));
  CHECK(calls == 1);
  CHECK_FALSE(lin.holds_input());  // released after the dW GEMM, as a kept input is
  // A forward after forget_input keeps its own input: the pending recompute is not called.
  lin.zero_grad();
  lin.forward(x);
  lin.forget_input(same_x);
  lin.forward(x);
  CHECK(lin.holds_input());
  CHECK(test::same_bytes(lin.backward(dy), dx_kept));
  CHECK(calls == 1);
  // A recompute of another shape is refused, naming both.
  lin.forward(x);
  lin.forget_input([&] { return Tensor::zeros({2, 5}, DType::F64); });
  CHECK_THROWS_WITH(lin.backward(dy),
                    Catch::Contains("recomputed input must be f64 (3, 5) as in the forward, got f64 (2, 5)"));
}

namespace {

// Every LayerNorm's gamma and beta moved off their 1 / 0 start (uniform in
// [0.5, 1.5), the same draws for modules built alike), so that a recompute
// reading the wrong gain or shift shows.
void spread_layernorm_params(Module& m, uint64_t seed) {
  Generator g(seed);
  const auto ends_with = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  for (auto& [name, p] : m.named_parameters())
    if (ends_with(name, "gamma") || ends_with(name, "beta"))
      p->value.copy_(Tensor::rand(p->value.shape(), g, DType::F64, Device::CPU, 0.5, 1.5));
}

// Every parameter gradient of two modules built alike, byte for byte.
void check_same_grads(Module& a, Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("grad of " << pa[i].first);
    CHECK(test::same_bytes(pa[i].second->grad, pb[i].second->grad));
  }
}

}  // namespace

// On the CPU LN2's recompute runs layernorm_forward on the stored h, as the
// residual forward composes it: both layers run the same float32 arithmetic
// on the same values, so every output and gradient is bitwise the same, in
// both kernel modes, with either attention core, with dropout and with
// recompute_gelu on in both layers.
TEST_CASE("TransformerLayer recompute_layernorm: float32 gradients bitwise the kept-input layer's", "[models]") {
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, -1e9}, {2, 1, 1, 4});
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused})
    for (auto impl : {AttentionImpl::Softmax, AttentionImpl::Flash})
      for (bool gelu : {false, true}) {
        if (mode == KernelMode::Unfused && impl == AttentionImpl::Flash) continue;  // unfused composes softmax
        KernelModeScope scope(mode);
        INFO("mode " << kernel_mode_name(mode) << ", attention " << attention_impl_name(impl) << ", recompute_gelu "
                     << gelu);
        Generator g_kept(8), g(8);  // one seed: the same weights and dropout masks
        TransformerLayer kept(8, 2, 16, g_kept, 0.3, 5), recomputed(8, 2, 16, g, 0.3, 5);
        for (TransformerLayer* m : {&kept, &recomputed}) {
          m->attn.set_impl(impl);
          m->ffn.set_recompute_gelu(gelu);
        }
        recomputed.set_recompute_layernorm(true);
        spread_layernorm_params(kept, 4);
        spread_layernorm_params(recomputed, 4);
        Generator data(9);
        const Tensor x = Tensor::randn({2, 4, 8}, data), w = Tensor::randn({2, 4, 8}, data);
        kept.zero_grad();
        recomputed.zero_grad();
        CHECK(test::same_bytes(kept.forward(x, mask), recomputed.forward(x, mask)));
        CHECK(kept.attn.qkv.holds_input());
        CHECK(kept.ffn.fc1.holds_input());
        CHECK_FALSE(recomputed.attn.qkv.holds_input());  // LN1's output is gone ...
        CHECK_FALSE(recomputed.ffn.fc1.holds_input());   // ... and LN2's
        CHECK(test::same_bytes(kept.backward(w), recomputed.backward(w)));
        check_same_grads(kept, recomputed);
      }
}

TEST_CASE("TransformerLayer recompute_layernorm: grads match finite differences, fused and unfused", "[models]") {
  Generator g(8);
  TransformerLayer layer(8, 2, 16, g);
  layer.to(DType::F64);
  layer.set_recompute_layernorm(true);
  spread_layernorm_params(layer, 4);
  Tensor x = Tensor::randn({2, 4, 8}, g, DType::F64);
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, -1e9}, {2, 1, 1, 4}, DType::F64);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused})
    for (bool gelu : {false, true}) {
      KernelModeScope scope(mode);
      INFO("mode " << kernel_mode_name(mode) << ", recompute_gelu " << gelu);
      layer.ffn.set_recompute_gelu(gelu);
      check_module(
          layer, x, [&](TransformerLayer& m, const Tensor& in) { return m.forward(in, mask); }, 200);
    }
}

// ---------------------------------------------------------------------------
// Dropout > 0 in gradient checks. Each Dropout draws its mask from its own
// seeded stream; reseeding every one of them before each forward gives every
// finite-difference evaluation exactly the masks the analytic backward used.
// A backward that skips a mask, or applies it twice, is then off by O(p) in
// every gradient upstream of it. MultiHeadAttention has no dropout of its
// own: the attention branch's dropout is TransformerLayer::attn_drop, checked
// with the layer (and, in the CUDA case below, on the GPU).
namespace {

constexpr double kDropP = 0.3;

void reseed_dropouts(FeedForward& m, uint64_t seed) { m.drop.reseed(seed); }
void reseed_dropouts(TransformerLayer& m, uint64_t seed) {
  m.attn_drop.reseed(seed);
  reseed_dropouts(m.ffn, seed + 1);
}
void reseed_dropouts(DecoderLM& m, uint64_t seed) {
  m.embed_drop.reseed(seed);
  for (size_t i = 0; i < m.layers.size(); ++i) reseed_dropouts(*m.layers[i], seed + 2 + 2 * i);
}

// The fraction of elements the last forward of d dropped (0 when it was the identity).
double dropped_fraction(const Dropout& d) {
  if (!d.mask().defined()) return 0.0;
  const std::vector<double> m = d.mask().to_vector();
  return static_cast<double>(std::count(m.begin(), m.end(), 0.0)) / static_cast<double>(m.size());
}

// Every mask of the layer really dropped something (so the check has teeth).
void check_masks_used(TransformerLayer& m) {
  CHECK(dropped_fraction(m.attn_drop) > 0.1);
  CHECK(dropped_fraction(m.ffn.drop) > 0.1);
}

}  // namespace

TEST_CASE("FeedForward with dropout: grads match finite differences, masks replayed", "[models][dropout]") {
  Generator g(17);
  FeedForward ffn(6, 24, g, kDropP, 5);
  ffn.to(DType::F64);
  Tensor x = Tensor::randn({2, 3, 6}, g, DType::F64);
  check_module(ffn, x, [](FeedForward& m, const Tensor& in) {
    reseed_dropouts(m, 31);
    return m.forward(in);
  });
  CHECK(dropped_fraction(ffn.drop) > 0.1);
}

TEST_CASE("TransformerLayer with dropout: grads match finite differences, fused and unfused", "[models][dropout]") {
  Generator g(18);
  TransformerLayer layer(8, 2, 16, g, kDropP, 9);
  layer.to(DType::F64);
  Tensor x = Tensor::randn({2, 4, 8}, g, DType::F64);
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, -1e9, 0}, {2, 1, 1, 4}, DType::F64);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    check_module(
        layer, x,
        [&](TransformerLayer& m, const Tensor& in) {
          reseed_dropouts(m, 41);
          return m.forward(in, mask);
        },
        120);
    check_masks_used(layer);
  }
}

namespace {

// One forward + backward of a module with dy = w; grads and dx (in the
// field StepResult names for the DecoderLM's input gradient) on the host.
template <class M, class Fwd>
StepResult module_step(M& m, const Tensor& x, const Tensor& w, Fwd forward) {
  StepResult r;
  m.zero_grad();
  r.loss = weighted_sum(test::f64(forward(m, x)), test::f64(w));
  r.dembedded = m.backward(w).to(Device::CPU);
  for (auto& [name, p] : m.named_parameters()) r.grads.emplace_back(name, p->grad.to(Device::CPU));
  return r;
}

// A path a module's gradients are computed on.
struct ModulePath {
  const char* name;
  Device device;
  DType dtype;
  KernelMode mode;
};

// Every path of a model against its float64 CPU gradients (themselves
// checked by finite differences above). make() builds the same float32 model
// each call (the float64 one is it widened: the same weights exactly);
// step(model, dtype, device) runs one forward + backward on inputs stored in
// that dtype and device, replaying any dropout masks. The paths of `device`:
// f64 (unfused: CUDA has no fused f64), fused f32 and unfused f32.
template <class Make, class Step>
void check_paths_against_f64(const std::string& what, Device device, Make make, Step step, double f32_tol) {
  const std::vector<ModulePath> paths = {{"unfused f64", device, DType::F64, KernelMode::Unfused},
                                         {"fused f32", device, DType::F32, KernelMode::Fused},
                                         {"unfused f32", device, DType::F32, KernelMode::Unfused}};
  StepResult ref;
  {
    KernelModeScope scope(KernelMode::Fused);
    auto m = make();
    m->to(DType::F64);
    ref = step(*m, DType::F64, Device::CPU);
  }
  for (const ModulePath& p : paths) {
    INFO(what << ", path " << device_name(p.device) << " " << p.name);
    KernelModeScope scope(p.mode);
    auto m = make();
    m->to(p.dtype);
    m->to(p.device);
    // float64 paths differ from the reference only in summation order.
    const double tol = p.dtype == DType::F64 ? 1e-12 : f32_tol;
    compare_steps(ref, step(*m, p.dtype, p.device), tol, tol);
  }
}

// The step of a module whose loss is sum(forward(x) * w), x and w float32 values.
template <class M, class Fwd>
auto module_stepper(const Tensor& x, const Tensor& w, Fwd forward) {
  return [=](M& m, DType dtype, Device device) {
    return module_step(m, x.to(dtype).to(device), w.to(dtype).to(device), forward);
  };
}

// Dropout, FeedForward and TransformerLayer with dropout 0.3 on every path of `device`.
// float32 bound: measured on the CPU, the float32 paths' worst relative
// error against float64 (any parameter gradient, dx or the loss, both
// modules) is 3.7e-7; 3e-6 is an 8x margin. A skipped or doubled mask is off by O(p).
void check_dropout_modules_on(Device device) {
  Generator g(19);
  const Tensor x = Tensor::randn({2, 5, 8}, g).to(DType::F64);
  const Tensor w = Tensor::randn({2, 5, 8}, g).to(DType::F64);
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, -1e9, 0, 0}, {2, 1, 1, 5});
  const double f32_tol = 3e-6;
  check_paths_against_f64(
      "Dropout", device, [] { return std::make_unique<Dropout>(kDropP, 3); },
      module_stepper<Dropout>(x, w,
                              [](Dropout& m, const Tensor& in) {
                                m.reseed(51);
                                return m.forward(in);
                              }),
      f32_tol);
  check_paths_against_f64(
      "FeedForward with dropout", device,
      [] {
        Generator init(23);
        return std::make_unique<FeedForward>(8, 20, init, kDropP, 7);
      },
      module_stepper<FeedForward>(x, w,
                                  [](FeedForward& m, const Tensor& in) {
                                    reseed_dropouts(m, 61);
                                    return m.forward(in);
                                  }),
      f32_tol);
  check_paths_against_f64(
      "TransformerLayer with dropout", device,
      [] {
        Generator init(29);
        return std::make_unique<TransformerLayer>(8, 2, 20, init, kDropP, 11);
      },
      module_stepper<TransformerLayer>(x, w,
                                       [mask](TransformerLayer& m, const Tensor& in) {
                                         reseed_dropouts(m, 71);
                                         return m.forward(in, mask.to(math_dtype(in.dtype())).to(in.device()));
                                       }),
      f32_tol);
}

}  // namespace

TEST_CASE("modules with dropout: CPU paths against the float64 gradients, masks replayed", "[models][dropout]") {
  check_dropout_modules_on(Device::CPU);
}

TEST_CASE("CUDA: modules with dropout against the float64 CPU gradients, masks replayed", "[cuda][models][dropout]") {
  HG_REQUIRE_GPU();
  check_dropout_modules_on(Device::CUDA);
}

// ---------------------------------------------------------------------------
TEST_CASE("cross_entropy: value, ignore_index and grads vs finite differences", "[ops][cross_entropy]") {
  Generator g(9);
  Tensor logits = Tensor::randn({3, 4, 7}, g, DType::F64, Device::CPU, 0.0, 3.0);
  const Tensor targets = Tensor::from_vector({0, 6, -100, 3, 2, 2, -100, -100, 5, 1, 0, 4}, {3, 4}, DType::F32);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    CrossEntropySaved saved;
    const double loss = cross_entropy_forward(logits, targets, -100, &saved).item();
    // Reference: direct formula on the host.
    const auto lv = logits.to_vector();
    const auto tv = targets.to_vector();
    double ref = 0;
    int n = 0;
    for (int r = 0; r < 12; ++r) {
      if (tv[r] == -100) continue;
      double m = -INFINITY, s = 0;
      for (int j = 0; j < 7; ++j) m = std::max(m, lv[r * 7 + j]);
      for (int j = 0; j < 7; ++j) s += std::exp(lv[r * 7 + j] - m);
      ref += m + std::log(s) - lv[r * 7 + static_cast<int>(tv[r])];
      ++n;
    }
    CHECK(std::abs(loss - ref / n) < 1e-12 * std::abs(ref));
    CHECK(saved.n_valid == 9);
    const Tensor dlogits = cross_entropy_backward(saved, 1.0);
    REQUIRE(dlogits.shape() == logits.shape());
    Generator pick(1);
    auto f = [&] { return cross_entropy_forward(logits, targets, -100, nullptr).item(); };
    CHECK(fd_rel_error(f, logits, dlogits, 1000, pick) < kGradTol);
    // Ignored rows have exactly zero gradient; scaling by dloss is linear.
    for (int j = 0; j < 7; ++j) CHECK(dlogits.at({0, 2, j}) == 0.0);
    CHECK(rel_error(cross_entropy_backward(saved, -2.5), mul_scalar(dlogits, -2.5)) < 1e-15);
  }
}

TEST_CASE("cross_entropy: hostile inputs", "[ops][cross_entropy]") {
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    // Every position ignored: loss 0, grads 0, no NaN.
    CrossEntropySaved saved;
    const Tensor logits = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    const Tensor ignored = Tensor::from_vector({-1, -1}, {2});
    CHECK(cross_entropy_forward(logits, ignored, -1, &saved).item() == 0.0);
    CHECK(test::max_abs_diff(cross_entropy_backward(saved), Tensor::zeros({2, 3})) == 0.0);
    // Large offsets and a huge spread stay finite and exact.
    const Tensor big = Tensor::from_vector({1e4, 1e4 + 1, 1e4 - 30, -1e4}, {1, 4});
    const double l = cross_entropy_forward(big, Tensor::from_vector({1}, {1}), -100, &saved).item();
    CHECK(std::abs(l - std::log1p(std::exp(-1.0) + std::exp(-31.0))) < 1e-5);
    CHECK(test::all_finite(cross_entropy_backward(saved)));
    // Vocab of one class: loss is exactly 0.
    CHECK(cross_entropy_forward(Tensor::from_vector({3.0}, {1, 1}), Tensor::from_vector({0}, {1}), -100, nullptr)
              .item() == 0.0);
    // Bad targets and shapes.
    CHECK_THROWS_AS(cross_entropy_forward(logits, Tensor::from_vector({0, 3}, {2}), -100, nullptr), Error);
    CHECK_THROWS_AS(cross_entropy_forward(logits, Tensor::from_vector({0, 0.5}, {2}), -100, nullptr), Error);
    CHECK_THROWS_AS(cross_entropy_forward(logits, Tensor::from_vector({0, 1, 2}, {3}), -100, nullptr), Error);
    CHECK_THROWS_AS(cross_entropy_forward(logits, Tensor::from_vector({0, 1}, {2}, DType::F64), -100, nullptr), Error);
  }
  CHECK_THROWS_AS(cross_entropy_backward(CrossEntropySaved{}), Error);
}

TEST_CASE("cross_entropy: fused and unfused agree in float32 over a wide vocab", "[ops][cross_entropy]") {
  // V = 4097 (odd, past a power of two). Both paths compute in a different
  // order; float32 rounding bounds their gap near 1e-6 relative.
  Generator g(10);
  const Tensor logits = Tensor::randn({5, 4097}, g, DType::F32, Device::CPU, 50.0, 4.0);
  const Tensor targets = Tensor::from_vector({0, 4096, -100, 17, 2048}, {5});
  CrossEntropySaved sf, su;
  double lf, lu;
  {
    KernelModeScope s(KernelMode::Fused);
    lf = cross_entropy_forward(logits, targets, -100, &sf).item();
  }
  {
    KernelModeScope s(KernelMode::Unfused);
    lu = cross_entropy_forward(logits, targets, -100, &su).item();
  }
  CHECK(std::abs(lf - lu) < 1e-5 * std::abs(lf));
  CHECK(rel_error(cross_entropy_backward(sf), cross_entropy_backward(su)) < 1e-5);
}

namespace {

// max_i |a_i - b_i| / |b_i|: every element to relative accuracy, however
// small (an exact zero in b must be an exact zero in a).
double max_elementwise_rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (vb[i] == 0) {
      if (va[i] != 0) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(va[i] - vb[i]) / std::abs(vb[i]));
  }
  return worst;
}

}  // namespace

TEST_CASE("cross_entropy: float32 fused and unfused vs the float64 path at hostile sizes", "[ops][cross_entropy]") {
  // float32 logits near 1e3 (large offset): every path works relative to the
  // row max, so the loss keeps ~1e-6 relative accuracy. The gradient
  // (softmax - onehot) / n has entries from ~1e-1 down to ~1e-20 at vocab
  // 65536, so an absolute bound says nothing about most of them: each entry
  // is checked relative to itself. Its float32 error is that of
  // exp(z - max - log(sum)): up to |z - max - log(sum)| 2^-24 <= ~50 * 6e-8
  // from the rounded argument, plus the sum's. Measured on the CPU: worst
  // entry 1.3e-6 (unfused, vocab 65536; fused, float32 SIMD exp and double
  // sums: 1.6e-7), norm-wise 4.5e-8. Bounds: 1e-5 per entry, 5e-7 norm-wise
  // (>= 7x).
  Generator g(13);
  for (int64_t vocab : {1, 3, 1000, 4097, 65536}) {
    INFO("vocab " << vocab);
    const Tensor logits64 = Tensor::randn({4, vocab}, g, DType::F64, Device::CPU, 1000.0, 4.0);
    const Tensor logits32 = logits64.to(DType::F32);
    const Tensor targets =
        Tensor::from_vector({0, static_cast<double>(vocab - 1), -100, static_cast<double>(vocab / 3)}, {4});
    CrossEntropySaved ref_saved;
    // The float64 reference sees the same (float32-rounded) logits.
    const double ref = cross_entropy_forward(logits32.to(DType::F64), targets, -100, &ref_saved).item();
    const Tensor ref_grad = cross_entropy_backward(ref_saved);
    for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
      KernelModeScope scope(mode);
      INFO("mode " << kernel_mode_name(mode));
      CrossEntropySaved saved;
      const double loss = cross_entropy_forward(logits32, targets, -100, &saved).item();
      CHECK(std::abs(loss - ref) <= 1e-5 * std::max(1.0, std::abs(ref)));
      const Tensor grad = cross_entropy_backward(saved).to(DType::F64);
      CHECK(rel_error(grad, ref_grad) < 5e-7);
      CHECK(max_elementwise_rel_error(grad, ref_grad) < 1e-5);
    }
  }
}

TEST_CASE("gather_rows / scatter_add_rows: values, repeated ids, errors", "[core][indexing]") {
  const Tensor table = Tensor::from_vector({0, 1, 10, 11, 20, 21}, {3, 2});
  const Tensor ids = Tensor::from_vector({2, 0, 2}, {3});
  const Tensor rows = gather_rows(table, ids);
  CHECK(rows.to_vector() == std::vector<double>({20, 21, 0, 1, 20, 21}));
  Tensor grad_table = Tensor::zeros({3, 2});
  scatter_add_rows(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}), ids, grad_table);
  CHECK(grad_table.to_vector() == std::vector<double>({3, 4, 0, 0, 6, 8}));
  CHECK_THROWS_AS(gather_rows(table, Tensor::from_vector({3}, {1})), Error);
  CHECK_THROWS_AS(gather_rows(Tensor::zeros({6}), ids), Error);
  CHECK_THROWS_AS(scatter_add_rows(Tensor::zeros({3, 3}), ids, grad_table), Error);
}

// What TrainStep checks a GPU batch with: the count of values that are not
// ids, on every device the same, across many blocks on CUDA.
TEST_CASE("count_bad_indices: non-integers, out of range, NaN and inf are counted, the exception value apart",
          "[core][indexing]") {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const Tensor few = Tensor::from_vector({0, 39, 40, -1, 2.5, nan, inf, -inf, -100, 7, 39.5}, {11}, DType::F32);
  Generator g(12);
  std::vector<double> many(100003);
  for (double& v : many) v = static_cast<double>(g.next_u64() % 40);
  int64_t planted = 0;
  for (size_t i = 17; i < many.size(); i += 977, ++planted) many[i] = i % 3 == 0 ? 40 : (i % 3 == 1 ? -0.5 : nan);
  const Tensor lots = Tensor::from_vector(many, {100003}, DType::F32);
  std::vector<Device> devices{Device::CPU};
  if (test::cuda_paths_run("count_bad_indices")) devices.push_back(Device::CUDA);
  for (const Device dev : devices) {
    INFO(device_name(dev));
    CHECK(count_bad_indices(few.to(dev), 40) == 8);
    CHECK(count_bad_indices(few.to(dev), 40, -100) == 7);
    CHECK(count_bad_indices(few.to(dev), 41) == 7);  // 40 is an id now
    CHECK(count_bad_indices(lots.to(dev), 40) == planted);
    CHECK(count_bad_indices(Tensor::zeros({0}, DType::F32, dev), 40) == 0);
    // Several sets, read back together: each its own count, in order.
    const std::vector<int64_t> counts = count_bad_indices({{few.to(dev), 40, nan},
                                                           {lots.to(dev), 40, nan},
                                                           {Tensor::zeros({0}, DType::F32, dev), 40, nan},
                                                           {few.to(dev), 40, -100},
                                                           {few.to(dev), 41, nan}});
    CHECK(counts == std::vector<int64_t>{8, planted, 0, 7, 7});
  }
  CHECK_THROWS_AS(count_bad_indices(few.to(DType::F64), 40), Error);
  CHECK_THROWS_AS(count_bad_indices(few, 0), Error);
  CHECK(count_bad_indices(std::vector<IndexSet>{}).empty());
  if (devices.size() > 1) CHECK_THROWS_AS(count_bad_indices({{few, 40, nan}, {few.to(Device::CUDA), 40, nan}}), Error);
}

TEST_CASE("DecoderLM: two backwards without zero_grad give twice one backward's gradients", "[models][lm]") {
  // Gradients accumulate in every module (PyTorch's rule): nothing may
  // overwrite what an earlier backward left. The second backward computes
  // the same gradients as the first, so the sum is twice them (to rounding
  // where repeated token ids are summed in another order).
  std::vector<std::pair<Device, DType>> runs{{Device::CPU, DType::F64}};
  if (test::cuda_paths_run("DecoderLM gradient accumulation")) runs.push_back({Device::CUDA, DType::F32});
  for (const auto& [device, dtype] : runs) {
    INFO(device_name(device));
    DecoderLMConfig c = tiny_config();
    c.dtype = dtype;
    DecoderLM model(c);
    model.to(device);
    Tensor ids, targets;
    fixed_batch(c, 2, 5, &ids, &targets);
    ids = ids.to(device), targets = targets.to(device);
    StepResult once = lm_step(model, ids, targets);                      // zero_grad, forward, backward
    for (auto& named : once.grads) named.second = named.second.clone();  // not the live gradient
    CrossEntropySaved saved;
    cross_entropy_forward(model.forward(ids), targets, -100, &saved);
    model.backward(cross_entropy_backward(saved));
    for (const auto& [name, g] : once.grads) {
      INFO(name);
      Parameter* p = nullptr;
      for (auto& [n, q] : model.named_parameters())
        if (n == name) p = q;
      REQUIRE(p != nullptr);
      CHECK(hg::rel_error(p->grad.to(Device::CPU).to(DType::F64), hg::mul_scalar(g.to(DType::F64), 2.0)) <
            (dtype == DType::F64 ? 1e-12 : 1e-6));
    }
  }
}

TEST_CASE("training memory estimate: the parameter count of the built model, linear in the batch", "[models]") {
  for (int64_t layers : {0, 1, 3})
    for (int64_t hidden : {0, 24}) {
      DecoderLMConfig c = tiny_config();
      c.n_layers = layers;
      c.ffn_hidden = hidden;
      INFO("layers " << layers << " ffn_hidden " << hidden);
      DecoderLM model(c);
      CHECK(parameter_count(c) == model.num_parameters());
      const TrainingMemory one = estimate_training_memory(c, 1, 6), many = estimate_training_memory(c, 1000, 6);
      CHECK(one.weight_bytes == 16.0 * static_cast<double>(model.num_parameters()));
      CHECK(many.activation_bytes() == Approx(1000 * one.activation_bytes()));
      CHECK(many.total_bytes() > one.total_bytes());
    }
}

TEST_CASE("training memory estimate: recomputed activations are left out", "[models]") {
  DecoderLMConfig c = tiny_config();
  const int64_t seq = 6;
  const double base = estimate_training_memory(c, 1, seq).per_sequence_bytes;
  // fp32: 4 bytes a value, per token and layer 2 d LayerNorm outputs and the 4 d of gelu(pre).
  const double per_d = 4.0 * static_cast<double>(c.n_layers * c.d_model * seq);
  c.recompute_layernorm = true;
  CHECK(estimate_training_memory(c, 1, seq).per_sequence_bytes == Approx(base - 2 * per_d));
  c.recompute_gelu = true;
  CHECK(estimate_training_memory(c, 1, seq).per_sequence_bytes == Approx(base - 6 * per_d));
}

// The whole model on the CPU: the same float32 step with and without the
// recompute, bitwise (see the TransformerLayer case above).
TEST_CASE("DecoderLM recompute_layernorm: CPU float32 gradients bitwise the kept run's", "[models][lm]") {
  Tensor ids, targets;
  fixed_batch(tiny_config(), 2, 5, &ids, &targets);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused})
    for (bool gelu : {false, true}) {
      if (mode == KernelMode::Unfused && gelu) continue;  // recompute_gelu is fused mode's
      KernelModeScope scope(mode);
      INFO("mode " << kernel_mode_name(mode) << ", recompute_gelu " << gelu);
      DecoderLMConfig c = tiny_config();
      c.recompute_gelu = gelu;
      DecoderLM kept(c);
      c.recompute_layernorm = true;
      DecoderLM recomputed(c);
      spread_layernorm_params(kept, 4);
      spread_layernorm_params(recomputed, 4);
      const StepResult a = lm_step(kept, ids, targets), b = lm_step(recomputed, ids, targets);
      CHECK(a.loss == b.loss);
      CHECK(test::same_bytes(a.dembedded, b.dembedded));
      check_same_grads(kept, recomputed);
    }
}

TEST_CASE("DecoderLM tiny: every parameter and the input embeddings vs finite differences", "[models][lm]") {
  const DecoderLMConfig c = tiny_config();
  DecoderLM model(c);
  model.to(DType::F64);
  Tensor ids, targets;
  fixed_batch(c, 2, 5, &ids, &targets);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    const StepResult r = lm_step(model, ids, targets);
    auto loss = [&] { return cross_entropy_forward(model.forward(ids), targets, -100, nullptr).item(); };
    check_parameters(model, loss, 150);

    // The gradient at the embedding output, through forward_embedded.
    model.eval();
    Tensor h = model.embed.forward(ids).clone();
    auto loss_h = [&] { return cross_entropy_forward(model.forward_embedded(h), targets, -100, nullptr).item(); };
    Generator pick(4);
    const double err = fd_rel_error(loss_h, h, r.dembedded, 1000, pick);
    INFO("input embeddings rel error " << err);
    CHECK(err < kGradTol);
    model.train();
  }
}

TEST_CASE("DecoderLM tiny with dropout: every parameter and the input embeddings vs finite differences",
          "[models][lm][dropout]") {
  DecoderLMConfig c = tiny_config();
  c.dropout = kDropP;
  DecoderLM model(c);
  model.to(DType::F64);
  Tensor ids, targets;
  fixed_batch(c, 2, 5, &ids, &targets);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    reseed_dropouts(model, 51);
    const StepResult r = lm_step(model, ids, targets);
    CHECK(dropped_fraction(model.embed_drop) > 0.1);
    for (auto& layer : model.layers) check_masks_used(*layer);
    auto loss = [&] {
      reseed_dropouts(model, 51);
      return cross_entropy_forward(model.forward(ids), targets, -100, nullptr).item();
    };
    // 60 coordinates per parameter: a skipped or doubled mask moves every
    // coordinate upstream of it, so a sample this size cannot miss it.
    check_parameters(model, loss, 60);
    // The gradient at the embedding output (after embed_drop), with the
    // layers' masks replayed: forward_embedded runs every layer's dropout.
    reseed_dropouts(model, 51);
    Tensor h = model.embed_drop.forward(model.embed.forward(ids)).clone();
    auto loss_h = [&] {
      reseed_dropouts(model, 51);
      return cross_entropy_forward(model.forward_embedded(h), targets, -100, nullptr).item();
    };
    Generator pick(4);
    const double err = fd_rel_error(loss_h, h, r.dembedded, 200, pick);
    INFO("input embeddings rel error " << err);
    CHECK(err < kGradTol);
  }
}

// The seams between layers: each layer's last residual add runs in the next
// LayerNorm (the next LN1, or ln_f), whose backward adds that path's gradient.
// Three layers (two layer-to-layer seams and the one into ln_f), dropout
// (masks replayed), a padding mask, recompute_layernorm (LN1 recomputed from
// the sum it formed). On the CPU the LayerNorm forms the sum with the same
// add as a stand-alone layer, so the stack is bitwise the stand-alone layers'
// composition; and its gradients match finite differences. A seam that
// drops or doubles a branch, or its gradient, is O(1) off.
TEST_CASE("DecoderLM seams: three layers, dropout, padding mask, recomputed LayerNorms", "[models][lm][dropout]") {
  DecoderLMConfig c = tiny_config();
  c.n_layers = 3;
  c.dropout = kDropP;
  c.recompute_layernorm = true;
  DecoderLM model(c);
  model.to(DType::F64);
  spread_layernorm_params(model, 6);
  Tensor ids, targets;
  fixed_batch(c, 2, 5, &ids, &targets);
  // Sequence 1's last two positions are padding keys.
  const Tensor mask = Tensor::from_vector({0, 0, 0, 0, 0, 0, 0, 0, -1e9, -1e9}, {2, 1, 1, 5}, DType::F64);
  for (auto mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO("mode " << kernel_mode_name(mode));
    reseed_dropouts(model, 17);
    const Tensor h = model.embed_drop.forward(model.embed.forward(ids)).clone();
    const Tensor logits = model.forward_embedded(h, mask);
    for (auto& layer : model.layers) check_masks_used(*layer);
    reseed_dropouts(model, 17);
    Tensor y = h;
    for (auto& layer : model.layers) y = layer->forward(y, mask);
    const Tensor composed = model.head.forward(model.ln_f.forward(y).reshape({-1, c.d_model}));
    CHECK(test::same_bytes(logits, composed.reshape(logits.shape())));

    model.zero_grad();
    reseed_dropouts(model, 17);
    CrossEntropySaved saved;
    cross_entropy_forward(model.forward(ids, mask), targets, -100, &saved);
    const Tensor dembedded = model.backward(cross_entropy_backward(saved));
    auto loss = [&] {
      reseed_dropouts(model, 17);
      return cross_entropy_forward(model.forward(ids, mask), targets, -100, nullptr).item();
    };
    check_parameters(model, loss, 40);
    Tensor h_in = h.clone();
    auto loss_h = [&] {
      reseed_dropouts(model, 17);
      return cross_entropy_forward(model.forward_embedded(h_in, mask), targets, -100, nullptr).item();
    };
    Generator pick(5);
    const double err = fd_rel_error(loss_h, h_in, dembedded, 80, pick);
    INFO("input embeddings rel error " << err);
    CHECK(err < kGradTol);
  }
}

namespace {

// A DecoderLM (d = 32, 4 heads, T = 16, vocab 300: wider than one block of
// the CUDA loss kernel), without and with dropout, on every path of `device`
// against the same model in float64. float32 bound: measured on the CPU, the
// worst relative error of the loss, of any parameter's gradient and of the
// embedding-output gradient is 6.8e-7 over fused and unfused, with and
// without dropout (fused and unfused float32 agree to the same order: the
// old 1e-4 bound on their difference was ~100x that); 5e-6 is a 7x margin.
// A wrong term is O(1), a skipped dropout mask O(p).
void check_lm_paths_on(Device device) {
  for (double dropout : {0.0, 0.2}) {
    DecoderLMConfig c = tiny_config();
    c.d_model = 32;
    c.n_heads = 4;
    c.max_seq_len = 16;
    c.vocab_size = 300;
    c.dropout = dropout;
    Tensor ids, targets;
    fixed_batch(c, 3, 16, &ids, &targets);
    check_paths_against_f64(
        "DecoderLM with dropout " + std::to_string(dropout), device, [c] { return std::make_unique<DecoderLM>(c); },
        [ids, targets](DecoderLM& m, DType, Device dev) {
          reseed_dropouts(m, 91);
          return lm_step(m, ids.to(dev), targets.to(dev));
        },
        5e-6);
  }
}

}  // namespace

TEST_CASE("DecoderLM: every CPU path against float64 after one step, with and without dropout", "[models][lm]") {
  check_lm_paths_on(Device::CPU);
}

namespace {
std::vector<double> loss_curve(uint64_t seed, int steps, Device dev) {
  DecoderLMConfig c = tiny_config();
  c.seed = seed;
  c.dropout = 0.1;  // masks must replay too
  DecoderLM model(c);
  model.to(dev);
  AdamWOptions options;
  options.lr = 1e-2;
  AdamW opt(model.parameters(), options);
  Generator g(seed);
  // One fixed batch: the curve must then go down.
  const Tensor ids = random_ids({4, 6}, c.vocab_size, g).to(dev);
  const Tensor targets = random_ids({4, 6}, c.vocab_size, g).to(dev);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    CrossEntropySaved saved;
    losses.push_back(cross_entropy_forward(model.forward(ids), targets, -100, &saved).item());
    model.backward(cross_entropy_backward(saved));
    opt.step();
  }
  return losses;
}
}  // namespace

TEST_CASE("DecoderLM: same seed gives a bitwise identical loss curve", "[models][lm]") {
  const std::vector<double> a = loss_curve(5, 6, Device::CPU), b = loss_curve(5, 6, Device::CPU);
  CHECK(a == b);
  CHECK(a != loss_curve(6, 6, Device::CPU));
  CHECK(a.back() < a.front());  // and it is learning something
}

TEST_CASE("profiler: records op kinds only when enabled", "[core][profiler]") {
  DecoderLM model(tiny_config());
  Tensor ids, targets;
  fixed_batch(tiny_config(), 2, 5, &ids, &targets);
  prof::reset();
  lm_step(model, ids, targets);
  CHECK(prof::entries().empty());
  prof::enable(true);
  lm_step(model, ids, targets);
  prof::enable(false);
  std::vector<std::string> kinds;
  for (const auto& e : prof::entries()) {
    kinds.push_back(e.kind);
    CHECK(e.calls > 0);
    CHECK(e.total_ms >= 0);
  }
  for (const char* k : {"embedding", "layernorm", "linear", "attention"})
    CHECK(std::find(kinds.begin(), kinds.end(), k) != kinds.end());
  // Fused, the CPU's softmax attention runs its products and softmax rows a
  // head at a time in one op (kind "attention"); unfused, they are ops of
  // their own.
  CHECK(std::find(kinds.begin(), kinds.end(), "matmul") == kinds.end());
  CHECK(std::find(kinds.begin(), kinds.end(), "softmax") == kinds.end());
  // Every residual add of the step runs in a LayerNorm's pass (kind
  // "layernorm"), the seams between the layers included: none on its own.
  CHECK(std::find(kinds.begin(), kinds.end(), "residual") == kinds.end());
  // Fused mode runs GELU in the GEMM epilogues (kind "linear"), and the CPU
  // attention's products read and write the packed layouts (no "layout"
  // copies); unfused, both are kinds of their own.
  CHECK(std::find(kinds.begin(), kinds.end(), "gelu") == kinds.end());
  CHECK(std::find(kinds.begin(), kinds.end(), "layout") == kinds.end());
  {
    KernelModeScope unfused(KernelMode::Unfused);
    prof::reset();
    prof::enable(true);
    lm_step(model, ids, targets);
    prof::enable(false);
    bool gelu = false, layout = false, matmul = false, softmax = false;
    for (const auto& e : prof::entries()) {
      gelu = gelu || e.kind == "gelu";
      layout = layout || e.kind == "layout";
      matmul = matmul || e.kind == "matmul";
      softmax = softmax || e.kind == "softmax";
    }
    CHECK(gelu);
    CHECK(layout);
    CHECK(matmul);
    CHECK(softmax);
  }
  prof::reset();
}

// ---------------------------------------------------------------------------
// CUDA: the same step on the GPU against the same float64 reference and bound
// as the CPU paths. float32 with other reduction orders (cuBLAS vs Eigen, warp
// trees vs loops) rounds by the same 2^-24 per operation, so its gap from
// float64 is of the CPU's size; the GPU's own gap has not been measured here.
TEST_CASE("CUDA: DecoderLM paths against float64 after one step, with and without dropout", "[cuda][models][lm]") {
  HG_REQUIRE_GPU();
  check_lm_paths_on(Device::CUDA);
}

namespace {

// The bf16 model and batch of the recompute cases: B 8, T 128 (1024 rows), vocab 64.
DecoderLMConfig recompute_config(int64_t d_model, int64_t layers, Tensor* ids, Tensor* targets) {
  DecoderLMConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 128;
  c.d_model = d_model;
  c.n_heads = 2;
  c.n_layers = layers;
  c.seed = 5;
  c.precision = Precision::BF16;
  fixed_batch(c, 8, 128, ids, targets);
  *ids = ids->to(Device::CUDA);
  *targets = targets->to(Device::CUDA);
  return c;
}

// One bf16 DecoderLM step on the GPU (fused mode) after a warm-up step, and
// its peak memory in MiB. LayerNorm parameters spread off 1 / 0.
StepResult bf16_step_with_peak(const DecoderLMConfig& c, const Tensor& ids, const Tensor& targets, double* peak_mib) {
  DecoderLM model(c);
  spread_layernorm_params(model, 4);
  model.to(Device::CUDA);
  lm_step(model, ids, targets);  // warm the allocator's cache
  gpu::synchronize();
  gpu::reset_peak_memory();
  StepResult r = lm_step(model, ids, targets);
  *peak_mib = static_cast<double>(gpu::memory_stats().peak_in_use) / (1 << 20);
  return r;
}

void check_same_steps(const StepResult& a, const StepResult& b) {
  CHECK(a.loss == b.loss);
  CHECK(test::same_bytes(a.dembedded, b.dembedded));
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO("grad of " << a.grads[i].first);
    CHECK(test::same_bytes(a.grads[i].second, b.grads[i].second));
  }
}

}  // namespace

// bf16 on the GPU: the recomputed gelu(pre) rounds from the stored bf16 pre,
// the forward's epilogue from the unrounded f32 sum, so fc2's weight gradient
// sees inputs within one bf16 rounding (2^-8 relative) of the forward's; the
// other gradients follow from it. Bound 1e-2 relative on every gradient.
// The activation memory drops by the hidden values of every layer.
TEST_CASE("CUDA: DecoderLM with recompute_gelu: gradients within bf16 rounding, less peak memory",
          "[cuda][models][lm]") {
  HG_REQUIRE_GPU();
  KernelModeScope scope(KernelMode::Fused);
  Tensor ids, targets;
  DecoderLMConfig c = recompute_config(128, 3, &ids, &targets);
  double kept_mib = 0, recomputed_mib = 0;
  const StepResult kept = bf16_step_with_peak(c, ids, targets, &kept_mib);
  c.recompute_gelu = true;
  const StepResult recomputed = bf16_step_with_peak(c, ids, targets, &recomputed_mib);
  compare_steps(kept, recomputed, 1e-3, 1e-2);
  // 3 layers x 1024 rows x 512 hidden x 2 bytes = 3 MiB of gelu outputs no longer kept.
  INFO("peak MiB kept " << kept_mib << ", recomputed " << recomputed_mib);
  CHECK(recomputed_mib <= kept_mib - 2.5);
}

// bf16, d_model 256: LN1's recompute is its own forward again, LN2's the
// residual forward's resident kernel without the add on the stored h
// (residual_layernorm_output): the gradients equal the kept run's bit for
// bit, with recompute_gelu off and on.
// Memory: 4 layers x 2 LayerNorm outputs x 1024 rows x 256 x 2 bytes = 4 MiB
// not kept; the backward holds one of them again at a time (0.5 MiB).
TEST_CASE("CUDA: DecoderLM with recompute_layernorm: bitwise the kept run's gradients, less peak memory",
          "[cuda][models][lm]") {
  HG_REQUIRE_GPU();
  KernelModeScope scope(KernelMode::Fused);
  Tensor ids, targets;
  const DecoderLMConfig c = recompute_config(256, 4, &ids, &targets);
  for (bool gelu : {false, true}) {
    INFO("recompute_gelu " << gelu);
    DecoderLMConfig cc = c;
    cc.recompute_gelu = gelu;
    double kept_mib = 0, recomputed_mib = 0;
    const StepResult kept = bf16_step_with_peak(cc, ids, targets, &kept_mib);
    cc.recompute_layernorm = true;
    const StepResult recomputed = bf16_step_with_peak(cc, ids, targets, &recomputed_mib);
    check_same_steps(kept, recomputed);
    INFO("peak MiB kept " << kept_mib << ", recomputed " << recomputed_mib);
    CHECK(recomputed_mib <= kept_mib - 3.0);
  }
}

// Rows the resident kernels do not take (bf16 and f32 rows of 72 bytes, not
// 16-byte rows): the residual forward runs its one-block-per-row kernel and
// LN2's recompute the same kernel on h, so the gradients are bitwise the
// kept run's here too.
TEST_CASE("CUDA: DecoderLM with recompute_layernorm on rows off the resident kernels: bitwise the kept run's",
          "[cuda][models][lm]") {
  HG_REQUIRE_GPU();
  KernelModeScope scope(KernelMode::Fused);
  for (const auto& [precision, d] : {std::pair<Precision, int64_t>{Precision::BF16, 36}, {Precision::FP32, 18}}) {
    INFO(precision_name(precision) << " d_model " << d);
    DecoderLMConfig c = tiny_config();
    c.d_model = d;
    c.precision = precision;
    Tensor ids, targets;
    fixed_batch(c, 4, 6, &ids, &targets);
    ids = ids.to(Device::CUDA);
    targets = targets.to(Device::CUDA);
    DecoderLM kept(c);
    c.recompute_layernorm = true;
    DecoderLM recomputed(c);
    spread_layernorm_params(kept, 4);
    spread_layernorm_params(recomputed, 4);
    kept.to(Device::CUDA);
    recomputed.to(Device::CUDA);
    check_same_steps(lm_step(kept, ids, targets), lm_step(recomputed, ids, targets));
  }
}

TEST_CASE("CUDA: same seed gives a bitwise identical loss curve on the GPU", "[cuda][models][lm]") {
  HG_REQUIRE_GPU();
  CHECK(loss_curve(5, 6, Device::CUDA) == loss_curve(5, 6, Device::CUDA));
}

TEST_CASE("CUDA: gather / scatter-add and fused cross-entropy match the CPU", "[cuda][indexing][cross_entropy]") {
  HG_REQUIRE_GPU();
  Generator g(12);
  // Many repeats of few rows: the deterministic scatter must still sum them all.
  const Tensor table = Tensor::randn({5, 33}, g);
  const Tensor ids = random_ids({7, 9}, 5, g);
  const Tensor rows = gather_rows(table, ids);
  CHECK(test::max_abs_diff(gather_rows(table.to(Device::CUDA), ids.to(Device::CUDA)).to(Device::CPU), rows) == 0.0);
  const Tensor grad = Tensor::randn({7, 9, 33}, g);
  Tensor acc_cpu = Tensor::ones({5, 33});
  Tensor acc_gpu = Tensor::ones({5, 33}, DType::F32, Device::CUDA);
  scatter_add_rows(grad, ids, acc_cpu);
  scatter_add_rows(grad.to(Device::CUDA), ids.to(Device::CUDA), acc_gpu);
  CHECK(rel_error(acc_gpu.to(Device::CPU), acc_cpu) < 1e-6);

  // Skewed like text: one row owns most positions (thousands of adds for its
  // threads), the rest are spread; odd counts leave a remainder after the
  // groups of loads. Both CUDA paths (ids checked on the host, on the device)
  // against the float64 CPU sums.
  {
    const int64_t n = 4099, v = 300, d = 37;
    std::vector<double> skewed(static_cast<size_t>(n));
    for (double& x : skewed) x = g.next_u64() % 10 < 9 ? 3.0 : static_cast<double>(g.next_u64() % v);
    const Tensor sids = Tensor::from_vector(skewed, {n});
    const Tensor sgrad = Tensor::randn({n, d}, g, DType::F64);
    Tensor ref = Tensor::zeros({v, d}, DType::F64);
    scatter_add_rows(sgrad, sids, ref);
    for (const IdCheck check : {IdCheck::Host, IdCheck::Device}) {
      Tensor acc = Tensor::zeros({v, d}, DType::F32, Device::CUDA);
      scatter_add_rows(sgrad.to(DType::F32).to(Device::CUDA), sids.to(DType::F32).to(Device::CUDA), acc, check);
      CHECK(rel_error(acc.to(Device::CPU).to(DType::F64), ref) < 1e-5);
    }
  }

  for (int64_t vocab : {1, 3, 1000, 4097, 65536}) {
    INFO("vocab " << vocab);
    const Tensor logits = Tensor::randn({6, vocab}, g, DType::F32, Device::CPU, 100.0, 5.0);
    std::vector<double> t{0, static_cast<double>(vocab - 1), -100, 0, -100, static_cast<double>(vocab / 2)};
    const Tensor targets = Tensor::from_vector(t, {6});
    KernelModeScope scope(KernelMode::Fused);
    CrossEntropySaved sc, sg;
    const double lc = cross_entropy_forward(logits, targets, -100, &sc).item();
    const double lg = cross_entropy_forward(logits.to(Device::CUDA), targets.to(Device::CUDA), -100, &sg).item();
    CHECK(std::abs(lc - lg) <= 1e-5 * std::max(1.0, std::abs(lc)));
    // The CPU's fused float32 gradient is accurate to ~6e-8 per entry; the
    // GPU's float32 exp of arguments up to ~50 in size: 1e-5 per entry
    // (entries down to ~1e-20) as in the CPU case above; norm-wise 1e-6
    // (16 float32 ulps: the large entries carry the row sum's rounding, whose
    // order on the GPU has not been measured).
    const Tensor grad_gpu = cross_entropy_backward(sg).to(Device::CPU).to(DType::F64);
    const Tensor grad_cpu = cross_entropy_backward(sc).to(DType::F64);
    CHECK(rel_error(grad_gpu, grad_cpu) < 1e-6);
    CHECK(max_elementwise_rel_error(grad_gpu, grad_cpu) < 1e-5);
  }
}
