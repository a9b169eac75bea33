// Residual add + LayerNorm: the float64 CPU path against central finite
// differences (loss = <wy, y> + <wh, h>, so dy = wy and the residual-stream
// gradient dh_in = wh), then every other path (CPU F32 fused and unfused,
// CUDA F32 / BF16 fused, CUDA F32 unfused) against float64 on random and
// hostile rows: offsets of 1e4, constant rows, D = 1, 3, 1000, 1025.
//
// Each path is compared with the float64 math applied to the h that path
// stored (h's own rounding to F32 / BF16 is checked separately, against
// f64(x) + f64(r)): that isolates the LayerNorm part. Bounds:
// - h: one rounding, 2^-24 |h| (F32), 2^-9 |h| (BF16).
// - y: float32 statistics. The saved mean is a float32, up to half an ulp of
//   |mean| off, which shifts xhat by that times rstd: bound
//   2^-23 (|mean| + 1) rstd max|gamma| + 1e-5 (1 + |y|); BF16 adds 2^-8 |y|.
// - dh, dgamma, dbeta: float32 sums over D <= 1025 (or rows <= 40) terms,
//   error <= terms * 2^-24 relative to the sum of magnitudes, so
//   ||got - want|| / ||want|| <= 1e-4; dh in BF16 adds one rounding: 2^-8.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/kernel_mode.hpp"
#include "ops/residual_layernorm.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::f64;
using hg::test::rel_error;
using hg::test::weighted_sum;

namespace {

constexpr double kEps = 1e-5;

struct Inputs {
  Tensor x, r, gamma, beta, wy, wh;  // float64 CPU
};

enum class Rows { Random, Offset, Constant };

Inputs make_inputs(int64_t rows, int64_t D, Rows kind, uint64_t seed) {
  Generator gen(seed);
  Inputs in;
  in.x = Tensor::randn({rows, D}, gen, DType::F64);
  in.r = Tensor::randn({rows, D}, gen, DType::F64, Device::CPU, 0.0, 0.5);
  if (kind == Rows::Offset) in.x = Tensor::randn({rows, D}, gen, DType::F64, Device::CPU, 1e4, 1.0);
  if (kind == Rows::Constant) {
    in.x = Tensor::full({rows, D}, 5.0, DType::F64);
    in.r = Tensor::full({rows, D}, 3.0, DType::F64);
  }
  in.gamma = Tensor::randn({D}, gen, DType::F64, Device::CPU, 1.0, 0.3);
  in.beta = Tensor::randn({D}, gen, DType::F64);
  in.wy = Tensor::randn({rows, D}, gen, DType::F64);
  in.wh = Tensor::randn({rows, D}, gen, DType::F64);
  return in;
}

}  // namespace

TEST_CASE("residual_layernorm float64 gradients match central differences", "[residual_layernorm]") {
  for (const auto& [rows, D] : {std::pair<int64_t, int64_t>{3, 1}, {4, 3}, {5, 17}, {2, 64}}) {
    INFO("rows " << rows << " D " << D);
    Inputs in = make_inputs(rows, D, Rows::Random, 100 + D);
    auto loss = [&] {
      const ResidualLayerNormOutput o = residual_layernorm_forward(in.x, in.r, in.gamma, in.beta, kEps, nullptr);
      return weighted_sum(o.y, in.wy) + weighted_sum(o.h, in.wh);
    };
    LayerNormSaved saved;
    const ResidualLayerNormOutput o = residual_layernorm_forward(in.x, in.r, in.gamma, in.beta, kEps, &saved);
    const LayerNormGrads g = residual_layernorm_backward(in.wy, in.wh, o.h, in.gamma, saved);
    CHECK(rel_error(g.dx, numerical_grad(loss, in.x)) < 1e-7);
    CHECK(rel_error(g.dx, numerical_grad(loss, in.r)) < 1e-7);  // h = x + r: the same gradient
    CHECK(rel_error(g.dgamma, numerical_grad(loss, in.gamma)) < 1e-7);
    CHECK(rel_error(g.dbeta, numerical_grad(loss, in.beta)) < 1e-7);
    // Without a residual gradient, dh is LayerNorm's dx alone.
    const LayerNormGrads plain = residual_layernorm_backward(in.wy, Tensor(), o.h, in.gamma, saved);
    const LayerNormGrads ln = layernorm_backward(in.wy, o.h, in.gamma, saved);
    CHECK(hg::test::max_abs_diff(plain.dx, ln.dx) == 0.0);
  }
}

namespace {

// Runs one path (device, storage dtype, kernel mode) and checks it against
// float64 on the same stored h.
void check_path(Device dev, DType dtype, KernelMode mode, int64_t rows, int64_t D, Rows kind) {
  INFO(device_name(dev) << " " << dtype_name(dtype) << " " << kernel_mode_name(mode) << " rows " << rows << " D "
                        << D << " kind " << int(kind));
  const Inputs in = make_inputs(rows, D, kind, 7 * D + rows + int(kind));
  const DType math = math_dtype(dtype);
  const Tensor x = in.x.to(dtype).to(dev), r = in.r.to(dtype).to(dev);
  const Tensor gamma = in.gamma.to(math).to(dev), beta = in.beta.to(math).to(dev);
  const Tensor dy = in.wy.to(dtype).to(dev), dh_in = in.wh.to(dtype).to(dev);
  KernelModeScope scope(mode);
  LayerNormSaved saved;
  const ResidualLayerNormOutput o = residual_layernorm_forward(x, r, gamma, beta, kEps, &saved);
  const LayerNormGrads g = residual_layernorm_backward(dy, dh_in, o.h, gamma, saved);

  const bool bf16 = dtype == DType::BF16;
  // h: one rounding of the exact sum of the stored inputs.
  const auto h = f64(o.h).to_vector(), xs = f64(x).to_vector(), rs = f64(r).to_vector();
  // One round-to-nearest: half an ulp, at most 2^-p of the value for a p-bit significand (bf16 p = 8, f32 p = 24).
  const double h_rel = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  for (size_t i = 0; i < h.size(); ++i) REQUIRE(std::abs(h[i] - (xs[i] + rs[i])) <= h_rel * std::abs(xs[i] + rs[i]));

  // The float64 reference on that h.
  LayerNormSaved ref_saved;
  const Tensor h64 = f64(o.h), gamma64 = f64(gamma);
  const Tensor y_ref = layernorm_forward(h64, gamma64, f64(beta), kEps, &ref_saved);
  const LayerNormGrads g_ref = residual_layernorm_backward(f64(dy), f64(dh_in), h64, gamma64, ref_saved);

  const auto y = f64(o.y).to_vector(), yr = y_ref.to_vector();
  const auto mean = ref_saved.mean.to_vector(), rstd = ref_saved.rstd.to_vector();
  double gmax = 0;
  for (double v : gamma64.to_vector()) gmax = std::max(gmax, std::abs(v));
  const double stat_ulp = dtype == DType::F64 ? 1e-15 : std::ldexp(1.0, -23);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < D; ++j) {
      const size_t k = static_cast<size_t>(i * D + j);
      const double bound = stat_ulp * (std::abs(mean[i]) + 1) * rstd[i] * gmax + 1e-5 * (1 + std::abs(yr[k])) +
                           (bf16 ? std::ldexp(std::abs(yr[k]), -8) : 0.0);
      CHECK(std::abs(y[k] - yr[k]) <= bound);
    }
  CHECK(rel_error(f64(g.dx), g_ref.dx) <= (bf16 ? std::ldexp(1.0, -8) : 1e-4));
  CHECK(rel_error(f64(g.dgamma), g_ref.dgamma) <= 1e-4);
  CHECK(rel_error(f64(g.dbeta), g_ref.dbeta) <= 1e-4);
  CHECK(hg::test::all_finite(g.dx));
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{5, 1}, {7, 3}, {9, 1000}, {40, 1025}, {3, 64}};

}  // namespace

TEST_CASE("residual_layernorm CPU paths match float64 on random and hostile rows", "[residual_layernorm]") {
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant})
      for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
        check_path(Device::CPU, DType::F32, mode, rows, D, kind);
}

TEST_CASE("residual_layernorm validates its inputs", "[residual_layernorm]") {
  Generator gen(1);
  const Tensor x = Tensor::randn({4, 8}, gen), r = Tensor::randn({4, 7}, gen);
  const Tensor gamma = Tensor::ones({8}), beta = Tensor::zeros({8});
  CHECK_THROWS_AS(residual_layernorm_forward(x, r, gamma, beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x.to(DType::F64), gamma, beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x, Tensor::ones({7}), beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x, gamma, beta, -1.0, nullptr), Error);
  LayerNormSaved saved;
  const ResidualLayerNormOutput o = residual_layernorm_forward(x, x, gamma, beta, kEps, &saved);
  CHECK_THROWS_AS(residual_layernorm_backward(x, Tensor::zeros({4, 9}), o.h, gamma, saved), Error);
  CHECK_THROWS_AS(residual_layernorm_backward(Tensor::zeros({3, 8}), Tensor(), o.h, gamma, saved), Error);
}

TEST_CASE("residual_layernorm CUDA fused (F32, BF16) and unfused match float64", "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant}) {
      check_path(Device::CUDA, DType::F32, KernelMode::Fused, rows, D, kind);
      check_path(Device::CUDA, DType::BF16, KernelMode::Fused, rows, D, kind);
      check_path(Device::CUDA, DType::F32, KernelMode::Unfused, rows, D, kind);
    }
}

TEST_CASE("residual_layernorm CUDA backward is deterministic (no float atomics)",
          "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
  const Inputs in = make_inputs(300, 768, Rows::Random, 5);
  const Tensor x = in.x.to(DType::BF16).to(Device::CUDA), r = in.r.to(DType::BF16).to(Device::CUDA);
  const Tensor gamma = in.gamma.to(DType::F32).to(Device::CUDA), beta = in.beta.to(DType::F32).to(Device::CUDA);
  const Tensor dy = in.wy.to(DType::BF16).to(Device::CUDA), dh_in = in.wh.to(DType::BF16).to(Device::CUDA);
  LayerNormSaved saved;
  const ResidualLayerNormOutput o = residual_layernorm_forward(x, r, gamma, beta, kEps, &saved);
  const LayerNormGrads a = residual_layernorm_backward(dy, dh_in, o.h, gamma, saved);
  const LayerNormGrads b = residual_layernorm_backward(dy, dh_in, o.h, gamma, saved);
  CHECK(hg::test::max_abs_diff(a.dx, b.dx) == 0.0);
  CHECK(hg::test::max_abs_diff(a.dgamma, b.dgamma) == 0.0);
  CHECK(hg::test::max_abs_diff(a.dbeta, b.dbeta) == 0.0);
}
