// The float32 column sums (core/column_sums.hpp) against their definition,
// bit for bit: each column summed in double in row order, scaled, rounded to
// float once. Widths around the 8-column vectors and the 256-column limit,
// one row, padded rows (the padding must not be read into the sums), a mean's
// scale, values whose float32 sum would drift, and inf / NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/column_sums.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "tests/test_util.hpp"

namespace {

std::vector<float> definition(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld, double scale) {
  std::vector<float> y(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double acc = x[static_cast<size_t>(j)];
    for (int64_t i = 1; i < rows; ++i) acc += x[static_cast<size_t>(i * ld + j)];
    y[static_cast<size_t>(j)] = static_cast<float>(acc * scale);
  }
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("column sums equal their definition bit for bit", "[cpu][reduce]") {
  hg::Generator gen(5);
  for (int64_t cols : {1, 7, 8, 9, 31, 64, 100, 255, 256})
    for (int64_t rows : {1, 2, 17, 700})
      for (int64_t pad : {0, 3}) {
        const int64_t ld = cols + pad;
        // 1e4 + N(0, 1): a float32 running sum would drift from the double one.
        const hg::Tensor t = hg::Tensor::randn({rows, ld}, gen, hg::DType::F32, hg::Device::CPU, 1e4, 1.0);
        std::vector<float> x(t.data<float>(), t.data<float>() + t.numel());
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = cols; j < ld; ++j) x[static_cast<size_t>(i * ld + j)] = std::nanf("");
        for (double scale : {1.0, 1.0 / static_cast<double>(rows)}) {
          INFO("rows " << rows << " cols " << cols << " ld " << ld << " scale " << scale);
          std::vector<float> y(static_cast<size_t>(cols) + 1, -7.f);  // one past the end: untouched
          hg::cpu::column_sums(x.data(), rows, cols, ld, scale, y.data());
          CHECK(y.back() == -7.f);
          y.pop_back();
          CHECK(same_bits(y, definition(x, rows, cols, ld, scale)));
        }
      }
}

TEST_CASE("column sums carry inf and NaN as the double sums do", "[cpu][reduce]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t rows = 3, cols = 11;
  std::vector<float> x(static_cast<size_t>(rows * cols), 1.f);
  x[0] = kInf;                            // column 0: inf
  x[cols + 1] = -kInf;                    // column 1: -inf
  x[2] = kInf, x[cols + 2] = -kInf;       // column 2: inf - inf = NaN
  x[2 * cols + 9] = std::nanf("");        // column 9 (the scalar tail): NaN
  x[2 * cols + 3] = 3e38f, x[3] = 3e38f;  // column 3: above float's range, finite in double -> inf
  std::vector<float> y(static_cast<size_t>(cols));
  hg::cpu::column_sums(x.data(), rows, cols, cols, 1.0, y.data());
  CHECK(y[0] == kInf);
  CHECK(y[1] == -kInf);
  CHECK(std::isnan(y[2]));
  CHECK(y[3] == kInf);
  CHECK(std::isnan(y[9]));
  CHECK(y[4] == 3.f);
  CHECK(same_bits(y, definition(x, rows, cols, cols, 1.0)));
}
