// The CUDA runtime and primitive backend against the CPU backend: every map,
// zip (with broadcasting), reduce, matmul, fill, cast and transpose on the
// same seeded inputs; the caching allocator; CUDA errors as hg::Error; the
// fused optimizer kernels against the CPU optimizers.
//
// Tolerances (and why):
// - map: the CUDA result against the CPU float64 map of the same values.
//   f32: exactly rounded ops (neg, abs, square, sqrt, reciprocal, relu...)
//   and the libm-style ones (expf, logf, tanhf: <= 2 ulp in CUDA's tables)
//   get 1e-7 + 5e-7 |ref| (a few ulp, 1 ulp = 6e-8). gelu / gelu_grad get
//   5e-6 + 1e-6 |ref|: they use 1 +- tanh(u) and 1 - tanh(u)^2 where |tanh|
//   is near 1, so a 2-ulp tanhf error (1.2e-7) is multiplied by up to
//   |x| c (1 + 3 a x^2) ~ 17 before tanh saturates. f64: 1e-13 + 1e-13 |ref|.
// - zip: Add/Sub/Mul/Div/Max/Min/Eq/Gt are single correctly-rounded
//   operations, so they must match the CPU bit for bit; Pow is checked against
//   the float64 pow with 1e-6 relative (powf is within a few ulp).
// - reduce: Max/Min pick an element, so they match exactly. Sum/Mean are
//   compared with the float64 sum of the same values: |gpu - ref| <=
//   1e-5 * sum|x| for f32 (each GPU thread adds at most a few hundred terms
//   in sequence, then a tree; the observed error grows like sqrt(terms) * 6e-8,
//   far below this) and 1e-13 * sum|x| for f64.
// - matmul: the float64 CPU product of the same values as reference;
//   ||gpu - ref|| / ||ref|| <= 1e-5 for f32 (K <= 1000: sqrt(K) * 6e-8 ~ 2e-6;
//   cuBLAS runs with CUBLAS_DEFAULT_MATH, no TF32 whose 1e-3 error would fail
//   this), 1e-12 for f64.
// - fill, cast, transpose, device round trips: bit-exact (same rounding rule,
//   round to nearest even, on both sides).
// - optimizers: CPU runs the update in double, the GPU in float: after 3
//   steps the parameters agree to rel 1e-5 (SGD) / 1e-5 (AdamW, whose
//   update m / (sqrt(v) + eps) is well conditioned once v >> eps^2).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/module.hpp"
#include "core/optim.hpp"
#include "core/tensor.hpp"
#include "cuda/optim_kernels.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::BinaryOp;
using hg::Device;
using hg::DType;
using hg::ReduceOp;
using hg::Shape;
using hg::Tensor;
using hg::UnaryOp;

Tensor to_gpu(const Tensor& t) { return t.to(Device::CUDA); }

// Worst element of |got - want| / (atol + rtol |want|) must be <= 1; NaN must meet NaN.
void require_close(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  INFO(what << ": got " << got.describe() << ", want " << want.describe());
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double ratio;
    if (std::isnan(w[i]) || std::isnan(g[i])) ratio = std::isnan(w[i]) && std::isnan(g[i]) ? 0.0 : INFINITY;
    else if (g[i] == w[i]) ratio = 0.0;  // also equal infinities
    else ratio = std::abs(g[i] - w[i]) / (atol + rtol * std::abs(w[i]));
    if (!(ratio <= worst)) {
      worst = ratio;
      worst_i = i;
    }
  }
  INFO("worst element " << worst_i << ": got " << (g.empty() ? 0.0 : g[worst_i]) << " want "
                        << (w.empty() ? 0.0 : w[worst_i]) << " (error / tolerance = " << worst << ")");
  CHECK(worst <= 1.0);
}

const std::vector<UnaryOp> kUnaryOps = {UnaryOp::Identity, UnaryOp::Neg,   UnaryOp::Exp,        UnaryOp::Log,
                                        UnaryOp::Sqrt,     UnaryOp::Rsqrt, UnaryOp::Reciprocal, UnaryOp::Square,
                                        UnaryOp::Abs,      UnaryOp::Relu,  UnaryOp::ReluGrad,   UnaryOp::Gelu,
                                        UnaryOp::GeluGrad, UnaryOp::Tanh,  UnaryOp::Sigmoid};

const std::vector<BinaryOp> kBinaryOps = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max,
                                          BinaryOp::Min, BinaryOp::Pow, BinaryOp::Eq,  BinaryOp::Gt};

// Inputs inside each op's domain: log/sqrt/rsqrt/reciprocal get positive values.
Tensor map_input(UnaryOp op, int64_t n, DType dtype, hg::Generator& gen) {
  const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal;
  if (positive) return Tensor::rand({n}, gen, dtype, Device::CPU, 0.05, 20.0);
  return Tensor::randn({n}, gen, dtype, Device::CPU, 0.0, 3.0);
}

}  // namespace

TEST_CASE("cuda runtime: device facts", "[cuda]") {
  HG_REQUIRE_GPU();
  CHECK(hg::gpu::built_with_cuda());
  CHECK(hg::gpu::device_count() >= 1);
  CHECK(hg::gpu::sm_count() > 0);
  CHECK(std::string(hg::gpu::device_name()).size() > 0);
  hg::gpu::Timer timer;
  Tensor x = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
  timer.start();
  x.fill_(1.0);
  const float ms = timer.stop_ms();
  CHECK(ms >= 0.0f);
  CHECK(x.at({(1 << 20) - 1}) == 1.0);
}

TEST_CASE("cuda runtime: set_stream moves the work in order; refused while capturing", "[cuda]") {
  HG_REQUIRE_GPU();
  const intptr_t own = hg::gpu::current_stream();
  CHECK(own != 0);  // handgrad's own stream, not the legacy default one
  hg::Generator gen(5);
  const Tensor x = Tensor::randn({1024, 4096}, gen, DType::F32, Device::CUDA);
  Tensor y = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
  hg::cuda_backend().map(UnaryOp::Exp, x, y);
  const std::vector<double> want = y.to_vector();
  for (int round = 0; round < 3; ++round) {
    y.fill_(0.0);
    hg::cuda_backend().map(UnaryOp::Exp, x, y);  // queued on the own stream
    hg::gpu::set_stream(0);                      // the legacy default stream waits for it
    CHECK(hg::gpu::current_stream() == 0);
    Tensor z = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
    hg::cuda_backend().map(UnaryOp::Neg, y, z);
    hg::cuda_backend().map(UnaryOp::Neg, z, z);
    y = Tensor();  // its block goes back to the cache; the next allocation may take it on the own stream
    hg::gpu::use_own_stream();
    CHECK(hg::gpu::current_stream() == own);
    y = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
    CHECK(z.to_vector() == want);
  }
  hg::gpu::set_stream(0);
  hg::gpu::set_stream(1);  // cudaStreamLegacy: the same stream, nothing to order
  hg::gpu::use_own_stream();
  hg::gpu::Graph graph;
  graph.begin_capture();
  const std::string msg = hg::test::thrown_message([] { hg::gpu::set_stream(0); });
  graph.abort_capture();
  CHECK(hg::test::contains(msg, "being captured"));
  CHECK(hg::gpu::current_stream() == own);
}

// Tolerance of a CUDA map result against the float64 reference (see top of file).
std::pair<double, double> map_tolerance(UnaryOp op, DType dtype) {
  if (dtype == DType::F64) return {1e-13, 1e-13};
  if (op == UnaryOp::Gelu || op == UnaryOp::GeluGrad) return {5e-6, 1e-6};
  return {1e-7, 5e-7};
}

// The CPU float64 map of x's values: the reference for both dtypes.
Tensor map_reference(UnaryOp op, const Tensor& x) {
  const Tensor x64 = x.to(DType::F64);
  Tensor ref = Tensor::empty(x.shape(), DType::F64);
  hg::cpu_backend().map(op, x64, ref);
  return ref;
}

TEST_CASE("cuda map matches the float64 CPU map for every op, size and alignment", "[cuda][map]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(11);
  for (DType dtype : {DType::F32, DType::F64}) {
    for (UnaryOp op : kUnaryOps) {
      const auto [atol, rtol] = map_tolerance(op, dtype);
      for (int64_t n : {1, 3, 1000, 4097, 65536}) {
        const Tensor x = map_input(op, n + 1, dtype, gen);
        const Tensor xg_full = to_gpu(x);
        // Aligned whole tensor (float4 path when n % 4 == 0) and a slice
        // starting one element in (misaligned: scalar path).
        for (int64_t start : {0, 1}) {
          const Tensor want = map_reference(op, x.slice(start, start + n));
          Tensor got = Tensor::empty({n}, dtype, Device::CUDA);
          hg::cuda_backend().map(op, xg_full.slice(start, start + n), got);
          require_close(got, want, atol, rtol,
                        std::string(hg::unary_op_name(op)) + " " + hg::dtype_name(dtype) + " n=" + std::to_string(n) +
                            " start=" + std::to_string(start));
        }
      }
      // In place: out aliases x.
      const Tensor x = map_input(op, 4096, dtype, gen);
      const Tensor want = map_reference(op, x);
      Tensor xg = to_gpu(x);
      hg::cuda_backend().map(op, xg, xg);
      require_close(xg, want, atol, rtol, std::string("in-place ") + hg::unary_op_name(op));
    }
  }
}

// bf16: f32 math on the widened value, one rounding at the store. Against
// the float64 map of the same bf16 values rounded to bf16: at most one bf16
// ulp apart (2^-7 relative covers an ulp anywhere in a binade) beyond the f32
// math's own absolute error. The 16-byte
// path (8 values, aligned, n % 8 == 0) must give the scalar path's bits.
TEST_CASE("cuda map bf16: every op within one ulp of float64, vector and scalar paths bitwise equal", "[cuda][map]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(13);
  for (UnaryOp op : kUnaryOps) {
    for (int64_t n : {1, 7, 8, 1000, 4096, 4104, 65536}) {
      const Tensor x = map_input(op, n, DType::F64, gen).to(DType::BF16);
      const Tensor want = map_reference(op, x).to(DType::BF16);
      Tensor vec = Tensor::empty({n}, DType::BF16, Device::CUDA);
      hg::cuda_backend().map(op, to_gpu(x), vec);
      const std::string what = std::string(hg::unary_op_name(op)) + " bf16 n=" + std::to_string(n);
      // atol: the f32 math's own absolute error (GELU's tails cancel 1 + tanh).
      require_close(vec, want, map_tolerance(op, DType::F32).first, 1.0 / 128, what);
      // The same values one element in: misaligned, so the scalar kernel.
      Tensor shifted = Tensor::zeros({n + 1}, DType::BF16, Device::CUDA);
      Tensor tail = shifted.slice(1, n + 1);
      tail.copy_(to_gpu(x));
      Tensor scalar = Tensor::empty({n + 1}, DType::BF16, Device::CUDA);
      Tensor scalar_tail = scalar.slice(1, n + 1);
      hg::cuda_backend().map(op, tail, scalar_tail);
      INFO(what);
      CHECK(hg::test::same_bytes(vec.to(Device::CPU), scalar_tail.to(Device::CPU)));
    }
  }
}

TEST_CASE("cuda map: hostile values stay finite where the answer is finite", "[cuda][map]") {
  HG_REQUIRE_GPU();
  const Tensor x = Tensor::from_vector({-1e30, -100.0, -20.0, -6.0, 0.0, 6.0, 20.0, 100.0, 1e30}, {9});
  for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluGrad, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Relu,
                     UnaryOp::ReluGrad, UnaryOp::Abs, UnaryOp::Neg}) {
    Tensor got = Tensor::empty({9}, DType::F32, Device::CUDA);
    hg::cuda_backend().map(op, to_gpu(x), got);
    INFO(hg::unary_op_name(op));
    CHECK(hg::test::all_finite(got));
    const auto [atol, rtol] = map_tolerance(op, DType::F32);
    require_close(got, map_reference(op, x), atol, rtol, std::string("hostile ") + hg::unary_op_name(op));
  }
}

TEST_CASE("cuda zip matches the CPU, with and without broadcasting", "[cuda][zip]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(12);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4097}, {4097}},
      {{65536}, {65536}},
      {{5, 7}, {7}},
      {{7}, {5, 7}},
      {{5, 1}, {1, 7}},
      {{2, 3, 4, 5}, {3, 1, 5}},
      {{6, 4}, {}},
      {{1}, {7, 3}},
      {{2, 1, 3, 1, 4, 1, 5}, {1, 2, 1, 3, 1, 4, 1}},   // 7 dims, little to merge
      {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 300}, {300}},  // 12 dims that merge into 1
      {{513, 33}, {513, 1}},
      {{1, 6}, {6}},
  };
  for (DType dtype : {DType::F32, DType::F64}) {
    for (BinaryOp op : kBinaryOps) {
      for (const auto& [sa, sb] : cases) {
        Tensor a, b;
        if (op == BinaryOp::Pow) {  // positive base, moderate exponent
          a = Tensor::rand(sa, gen, dtype, Device::CPU, 0.5, 2.0);
          b = Tensor::rand(sb, gen, dtype, Device::CPU, -2.0, 2.0);
        } else if (op == BinaryOp::Eq || op == BinaryOp::Gt || op == BinaryOp::Max || op == BinaryOp::Min) {
          // Small integers so that ties (a == b) really occur.
          auto ints = [&](const Shape& s) {
            std::vector<double> v(hg::shape_numel(s));
            for (double& e : v) e = std::floor(gen.uniform() * 4.0);
            return Tensor::from_vector(v, s, dtype);
          };
          a = ints(sa);
          b = ints(sb);
        } else {
          a = Tensor::randn(sa, gen, dtype);
          b = Tensor::randn(sb, gen, dtype);
          if (op == BinaryOp::Div) b = Tensor::rand(sb, gen, dtype, Device::CPU, 0.5, 3.0);
        }
        const Shape out_shape = hg::broadcast_shapes(sa, sb, "test");
        Tensor want = Tensor::empty(out_shape, dtype);
        hg::cpu_backend().zip(op, a, b, want);
        Tensor got = Tensor::empty(out_shape, dtype, Device::CUDA);
        hg::cuda_backend().zip(op, to_gpu(a), to_gpu(b), got);
        const std::string what = std::string(hg::binary_op_name(op)) + " " + hg::dtype_name(dtype) + " " +
                                 hg::shape_str(sa) + " with " + hg::shape_str(sb);
        if (op == BinaryOp::Pow) {
          Tensor ref = Tensor::empty(out_shape, DType::F64);
          hg::cpu_backend().zip(op, a.to(DType::F64), b.to(DType::F64), ref);
          require_close(got, ref, 0.0, dtype == DType::F32 ? 1e-6 : 1e-13, what);
        } else {
          INFO(what);
          CHECK(hg::test::same_bytes(got, want));
        }
      }
    }
  }
}

TEST_CASE("cuda zip: in place, bad shapes and too many unmergeable dims", "[cuda][zip]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(13);
  Tensor a = Tensor::randn({33, 17}, gen), b = Tensor::randn({17}, gen);
  Tensor want = Tensor::empty({33, 17});
  hg::cpu_backend().zip(BinaryOp::Sub, a, b, want);
  Tensor ag = to_gpu(a);
  hg::cuda_backend().zip(BinaryOp::Sub, ag, to_gpu(b), ag);  // out aliases a
  CHECK(hg::test::same_bytes(ag, want));

  Tensor wrong = Tensor::empty({33, 16}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().zip(BinaryOp::Add, ag, to_gpu(b), wrong), hg::Error);
  Tensor other = Tensor::empty({5}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().zip(BinaryOp::Add, ag, other, ag), hg::Error);

  // 9 dims alternating broadcast in a and b cannot merge: a clear error, not a wrong answer.
  const Shape sa = {2, 1, 2, 1, 2, 1, 2, 1, 2}, sb = {1, 2, 1, 2, 1, 2, 1, 2, 1};
  Tensor out = Tensor::empty(hg::broadcast_shapes(sa, sb, "test"), DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().zip(BinaryOp::Add, Tensor::zeros(sa, DType::F32, Device::CUDA),
                                         Tensor::zeros(sb, DType::F32, Device::CUDA), out),
                  hg::Error);
}

TEST_CASE("cuda reduce matches the float64 reference over every dim", "[cuda][reduce]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(14);
  const std::vector<Shape> shapes = {{7, 1000}, {3, 4097, 5}, {65536},      {2, 3, 4, 5}, {1, 1},
                                     {4097, 3}, {3, 1},       {1000, 1025}, {2, 2048, 1}};
  for (DType dtype : {DType::F32, DType::F64}) {
    const double sum_tol = dtype == DType::F32 ? 1e-5 : 1e-13;
    for (const Shape& shape : shapes) {
      // Offset mean: sums far from zero catch a wrong divisor or a dropped block.
      const Tensor x = Tensor::randn(shape, gen, dtype, Device::CPU, 0.5, 1.0);
      const Tensor x64 = x.to(DType::F64);
      const Tensor abs64 = [&] {
        Tensor t = Tensor::empty(shape, DType::F64);
        hg::cpu_backend().map(UnaryOp::Abs, x64, t);
        return t;
      }();
      const Tensor xg = to_gpu(x);
      for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
        Shape out_shape = shape;
        out_shape[dim] = 1;
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
          const std::string what = std::string(hg::reduce_op_name(op)) + " " + hg::dtype_name(dtype) + " " +
                                   hg::shape_str(shape) + " dim " + std::to_string(dim);
          Tensor got = Tensor::empty(out_shape, dtype, Device::CUDA);
          hg::cuda_backend().reduce(op, xg, dim, got);
          Tensor ref = Tensor::empty(out_shape, DType::F64);
          hg::cpu_backend().reduce(op, x64, dim, ref);
          if (op == ReduceOp::Max || op == ReduceOp::Min) {
            INFO(what);
            CHECK(hg::test::same_bytes(got, ref.to(dtype)));
            continue;
          }
          // Error bound per output: sum_tol * sum |x| (divided by the length for the mean).
          Tensor bound = Tensor::empty(out_shape, DType::F64);
          hg::cpu_backend().reduce(op, abs64, dim, bound);
          const auto g = got.to_vector(), r = ref.to_vector(), bnd = bound.to_vector();
          double worst = 0;
          for (size_t i = 0; i < g.size(); ++i)
            worst = std::max(worst, std::abs(g[i] - r[i]) / (sum_tol * bnd[i] + 1e-300));
          INFO(what << ": worst error / bound = " << worst);
          CHECK(worst <= 1.0);
        }
      }
      // Negative dims count from the end.
      Shape keep = shape;
      keep.back() = 1;
      Tensor a = Tensor::empty(keep, dtype, Device::CUDA), b = Tensor::empty(keep, dtype, Device::CUDA);
      hg::cuda_backend().reduce(ReduceOp::Max, xg, -1, a);
      hg::cuda_backend().reduce(ReduceOp::Max, xg, static_cast<int>(shape.size()) - 1, b);
      CHECK(hg::test::same_bytes(a, b));
    }
  }
}

TEST_CASE("cuda reduce: empty dims and bad output shapes", "[cuda][reduce]") {
  HG_REQUIRE_GPU();
  const Tensor empty = Tensor::empty({3, 0, 2}, DType::F32, Device::CUDA);
  Tensor out = Tensor::full({3, 1, 2}, 7.0, DType::F32, Device::CUDA);
  hg::cuda_backend().reduce(ReduceOp::Sum, empty, 1, out);
  for (double v : out.to_vector()) CHECK(v == 0.0);
  CHECK_THROWS_AS(hg::cuda_backend().reduce(ReduceOp::Max, empty, 1, out), hg::Error);
  Tensor x = Tensor::ones({4, 5}, DType::F32, Device::CUDA);
  Tensor bad = Tensor::empty({4, 5}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().reduce(ReduceOp::Sum, x, 1, bad), hg::Error);
  CHECK_THROWS_AS(hg::cuda_backend().reduce(ReduceOp::Sum, x, 2, bad), hg::Error);
}

TEST_CASE("cuda matmul matches the float64 product", "[cuda][matmul]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(15);
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{17, 33}, {33, 9}, false, false},      {{33, 17}, {33, 9}, true, false},
      {{17, 33}, {9, 33}, false, true},       {{33, 17}, {9, 33}, true, true},
      {{3, 5, 7}, {3, 7, 4}, false, false},   {{2, 3, 7, 5}, {2, 3, 4, 7}, true, true},
      {{2, 3, 5, 7}, {7, 4}, false, false},   {{4, 7, 5}, {4, 7}, true, true},  // shared 2-D b
      {{64, 1000}, {1000, 96}, false, false}, {{1, 1}, {1, 1}, false, false},
      {{1, 300}, {300, 1}, false, false},     {{129, 1}, {1, 65}, false, false},
  };
  for (DType dtype : {DType::F32, DType::F64}) {
    const double tol = dtype == DType::F32 ? 1e-5 : 1e-12;
    for (const Case& c : cases) {
      for (bool accumulate : {false, true}) {
        const Tensor a = Tensor::randn(c.a, gen, dtype), b = Tensor::randn(c.b, gen, dtype);
        // Reference in float64 on the CPU.
        const Tensor a64 = a.to(DType::F64), b64 = b.to(DType::F64);
        Shape os(c.a.begin(), c.a.end() - 2);
        os.push_back(c.ta ? c.a.back() : c.a[c.a.size() - 2]);
        os.push_back(c.tb ? c.b[c.b.size() - 2] : c.b.back());
        const Tensor init = Tensor::randn(os, gen, dtype);
        // clone(): for F64, to(F64) returns init itself and the CPU product would
        // accumulate into the very tensor the GPU copy starts from.
        Tensor ref = accumulate ? init.to(DType::F64).clone() : Tensor::empty(os, DType::F64);
        hg::cpu_backend().matmul(a64, b64, ref, c.ta, c.tb, accumulate);
        Tensor got = accumulate ? to_gpu(init) : Tensor::full(os, 12345.0, dtype, Device::CUDA);
        hg::cuda_backend().matmul(to_gpu(a), to_gpu(b), got, c.ta, c.tb, accumulate);
        INFO(hg::dtype_name(dtype) << " a " << hg::shape_str(c.a) << (c.ta ? "^T" : "") << " b " << hg::shape_str(c.b)
                                   << (c.tb ? "^T" : "") << (accumulate ? " accumulate" : ""));
        const double err = hg::test::rel_error(got.to(DType::F64), ref);
        INFO("rel error " << err);
        CHECK(err <= tol);
      }
    }
  }
}

TEST_CASE("cuda matmul: k = 0, bad shapes", "[cuda][matmul]") {
  HG_REQUIRE_GPU();
  Tensor a = Tensor::empty({4, 0}, DType::F32, Device::CUDA), b = Tensor::empty({0, 3}, DType::F32, Device::CUDA);
  Tensor out = Tensor::full({4, 3}, 5.0, DType::F32, Device::CUDA);
  hg::cuda_backend().matmul(a, b, out, false, false, true);  // += nothing
  for (double v : out.to_vector()) CHECK(v == 5.0);
  hg::cuda_backend().matmul(a, b, out, false, false, false);  // = empty sum
  for (double v : out.to_vector()) CHECK(v == 0.0);
  Tensor x = Tensor::ones({4, 5}, DType::F32, Device::CUDA), y = Tensor::ones({6, 3}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().matmul(x, y, out, false, false), hg::Error);
  Tensor y2 = Tensor::ones({5, 3}, DType::F32, Device::CUDA), wrong = Tensor::empty({4, 4}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().matmul(x, y2, wrong, false, false), hg::Error);
  Tensor y64 = Tensor::ones({5, 3}, DType::F64, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().matmul(x, y64, out, false, false), hg::Error);
}

TEST_CASE("cuda fill and cast agree with the CPU bit for bit", "[cuda][cast]") {
  HG_REQUIRE_GPU();
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16, DType::F16};
  // 1e-6 is subnormal in f16, 1e5 overflows f16 to inf, 1/3 needs rounding everywhere.
  for (DType dtype : dtypes) {
    for (double value : {0.0, -2.75, 1.0 / 3.0, 1e-6, 1e5, -1e30}) {
      Tensor got = Tensor::empty({1001}, dtype, Device::CUDA);
      hg::cuda_backend().fill(got, value);
      Tensor want = Tensor::empty({1001}, dtype);
      hg::cpu_backend().fill(want, value);
      INFO("fill " << hg::dtype_name(dtype) << " " << value);
      CHECK(hg::test::same_bytes(got, want));
    }
  }
  hg::Generator gen(16);
  std::vector<double> values;
  for (double scale : {1e-7, 1e-3, 1.0, 300.0, 1e5, 1e39})
    for (int i = 0; i < 700; ++i) values.push_back(scale * gen.normal());
  const int64_t n = static_cast<int64_t>(values.size());
  for (DType from : dtypes) {
    const Tensor src = Tensor::from_vector(values, {n}, from);
    const Tensor src_gpu = to_gpu(src);
    for (DType to : dtypes) {
      Tensor want = Tensor::empty({n}, to);
      hg::cpu_backend().cast(src, want);
      Tensor got = Tensor::empty({n}, to, Device::CUDA);
      hg::cuda_backend().cast(src_gpu, got);
      INFO("cast " << hg::dtype_name(from) << " -> " << hg::dtype_name(to));
      CHECK(hg::test::same_bytes(got, want));
    }
  }
}

TEST_CASE("cuda transpose agrees with the CPU", "[cuda][transpose]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(17);
  const std::vector<std::tuple<Shape, int, int>> cases = {
      {{33, 65}, 0, 1},    {{2, 17, 4, 8}, 1, 2}, {{3, 5, 7, 2}, 0, 3}, {{4, 1, 6}, 0, 1},
      {{2, 3, 4}, -1, -2}, {{1, 3, 4, 8}, 0, 2},  {{3, 5, 1}, 0, 2}};
  for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    for (const auto& [shape, d0, d1] : cases) {
      const Tensor x = Tensor::randn(shape, gen, dtype);
      Shape os = shape;
      const int a = d0 < 0 ? d0 + static_cast<int>(shape.size()) : d0;
      const int b = d1 < 0 ? d1 + static_cast<int>(shape.size()) : d1;
      std::swap(os[a], os[b]);
      Tensor want = Tensor::empty(os, dtype);
      hg::cpu_backend().transpose(x, d0, d1, want);
      Tensor got = Tensor::empty(os, dtype, Device::CUDA);
      hg::cuda_backend().transpose(to_gpu(x), d0, d1, got);
      INFO(hg::dtype_name(dtype) << " " << hg::shape_str(shape) << " dims " << d0 << ", " << d1);
      CHECK(hg::test::same_bytes(got, want));
    }
  }
}

TEST_CASE("cuda device round trips are bit-exact", "[cuda][runtime]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(18);
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (int64_t n : {1, 3, 4097, 1 << 20}) {
      const Tensor x = Tensor::randn({n}, gen, dtype);
      const Tensor back = to_gpu(x).clone().to(Device::CPU);  // H2D, D2D, D2H
      INFO(hg::dtype_name(dtype) << " n=" << n);
      CHECK(hg::test::same_bytes(x, back));
    }
  }
  // copy_ into a slice of a GPU tensor writes exactly those rows.
  Tensor big = Tensor::zeros({10, 3}, DType::F32, Device::CUDA);
  const Tensor rows = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  big.slice(4, 6).copy_(rows);
  const auto v = big.to_vector();
  for (int64_t i = 0; i < 30; ++i) CHECK(v[i] == (i >= 12 && i < 18 ? static_cast<double>(i - 11) : 0.0));
}

TEST_CASE("cuda caching allocator reaches a steady state", "[cuda][allocator]") {
  HG_REQUIRE_GPU();
  const std::vector<size_t> sizes = {1, 513, 4097 * 4, 1 << 20, (3 << 20) + 5, 64 << 20};
  const hg::gpu::MemoryStats before = hg::gpu::memory_stats();
  auto round = [&] {
    std::vector<void*> blocks;
    for (size_t s : sizes) blocks.push_back(hg::gpu::allocate(s));
    for (size_t i = 0; i + 1 < blocks.size(); ++i) CHECK(blocks[i] != blocks[i + 1]);
    for (void* p : blocks) hg::gpu::release(p);
    // Tensors go through the same allocator.
    for (int i = 0; i < 3; ++i) {
      Tensor t = Tensor::empty({1000, 37}, DType::F32, Device::CUDA);
      t.fill_(1.0);
    }
  };
  round();  // warm-up: fills the cache (twice, so every best-fit choice has settled)
  round();
  const hg::gpu::MemoryStats warm = hg::gpu::memory_stats();
  for (int i = 0; i < 20; ++i) round();
  const hg::gpu::MemoryStats after = hg::gpu::memory_stats();
  CHECK(after.device_mallocs == warm.device_mallocs);
  CHECK(after.reserved == warm.reserved);
  CHECK(after.in_use == before.in_use);
  CHECK(after.peak_in_use >= before.in_use + (64u << 20));
  CHECK(after.reserved >= after.in_use);

  // Emptying the cache leaves only live blocks reserved.
  hg::gpu::empty_cache();
  const hg::gpu::MemoryStats emptied = hg::gpu::memory_stats();
  CHECK(emptied.reserved == emptied.in_use);

  // A cached block is reused for a request of at least half its size, not for a tiny one.
  void* big = hg::gpu::allocate(64 << 20);
  hg::gpu::release(big);
  const int64_t mallocs = hg::gpu::memory_stats().device_mallocs;
  const hg::gpu::MemoryStats idle = hg::gpu::memory_stats();
  hg::gpu::reset_peak_memory();
  void* reused = hg::gpu::allocate((40 << 20) + 1);
  CHECK(reused == big);
  CHECK(hg::gpu::memory_stats().device_mallocs == mallocs);
  // in_use counts the whole 64 MiB block; requested what was asked, to 512 bytes.
  const hg::gpu::MemoryStats holding = hg::gpu::memory_stats();
  CHECK(holding.in_use == idle.in_use + (64u << 20));
  CHECK(holding.requested == idle.requested + (40u << 20) + 512);
  CHECK(holding.peak_requested == holding.requested);
  hg::gpu::release(reused);
  CHECK(hg::gpu::memory_stats().requested == idle.requested);
  CHECK(hg::gpu::memory_stats().peak_requested == holding.requested);
  void* small = hg::gpu::allocate(1000);
  CHECK(small != big);
  CHECK(hg::gpu::memory_stats().device_mallocs == mallocs + 1);
  hg::gpu::release(small);
  hg::gpu::empty_cache();

  // Releasing a pointer the allocator never handed out is ignored, not a crash.
  int not_ours = 0;
  hg::gpu::release(&not_ours);
  hg::gpu::release(nullptr);
  CHECK(hg::gpu::memory_stats().in_use == before.in_use);
}

TEST_CASE("cuda caching allocator: a memory limit refuses what would go over it, after giving the cache back",
          "[cuda][allocator]") {
  HG_REQUIRE_GPU();
  constexpr size_t kMiB = size_t(1) << 20;
  hg::gpu::empty_cache();
  const size_t held = hg::gpu::memory_stats().reserved;
  {
    const hg::test::GpuMemoryLimit limit(held + 64 * kMiB);
    CHECK(hg::gpu::memory_limit() == held + 64 * kMiB);
    void* fits = hg::gpu::allocate(32 * kMiB);
    try {
      hg::gpu::allocate(48 * kMiB);  // 32 + 48 held: over
      FAIL("48 MiB more should go over the limit");
    } catch (const hg::OutOfMemory& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("set_memory_limit") != std::string::npos);
    }
    // Released, the 32 MiB block is cached (too small for 48); the cache is
    // given back before the request is refused, so 48 MiB fits now.
    hg::gpu::release(fits);
    void* after = hg::gpu::allocate(48 * kMiB);
    CHECK(hg::gpu::memory_stats().reserved == held + 48 * kMiB);
    hg::gpu::release(after);
  }
  CHECK(hg::gpu::memory_limit() == 0);
  void* big = hg::gpu::allocate(256 * kMiB);  // no limit now
  hg::gpu::release(big);
  hg::gpu::empty_cache();
  // The driver's own out of memory is an OutOfMemory too.
  CHECK_THROWS_AS(hg::gpu::allocate(size_t(1) << 50), hg::OutOfMemory);
}

TEST_CASE("cuda failures come out as hg::Error and leave the GPU usable", "[cuda][errors][api-errors]") {
  HG_REQUIRE_GPU();
  // cudaMalloc of a petabyte fails with cudaErrorMemoryAllocation.
  try {
    hg::gpu::allocate(size_t(1) << 50);
    FAIL("allocating 1 PiB should throw");
  } catch (const hg::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("cudaMalloc") != std::string::npos);
  }
  // The failure did not poison later launches (the error was cleared).
  Tensor t = Tensor::zeros({4097}, DType::F32, Device::CUDA);
  t.fill_(2.5);
  CHECK(t.at({4096}) == 2.5);

  int host = 0;
  CHECK_THROWS_AS(hg::gpu::copy_bytes(nullptr, Device::CUDA, &host, Device::CPU, sizeof host), hg::Error);

  // The backend rejects what it cannot compute, naming the op and the dtype
  // (BF16 arithmetic runs since mixed precision; F16 is storage only).
  Tensor h = Tensor::empty({8}, DType::F16, Device::CUDA);
  try {
    hg::cuda_backend().map(UnaryOp::Exp, h, h);
    FAIL("f16 map should throw");
  } catch (const hg::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("exp") != std::string::npos);
    CHECK(std::string(e.what()).find("f16") != std::string::npos);
  }
  Tensor cpu = Tensor::zeros({8});
  Tensor gpu_out = Tensor::empty({8}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().map(UnaryOp::Neg, cpu, gpu_out), hg::Error);
  Tensor f64 = Tensor::empty({8}, DType::F64, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().map(UnaryOp::Neg, gpu_out, f64), hg::Error);
  Tensor shorter = Tensor::empty({7}, DType::F32, Device::CUDA);
  CHECK_THROWS_AS(hg::cuda_backend().map(UnaryOp::Neg, gpu_out, shorter), hg::Error);
  CHECK_THROWS_AS(hg::cuda_backend().cast(gpu_out, shorter), hg::Error);
}

namespace {

// A CPU parameter and its GPU twin with identical value and grad.
struct TwinParams {
  std::vector<hg::Parameter> cpu, gpu;
  std::vector<Tensor> initial;  // CPU copies of the starting values
  std::vector<hg::Parameter*> cpu_ptrs() {
    std::vector<hg::Parameter*> out;
    for (auto& p : cpu) out.push_back(&p);
    return out;
  }
  std::vector<hg::Parameter*> gpu_ptrs() {
    std::vector<hg::Parameter*> out;
    for (auto& p : gpu) out.push_back(&p);
    return out;
  }
};

TwinParams make_twins(hg::Generator& gen) {
  TwinParams t;
  for (int64_t n : {1, 1000, 4097}) {
    hg::Parameter p{Tensor::randn({n}, gen), Tensor::zeros({n}), Tensor()};
    t.cpu.push_back(p);
    t.gpu.push_back({to_gpu(p.value), to_gpu(p.grad), Tensor()});
    t.initial.push_back(p.value.clone());
  }
  return t;
}

// New random grads, the same on both sides.
void set_grads(TwinParams& t, hg::Generator& gen, double scale) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    const Tensor g = Tensor::randn(t.cpu[i].value.shape(), gen, DType::F32, Device::CPU, 0.0, scale);
    t.cpu[i].grad.copy_(g);
    t.gpu[i].grad.copy_(g);
  }
}

void require_twins_close(TwinParams& t, double rtol, const std::string& what) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    const double err = hg::test::rel_error(t.gpu[i].value, t.cpu[i].value);
    INFO(what << " parameter " << i << " rel error " << err);
    CHECK(err <= rtol);
    // The steps really moved the parameters, so agreement is not two no-ops.
    CHECK(hg::test::rel_error(t.cpu[i].value, t.initial[i]) > 1e-3);
  }
}

}  // namespace

TEST_CASE("cuda optimizer kernels match the CPU optimizers over 3 steps", "[cuda][optim]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(19);
  SECTION("SGD with momentum and weight decay") {
    TwinParams t = make_twins(gen);
    const hg::SGDOptions opt{0.1, 0.9, 0.01};
    hg::SGD cpu(t.cpu_ptrs(), opt), gpu(t.gpu_ptrs(), opt);
    for (int step = 0; step < 3; ++step) {
      set_grads(t, gen, 1.0);
      cpu.step();
      gpu.step();
    }
    require_twins_close(t, 1e-5, "sgd momentum");
  }
  SECTION("SGD without momentum") {
    TwinParams t = make_twins(gen);
    const hg::SGDOptions opt{0.05, 0.0, 0.0};
    hg::SGD cpu(t.cpu_ptrs(), opt), gpu(t.gpu_ptrs(), opt);
    for (int step = 0; step < 3; ++step) {
      set_grads(t, gen, 1.0);
      cpu.step();
      gpu.step();
    }
    require_twins_close(t, 1e-5, "sgd plain");
  }
  SECTION("AdamW") {
    TwinParams t = make_twins(gen);
    const hg::AdamWOptions opt{1e-2, 0.9, 0.999, 1e-8, 0.01};
    hg::AdamW cpu(t.cpu_ptrs(), opt), gpu(t.gpu_ptrs(), opt);
    for (int step = 0; step < 3; ++step) {
      set_grads(t, gen, 1.0);
      cpu.step();
      gpu.step();
    }
    require_twins_close(t, 1e-5, "adamw");
  }
  SECTION("clip_grad_norm") {
    TwinParams t = make_twins(gen);
    set_grads(t, gen, 3.0);
    const double cpu_norm = hg::clip_grad_norm(t.cpu_ptrs(), 1.0);
    const double gpu_norm = hg::clip_grad_norm(t.gpu_ptrs(), 1.0);
    CHECK(cpu_norm > 1.0);  // so clipping really happened
    CHECK(std::abs(gpu_norm - cpu_norm) <= 1e-12 * cpu_norm);
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      const double err = hg::test::rel_error(t.gpu[i].grad, t.cpu[i].grad);
      INFO("clipped grad " << i << " rel error " << err);
      CHECK(err <= 1e-6);
    }
  }
}

TEST_CASE("cuda sum_of_squares is exact-ish and deterministic", "[cuda][optim]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(20);
  for (int64_t n : {1, 3, 1000, 4097, 65536 + 7, 3000000}) {
    const Tensor x = Tensor::randn({n}, gen);
    const std::vector<double> v = x.to_vector();
    double ref = 0;
    for (double e : v) ref += e * e;  // each float square is exact in double
    const Tensor xg = to_gpu(x);
    const double first = hg::gpu::sum_of_squares(xg.data<float>(), n);
    const double second = hg::gpu::sum_of_squares(xg.data<float>(), n);
    // Summing n positive doubles in sequence (the reference) errs by at most
    // about n * 2^-53 relative; the GPU's tree is more accurate than that.
    const double tol = std::max(1e-14, static_cast<double>(n) * 1.2e-16);
    INFO("n=" << n << " gpu " << first << " ref " << ref);
    CHECK(std::abs(first - ref) <= tol * ref);
    CHECK(std::memcmp(&first, &second, sizeof first) == 0);  // bitwise the same run to run
  }
  CHECK(hg::gpu::sum_of_squares(nullptr, 0) == 0.0);
  Tensor y = Tensor::full({4097}, 2.0, DType::F32, Device::CUDA);
  hg::gpu::scale_inplace(y.data<float>(), y.numel(), 0.25f);
  for (double e : y.to_vector()) CHECK(e == 0.5);
}
