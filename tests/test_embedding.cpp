// The token + position embedding op (ops/embedding.hpp). The forward is one
// f32 addition a value, rounded once to the output dtype, so every path
// (CPU, CUDA unfused, CUDA fused: embed_rows_kernel) must give the bits of
// the float64 sum rounded to f32 (double rounding through f64 is exact for
// a sum of two f32) and then to bf16: compared value for value, NaN for NaN.
// The backward's token rows are a scatter in ascending position order on
// every path, so the CUDA fused path fed a bf16 dy must give the bits of the
// unfused path fed its f32 cast; every gradient is an f32 sum within the
// bound of recursive summation of the float64 sum: (terms - 1) 2^-24 times
// the sum of the terms' magnitudes. Sizes: odd
// widths (the scalar kernel), widths of 16-byte rows (the vector kernel),
// a start past position 0, many repeated ids; values: 1e30, 1e-30, -0, a
// NaN and an overflow to inf.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/indexing.hpp"
#include "core/kernel_mode.hpp"
#include "core/random.hpp"
#include "core/tensor_functions.hpp"
#include "ops/embedding.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

struct Case {
  int64_t v, b, t, d, start;
};

const Case kCases[] = {
    {1, 1, 1, 1, 0}, {37, 3, 5, 13, 2}, {50, 2, 7, 64, 0}, {300, 4, 33, 772, 5}, {5000, 2, 40, 256, 1}};

struct Tables {
  Tensor token, positions_all, ids;  // CPU F32; positions_all has start + T rows
};

// Random tables with hostile entries; every third id is row 0 (repeats).
Tables make_tables(const Case& c, Generator& g) {
  Tables s;
  std::vector<double> token = Tensor::randn({c.v, c.d}, g).to_vector();
  std::vector<double> pos = Tensor::randn({c.start + c.t, c.d}, g).to_vector();
  const size_t first = static_cast<size_t>(c.start * c.d);  // position start: where t = 0 reads
  token[0] = 1e30, pos[first] = -1e30;                      // id 0 at t = 0 (always): 1e30 - 1e30
  if (c.d > 2) {
    token[1] = 3e38, pos[first + 1] = 3e38;  // overflow: inf
    token[2] = -0.0, pos[first + 2] = -0.0;  // -0 + -0 = -0
  }
  token.back() = 1e-30;
  pos.back() = std::nan("");  // the last position's last column: NaN in every sequence
  std::vector<double> ids(static_cast<size_t>(c.b * c.t));
  for (size_t p = 0; p < ids.size(); ++p)
    ids[p] = p % 3 == 0 ? 0.0 : static_cast<double>(g.next_u64() % static_cast<uint64_t>(c.v));
  s.token = Tensor::from_vector(token, {c.v, c.d});
  s.positions_all = Tensor::from_vector(pos, {c.start + c.t, c.d});
  s.ids = Tensor::from_vector(ids, {c.b, c.t});
  return s;
}

// v rounded to the nearest f32, past the largest one to +-inf (a conversion
// out of float's range is undefined in C++, not inf).
float rounded_to_f32(double v) {
  const float inf = std::numeric_limits<float>::infinity();
  if (std::abs(v) >= 0x1p128 - 0x1p103) return v > 0 ? inf : -inf;
  return static_cast<float>(v);
}

// The float64 sum of each pair, rounded to f32, then to `out`.
Tensor reference_forward(const Case& c, const Tables& s, DType out) {
  const std::vector<double> token = s.token.to_vector(), pos = s.positions_all.to_vector(), ids = s.ids.to_vector();
  std::vector<double> ref(static_cast<size_t>(c.b * c.t * c.d));
  for (int64_t r = 0; r < c.b * c.t; ++r)
    for (int64_t j = 0; j < c.d; ++j)
      ref[r * c.d + j] =
          rounded_to_f32(token[static_cast<size_t>(ids[r]) * c.d + j] + pos[(c.start + r % c.t) * c.d + j]);
  return Tensor::from_vector(ref, {c.b, c.t, c.d}, DType::F32).to(out);
}

// Equal values of one dtype and shape, NaN where NaN (a NaN's payload may
// differ between devices), -0 apart from +0.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    const bool both_nan = std::isnan(x[i]) && std::isnan(y[i]);
    if (!both_nan && (x[i] != y[i] || std::signbit(x[i]) != std::signbit(y[i]))) return false;
  }
  return true;
}

Tensor forward_on(const Tables& s, const Case& c, Device dev, KernelMode mode, DType out, IdCheck check) {
  KernelModeScope scope(mode);
  const Tensor positions = s.positions_all.to(dev).slice(c.start, c.start + c.t);
  return embedding_forward(s.token.to(dev), positions, s.ids.to(dev), out, check);
}

struct Grads {
  Tensor token, positions;
};

// Both gradients after one backward into tables that already hold `base`.
Grads backward_on(const Tensor& dy, const Tensor& ids, const Grads& base, KernelMode mode, IdCheck check) {
  KernelModeScope scope(mode);
  const Device dev = dy.device();
  Grads g{base.token.to(dev).clone(), base.positions.to(dev).clone()};
  embedding_backward(dy, ids.to(dev), &g.token, g.positions, check);
  return g;
}

// base + the float64 sums of dy's rows (dy as its float64 values), and for
// each sum the bound of an f32 sum of its terms in any order: (terms - 1)
// 2^-24 times the sum of their magnitudes.
struct Reference {
  Grads sum, bound;
};
Reference reference_backward(const Tensor& dy, const Tensor& ids, const Grads& base) {
  const std::vector<double> d = dy.to_vector(), id = ids.to_vector();
  std::vector<double> token = base.token.to_vector(), pos = base.positions.to_vector();
  std::vector<double> token_mag(token.size()), pos_mag(pos.size()), token_n(token.size(), 1), pos_n(pos.size(), 1);
  for (size_t i = 0; i < token.size(); ++i) token_mag[i] = std::abs(token[i]);
  for (size_t i = 0; i < pos.size(); ++i) pos_mag[i] = std::abs(pos[i]);
  const int64_t b = ids.size(0), t = ids.size(1), w = base.token.size(1);
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t j = 0; j < w; ++j) {
      const double v = d[r * w + j];
      const size_t k = static_cast<size_t>(id[r]) * w + j, p = (r % t) * w + j;
      token[k] += v, token_mag[k] += std::abs(v), token_n[k] += 1;
      pos[p] += v, pos_mag[p] += std::abs(v), pos_n[p] += 1;
    }
  auto bound = [](std::vector<double> mag, const std::vector<double>& n) {
    for (size_t i = 0; i < mag.size(); ++i) mag[i] *= (n[i] - 1) * std::ldexp(1.0, -24);
    return mag;
  };
  auto f64 = [](const std::vector<double>& v, const Tensor& like) {
    return Tensor::from_vector(v, like.shape(), DType::F64);
  };
  return {{f64(token, base.token), f64(pos, base.positions)},
          {f64(bound(token_mag, token_n), base.token), f64(bound(pos_mag, pos_n), base.positions)}};
}

// Within the reference's bound everywhere; NaN exactly where it has one.
bool within_sum_error(const Tensor& got, const Tensor& want, const Tensor& bound) {
  const std::vector<double> x = got.to_vector(), y = want.to_vector(), e = bound.to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(y[i]) != std::isnan(x[i])) return false;
    if (!std::isnan(y[i]) && !(std::abs(x[i] - y[i]) <= e[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("embedding_forward: every path gives the f32 sum rounded once, f32 and bf16 out", "[embedding][cuda]") {
  Generator g(71);
  const bool cuda = test::cuda_paths_run("embedding_forward");
  for (const Case& c : kCases) {
    INFO("V " << c.v << " B " << c.b << " T " << c.t << " D " << c.d << " start " << c.start);
    const Tables s = make_tables(c, g);
    for (DType out : {DType::F32, DType::BF16}) {
      INFO("out " << dtype_name(out));
      const Tensor want = reference_forward(c, s, out);
      CHECK(same_values(forward_on(s, c, Device::CPU, KernelMode::Fused, out, IdCheck::Host), want));
      if (!cuda) continue;
      for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
        INFO("CUDA " << kernel_mode_name(mode));
        for (IdCheck check : {IdCheck::Host, IdCheck::Device})
          CHECK(same_values(forward_on(s, c, Device::CUDA, mode, out, check), want));
      }
    }
  }
}

TEST_CASE("embedding_forward: a bad id is refused on the host, a NaN row when checked on the device",
          "[embedding][cuda]") {
  const Tensor token = Tensor::ones({4, 6}), positions = Tensor::zeros({3, 6});
  const Tensor bad = Tensor::from_vector({1, 4, 2.5, -1, std::nan(""), 3}, {2, 3});
  CHECK(contains(thrown_message([&] { embedding_forward(token, positions, bad, DType::F32, IdCheck::Host); }),
                 "id 4 at flat position 1"));
  if (!test::cuda_paths_run("embedding_forward with bad ids")) return;
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO(kernel_mode_name(mode));
    CHECK(contains(thrown_message([&] {
                     embedding_forward(token.to(Device::CUDA), positions.to(Device::CUDA), bad.to(Device::CUDA),
                                       DType::BF16, IdCheck::Host);
                   }),
                   "not an integer in [0, 4)"));
    const std::vector<double> rows = embedding_forward(token.to(Device::CUDA), positions.to(Device::CUDA),
                                                       bad.to(Device::CUDA), DType::BF16, IdCheck::Device)
                                         .to_vector();
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t j = 0; j < 6; ++j) {
        INFO("row " << r << " column " << j);
        if (r == 0 || r == 5) CHECK(rows[r * 6 + j] == 1.0);
        else CHECK(std::isnan(rows[r * 6 + j]));
      }
  }
}

TEST_CASE("embedding_backward: token rows bitwise the unfused path's, position rows the float64 sums",
          "[embedding][cuda]") {
  Generator g(72);
  const bool cuda = test::cuda_paths_run("embedding_backward");
  for (const Case& c : kCases) {
    INFO("V " << c.v << " B " << c.b << " T " << c.t << " D " << c.d);
    const Tables s = make_tables(c, g);
    const Grads base{Tensor::randn({c.v, c.d}, g), Tensor::randn({c.t, c.d}, g)};
    std::vector<double> dy_values = Tensor::randn({c.b, c.t, c.d}, g).to_vector();
    dy_values[dy_values.size() / 2] = std::nan("");  // reaches one token row and one position row
    dy_values[0] = 1e30;                             // the sums of its column are 1e30's
    dy_values[dy_values.size() - 1] = 1e-30;
    const Tensor dy32 = Tensor::from_vector(dy_values, {c.b, c.t, c.d});
    const Tensor dy16 = dy32.to(DType::BF16);
    for (const Tensor& dy : {dy32, dy16}) {
      INFO("dy " << dtype_name(dy.dtype()));
      const Reference want = reference_backward(dy, s.ids, base);
      const Grads cpu = backward_on(dy, s.ids, base, KernelMode::Fused, IdCheck::Host);
      CHECK(within_sum_error(cpu.token, want.sum.token, want.bound.token));
      CHECK(within_sum_error(cpu.positions, want.sum.positions, want.bound.positions));
      if (!cuda) continue;
      const Tensor dy_gpu = dy.to(Device::CUDA);
      const Grads unfused = backward_on(dy_gpu, s.ids, base, KernelMode::Unfused, IdCheck::Host);
      CHECK(within_sum_error(unfused.positions, want.sum.positions, want.bound.positions));
      for (IdCheck check : {IdCheck::Host, IdCheck::Device}) {
        INFO("fused, ids checked on the " << (check == IdCheck::Host ? "host" : "device"));
        const Grads fused = backward_on(dy_gpu, s.ids, base, KernelMode::Fused, check);
        CHECK(same_values(fused.token, unfused.token));
        CHECK(within_sum_error(fused.positions, want.sum.positions, want.bound.positions));
      }
    }
  }
}

TEST_CASE("embedding_forward / _backward: wrong dtypes and shapes are refused by name", "[embedding]") {
  const Tensor token = Tensor::zeros({5, 4}), positions = Tensor::zeros({3, 4});
  const Tensor ids = Tensor::zeros({2, 3});
  CHECK(contains(thrown_message([&] { embedding_forward(token, positions, ids, DType::F64, IdCheck::Host); }),
                 "out dtype f64 is not allowed for f32 tables: the tables' dtype, or bf16 for f32 tables"));
  CHECK(contains(thrown_message([&] {
                   embedding_forward(token, Tensor::zeros({2, 4}), ids, DType::F32, IdCheck::Host);
                 }),
                 "must be (V, D) and (T, D) of one dtype, T = 3"));
  CHECK(contains(
      thrown_message([&] { embedding_forward(token.to(DType::F64), positions, ids, DType::F64, IdCheck::Host); }),
      "of one dtype"));
  Tensor token_grad = Tensor::zeros({5, 4}), positions_grad = Tensor::zeros({3, 4});
  CHECK(contains(
      thrown_message([&] {
        embedding_backward(Tensor::zeros({2, 3, 4}, DType::F64), ids, &token_grad, positions_grad, IdCheck::Host);
      }),
      "dy must be the gradients' dtype, or bf16 for f32 gradients"));
  CHECK(contains(thrown_message([&] {
                   embedding_backward(Tensor::zeros({2, 3, 5}), ids, &token_grad, positions_grad, IdCheck::Host);
                 }),
                 "must be (B, T, D) = (2, 3, 4)"));
  CHECK(contains(thrown_message([&] {
                   embedding_backward(Tensor::zeros({2, 3, 4}), Tensor::from_vector({0, 1, 7, 0, 0, 0}, {2, 3}),
                                      &token_grad, positions_grad, IdCheck::Host);
                 }),
                 "id 7 at flat position 2"));
}
