// The CPU primitive backend (map / zip / reduce / matmul / fill / cast /
// transpose / gather / scatter) and the tensor_functions wrappers, each
// against a plain-loop reference written here in double precision that shares
// no code with it; and, in CPU-only builds, the throwing GPU entry points.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/half.hpp"
#include "core/tensor_functions.hpp"
#include "core/transpose_plan.hpp"
#include "cuda/cross_entropy_kernels.hpp"
#include "cuda/indexing_kernels.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "cuda/softmax_kernels.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::BinaryOp;
using hg::Device;
using hg::DType;
using hg::ReduceOp;
using hg::Shape;
using hg::Tensor;
using hg::UnaryOp;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Float32 results are compared with a double reference at a few float ulps
// (2^-23 ~ 1.2e-7), allowing for Eigen's vectorised exp/log/tanh; float64 at
// a few double ulps.
double tolerance(DType t) { return t == DType::F32 ? 4e-6 : 1e-13; }

bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(got - want) <= tol * (1.0 + std::abs(want));
}

// Checks every element and reports the first mismatch with its index.
void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!close(got[i], want[i], tol)) {
      INFO(what << ": element " << i << " got " << got[i] << " want " << want[i]);
      REQUIRE(close(got[i], want[i], tol));
    }
  }
}

double gelu_ref(double x) {
  const long double c = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  const long double xl = x;
  return static_cast<double>(0.5L * xl * (1.0L + std::tanh(c * (xl + 0.044715L * xl * xl * xl))));
}

double gelu_grad_ref(double x) {
  const long double c = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  const long double xl = x;
  const long double t = std::tanh(c * (xl + 0.044715L * xl * xl * xl));
  if (t * t == 1.0L) return static_cast<double>(0.5L * (1.0L + t));
  return static_cast<double>(0.5L * (1.0L + t) + 0.5L * xl * (1.0L - t * t) * c * (1.0L + 3.0L * 0.044715L * xl * xl));
}

double unary_ref(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Identity: return x;
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Rsqrt: return 1.0 / std::sqrt(x);
    case UnaryOp::Reciprocal: return 1.0 / x;
    case UnaryOp::Square: return x * x;
    case UnaryOp::Abs: return std::abs(x);
    case UnaryOp::Relu: return x > 0 ? x : 0.0;
    case UnaryOp::ReluGrad: return x > 0 ? 1.0 : 0.0;
    case UnaryOp::Gelu: return gelu_ref(x);
    case UnaryOp::GeluGrad: return gelu_grad_ref(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
  }
  return 0;
}

double binary_ref(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Max: return a > b ? a : b;
    case BinaryOp::Min: return a < b ? a : b;
    case BinaryOp::Pow: return std::pow(a, b);
    case BinaryOp::Eq: return a == b ? 1.0 : 0.0;
    case BinaryOp::Gt: return a > b ? 1.0 : 0.0;
  }
  return 0;
}

const UnaryOp kUnaryOps[] = {UnaryOp::Identity, UnaryOp::Neg,   UnaryOp::Exp,        UnaryOp::Log,
                             UnaryOp::Sqrt,     UnaryOp::Rsqrt, UnaryOp::Reciprocal, UnaryOp::Square,
                             UnaryOp::Abs,      UnaryOp::Relu,  UnaryOp::ReluGrad,   UnaryOp::Gelu,
                             UnaryOp::GeluGrad, UnaryOp::Tanh,  UnaryOp::Sigmoid};
const BinaryOp kBinaryOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max,
                               BinaryOp::Min, BinaryOp::Pow, BinaryOp::Eq,  BinaryOp::Gt};

bool needs_positive(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal;
}

// Element of `shape` at flat index `flat` of the broadcast shape `out`.
int64_t broadcast_source(const Shape& shape, const Shape& out, int64_t flat) {
  int64_t src = 0, stride = 1;
  for (int d = static_cast<int>(out.size()) - 1, s = static_cast<int>(shape.size()) - 1; d >= 0; --d, --s) {
    const int64_t i = flat % out[d];
    flat /= out[d];
    if (s >= 0) {
      if (shape[s] != 1) src += i * stride;
      stride *= shape[s];
    }
  }
  return src;
}

}  // namespace

TEST_CASE("op names are distinct and readable", "[backend]") {
  REQUIRE(std::string(hg::unary_op_name(UnaryOp::GeluGrad)) == "gelu_grad");
  REQUIRE(std::string(hg::binary_op_name(BinaryOp::Add)) == "add");
  REQUIRE(std::string(hg::reduce_op_name(ReduceOp::Mean)) == "mean");
  REQUIRE(&hg::backend_for(Device::CPU) == &hg::cpu_backend());
}

TEST_CASE("map matches std math for every unary op", "[backend][map]") {
  hg::Generator gen(11);
  for (DType dt : {DType::F32, DType::F64}) {
    for (UnaryOp op : kUnaryOps) {
      // 1000 elements: more than one SIMD packet with a ragged tail.
      const Tensor x = needs_positive(op) ? Tensor::rand({10, 100}, gen, dt, Device::CPU, 0.05, 8.0)
                                          : Tensor::rand({10, 100}, gen, dt, Device::CPU, -6.0, 6.0);
      const Tensor y = hg::map(op, x);
      REQUIRE(y.shape() == x.shape());
      REQUIRE(y.dtype() == dt);
      std::vector<double> want;
      for (double v : x.to_vector()) want.push_back(unary_ref(op, v));
      require_close(y.to_vector(), want, tolerance(dt), std::string(hg::unary_op_name(op)) + " " + hg::dtype_name(dt));
    }
  }
}

TEST_CASE("map stays finite on hostile inputs", "[backend][map]") {
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor x = Tensor::from_vector({-1e30, -1e20, -1e4, -100, 0, 100, 1e4, 1e20, 1e30}, {9}, dt);
    const auto gelu = hg::map(UnaryOp::Gelu, x).to_vector();
    const auto dgelu = hg::map(UnaryOp::GeluGrad, x).to_vector();
    const auto sig = hg::map(UnaryOp::Sigmoid, x).to_vector();
    const auto xs = x.to_vector();
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO(hg::dtype_name(dt) << " x = " << xs[i]);
      REQUIRE(std::isfinite(gelu[i]));
      REQUIRE(std::isfinite(dgelu[i]));
      REQUIRE(std::isfinite(sig[i]));
      if (xs[i] >= 100) {
        REQUIRE(gelu[i] == xs[i]);
        REQUIRE(dgelu[i] == 1.0);
        REQUIRE(sig[i] == 1.0);
      }
      if (xs[i] <= -100) {
        REQUIRE(gelu[i] == 0.0);
        REQUIRE(dgelu[i] == 0.0);
        REQUIRE(sig[i] >= 0.0);
        REQUIRE(sig[i] < 1e-40);  // exp(-100) ~ 3.7e-44 in f64, exactly 0 in f32
      }
    }
  }
}

TEST_CASE("zip broadcasts like NumPy for every binary op", "[backend][zip]") {
  hg::Generator gen(12);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 5}, {3, 5}},              // same shape
      {{2, 1, 3}, {4, 3}},           // both sides broadcast: (2, 4, 3)
      {{7, 33}, {33}},               // rows of a, b repeated (fast path)
      {{33}, {7, 33}},               // a repeated over b's rows
      {{2, 3, 4}, {1, 4}},           // leading 1 on the repeated operand
      {{3, 1}, {1, 4}},              // outer product shape
      {{4, 5}, {}},                  // scalar b
      {{}, {4, 5}},                  // scalar a
      {{1}, {6}},                    // size-1 vector acts as scalar
      {{2, 1, 3, 1}, {5, 1, 4}},     // general strided fallback, rank 4
      {{2, 3, 4}, {2, 1, 4}},        // middle dim broadcast
      {{1, 4}, {3, 1}},              // general, a contiguous in a row, b repeated
      {{2, 1, 1}, {3, 1}},           // general, both repeated within a row
      {{2, 3, 4, 4}, {2, 1, 1, 4}},  // attention-mask shape
      {{}, {}},                      // 0-d with 0-d
  };
  for (DType dt : {DType::F32, DType::F64}) {
    for (const auto& [sa, sb] : cases) {
      // Positive operands keep Pow and Div finite; Eq gets exact ties from a
      // separate small-integer draw below.
      const Tensor a = Tensor::rand(sa, gen, dt, Device::CPU, 0.5, 2.0);
      const Tensor b = Tensor::rand(sb, gen, dt, Device::CPU, 0.5, 2.0);
      const Shape out_shape = hg::broadcast_shapes(sa, sb, "test");
      for (BinaryOp op : kBinaryOps) {
        const Tensor out = hg::zip(op, a, b);
        REQUIRE(out.shape() == out_shape);
        const auto va = a.to_vector(), vb = b.to_vector();
        std::vector<double> want(static_cast<size_t>(hg::shape_numel(out_shape)));
        for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i)
          want[i] = binary_ref(op, va[broadcast_source(sa, out_shape, i)], vb[broadcast_source(sb, out_shape, i)]);
        require_close(out.to_vector(), want, tolerance(dt),
                      std::string(hg::binary_op_name(op)) + " " + hg::shape_str(sa) + " " + hg::shape_str(sb));
      }
    }
  }
}

TEST_CASE("zip Eq and Gt give exactly 1 and 0", "[backend][zip]") {
  const Tensor a = Tensor::from_vector({1, 2, 3, 4, 2, 2}, {2, 3});
  const Tensor b = Tensor::from_vector({2, 2, 1}, {3});
  REQUIRE(hg::zip(BinaryOp::Eq, a, b).to_vector() == std::vector<double>{0, 1, 0, 0, 1, 0});
  REQUIRE(hg::zip(BinaryOp::Gt, a, b).to_vector() == std::vector<double>{0, 0, 1, 1, 0, 1});
}

TEST_CASE("zip rejects shapes that do not broadcast, naming both", "[backend][zip]") {
  const Tensor a = Tensor::zeros({2, 3});
  const Tensor b = Tensor::zeros({4, 3});
  try {
    hg::add(a, b);
    FAIL("add of (2, 3) and (4, 3) did not throw");
  } catch (const hg::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.rfind("add", 0) == 0);
    REQUIRE(msg.find("(2, 3)") != std::string::npos);
    REQUIRE(msg.find("(4, 3)") != std::string::npos);
  }
  REQUIRE_THROWS_AS(hg::mul(Tensor::zeros({3}), Tensor::zeros({4})), hg::Error);
  REQUIRE_THROWS_AS(hg::add(Tensor::zeros({3}), Tensor::zeros({3}, DType::F64)), hg::Error);
  REQUIRE_THROWS_AS(hg::add(Tensor(), Tensor::zeros({3})), hg::Error);
  // The backend checks its out tensor too.
  Tensor wrong = Tensor::zeros({2, 4});
  REQUIRE_THROWS_AS(hg::cpu_backend().zip(BinaryOp::Add, Tensor::zeros({2, 3}), Tensor::zeros({3}), wrong), hg::Error);
}

TEST_CASE("scalar map and zip functions", "[backend][zip]") {
  const Tensor a = Tensor::from_vector({1, -2, 3}, {3}, DType::F64);
  REQUIRE(hg::add_scalar(a, 0.5).to_vector() == std::vector<double>{1.5, -1.5, 3.5});
  REQUIRE(hg::mul_scalar(a, -2).to_vector() == std::vector<double>{-2, 4, -6});
  REQUIRE(hg::maximum(a, Tensor::zeros({}, DType::F64)).to_vector() == std::vector<double>{1, 0, 3});
}

TEST_CASE("reduce over every dim, keepdim or not", "[backend][reduce]") {
  hg::Generator gen(13);
  const std::vector<Shape> shapes = {{3, 4, 5}, {7}, {1, 9}, {2, 1, 33}, {65}};
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Shape& s : shapes) {
      const Tensor x = Tensor::randn(s, gen, dt);
      const auto vx = x.to_vector();
      for (int dim = -static_cast<int>(s.size()); dim < static_cast<int>(s.size()); ++dim) {
        const int d = dim < 0 ? dim + static_cast<int>(s.size()) : dim;
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < d; ++i) outer *= s[i];
        for (size_t i = d + 1; i < s.size(); ++i) inner *= s[i];
        const int64_t len = s[d];
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean}) {
          std::vector<double> want;
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t in = 0; in < inner; ++in) {
              double acc = op == ReduceOp::Max ? -kInf : op == ReduceOp::Min ? kInf : 0.0;
              for (int64_t l = 0; l < len; ++l) {
                const double v = vx[(o * len + l) * inner + in];
                if (op == ReduceOp::Max) acc = std::max(acc, v);
                else if (op == ReduceOp::Min) acc = std::min(acc, v);
                else acc += v;
              }
              want.push_back(op == ReduceOp::Mean ? acc / len : acc);
            }
          for (bool keepdim : {false, true}) {
            const Tensor y = hg::reduce(op, x, dim, keepdim);
            Shape expect = s;
            if (keepdim) expect[d] = 1;
            else expect.erase(expect.begin() + d);
            REQUIRE(y.shape() == expect);
            require_close(y.to_vector(), want, tolerance(dt) * 4,
                          std::string(hg::reduce_op_name(op)) + " " + hg::shape_str(s) + " dim " + std::to_string(dim));
          }
        }
      }
    }
  }
}

TEST_CASE("float32 sums of long slices with a large offset stay within one rounding", "[backend][reduce]") {
  // Values 1e4 + N(0, 1): a float32 running sum would drift by ~len * eps.
  // Sums accumulate in double, so the result is the float64 sum of the same
  // float values rounded once: relative error at most 2^-24, asserted 2^-23.
  hg::Generator gen(17);
  for (int64_t len : {1, 3, 1000, 4097, 65536}) {
    const Tensor x64 = Tensor::randn({2, len}, gen, DType::F64, Device::CPU, 1e4, 1.0).to(DType::F32).to(DType::F64);
    const Tensor x32 = x64.to(DType::F32);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      // along the contiguous last dim, and down columns (dim 0 of the transpose)
      const double row_err = hg::test::rel_error(hg::reduce(op, x32, 1), hg::reduce(op, x64, 1));
      const Tensor t32 = hg::transpose(x32, 0, 1), t64 = hg::transpose(x64, 0, 1);
      const double col_err = hg::test::rel_error(hg::reduce(op, t32, 0), hg::reduce(op, t64, 0));
      INFO(hg::reduce_op_name(op) << " len " << len << " row err " << row_err << " col err " << col_err);
      REQUIRE(row_err <= std::ldexp(1.0, -23));
      REQUIRE(col_err <= std::ldexp(1.0, -23));
    }
  }
}

TEST_CASE("reduce errors and sum_all", "[backend][reduce]") {
  const Tensor x = Tensor::ones({2, 3}, DType::F64);
  REQUIRE_THROWS_AS(hg::sum(x, 2), hg::Error);
  REQUIRE_THROWS_AS(hg::sum(x, -3), hg::Error);
  REQUIRE_THROWS_AS(hg::max(Tensor::zeros({2, 0}), 1), hg::Error);  // max of nothing
  REQUIRE(hg::sum(Tensor::zeros({2, 0}), 1).to_vector() == std::vector<double>{0, 0});
  const Tensor s = hg::sum_all(Tensor::arange(10, DType::F64).reshape({2, 5}));
  REQUIRE(s.shape() == Shape{});
  REQUIRE(s.item() == 45.0);
}

namespace {

// out[b] = op(a[b]) op(b[b or shared]) by a plain triple loop in double.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const auto va = a.to_vector(), vb = b.to_vector();
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const int64_t batch = a.numel() / (m * k);
  const bool shared = b.ndim() == 2;
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const double* pa = va.data() + bi * m * k;
    const double* pb = vb.data() + (shared ? 0 : bi * k * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l)
          acc += (ta ? pa[l * m + i] : pa[i * k + l]) * (tb ? pb[j * k + l] : pb[l * n + j]);
        out[(bi * m + i) * n + j] = acc;
      }
  }
  return out;
}

Shape operand(const Shape& batch, int64_t rows, int64_t cols, bool transposed) {
  Shape s = batch;
  s.push_back(transposed ? cols : rows);
  s.push_back(transposed ? rows : cols);
  return s;
}

}  // namespace

TEST_CASE("matmul matches a triple loop: transposes, batches, shared b", "[backend][matmul]") {
  hg::Generator gen(14);
  struct Case {
    Shape batch;
    int64_t m, k, n;
    bool shared_b;
  };
  const std::vector<Case> cases = {{{}, 1, 1, 1, false},    {{}, 3, 5, 7, false},     {{}, 17, 33, 9, false},
                                   {{4}, 5, 3, 6, false},   {{2, 3}, 4, 7, 5, false}, {{3}, 6, 4, 5, true},
                                   {{2, 2}, 3, 9, 1, true}, {{}, 64, 65, 63, false}};
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Case& c : cases) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a = Tensor::randn(operand(c.batch, c.m, c.k, ta), gen, dt);
          const Tensor b = Tensor::randn(operand(c.shared_b ? Shape{} : c.batch, c.k, c.n, tb), gen, dt);
          const Tensor out = hg::matmul(a, b, ta, tb);
          REQUIRE(out.shape() == operand(c.batch, c.m, c.n, false));
          // float32 sums of k products of unit normals: error grows like sqrt(k) ulps.
          require_close(
              out.to_vector(), naive_matmul(a, b, ta, tb), dt == DType::F32 ? 1e-5 : 1e-13,
              hg::shape_str(a.shape()) + " x " + hg::shape_str(b.shape()) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        }
      }
    }
  }
}

TEST_CASE("matmul accumulate adds onto out", "[backend][matmul]") {
  hg::Generator gen(15);
  for (bool ta : {false, true}) {
    const Tensor a = Tensor::randn(operand({2}, 3, 4, ta), gen, DType::F64);
    const Tensor b = Tensor::randn({4, 5}, gen, DType::F64);
    const Tensor start = Tensor::randn({2, 3, 5}, gen, DType::F64);
    Tensor out = start.clone();
    hg::cpu_backend().matmul(a, b, out, ta, false, /*accumulate=*/true);
    const auto product = naive_matmul(a, b, ta, false);
    auto want = start.to_vector();
    for (size_t i = 0; i < want.size(); ++i) want[i] += product[i];
    require_close(out.to_vector(), want, 1e-13, "accumulate");
    // accumulate=false overwrites whatever was there
    hg::cpu_backend().matmul(a, b, out, ta, false, false);
    require_close(out.to_vector(), product, 1e-13, "overwrite");
  }
}

TEST_CASE("matmul rejects bad shapes, naming them", "[backend][matmul]") {
  const Tensor a = Tensor::zeros({2, 3});
  try {
    hg::matmul(a, Tensor::zeros({4, 5}));
    FAIL("matmul (2, 3) x (4, 5) did not throw");
  } catch (const hg::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.rfind("matmul", 0) == 0);
    REQUIRE(msg.find("(2, 3)") != std::string::npos);
    REQUIRE(msg.find("(4, 5)") != std::string::npos);
  }
  REQUIRE_NOTHROW(hg::matmul(a, Tensor::zeros({5, 3}), false, true));
  REQUIRE_THROWS_AS(hg::matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 4})), hg::Error);  // batch dims
  REQUIRE_THROWS_AS(hg::matmul(a, Tensor::zeros({2, 3, 4})), hg::Error);                         // only b may be shared
  REQUIRE_THROWS_AS(hg::matmul(Tensor::zeros({3}), Tensor::zeros({3, 4})), hg::Error);           // 1-D
  REQUIRE_THROWS_AS(hg::matmul(a, Tensor::zeros({3, 4}, DType::F64)), hg::Error);
  Tensor out = Tensor::zeros({2, 5});
  REQUIRE_THROWS_AS(hg::cpu_backend().matmul(a, Tensor::zeros({3, 4}), out, false, false), hg::Error);
}

TEST_CASE("transpose swaps any two dims", "[backend][transpose]") {
  hg::Generator gen(16);
  // Dims of size 1 too: swapped across a larger dim they still move the elements.
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 3, 4, 5}, Shape{2, 1, 4, 1}, Shape{1, 3, 1, 5}})
    for (DType dt : {DType::F32, DType::F64}) {
      const Tensor x = Tensor::randn(s, gen, dt);
      const auto vx = x.to_vector();
      for (int d0 = 0; d0 < 4; ++d0)
        for (int d1 = 0; d1 < 4; ++d1) {
          const Tensor y = hg::transpose(x, d0 - 4, d1);  // negative dims too
          Shape ys = s;
          std::swap(ys[d0], ys[d1]);
          REQUIRE(y.shape() == ys);
          const auto vy = y.to_vector();
          bool all_equal = true;
          for (int64_t i = 0; i < x.numel(); ++i) {
            int64_t idx[4], rest = i;
            for (int d = 3; d >= 0; --d) {
              idx[d] = rest % s[d];
              rest /= s[d];
            }
            std::swap(idx[d0], idx[d1]);
            const int64_t j = ((idx[0] * ys[1] + idx[1]) * ys[2] + idx[2]) * ys[3] + idx[3];
            all_equal = all_equal && vy[j] == vx[i];
          }
          INFO("shape " << hg::shape_str(s) << ", dims " << d0 << " " << d1);
          REQUIRE(all_equal);
        }
    }
  REQUIRE_THROWS_AS(hg::transpose(Tensor::zeros({2, 3}), 0, 2), hg::Error);
}

TEST_CASE("transpose plan: the (A, n0, M, n1, B) factoring both backends use", "[backend][transpose]") {
  const Shape x = {2, 3, 4, 5};
  const hg::TransposePlan p = hg::transpose_plan(x, {2, 5, 4, 3}, 3, 1, "transpose");  // dims in either order
  CHECK((p.A == 2 && p.n0 == 3 && p.M == 4 && p.n1 == 5 && p.B == 1));
  CHECK_FALSE(p.plain_copy);
  const hg::TransposePlan q = hg::transpose_plan(x, {4, 3, 2, 5}, 0, -2, "transpose");  // negative dim
  CHECK((q.A == 1 && q.n0 == 2 && q.M == 3 && q.n1 == 4 && q.B == 5));
  CHECK(hg::transpose_plan({2, 1, 4}, {1, 2, 4}, 0, 1, "transpose").plain_copy);  // a dim of size 1
  CHECK(hg::transpose_plan({1, 3, 1}, {1, 3, 1}, 0, 2, "transpose").plain_copy);  // both of size 1
  // A dim of size 1 swapped across others moves the elements: (1, 3, 4) -> (4, 3, 1) is a real transpose.
  CHECK_FALSE(hg::transpose_plan({1, 3, 4}, {4, 3, 1}, 0, 2, "transpose").plain_copy);
  CHECK_FALSE(hg::transpose_plan({2, 5, 1}, {1, 5, 2}, 0, 2, "transpose").plain_copy);
  CHECK(hg::transpose_plan(x, x, 2, 2, "transpose").plain_copy);  // a dim with itself
  // out of the wrong shape, or a dim out of range: an hg::Error naming the op and the shapes
  try {
    hg::transpose_plan(x, x, 0, 1, "cuda transpose");
    FAIL("no error for a wrong out shape");
  } catch (const hg::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("cuda transpose") != std::string::npos);
    CHECK(what.find("(3, 2, 4, 5)") != std::string::npos);
  }
  CHECK_THROWS_AS(hg::transpose_plan(x, x, 0, 4, "transpose"), hg::Error);
}

TEST_CASE("fill and cast, including bf16 and f16", "[backend][cast]") {
  Tensor f32 = Tensor::empty({5}, DType::F32);
  hg::cpu_backend().fill(f32, 0.1);
  REQUIRE(f32.to_vector() == std::vector<double>(5, static_cast<double>(0.1f)));

  const Tensor src = Tensor::from_vector({1.0, -2.5, 0.1, 3e38, 1e-30, 65504, 65520, 1e-7}, {8}, DType::F64);
  // f64 -> f32 rounds each value once
  Tensor as_f32 = Tensor::empty({8}, DType::F32);
  hg::cpu_backend().cast(src, as_f32);
  const auto v32 = as_f32.to_vector();
  const auto vs = src.to_vector();
  for (size_t i = 0; i < vs.size(); ++i) REQUIRE(v32[i] == static_cast<double>(static_cast<float>(vs[i])));

  // bf16: agrees with the scalar conversion and round trips through float
  Tensor bf = Tensor::empty({8}, DType::BF16);
  hg::cpu_backend().cast(as_f32, bf);
  const hg::bf16_t* bits = bf.data<hg::bf16_t>();
  for (size_t i = 0; i < vs.size(); ++i) REQUIRE(bits[i].bits == hg::float_to_bf16(static_cast<float>(vs[i])).bits);
  Tensor back = Tensor::empty({8}, DType::F64);
  hg::cpu_backend().cast(bf, back);
  const auto vb = back.to_vector();
  for (size_t i = 0; i < vs.size(); ++i) {
    INFO("bf16 of " << vs[i]);
    REQUIRE(std::abs(vb[i] - vs[i]) <= std::abs(vs[i]) * std::ldexp(1.0, -8));  // 8 significant bits
  }

  // f16: exact IEEE bit patterns
  Tensor half = Tensor::empty({8}, DType::F16);
  hg::cpu_backend().cast(src, half);
  const hg::f16_t* h = half.data<hg::f16_t>();
  REQUIRE(h[0].bits == 0x3c00);  // 1
  REQUIRE(h[1].bits == 0xc100);  // -2.5
  REQUIRE(h[2].bits == 0x2e66);  // 0.1
  REQUIRE(h[3].bits == 0x7c00);  // overflow -> inf
  REQUIRE(h[4].bits == 0x0000);  // underflow -> 0
  REQUIRE(h[5].bits == 0x7bff);  // largest finite half
  REQUIRE(h[6].bits == 0x7c00);  // 65520 is a tie between 65504 and 65536: even -> inf
  REQUIRE(h[7].bits == 0x0002);  // 1e-7 ~ 1.68 * 2^-24: subnormal, rounds to 2 * 2^-24

  Tensor hf = Tensor::empty({3}, DType::F16);
  hg::cpu_backend().fill(hf, -0.5);
  REQUIRE(hf.data<hg::f16_t>()[2].bits == 0xb800);
}

TEST_CASE("f16 conversion round trips every half value", "[backend][cast]") {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const hg::f16_t h{static_cast<uint16_t>(bits)};
    const float f = hg::half_to_float(h);
    const bool is_nan = ((bits >> 10) & 0x1f) == 0x1f && (bits & 0x3ff) != 0;
    if (is_nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(hg::half_to_float(hg::float_to_half(f))));
      continue;
    }
    REQUIRE(hg::float_to_half(f).bits == bits);
    ++checked;
  }
  REQUIRE(checked == 65536 - 2 * 1023);
  // Values just above / below a half-way point round to the nearer neighbour.
  const float one_plus_half_ulp = 1.0f + std::ldexp(1.0f, -11);
  REQUIRE(hg::float_to_half(one_plus_half_ulp).bits == 0x3c00);  // tie -> even
  REQUIRE(hg::float_to_half(std::nextafter(one_plus_half_ulp, 2.0f)).bits == 0x3c01);
  REQUIRE(hg::half_to_float(hg::f16_t{0x0001}) == std::ldexp(1.0f, -24));
}

TEST_CASE("zip may write into an operand of out's shape", "[backend][zip]") {
  hg::Generator gen(18);
  for (const Shape& sb : {Shape{4, 5}, Shape{5}, Shape{4, 1}}) {
    Tensor acc = Tensor::randn({4, 5}, gen, DType::F64);
    const Tensor g = Tensor::randn(sb, gen, DType::F64);
    const Tensor want = hg::add(acc, g);
    hg::cpu_backend().zip(BinaryOp::Add, acc, g, acc);
    INFO("b " << hg::shape_str(sb));
    REQUIRE(hg::test::max_abs_diff(acc, want) == 0.0);
  }
}

TEST_CASE("matmul_into writes the product into a slice and checks out", "[backend][matmul]") {
  hg::Generator gen(19);
  const Tensor a = Tensor::randn({2, 3, 4}, gen, DType::F64), b = Tensor::randn({2, 5, 4}, gen, DType::F64);
  Tensor buffer = Tensor::zeros({3, 2, 3, 5}, DType::F64);
  Tensor slot = buffer[1];
  hg::matmul_into(a, b, slot, false, true);
  REQUIRE(hg::test::max_abs_diff(slot, hg::matmul(a, b, false, true)) == 0.0);
  REQUIRE(hg::test::max_abs_diff(buffer[0], Tensor::zeros({2, 3, 5}, DType::F64)) == 0.0);  // neighbours untouched
  Tensor wrong = Tensor::zeros({2, 5, 3}, DType::F64);
  Tensor wrong_dtype = Tensor::zeros({2, 3, 5}, DType::F32);
  for (Tensor* out : {&wrong, &wrong_dtype}) {
    try {
      hg::matmul_into(a, b, *out, false, true);
      FAIL("matmul_into accepted out " << hg::shape_str(out->shape()));
    } catch (const hg::Error& e) {
      const std::string what = e.what();
      CHECK(what.find("matmul_into") != std::string::npos);
      CHECK(what.find("(2, 3, 5)") != std::string::npos);  // the shape it needed, or a's
    }
  }
}

TEST_CASE("gather / scatter rows are Backend operations on the CPU", "[backend][indexing]") {
  // Through backend_for() exactly as core/indexing.cpp calls them, with
  // repeated ids: scatter sums every position of a row.
  const Tensor table = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::F64);
  const std::vector<int32_t> ids = {2, 0, 2};
  const Tensor ids_tensor = Tensor::from_vector({2, 0, 2}, {3}, DType::F32);
  Tensor out = Tensor::empty({3, 2}, DType::F64);
  hg::backend_for(Device::CPU).gather_rows(table, ids_tensor, ids, out);
  REQUIRE(out.to_vector() == std::vector<double>{5, 6, 1, 2, 5, 6});
  Tensor grad_table = Tensor::ones({3, 2}, DType::F64);
  hg::backend_for(Device::CPU)
      .scatter_add_rows(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::F64), ids, grad_table);
  REQUIRE(grad_table.to_vector() == std::vector<double>{4, 5, 1, 1, 7, 9});
}

TEST_CASE("without CUDA every GPU entry point throws an hg::Error naming it", "[backend][no-cuda]") {
  if (hg::gpu::built_with_cuda())
    HG_SKIP("SKIPPED: built with CUDA; this case checks cuda/no_cuda.cpp of CPU-only builds");
  CHECK(hg::gpu::device_count() == 0);
  Tensor t = Tensor::zeros({2, 4});
  const Tensor v = Tensor::ones({4});
  hg::SoftmaxRows rows;
  rows.rows = 2;
  rows.tk = 4;
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"cuda_backend", [] { hg::cuda_backend(); }},
      {"gpu::allocate", [] { hg::gpu::allocate(16); }},
      {"gpu::synchronize", [] { hg::gpu::synchronize(); }},
      {"gpu::layernorm_forward_fused", [&] { hg::gpu::layernorm_forward_fused(t, v, v, 1e-5f, t, t, t); }},
      {"gpu::layernorm_backward_fused", [&] { hg::gpu::layernorm_backward_fused(t, t, v, t, t, t, t, t); }},
      {"gpu::softmax_forward_fused", [&] { hg::gpu::softmax_forward_fused(t, rows, t); }},
      {"gpu::softmax_backward_fused", [&] { hg::gpu::softmax_backward_fused(t, t, 2, 4, 1.0f, t); }},
      {"gpu::cross_entropy_fused", [&] { hg::gpu::cross_entropy_fused(t, v, 2, 4, -100, 0.5f, t, t); }},
      {"gpu::gather_rows_cuda", [&] { hg::gpu::gather_rows_cuda(t, v, 2, t); }},
      {"gpu::embed_rows_cuda", [&] { hg::gpu::embed_rows_cuda(t, t, v, t); }},
      {"gpu::scatter_add_rows_cuda",
       [&] {
         hg::gpu::scatter_add_rows_cuda(t, {0, 1}, t);
       }},
  };
  for (const auto& [name, call] : calls) {
    INFO(name);
    try {
      call();
      FAIL("no error");
    } catch (const hg::Error& e) {
      const std::string what = e.what();
      CHECK(what.find(name) != std::string::npos);
      CHECK(what.find("built without CUDA") != std::string::npos);
    }
  }
}
