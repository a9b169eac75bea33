// Column sums on the GPU (cuda/column_sum.cu): the bias-gradient sums,
// called directly, against float64 sums of the same values; odd widths,
// short and long columns, views off 16-byte alignment, padded rows;
// accumulate; NaN; the same bits run to run. And the backend GEMM's
// GeluBackward (the DGELU epilogue, then the column sums) against float64.
//
// Bounds: a float32 sum of n terms in any order is within (n + 8) 2^-24
// sum |x| of the exact sum (the +8 also covers the start value when
// accumulating); bf16 out adds
// one rounding, 2^-8 |sum| (half an ulp is 2^-9). A dropped row, slice or
// column block is an O(|x|) error, far outside.
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "core/backend.hpp"
#include "core/gemm_check.hpp"
#include "core/tensor.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/gemm_lt.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::f64;
using hg::test::same_bytes;

namespace {

constexpr double kGeluC = 0.7978845608028654, kGeluA = 0.044715;
double gelu_grad(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluC * (1 + 3 * kGeluA * x * x);
}

// Worst |got - want| / bound over the columns of (rows, cols) values x
// (float64, row stride ld) summed onto start.
double worst_ratio(const std::vector<double>& x, int64_t rows, int64_t cols, int64_t ld,
                   const std::vector<double>& start, const std::vector<double>& got, bool bf16_out) {
  double worst = 0;
  for (int64_t j = 0; j < cols; ++j) {
    double sum = start[j], magnitude = std::abs(start[j]);
    for (int64_t i = 0; i < rows; ++i) sum += x[i * ld + j], magnitude += std::abs(x[i * ld + j]);
    const double bound =
        double(rows + 8) * std::ldexp(magnitude, -24) + (bf16_out ? std::ldexp(std::abs(sum), -8) : 0.0) + 1e-30;
    worst = std::max(worst, std::abs(got[j] - sum) / bound);
  }
  return worst;
}

}  // namespace

TEST_CASE("CUDA column_sum: odd widths, short and long columns, vs float64", "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  Generator gen(41);
  std::vector<std::tuple<int64_t, int64_t>> shapes;
  for (const int64_t cols : {1, 3, 7, 100, 513})
    for (const int64_t rows : {1, 2, 63, 8192, 32769}) shapes.push_back({rows, cols});
  for (const int64_t rows : {1, 2, 63, 8192}) shapes.push_back({rows, 2049});
  shapes.push_back({300, 512});
  shapes.push_back({4097, 2048});
  for (const auto& [rows, cols] : shapes)
    for (const DType in : {DType::F32, DType::BF16})
      for (const DType out_dtype : {DType::F32, DType::BF16}) {
        INFO("rows " << rows << " cols " << cols << " " << dtype_name(in) << " -> " << dtype_name(out_dtype));
        const Tensor x = Tensor::randn({rows, cols}, gen, DType::F32, Device::CUDA).to(in);
        Tensor out = Tensor::full({cols}, 99.0, out_dtype, Device::CUDA);
        gpu::column_sum(x, rows, cols, cols, out, false);
        const std::vector<double> zeros(cols, 0.0);
        CHECK(worst_ratio(f64(x).to_vector(), rows, cols, cols, zeros, f64(out).to_vector(),
                          out_dtype == DType::BF16) <= 1.0);
      }
}

TEST_CASE("CUDA column_sum: views off 16-byte alignment and padded rows", "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  Generator gen(42);
  for (const DType in : {DType::F32, DType::BF16})
    for (const auto& [rows, cols, ld, offset] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{1000, 512, 512, 1},  // start 2 or 4 bytes off
          {1000, 512, 513, 0},                                                // rows 2 or 4 bytes apart
          {777, 96, 104, 0},                                                  // padded, still 16-byte rows (bf16)
          {65, 33, 40, 3}}) {
      INFO(dtype_name(in) << " rows " << rows << " cols " << cols << " ld " << ld << " offset " << offset);
      const Tensor buffer = Tensor::randn({offset + rows * ld}, gen, DType::F32, Device::CUDA).to(in);
      const Tensor x = buffer.slice(offset, offset + rows * ld);
      Tensor out = Tensor::zeros({cols}, DType::F32, Device::CUDA);
      gpu::column_sum(x, rows, cols, ld, out, false);
      const std::vector<double> zeros(cols, 0.0);
      CHECK(worst_ratio(f64(x).to_vector(), rows, cols, ld, zeros, f64(out).to_vector(), false) <= 1.0);
    }
}

TEST_CASE("CUDA column_sum: accumulate adds onto out, bitwise the written sums plus one add; the same bits every run",
          "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  Generator gen(43);
  for (const auto& [rows, cols] : {std::tuple<int64_t, int64_t>{8192, 768}, {33, 7}, {32769, 100}})
    for (const DType in : {DType::F32, DType::BF16}) {
      INFO("rows " << rows << " cols " << cols << " " << dtype_name(in));
      const Tensor x = Tensor::randn({rows, cols}, gen, DType::F32, Device::CUDA).to(in);
      const Tensor start = Tensor::randn({cols}, gen, DType::F32, Device::CUDA, 0.0, 10.0);
      Tensor sums = Tensor::empty({cols}, DType::F32, Device::CUDA);
      gpu::column_sum(x, rows, cols, cols, sums, false);
      Tensor composed = start.clone();
      cuda_backend().zip(BinaryOp::Add, composed, sums, composed);
      Tensor added = start.clone();
      gpu::column_sum(x, rows, cols, cols, added, true);
      CHECK(same_bytes(added, composed));
      CHECK(worst_ratio(f64(x).to_vector(), rows, cols, cols, f64(start).to_vector(), f64(added).to_vector(), false) <=
            1.0);
      for (int run = 0; run < 3; ++run) {
        Tensor again = Tensor::full({cols}, -5.0, DType::F32, Device::CUDA);
        gpu::column_sum(x, rows, cols, cols, again, false);
        CHECK(same_bytes(again, sums));
      }
    }
}

// Past 4096 tiles of columns the sums run as several launches over slabs of
// the width, sharing the per-tile arrival counters; every launch must leave
// them at zero for the next (a count left behind makes a later tile finish
// early, with chunks missing). Rows 0 and 1 too.
TEST_CASE("CUDA column_sum: widths of several slabs, one launch after another, zero and one row",
          "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  Generator gen(45);
  for (const auto& [rows, cols] : {std::tuple<int64_t, int64_t>{3, 140001},  // odd: element loads, 2 slabs
                                   {40, 1048584},                            // 16-byte loads: 2 slabs (bf16), 3 (f32)
                                   {0, 300},
                                   {1, 300},
                                   {2000, 300}})
    for (const DType in : {DType::F32, DType::BF16}) {
      INFO("rows " << rows << " cols " << cols << " " << dtype_name(in));
      const Tensor x = Tensor::randn({rows, cols}, gen, DType::F32, Device::CUDA).to(in);
      const Tensor start = Tensor::randn({cols}, gen, DType::F32, Device::CUDA);
      Tensor out = start.clone();
      gpu::column_sum(x, rows, cols, cols, out, true);
      CHECK(worst_ratio(f64(x).to_vector(), rows, cols, cols, f64(start).to_vector(), f64(out).to_vector(), false) <=
            1.0);
    }
}

TEST_CASE("CUDA column_sum: a NaN reaches its own column only", "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  Generator gen(44);
  const int64_t rows = 5000, cols = 96, bad_row = 4321, bad_col = 37;
  for (const DType in : {DType::F32, DType::BF16}) {
    std::vector<double> v = Tensor::randn({rows, cols}, gen, DType::F64).to_vector();
    v[bad_row * cols + bad_col] = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = Tensor::from_vector(v, {rows, cols}, in, Device::CUDA);
    Tensor out = Tensor::zeros({cols}, DType::F32, Device::CUDA);
    gpu::column_sum(x, rows, cols, cols, out, false);
    const auto got = f64(out).to_vector();
    for (int64_t j = 0; j < cols; ++j) {
      INFO(dtype_name(in) << " column " << j << " got " << got[j]);
      CHECK(std::isnan(got[j]) == (j == bad_col));
    }
  }
}

// GeluBackward of the GEMM: the DGELU epilogue (cuBLASLt may use a tanh good
// to 2^-10 relative: tests/test_gemm.cpp), on bf16 operands with bf16 out (it
// may round the product to bf16 before multiplying by gelu': two roundings,
// 2^-8 each), against the float64 product of the same operands, K = 64 (fp32
// accumulation 1e-5 s), and its bias gradient added onto a start value.
TEST_CASE("CUDA gemm GeluBackward: the DGELU epilogue and its column sums vs float64", "[cuda][column_sum][gemm]") {
  HG_REQUIRE_GPU();
  Generator gen(46);
  const int64_t m = 1000, n = 136, k = 64;
  const Tensor a = Tensor::randn({m, k}, gen, DType::F32, Device::CUDA).to(DType::BF16);
  const Tensor b = Tensor::randn({k, n}, gen, DType::F32, Device::CUDA).to(DType::BF16);
  Tensor pre = Tensor::randn({m, n}, gen, DType::F32, Device::CUDA, 0.0, 2.0).to(DType::BF16);
  const auto av = f64(a).to_vector(), bv = f64(b).to_vector(), pv = f64(pre).to_vector();
  {
    Tensor out = Tensor::zeros({m, n}, DType::BF16, Device::CUDA);
    const Tensor start = Tensor::randn({n}, gen, DType::F32, Device::CUDA);
    Tensor bias_grad = start.clone();
    GemmArgs args;
    args.epilogue = GemmEpilogue::GeluBackward;
    args.aux = &pre;
    args.bias_grad = &bias_grad;
    args.bias_grad_accumulate = true;
    const MatmulShape s = check_gemm(a, b, out, args, "test");
    gpu::gemm_lt(a, b, out, args, s);
    const auto got = f64(out).to_vector();
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double p = 0, scale = 0;
        for (int64_t q = 0; q < k; ++q)
          p += av[i * k + q] * bv[q * n + j], scale += std::abs(av[i * k + q] * bv[q * n + j]);
        const double x = pv[i * n + j], g = gelu_grad(x), want = p * g;
        // The epilogue's tanh may be good to 2^-10 |t| only: |p| |d gelu' / dt| 2^-10 |t|.
        const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
        const double slack =
            std::abs(p) * std::abs(0.5 - x * t * kGeluC * (1 + 3 * kGeluA * x * x)) * std::ldexp(std::abs(t), -10);
        const double bound = 1.13 * 1e-5 * scale + std::ldexp(std::abs(p) * (std::abs(g) + 1.0), -8) * 2 + slack + 1e-6;
        worst = std::max(worst, std::abs(got[i * n + j] - want) / bound);
      }
    CHECK(worst <= 1.0);
    CHECK(worst_ratio(got, m, n, n, f64(start).to_vector(), f64(bias_grad).to_vector(), false) <= 1.0);
  }
}

TEST_CASE("column_sum refuses what it cannot do", "[cuda][column_sum]") {
  HG_REQUIRE_GPU();
  const Tensor x = Tensor::zeros({4, 6}, DType::F32, Device::CUDA);
  Tensor out = Tensor::zeros({6}, DType::F32, Device::CUDA), short_out = Tensor::zeros({5}, DType::F32, Device::CUDA);
  CHECK_THROWS_WITH(gpu::column_sum(x, 4, 6, 5, out, false), Catch::Contains("ld >= cols"));
  CHECK_THROWS_WITH(gpu::column_sum(x, 5, 6, 6, out, false), Catch::Contains("expected CUDA storage of 5 rows"));
  CHECK_THROWS_WITH(gpu::column_sum(x, 4, 6, 6, short_out, false), Catch::Contains("expected (6)"));
}
