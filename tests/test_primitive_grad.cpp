// Every hand-written primitive backward in core/tensor_functions against
// float64 central finite differences of the loss sum(w * f(x)) for a fixed
// random w (so dL/dout = w). h = 1e-6 gives truncation error ~1e-12 and
// rounding error ~1e-10 relative, far below the 1e-6 bound asserted.
#include <functional>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/tensor_functions.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::BinaryOp;
using hg::Device;
using hg::DType;
using hg::ReduceOp;
using hg::Shape;
using hg::Tensor;
using hg::UnaryOp;

constexpr double kMaxRelError = 1e-6;

// Compares `analytic` with the numerical gradient of sum(w * f()) w.r.t. x.
void check_grad(const std::function<Tensor()>& f, Tensor& x, const Tensor& w, const Tensor& analytic,
                const std::string& what) {
  const Tensor numeric = hg::test::numerical_grad([&] { return hg::test::weighted_sum(f(), w); }, x);
  REQUIRE(analytic.shape() == x.shape());
  const double err = hg::test::rel_error(analytic, numeric);
  INFO(what << ": rel error " << err);
  REQUIRE(err < kMaxRelError);
}

Tensor randn64(const Shape& s, hg::Generator& gen) { return Tensor::randn(s, gen, DType::F64); }

// Values with |x| in [0.1, 2] and random signs: away from the kinks of abs and relu.
Tensor away_from_zero(const Shape& s, hg::Generator& gen) {
  std::vector<double> v;
  for (int64_t i = 0; i < hg::shape_numel(s); ++i)
    v.push_back((gen.uniform() < 0.5 ? -1.0 : 1.0) * (0.1 + 1.9 * gen.uniform()));
  return Tensor::from_vector(v, s, DType::F64);
}

}  // namespace

TEST_CASE("map_backward for every differentiable unary op", "[grad][map]") {
  hg::Generator gen(21);
  const Shape s = {3, 7};
  const UnaryOp ops[] = {UnaryOp::Identity, UnaryOp::Neg,        UnaryOp::Exp,    UnaryOp::Log, UnaryOp::Sqrt,
                         UnaryOp::Rsqrt,    UnaryOp::Reciprocal, UnaryOp::Square, UnaryOp::Abs, UnaryOp::Relu,
                         UnaryOp::Gelu,     UnaryOp::Tanh,       UnaryOp::Sigmoid};
  for (UnaryOp op : ops) {
    const bool positive =
        op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal;
    Tensor x = positive ? Tensor::rand(s, gen, DType::F64, Device::CPU, 0.3, 3.0) : away_from_zero(s, gen);
    const Tensor w = randn64(s, gen);
    const Tensor out = hg::map(op, x);
    const Tensor dx = hg::map_backward(op, w, x, out);
    check_grad([&] { return hg::map(op, x); }, x, w, dx, hg::unary_op_name(op));
    // Without the saved output it is recomputed, giving the same gradient.
    REQUIRE(hg::test::max_abs_diff(hg::map_backward(op, w, x, Tensor()), dx) == 0.0);
  }
}

TEST_CASE("gelu backward on wide inputs, including the tails", "[grad][map]") {
  hg::Generator gen(22);
  Tensor x = Tensor::from_vector({-12, -6, -3, -1, -0.3, 0.2, 0.9, 2.5, 5, 11}, {10}, DType::F64);
  const Tensor w = randn64({10}, gen);
  check_grad([&] { return hg::gelu(x); }, x, w, hg::map_backward(UnaryOp::Gelu, w, x, Tensor()), "gelu tails");
}

TEST_CASE("map_backward refuses ReluGrad, GeluGrad and bad shapes", "[grad][map]") {
  const Tensor x = Tensor::ones({2}, DType::F64);
  for (UnaryOp op : {UnaryOp::ReluGrad, UnaryOp::GeluGrad}) {
    try {
      hg::map_backward(op, x, x, Tensor());
      FAIL("no error");
    } catch (const hg::Error& e) {
      REQUIRE(std::string(e.what()).find("not differentiable") != std::string::npos);
    }
  }
  REQUIRE_THROWS_AS(hg::map_backward(UnaryOp::Exp, Tensor::ones({3}, DType::F64), x, Tensor()), hg::Error);
}

TEST_CASE("sum_to_shape inverts broadcasting", "[grad][broadcast]") {
  const Tensor g = Tensor::arange(24, DType::F64).reshape({2, 3, 4});
  const Tensor r = hg::sum_to_shape(g, {3, 1});
  REQUIRE(r.shape() == Shape{3, 1});
  // sum over dims 0 and 2 of arange(24) laid out (2, 3, 4)
  std::vector<double> want(3, 0.0);
  for (int i = 0; i < 24; ++i) want[(i / 4) % 3] += i;
  REQUIRE(r.to_vector() == want);
  REQUIRE(hg::sum_to_shape(g, {}).item() == 276.0);
  REQUIRE(hg::sum_to_shape(g, {2, 3, 4}).to_vector() == g.to_vector());
  REQUIRE_THROWS_AS(hg::sum_to_shape(g, {2, 4}), hg::Error);
  REQUIRE_THROWS_AS(hg::sum_to_shape(g, {1, 2, 3, 4}), hg::Error);
}

TEST_CASE("add/sub/mul/div backward with broadcasting", "[grad][zip]") {
  hg::Generator gen(23);
  const std::vector<std::pair<Shape, Shape>> cases = {{{3, 4}, {3, 4}},    {{2, 3, 4}, {4}},      {{4}, {2, 3, 4}},
                                                      {{2, 1, 4}, {3, 1}}, {{3, 4}, {}},          {{}, {3, 4}},
                                                      {{5, 1}, {1, 6}},    {{2, 3, 4}, {2, 1, 4}}};
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
  for (const auto& [sa, sb] : cases) {
    for (BinaryOp op : ops) {
      Tensor a = randn64(sa, gen);
      // b in [0.5, 2] keeps division well conditioned
      Tensor b = op == BinaryOp::Div ? Tensor::rand(sb, gen, DType::F64, Device::CPU, 0.5, 2.0) : randn64(sb, gen);
      const Tensor w = randn64(hg::broadcast_shapes(sa, sb, "test"), gen);
      std::pair<Tensor, Tensor> grads;
      switch (op) {
        case BinaryOp::Add: grads = hg::add_backward(w, sa, sb); break;
        case BinaryOp::Sub: grads = hg::sub_backward(w, sa, sb); break;
        case BinaryOp::Mul: grads = hg::mul_backward(w, a, b); break;
        default: grads = hg::div_backward(w, a, b); break;
      }
      const std::string what = std::string(hg::binary_op_name(op)) + " " + hg::shape_str(sa) + " " + hg::shape_str(sb);
      auto f = [&] { return hg::zip(op, a, b); };
      check_grad(f, a, w, grads.first, what + " da");
      check_grad(f, b, w, grads.second, what + " db");
    }
  }
}

TEST_CASE("sum/mean/max backward over every dim", "[grad][reduce]") {
  hg::Generator gen(24);
  const Shape s = {3, 4, 5};
  for (int dim = -3; dim < 3; ++dim) {
    for (bool keepdim : {false, true}) {
      Tensor x = randn64(s, gen);  // continuous draws: no ties, so max is differentiable
      const Shape out_shape = hg::sum(x, dim, keepdim).shape();
      const Tensor w = randn64(out_shape, gen);
      const std::string what = "dim " + std::to_string(dim) + (keepdim ? " keepdim" : "");
      check_grad([&] { return hg::sum(x, dim, keepdim); }, x, w, hg::sum_backward(w, s, dim, keepdim), "sum " + what);
      check_grad([&] { return hg::mean(x, dim, keepdim); }, x, w, hg::mean_backward(w, s, dim, keepdim),
                 "mean " + what);
      const Tensor m = hg::max(x, dim, keepdim);
      check_grad([&] { return hg::max(x, dim, keepdim); }, x, w, hg::max_backward(w, x, m, dim, keepdim),
                 "max " + what);
    }
  }
  REQUIRE_THROWS_AS(hg::sum_backward(Tensor::ones({3}, DType::F64), s, 1, false), hg::Error);
}

TEST_CASE("max_backward sends a tied slice's gradient to its first maximum", "[grad][reduce]") {
  const Tensor x = Tensor::from_vector({1, 3, 3, 2, /**/ 5, 5, 5, 5, /**/ -1, -2, -1, -3}, {3, 4}, DType::F64);
  const Tensor dout = Tensor::from_vector({10, 20, 30}, {3}, DType::F64);
  const Tensor dx = hg::max_backward(dout, x, Tensor(), 1, false);
  REQUIRE(dx.to_vector() == std::vector<double>{0, 10, 0, 0, 20, 0, 0, 0, 30, 0, 0, 0});
  // and along dim 0 (column slices)
  const Tensor dx0 = hg::max_backward(Tensor::ones({1, 4}, DType::F64), x, Tensor(), 0, true);
  REQUIRE(dx0.to_vector() == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("matmul_backward: all transpose combinations, batches, shared b", "[grad][matmul]") {
  hg::Generator gen(25);
  struct Case {
    Shape batch;
    int64_t m, k, n;
    bool shared_b;
  };
  const std::vector<Case> cases = {{{}, 3, 4, 5, false}, {{2}, 3, 4, 2, false},   {{2, 2}, 2, 3, 3, false},
                                   {{3}, 2, 4, 3, true}, {{2, 2}, 3, 2, 1, true}, {{}, 1, 1, 1, false}};
  auto operand = [](const Shape& batch, int64_t rows, int64_t cols, bool t) {
    Shape s = batch;
    s.push_back(t ? cols : rows);
    s.push_back(t ? rows : cols);
    return s;
  };
  for (const Case& c : cases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = randn64(operand(c.batch, c.m, c.k, ta), gen);
        Tensor b = randn64(operand(c.shared_b ? Shape{} : c.batch, c.k, c.n, tb), gen);
        const Tensor w = randn64(operand(c.batch, c.m, c.n, false), gen);
        const auto [da, db] = hg::matmul_backward(w, a, b, ta, tb);
        const std::string what =
            hg::shape_str(a.shape()) + " x " + hg::shape_str(b.shape()) + (ta ? " ta" : "") + (tb ? " tb" : "");
        auto f = [&] { return hg::matmul(a, b, ta, tb); };
        check_grad(f, a, w, da, what + " da");
        check_grad(f, b, w, db, what + " db");
      }
    }
  }
  REQUIRE_THROWS_AS(hg::matmul_backward(Tensor::ones({2, 2}, DType::F64), Tensor::ones({2, 3}, DType::F64),
                                        Tensor::ones({3, 4}, DType::F64)),
                    hg::Error);
}

TEST_CASE("transpose is its own backward", "[grad][transpose]") {
  hg::Generator gen(26);
  Tensor x = randn64({2, 3, 4}, gen);
  const Tensor w = randn64({4, 3, 2}, gen);
  check_grad([&] { return hg::transpose(x, 0, 2); }, x, w, hg::transpose(w, 0, 2), "transpose(0, 2)");
}
