// Linear: forward against a plain loop, backward (dx, dW, db) against
// float64 central finite differences, gradient accumulation, the bias
// gradients the GEMMs add into the grads, and bad input.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"
#include "models/linear.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::Device;
using hg::DType;
using hg::Linear;
using hg::Shape;
using hg::Tensor;

// y[r, o] = sum_i x[r, i] W[o, i] + b[o], in double, by loops.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
  const auto vx = x.to_vector(), vw = w.to_vector();
  const auto vb = b.defined() ? b.to_vector() : std::vector<double>(out, 0.0);
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = vb[o];
      for (int64_t i = 0; i < in; ++i) acc += vx[r * in + i] * vw[o * in + i];
      y.push_back(acc);
    }
  return y;
}

}  // namespace

TEST_CASE("Linear shapes, init range and forward", "[linear]") {
  hg::Generator gen(31);
  Linear layer(16, 5, gen);
  REQUIRE(layer.weight.value.shape() == Shape{5, 16});
  REQUIRE(layer.bias.value.shape() == Shape{5});
  REQUIRE(layer.weight.grad.shape() == Shape{5, 16});
  REQUIRE(layer.num_parameters() == 5 * 16 + 5);
  const double bound = 1.0 / std::sqrt(16.0);
  for (double v : layer.weight.value.to_vector()) REQUIRE(std::abs(v) <= bound);
  // Not all identical, not all zero: the init really draws.
  const auto wv = layer.weight.value.to_vector();
  REQUIRE(*std::max_element(wv.begin(), wv.end()) > 0.5 * bound);
  REQUIRE(*std::min_element(wv.begin(), wv.end()) < -0.5 * bound);

  const Tensor x = Tensor::randn({2, 3, 16}, gen);
  const Tensor y = layer.forward(x);
  REQUIRE(y.shape() == Shape{2, 3, 5});
  const auto want = naive_linear(x, layer.weight.value, layer.bias.value);
  const auto got = y.to_vector();
  // float32 dot products of length 16: a few ulps of the magnitudes involved
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - want[i]) < 1e-5);

  // 1-D input is one row
  REQUIRE(layer.forward(Tensor::randn({16}, gen)).shape() == Shape{5});
}

TEST_CASE("Linear backward matches finite differences in float64", "[linear][grad]") {
  for (bool bias : {true, false}) {
    hg::Generator gen(32);
    Linear layer(4, 3, gen, bias, DType::F64);
    Tensor x = Tensor::randn({2, 5, 4}, gen, DType::F64);
    const Tensor w = Tensor::randn({2, 5, 3}, gen, DType::F64);
    auto loss = [&] { return hg::test::weighted_sum(layer.forward(x), w); };

    layer.forward(x);
    const Tensor dx = layer.backward(w);
    const Tensor dW = layer.weight.grad.clone();
    const Tensor db = bias ? layer.bias.grad.clone() : Tensor();

    const std::string what = bias ? "with bias" : "no bias";
    INFO(what);
    REQUIRE(hg::test::rel_error(dx, hg::test::numerical_grad(loss, x)) < 1e-6);
    REQUIRE(hg::test::rel_error(dW, hg::test::numerical_grad(loss, layer.weight.value)) < 1e-6);
    if (bias) REQUIRE(hg::test::rel_error(db, hg::test::numerical_grad(loss, layer.bias.value)) < 1e-6);
    else REQUIRE_FALSE(layer.bias.value.defined());
    REQUIRE(layer.parameters().size() == (bias ? 2u : 1u));
  }
}

TEST_CASE("Linear accumulates grads across backward calls", "[linear][grad]") {
  hg::Generator gen(33);
  Linear layer(3, 2, gen, true, DType::F64);
  const Tensor x1 = Tensor::randn({4, 3}, gen, DType::F64), dy1 = Tensor::randn({4, 2}, gen, DType::F64);
  const Tensor x2 = Tensor::randn({5, 3}, gen, DType::F64), dy2 = Tensor::randn({5, 2}, gen, DType::F64);

  layer.forward(x1);
  layer.backward(dy1);
  const Tensor w_after_one = layer.weight.grad.clone(), b_after_one = layer.bias.grad.clone();
  layer.forward(x2);
  layer.backward(dy2);

  // Expected: dW = dy1^T x1 + dy2^T x2, db = column sums of dy1 and dy2.
  const Tensor dw_want = hg::add(hg::matmul(dy1, x1, true, false), hg::matmul(dy2, x2, true, false));
  const Tensor db_want = hg::add(hg::sum(dy1, 0), hg::sum(dy2, 0));
  REQUIRE(hg::test::max_abs_diff(layer.weight.grad, dw_want) < 1e-12);
  REQUIRE(hg::test::max_abs_diff(layer.bias.grad, db_want) < 1e-12);
  REQUIRE(hg::test::max_abs_diff(w_after_one, hg::matmul(dy1, x1, true, false)) < 1e-12);
  REQUIRE(hg::test::max_abs_diff(b_after_one, hg::sum(dy1, 0)) < 1e-12);

  layer.zero_grad();
  for (double v : layer.weight.grad.to_vector()) REQUIRE(v == 0.0);
}

TEST_CASE("Linear rejects bad input", "[linear]") {
  hg::Generator gen(34);
  Linear layer(4, 3, gen);
  REQUIRE_THROWS_AS(layer.backward(Tensor::zeros({2, 3})), hg::Error);  // before forward
  try {
    layer.forward(Tensor::zeros({2, 5}));
    FAIL("no error for in_features mismatch");
  } catch (const hg::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.rfind("Linear::forward", 0) == 0);
    REQUIRE(msg.find("(2, 5)") != std::string::npos);
  }
  REQUIRE_THROWS_AS(layer.forward(Tensor::zeros({2, 4}, DType::F64)), hg::Error);  // dtype
  REQUIRE_THROWS_AS(layer.forward(Tensor()), hg::Error);
  layer.forward(Tensor::zeros({2, 4}));
  REQUIRE_THROWS_AS(layer.backward(Tensor::zeros({3, 3})), hg::Error);  // dy rows differ
  REQUIRE_THROWS_AS(layer.backward(Tensor::zeros({2, 4})), hg::Error);  // dy features differ
  REQUIRE_THROWS_AS(Linear(0, 3, gen), hg::Error);
}

namespace {

// The fused backward's bias gradient, added into bias.grad by the dW GEMM
// itself (BiasGradA over dy, bias_grad_accumulate), against the sums written
// by the same backend GEMM to a temp and then added to the grad: the same
// bits. backward_to_gelu_input: the same dW and db, and dx from the
// GeluBackward GEMM. x_dtype BF16: f32 parameters serving bf16 activations
// (their bf16 copies), f32 sums and grads.
void check_bias_grads_added_in_gemm(Device dev, DType param_dtype, DType x_dtype) {
  INFO(hg::device_name(dev) << " params " << hg::dtype_name(param_dtype) << " activations " << hg::dtype_name(x_dtype));
  hg::KernelModeScope fused(hg::KernelMode::Fused);
  hg::Generator gen(35);
  const int64_t rows = 70, in = 24, out = 40;
  Linear layer(in, out, gen, true, param_dtype);
  layer.to(dev);
  hg::Backend& be = hg::backend_for(dev);
  const Tensor x = Tensor::randn({rows, in}, gen, DType::F64).to(x_dtype).to(dev);
  const Tensor dy = Tensor::randn({rows, out}, gen, DType::F64).to(x_dtype).to(dev);
  const Tensor pre = Tensor::randn({rows, in}, gen, DType::F64).to(x_dtype).to(dev);
  const Tensor bias_start = Tensor::randn({out}, gen, DType::F64).to(param_dtype).to(dev);
  const DType sums_dtype = param_dtype;  // f32 sums of bf16 values

  // The composition: the sums to a temp, then one add.
  hg::GemmArgs dw;
  dw.transpose_a = true;
  dw.accumulate = true;
  dw.epilogue = hg::GemmEpilogue::BiasGradA;
  Tensor db = Tensor::empty({out}, sums_dtype, dev), dw_scratch = Tensor::zeros({out, in}, param_dtype, dev);
  dw.bias_grad = &db;
  be.gemm(dy, x, dw_scratch, dw);
  Tensor bias_want = bias_start.clone();
  be.zip(hg::BinaryOp::Add, bias_want, db, bias_want);
  layer.forward(x);  // the bf16 weight copy exists from here
  hg::GemmArgs gelu;
  gelu.epilogue = hg::GemmEpilogue::GeluBackward;
  Tensor aux = pre.clone();
  Tensor dx_want = Tensor::empty({rows, in}, x_dtype, dev);
  gelu.aux = &aux;
  be.gemm(dy, layer.weight_for(dy), dx_want, gelu);

  layer.bias.grad = bias_start.clone();
  layer.weight.grad.fill_(0.0);
  const Tensor dx = layer.backward_to_gelu_input(dy, pre);
  CHECK(hg::test::same_bytes(layer.bias.grad, bias_want));
  CHECK(hg::test::same_bytes(layer.weight.grad, dw_scratch));
  CHECK(hg::test::same_bytes(dx, dx_want));
  if (x_dtype == DType::BF16) return;
  layer.forward(x);
  layer.bias.grad = bias_start.clone();
  layer.backward(dy);
  CHECK(hg::test::same_bytes(layer.bias.grad, bias_want));
}

}  // namespace

TEST_CASE("Linear fused backward: bias grads added by the GEMMs are bitwise the sums plus one add", "[linear][grad]") {
  check_bias_grads_added_in_gemm(Device::CPU, DType::F32, DType::F32);
  check_bias_grads_added_in_gemm(Device::CPU, DType::F64, DType::F64);
}

TEST_CASE("CUDA Linear fused backward: bias grads added by the GEMMs are bitwise the sums plus one add",
          "[linear][grad][cuda]") {
  HG_REQUIRE_GPU();
  check_bias_grads_added_in_gemm(Device::CUDA, DType::F32, DType::F32);
  check_bias_grads_added_in_gemm(Device::CUDA, DType::F32, DType::BF16);
  check_bias_grads_added_in_gemm(Device::CUDA, DType::BF16, DType::BF16);
}
