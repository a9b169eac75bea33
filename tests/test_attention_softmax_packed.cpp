// The packed softmax attention (ops/attention_softmax_packed.hpp): q, k, v
// read in place from (B, T, 3 H dh) and the gradient written as such must
// equal the composed path (split_heads, matmul, the softmax ops, merge_heads)
// bit for bit, with and without mask and causal, at any thread count, on the
// shapes it suits (matmul runs the composed products one GEMM a head there);
// causal with T >= 128 (the blocks that leave out the hidden keys, the last
// block longer or not) included; bad input is refused by name.
#include <array>
#include <vector>

#include "core/parallel.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "core/tensor_functions.hpp"
#include "ops/attention.hpp"
#include "ops/attention_softmax_packed.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

struct Composed {
  Tensor out, dqkv;
};

// The composed path of models/attention.cpp, forward and backward.
Composed composed(const Tensor& qkv, int64_t heads, const SoftmaxOptions& options, const Tensor& dout) {
  const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
  const Tensor split = split_heads(qkv, 3, heads);
  const Tensor q = split[0], k = split[1], v = split[2];
  const Tensor p = attention_softmax_forward(matmul(q, k, false, true), options);
  Composed c;
  c.out = merge_heads(matmul(p, v));
  const Tensor dctx = split_heads(dout, 1, heads)[0];
  const Tensor dscores = softmax_backward(matmul(dctx, v, false, true), p, options.scale);
  Tensor dheads = Tensor::empty({3, b, heads, t, width / heads}, qkv.dtype());
  dheads[0].copy_(matmul(dscores, k));
  dheads[1].copy_(matmul(dscores, q, true, false));
  dheads[2].copy_(matmul(p, dctx, true, false));
  c.dqkv = merge_heads(dheads);
  return c;
}

}  // namespace

TEST_CASE("packed softmax attention equals the composed path bit for bit", "[attention][packed]") {
  Generator gen(71);
  const int saved_threads = num_threads();
  for (DType dt : {DType::F32, DType::F64})
    for (const auto& [b, t, heads, dh] : std::vector<std::array<int64_t, 4>>{
             {2, 7, 3, 5}, {1, 33, 2, 16}, {3, 1, 1, 4}, {8, 20, 2, 16}, {8, 130, 2, 8}, {16, 128, 1, 12}})
      for (bool causal : {false, true})
        for (bool masked : {false, true}) {
          REQUIRE(attention_softmax_packed_suits(b, heads, t, dh));
          INFO(dtype_name(dt) << " B " << b << " T " << t << " H " << heads << " dh " << dh << " causal " << causal
                              << " masked " << masked);
          const Tensor qkv = Tensor::randn({b, t, 3 * heads * dh}, gen, dt);
          const Tensor dout = Tensor::randn({b, t, heads * dh}, gen, dt);
          SoftmaxOptions options;
          options.causal = causal;
          options.scale = 0.37;
          if (masked) {  // the last key of batch 0 padded
            std::vector<double> m(static_cast<size_t>(b * t), 0.0);
            m[static_cast<size_t>(t - 1)] = -1e9;
            options.mask = Tensor::from_vector(m, {b, 1, 1, t}, dt);
          }
          const Composed want = composed(qkv, heads, options, dout);
          for (int threads : {1, 3}) {
            set_num_threads(threads);
            Tensor probs;
            const Tensor out = attention_softmax_packed_forward(qkv, heads, options, probs);
            const Tensor dqkv = attention_softmax_packed_backward(dout, qkv, probs, heads, options.scale, causal);
            CHECK(out.shape() == want.out.shape());
            CHECK(out.to_vector() == want.out.to_vector());
            CHECK(dqkv.shape() == qkv.shape());
            CHECK(dqkv.to_vector() == want.dqkv.reshape(qkv.shape()).to_vector());
          }
        }
  set_num_threads(saved_threads);
}

TEST_CASE("packed softmax attention suits the shapes matmul runs one GEMM a head", "[attention][packed]") {
  // Few heads in all with long rows: matmul tiles each product, so the
  // composed path keeps those shapes; 16 heads in all or short rows: whole.
  CHECK_FALSE(attention_softmax_packed_suits(1, 2, 70, 32));
  CHECK_FALSE(attention_softmax_packed_suits(1, 4, 1024, 64));
  CHECK(attention_softmax_packed_suits(8, 2, 70, 32));
  CHECK(attention_softmax_packed_suits(16, 4, 128, 64));
  CHECK(attention_softmax_packed_suits(1, 2, 33, 16));
}

TEST_CASE("packed softmax attention: bad input names what is wrong", "[attention][packed][errors]") {
  const Tensor qkv = Tensor::zeros({2, 4, 12});
  Tensor probs;
  SoftmaxOptions options;
  CHECK(contains(thrown_message([&] { attention_softmax_packed_forward(qkv, 5, options, probs); }),
                 "qkv must be (B, T, 3 * heads * head_dim) with heads 5"));
  CHECK(contains(thrown_message([&] { attention_softmax_packed_forward(qkv, 0, options, probs); }),
                 "heads must be positive"));
  CHECK(contains(thrown_message([&] {
                   attention_softmax_packed_forward(Tensor::zeros({2, 4, 12}, DType::BF16), 2, options, probs);
                 }),
                 "qkv must be f32 or f64"));
  const Tensor out = attention_softmax_packed_forward(qkv, 2, options, probs);
  CHECK(contains(thrown_message([&] {
                   attention_softmax_packed_backward(Tensor::zeros({2, 4, 5}), qkv, probs, 2, 1.0, false);
                 }),
                 "dout must be a f32 CPU tensor of shape"));
  CHECK(contains(thrown_message([&] {
                   attention_softmax_packed_backward(out, qkv, Tensor::zeros({2, 2, 4, 3}), 2, 1.0, false);
                 }),
                 "probs must be the forward's"));
}
