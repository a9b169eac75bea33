// The input-validation table of docs/reliability.md, executed: every public op
// and module x each bad input that applies. Each row must throw hg::Error
// (never abort, never a silent broadcast) whose message names the op and the
// offending shapes/values. With HG_VALIDATION_TABLE=<file> set, the rows and
// the actual messages are written there as the Markdown table the doc shows.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/npy.hpp"
#include "core/tensor_functions.hpp"
#include "models/attention.hpp"
#include "models/decoder_lm.hpp"
#include "models/embedding.hpp"
#include "models/layernorm.hpp"
#include "models/linear.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "tests/test_util.hpp"

using namespace hg;

namespace {

struct Row {
  std::string op;     // the op or module, as the table lists it
  std::string input;  // the bad input tried
  std::function<void()> call;
  std::vector<std::string> needles;  // must all appear in the message (op name first)
};

Tensor f32(const Shape& s) { return Tensor::ones(s); }
Tensor f64(const Shape& s) { return Tensor::ones(s, DType::F64); }

std::string escape(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// Runs every row; returns the table lines. Each row is its own SECTION-free check with INFO context.
std::vector<std::string> check_rows(const std::vector<Row>& rows, const char* test_name) {
  std::vector<std::string> table;
  for (const Row& r : rows) {
    INFO(r.op << " / " << r.input);
    std::string msg;
    bool threw_error = false;
    try {
      r.call();
    } catch (const Error& e) {
      threw_error = true;
      msg = e.what();
    }
    REQUIRE(threw_error);
    INFO("message: " << msg);
    for (const std::string& n : r.needles) CHECK(msg.find(n) != std::string::npos);
    table.push_back("| " + r.op + " | " + r.input + " | `" + escape(msg) + "` | " + test_name + " |");
  }
  return table;
}

void emit(const std::vector<std::string>& lines) {
  const char* path = std::getenv("HG_VALIDATION_TABLE");
  if (!path) return;
  std::ofstream out(path, std::ios::app);
  for (const auto& l : lines) out << l << '\n';
}

DecoderLMConfig tiny() {
  DecoderLMConfig c;
  c.vocab_size = 7;
  c.max_seq_len = 4;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 1;
  return c;
}

}  // namespace

TEST_CASE("validation: primitives (map, zip, reduce, matmul, their backwards)", "[validation]") {
  const Tensor a = f32({2, 3}), b = f32({4, 5});
  // One row a line: a table to read across.
  // clang-format off
  const std::vector<Row> rows = {
      {"map (exp, ...)", "undefined tensor", [] { exp(Tensor()); }, {"exp:", "undefined"}},
      {"map (exp, ...)", "wrong dtype (bf16)", [&] { exp(a.to(DType::BF16)); }, {"exp:", "(2, 3)", "bf16"}},
      {"zip (add, ...)", "shapes that do not broadcast", [&] { add(a, b); }, {"add:", "(2, 3)", "(4, 5)", "broadcast"}},
      {"zip (add, ...)", "trailing dim mismatch (D)", [&] { mul(a, f32({2})); }, {"mul:", "(2, 3)", "(2)"}},
      {"zip (add, ...)", "mixed dtypes f32 + f64", [&] { add(a, f64({2, 3})); }, {"add:", "(2, 3)", "f32", "f64"}},
      {"zip (add, ...)", "wrong dtype (f16)", [&] { sub(a.to(DType::F16), a.to(DType::F16)); }, {"sub:", "(2, 3)", "f16"}},
      {"reduce (sum, ...)", "dim out of range", [&] { sum(a, 2); }, {"sum:", "dim 2", "rank 2"}},
      {"reduce (max)", "empty reduced dim", [] { max(f32({2, 0}), 1); }, {"max:", "(2, 0)", "empty"}},
      {"reduce (mean)", "empty reduced dim", [] { mean(f32({0, 3}), 0); }, {"mean:", "(0, 3)", "empty"}},
      {"matmul", "1-D operand (wrong rank)", [] { matmul(f32({3}), f32({3, 2})); }, {"matmul", "(3)", "(3, 2)", "2 dims"}},
      {"matmul", "inner dims differ", [&] { matmul(a, f32({4, 2})); }, {"matmul", "(2, 3)", "(4, 2)", "inner"}},
      {"matmul", "batch dims differ", [] { matmul(f32({2, 3, 4}), f32({5, 4, 2})); }, {"matmul", "(2, 3, 4)", "(5, 4, 2)", "batch"}},
      {"matmul", "mixed dtypes", [&] { matmul(a, f64({3, 2})); }, {"matmul", "(2, 3)", "(3, 2)", "f64"}},
      {"sum_to_shape / add_backward", "target shape not broadcast-compatible", [&] { add_backward(a, {4}, {2, 3}); }, {"(2, 3)", "(4)"}},
      {"map_backward", "dout shape differs from x", [&] { map_backward(UnaryOp::Exp, b, a, a); }, {"map_backward", "(4, 5)", "(2, 3)"}},
      {"sum_backward", "dout shape wrong for the reduction", [&] { sum_backward(a, {2, 3}, 1, false); }, {"sum_backward", "(2, 3)"}},
      {"max_backward", "out shape differs from dout", [&] { max_backward(f32({2}), a, f32({3}), 1, false); }, {"max_backward", "(3)", "(2)"}},
      {"matmul_backward", "dout shape wrong", [&] { matmul_backward(f32({2, 5}), a, f32({3, 2})); }, {"matmul_backward", "(2, 5)", "(2, 3)", "(3, 2)"}},
      {"transpose", "dim out of range", [&] { transpose(a, 0, 3); }, {"transpose", "dim 3"}},
  };
  // clang-format on
  emit(check_rows(rows, "test_validation.cpp: primitives"));
}

TEST_CASE("validation: layernorm, softmax, attention softmax, cross-entropy", "[validation]") {
  const Tensor x = f32({4, 6}), g = f32({6}), bt = f32({6});
  LayerNormSaved saved;
  layernorm_forward(x, g, bt, 1e-5, &saved);
  SoftmaxOptions bad_mask;
  bad_mask.mask = f32({2, 1, 1, 5});
  SoftmaxOptions mask_tq;
  mask_tq.mask = f32({2, 1, 4, 7});
  SoftmaxOptions f64_mask;
  f64_mask.mask = f64({2, 1, 1, 7});
  SoftmaxOptions inf_scale;
  inf_scale.scale = INFINITY;
  const Tensor scores = f32({2, 3, 5, 7});
  // clang-format off
  const std::vector<Row> rows = {
      {"layernorm_forward", "gamma shape != (D,) (mismatched D)", [&] { layernorm_forward(x, f32({5}), bt, 1e-5, nullptr); }, {"layernorm_forward", "(5)", "(4, 6)"}},
      {"layernorm_forward", "beta rank 2", [&] { layernorm_forward(x, g, f32({1, 6}), 1e-5, nullptr); }, {"layernorm_forward", "(1, 6)"}},
      {"layernorm_forward", "0-d x (wrong rank)", [&] { layernorm_forward(f32({}), f32({1}), f32({1}), 1e-5, nullptr); }, {"layernorm_forward", "()"}},
      {"layernorm_forward", "empty x (D = 0)", [&] { layernorm_forward(f32({4, 0}), f32({0}), f32({0}), 1e-5, nullptr); }, {"layernorm_forward", "(4, 0)", "empty"}},
      {"layernorm_forward", "empty x (0 rows)", [&] { layernorm_forward(f32({0, 6}), g, bt, 1e-5, nullptr); }, {"layernorm_forward", "(0, 6)", "empty"}},
      {"layernorm_forward", "eps = 0", [&] { layernorm_forward(x, g, bt, 0.0, nullptr); }, {"layernorm_forward", "eps"}},
      {"layernorm_forward", "eps < 0", [&] { layernorm_forward(x, g, bt, -1e-5, nullptr); }, {"layernorm_forward", "eps"}},
      {"layernorm_forward", "eps NaN", [&] { layernorm_forward(x, g, bt, NAN, nullptr); }, {"layernorm_forward", "eps"}},
      {"layernorm_forward", "mixed dtypes (f64 gamma, f32 x)", [&] { layernorm_forward(x, f64({6}), bt, 1e-5, nullptr); }, {"layernorm_forward", "(6)", "f64"}},
      {"layernorm_forward", "wrong dtype (f16 x)", [&] { layernorm_forward(x.to(DType::F16), g, bt, 1e-5, nullptr); }, {"layernorm_forward", "(4, 6)", "f16"}},
      {"layernorm_backward", "dy shape != x shape", [&] { layernorm_backward(f32({4, 5}), x, g, saved); }, {"layernorm_backward", "(4, 5)", "(4, 6)"}},
      {"layernorm_backward", "saved stats missing", [&] { layernorm_backward(x, x, g, LayerNormSaved{}); }, {"layernorm_backward", "saved"}},
      {"layernorm_backward", "dy dtype differs", [&] { layernorm_backward(f64({4, 6}), x, g, saved); }, {"layernorm_backward", "(4, 6)", "f64"}},
      {"softmax_forward", "0-d x (wrong rank)", [] { softmax_forward(f32({})); }, {"softmax", "()"}},
      {"softmax_forward", "empty x", [] { softmax_forward(f32({3, 0})); }, {"softmax", "(3, 0)", "empty"}},
      {"softmax_forward", "wrong dtype (f16)", [] { softmax_forward(f32({3, 2}).to(DType::F16)); }, {"softmax", "(3, 2)", "f16"}},
      {"attention_softmax_forward", "scores not 4-D (wrong rank)", [] { attention_softmax_forward(f32({3, 5, 7}), {}); }, {"attention_softmax", "(3, 5, 7)", "4-D"}},
      {"attention_softmax_forward", "mask Tk != scores Tk (does not broadcast)", [&] { attention_softmax_forward(scores, bad_mask); }, {"attention_softmax", "(2, 1, 1, 5)", "(2, 3, 5, 7)", "broadcast"}},
      {"attention_softmax_forward", "mask Tq != scores Tq", [&] { attention_softmax_forward(scores, mask_tq); }, {"attention_softmax", "(2, 1, 4, 7)", "(2, 3, 5, 7)"}},
      {"attention_softmax_forward", "mask dtype differs", [&] { attention_softmax_forward(scores, f64_mask); }, {"attention_softmax", "(2, 1, 1, 7)", "f64"}},
      {"attention_softmax_forward", "scale not finite", [&] { attention_softmax_forward(scores, inf_scale); }, {"attention_softmax", "scale"}},
      {"softmax_backward", "dy shape != y shape", [] { softmax_backward(f32({3, 4}), f32({3, 5})); }, {"softmax_backward", "(3, 4)", "(3, 5)"}},
      {"softmax_backward", "dy dtype differs", [] { softmax_backward(f64({3, 5}), f32({3, 5})); }, {"softmax_backward", "(3, 5)", "f64"}},
      {"cross_entropy_forward", "targets shape != logits without last dim", [] { cross_entropy_forward(f32({4, 9}), Tensor::zeros({3}), -100, nullptr); }, {"cross_entropy_forward", "(3)", "(4, 9)"}},
      {"cross_entropy_forward", "0-d logits (wrong rank)", [] { cross_entropy_forward(f32({}), Tensor::zeros({}), -100, nullptr); }, {"cross_entropy_forward", "()"}},
      {"cross_entropy_forward", "empty class dim", [] { cross_entropy_forward(f32({4, 0}), Tensor::zeros({4}), -100, nullptr); }, {"cross_entropy_forward", "(4, 0)"}},
      {"cross_entropy_forward", "target out of [0, V)", [] { cross_entropy_forward(f32({2, 9}), Tensor::from_vector({0, 9}, {2}), -100, nullptr); }, {"cross_entropy_forward", "target 9", "[0, 9)"}},
      {"cross_entropy_forward", "non-integer target", [] { cross_entropy_forward(f32({2, 9}), Tensor::from_vector({0, 1.5}, {2}), -100, nullptr); }, {"cross_entropy_forward", "1.5"}},
      {"cross_entropy_forward", "targets dtype f64", [] { cross_entropy_forward(f32({2, 9}), Tensor::zeros({2}, DType::F64), -100, nullptr); }, {"cross_entropy_forward", "f64"}},
      {"cross_entropy_backward", "nothing saved", [] { cross_entropy_backward(CrossEntropySaved{}); }, {"cross_entropy_backward", "saved"}},
  };
  // clang-format on
  emit(check_rows(rows, "test_validation.cpp: ops"));
}

TEST_CASE("validation: modules (Linear, Embedding, LayerNorm, MultiHeadAttention, DecoderLM)", "[validation]") {
  Generator gen(1);
  Linear lin(4, 3, gen);
  Embedding emb(5, 4, 8, gen);
  hg::LayerNorm ln(6);
  MultiHeadAttention mha(8, 2, gen);
  DecoderLM lm(tiny());
  // clang-format off
  const std::vector<Row> rows = {
      {"Linear", "x last dim != in_features (mismatched D)", [&] { lin.forward(f32({2, 5})); }, {"Linear::forward", "(2, 5)", "4"}},
      {"Linear", "0-d x (wrong rank)", [&] { lin.forward(f32({})); }, {"Linear::forward", "()"}},
      {"Linear", "x dtype f64 into an f32 layer", [&] { lin.forward(f64({2, 4})); }, {"(2, 4)", "f64"}},
      {"Linear", "backward before forward", [&] { Linear fresh(4, 3, gen); fresh.backward(f32({2, 3})); }, {"Linear::backward", "before forward"}},
      {"Linear", "dy shape != forward output", [&] { lin.forward(f32({2, 4})); lin.backward(f32({2, 4})); }, {"Linear::backward", "(2, 4)", "(2, 3)"}},
      {"Linear", "zero features", [&] { Linear bad(0, 3, gen); }, {"Linear", "in=0"}},
      {"Embedding", "ids rank 1 (wrong rank)", [&] { emb.forward(f32({3})); }, {"Embedding::forward", "(3)"}},
      {"Embedding", "T > max_positions", [&] { emb.forward(Tensor::zeros({1, 5})); }, {"Embedding::forward", "5", "(1, 5)"}},
      {"Embedding", "id out of [0, vocab)", [&] { emb.forward(Tensor::from_vector({0, 5}, {1, 2})); }, {"5"}},
      {"Embedding", "non-integer id", [&] { emb.forward(Tensor::from_vector({0, 1.5}, {1, 2})); }, {"1.5"}},
      {"Embedding", "dy shape wrong", [&] { emb.forward(Tensor::zeros({1, 2})); emb.backward(f32({1, 2, 7})); }, {"Embedding::backward", "(1, 2, 7)", "(1, 2, 8)"}},
      {"LayerNorm (module)", "x last dim != dim (mismatched D)", [&] { ln.forward(f32({2, 5})); }, {"layernorm_forward", "(2, 5)", "(6)"}},
      {"LayerNorm (module)", "eps <= 0 at construction", [] { hg::LayerNorm bad(6, 0.0); }, {"LayerNorm", "eps"}},
      {"LayerNorm (module)", "dim 0", [] { hg::LayerNorm bad(0); }, {"LayerNorm", "dim"}},
      {"LayerNorm (module)", "backward before forward", [] { hg::LayerNorm fresh(6); fresh.backward(f32({2, 6})); }, {"LayerNorm::backward", "before forward"}},
      {"MultiHeadAttention", "d_model not divisible by heads", [&] { MultiHeadAttention bad(8, 3, gen); }, {"MultiHeadAttention", "8", "3"}},
      {"MultiHeadAttention", "x rank 2 (wrong rank)", [&] { mha.forward(f32({4, 8})); }, {"MultiHeadAttention::forward", "(4, 8)"}},
      {"MultiHeadAttention", "x last dim != d_model", [&] { mha.forward(f32({1, 4, 6})); }, {"MultiHeadAttention::forward", "(1, 4, 6)"}},
      {"MultiHeadAttention", "padding mask that does not broadcast", [&] { mha.forward(f32({2, 4, 8}), f32({2, 1, 1, 3})); }, {"MultiHeadAttention::forward", "(2, 1, 1, 3)", "(2, 1, 1, 4)"}},
      {"MultiHeadAttention", "backward before forward", [&] { MultiHeadAttention fresh(8, 2, gen); fresh.backward(f32({1, 2, 8})); }, {"MultiHeadAttention::backward", "before forward"}},
      {"DecoderLM", "T > max_seq_len", [&] { lm.forward(Tensor::zeros({1, 5})); }, {"5", "(1, 5)"}},
      {"DecoderLM", "ids rank 3 (wrong rank)", [&] { lm.forward(Tensor::zeros({1, 2, 3})); }, {"(1, 2, 3)"}},
      {"DecoderLM", "token id >= vocab", [&] { lm.forward(Tensor::from_vector({0, 7}, {1, 2})); }, {"7"}},
      {"DecoderLM", "backward before forward", [&] { DecoderLM fresh(tiny()); fresh.backward(f32({1, 2, 7})); }, {"DecoderLM", "before forward"}},
      {"DecoderLM", "d_model not divisible by heads", [] { DecoderLMConfig c = tiny(); c.n_heads = 3; DecoderLM bad(c); }, {"MultiHeadAttention", "8", "3"}},
  };
  // clang-format on
  emit(check_rows(rows, "test_validation.cpp: modules"));
}

TEST_CASE("validation: files (npy, checkpoint)", "[validation]") {
  const std::string good_npy = serialize_npy(f32({2, 3}));
  std::string huge = good_npy;
  huge.replace(huge.find("(2, 3)"), 6, "(9999999999, 999)");
  const std::string good_ckpt = serialize_checkpoint({{"w", f32({2, 3})}});
  // clang-format off
  const std::vector<Row> rows = {
      {"npy", "truncated data", [&] { parse_npy(good_npy.substr(0, good_npy.size() - 1), "t.npy"); }, {"load_npy", "t.npy", "(2, 3)"}},
      {"npy", "header claims a huge shape", [&] { parse_npy(huge, "h.npy"); }, {"load_npy", "h.npy", "(9999999999, 999)"}},
      {"npy", "wrong dtype ('<i4')", [&] { std::string s = good_npy; s.replace(s.find("<f4"), 3, "<i4"); parse_npy(s, "i.npy"); }, {"load_npy", "i.npy", "<i4"}},
      {"npy", "not a .npy file", [] { parse_npy("hello", "x.npy"); }, {"load_npy", "x.npy", "not a .npy"}},
      {"npy", "save of a bf16 tensor", [] { serialize_npy(f32({2}).to(DType::BF16)); }, {"save_npy", "bf16", "(2)"}},
      {"checkpoint", "flipped byte (checksum)", [&] { std::string s = good_ckpt; s[20] ^= 1; parse_checkpoint(s, "c.ckpt"); }, {"Module::load", "c.ckpt", "checksum"}},
      {"checkpoint", "truncated", [&] { parse_checkpoint(good_ckpt.substr(0, 30), "c.ckpt"); }, {"Module::load", "c.ckpt"}},
  };
  // clang-format on
  emit(check_rows(
      rows,
      "test_validation.cpp: files (more in test_npy.cpp, test_checkpoint_reliability.cpp, test_corpus_replay.cpp)"));
}

TEST_CASE("validation: views are contiguous by design and ops honour their offset", "[validation]") {
  // There is no non-contiguous view in handgrad (transpose copies), so the
  // "non-contiguous view" row becomes: a leading-dim slice (a view at an
  // offset into shared storage) must give the same results as a fresh copy.
  Generator g(5);
  const Tensor big = Tensor::randn({6, 4, 10}, g);
  const Tensor view = big.slice(2, 5);
  const Tensor copy = view.clone();
  REQUIRE(view.shares_storage_with(big));
  REQUIRE_FALSE(copy.shares_storage_with(big));
  const Tensor gamma = Tensor::randn({10}, g), beta = Tensor::randn({10}, g);
  REQUIRE(test::max_abs_diff(exp(view), exp(copy)) == 0.0);
  REQUIRE(test::max_abs_diff(add(view, gamma), add(copy, gamma)) == 0.0);
  REQUIRE(test::max_abs_diff(sum(view, 1), sum(copy, 1)) == 0.0);
  REQUIRE(test::max_abs_diff(matmul(view, transpose(view, 1, 2)), matmul(copy, transpose(copy, 1, 2))) == 0.0);
  REQUIRE(test::max_abs_diff(layernorm_forward(view, gamma, beta, 1e-5, nullptr),
                             layernorm_forward(copy, gamma, beta, 1e-5, nullptr)) == 0.0);
  REQUIRE(test::max_abs_diff(softmax_forward(view), softmax_forward(copy)) == 0.0);
  Tensor targets = Tensor::zeros({3, 4});
  REQUIRE(cross_entropy_forward(view, targets, -100, nullptr).item() ==
          cross_entropy_forward(copy, targets, -100, nullptr).item());
}

TEST_CASE("validation: mixed devices (CPU tensor with a CUDA tensor)", "[validation][cuda]") {
  HG_REQUIRE_GPU();
  const Tensor c = f32({2, 3}), d = f32({2, 3}).to(Device::CUDA);
  Generator gen(2);
  Linear lin(3, 2, gen);  // CPU parameters
  SoftmaxOptions cpu_mask;
  cpu_mask.mask = f32({1, 1, 1, 3});
  // clang-format off
  const std::vector<Row> rows = {
      {"zip (add, ...)", "mixed devices", [&] { add(c, d); }, {"add:", "(2, 3)", "cpu", "cuda"}},
      {"matmul", "mixed devices", [&] { matmul(c, f32({3, 2}).to(Device::CUDA)); }, {"matmul", "(2, 3)", "(3, 2)"}},
      {"layernorm_forward", "mixed devices (CPU gamma, CUDA x)", [&] { layernorm_forward(d, f32({3}), f32({3}).to(Device::CUDA), 1e-5, nullptr); }, {"layernorm_forward", "(3)", "cpu"}},
      {"attention_softmax_forward", "mask on another device", [&] { attention_softmax_forward(f32({1, 1, 2, 3}).to(Device::CUDA), cpu_mask); }, {"attention_softmax", "(1, 1, 1, 3)", "cpu"}},
      {"softmax_backward", "dy on another device", [&] { softmax_backward(c, d); }, {"softmax_backward", "(2, 3)"}},
      {"cross_entropy_forward", "targets on another device", [&] { cross_entropy_forward(d, Tensor::zeros({2}), -100, nullptr); }, {"cross_entropy_forward"}},
      {"Linear", "CUDA x into a CPU layer", [&] { lin.forward(d); }, {"(2, 3)"}},
  };
  // clang-format on
  emit(check_rows(rows, "test_validation.cpp: mixed devices (GPU)"));
}
