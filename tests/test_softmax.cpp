// Softmax and attention softmax: finite-difference gradients, agreement of
// every path with float64, hostile inputs and bad-input errors.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "ops/softmax.hpp"
#include "tests/bf16_ulps.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::Device;
using hg::DType;
using hg::KernelMode;
using hg::Shape;
using hg::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------
// The float64 reference, written straight from the definition in
// ops/softmax.hpp with plain loops; it shares no code with the op.
// x: (..., Tk) F64 CPU; a 4-D x is read as (B, H, Tq, Tk) for mask/causal.
Tensor naive_softmax(const Tensor& x, const Tensor& mask, bool causal, double scale) {
  const int64_t tk = x.size(-1);
  const int64_t rows = x.numel() / tk;
  const int64_t heads = x.ndim() == 4 ? x.size(1) : 1;
  const int64_t tq = x.ndim() == 4 ? x.size(2) : 1;
  const std::vector<double> xs = x.to_vector();
  const std::vector<double> ms = mask.defined() ? mask.to_vector() : std::vector<double>();
  std::vector<double> ys(xs.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (heads * tq), q = r % tq;
    bool row_nan = false;
    std::vector<double> z;  // visible keys only
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < tk; ++k) {
      const double v = scale * xs[r * tk + k];
      double m = 0.0;
      if (mask.defined()) {
        const int64_t mb = mask.size(0) == 1 ? 0 : b, mq = mask.size(2) == 1 ? 0 : q;
        m = ms[(mb * mask.size(2) + mq) * tk + k];
      }
      const bool causally_hidden = causal && k > q + (tk - tq);
      // NaN propagates from any key that is read: all but the causally hidden ones.
      if (!causally_hidden && (std::isnan(v) || std::isnan(m))) row_nan = true;
      const bool hidden = causally_hidden || m <= hg::kSoftmaxMaskThreshold;
      if (!hidden && v + m > -kInf) {
        z.push_back(v + m);
        keys.push_back(k);
      }
    }
    if (row_nan) {
      for (int64_t k = 0; k < tk; ++k) ys[r * tk + k] = kNaN;
      continue;
    }
    if (z.empty()) continue;  // every key masked: zeros
    double zmax = z[0];
    for (double v : z) zmax = std::max(zmax, v);
    double total = 0.0;
    for (double& v : z) total += (v = std::exp(v - zmax));
    for (size_t i = 0; i < z.size(); ++i) ys[r * tk + keys[i]] = z[i] / total;
  }
  return Tensor::from_vector(ys, x.shape(), DType::F64);
}

Tensor naive_softmax_backward(const Tensor& dy, const Tensor& y, double scale) {
  const int64_t tk = y.size(-1);
  const std::vector<double> dys = dy.to_vector(), ys = y.to_vector();
  std::vector<double> dx(ys.size());
  for (size_t r = 0; r < ys.size() / tk; ++r) {
    double dot = 0.0;
    for (int64_t k = 0; k < tk; ++k) dot += dys[r * tk + k] * ys[r * tk + k];
    for (int64_t k = 0; k < tk; ++k) dx[r * tk + k] = scale * ys[r * tk + k] * (dys[r * tk + k] - dot);
  }
  return Tensor::from_vector(dx, y.shape(), DType::F64);
}

// ---------------------------------------------------------------------------
// Inputs.

enum class MaskForm { None, KeyPadding, Full, SharedKeyPadding };  // (B,1,1,Tk) (B,1,Tq,Tk) (1,1,1,Tk)

struct Config {
  int64_t b, h, tq, tk;
  MaskForm mask = MaskForm::None;
  bool causal = false;
  double scale = 1.0;
};

std::string describe(const Config& c) {
  static const char* forms[] = {"none", "(B,1,1,Tk)", "(B,1,Tq,Tk)", "(1,1,1,Tk)"};
  return "B=" + std::to_string(c.b) + " H=" + std::to_string(c.h) + " Tq=" + std::to_string(c.tq) +
         " Tk=" + std::to_string(c.tk) + " mask=" + forms[static_cast<int>(c.mask)] +
         " causal=" + (c.causal ? "1" : "0") + " scale=" + std::to_string(c.scale);
}

// A mask mixing everything a real one holds: 0 (visible), mild additive
// biases, -1e9 and -inf (masked outright).
Tensor random_mask(const Shape& shape, hg::Generator& gen) {
  std::vector<double> v(static_cast<size_t>(hg::shape_numel(shape)));
  for (double& m : v) {
    const double u = gen.uniform();
    m = u < 0.15 ? -kInf : u < 0.25 ? -1e9 : u < 0.5 ? -3.0 * gen.uniform() : 0.0;
  }
  return Tensor::from_vector(v, shape, DType::F64);
}

Tensor make_mask(const Config& c, hg::Generator& gen) {
  switch (c.mask) {
    case MaskForm::None: return Tensor();
    case MaskForm::KeyPadding: return random_mask({c.b, 1, 1, c.tk}, gen);
    case MaskForm::Full: return random_mask({c.b, 1, c.tq, c.tk}, gen);
    case MaskForm::SharedKeyPadding: return random_mask({1, 1, 1, c.tk}, gen);
  }
  return Tensor();
}

// ---------------------------------------------------------------------------
// Paths: one answer expected from each.

struct Path {
  const char* name;
  Device device;
  DType dtype;
  KernelMode mode;
  double tolerance;  // on rel_error against float64 given the same (rounded) inputs
};

// Tolerances, relative (norm) error against float64 on the inputs the path saw:
//  F64: 1e-12 — same math, only summation order and exp rounding differ.
//  F32: 1e-5  — z = scale*x + mask is rounded (~6e-8 relative, so exp's argument
//               is off by ~1e-6 for |z| ~ 15), plus, from tolerance_for(), the
//               row sum: a sequentially accumulated float sum of Tk terms (as the
//               primitive reduce may do) drifts by ~sqrt(Tk) ulps, which every
//               element of y inherits; we allow 4 sqrt(Tk) ulps of 2^-24.
//               (Seen on the CPU: 4.4e-6 for the unfused path at Tk = 4097.)
//  BF16: y and dx are F32 results rounded once to bf16, so they are compared
//               in ulps with the float64 reference rounded to bf16 (check_y /
//               check_dx, tests/bf16_ulps.hpp: within 1 ulp, equal on >= 99%).
//               The tolerance, 2^-8, bounds only sums of outputs (a row sum:
//               each element is within 2^-9 of its value, relative).
const Path kCpuFusedF64{"cpu fused f64", Device::CPU, DType::F64, KernelMode::Fused, 1e-12};
const Path kCpuUnfusedF64{"cpu unfused f64", Device::CPU, DType::F64, KernelMode::Unfused, 1e-12};
const Path kCpuFusedF32{"cpu fused f32", Device::CPU, DType::F32, KernelMode::Fused, 1e-5};
const Path kCpuUnfusedF32{"cpu unfused f32", Device::CPU, DType::F32, KernelMode::Unfused, 1e-5};
const Path kCudaFusedF32{"cuda fused f32", Device::CUDA, DType::F32, KernelMode::Fused, 1e-5};
const Path kCudaUnfusedF32{"cuda unfused f32", Device::CUDA, DType::F32, KernelMode::Unfused, 1e-5};
const Path kCudaFusedBF16{"cuda fused bf16", Device::CUDA, DType::BF16, KernelMode::Fused, 1.0 / 256};
const Path kCudaUnfusedBF16{"cuda unfused bf16", Device::CUDA, DType::BF16, KernelMode::Unfused, 1.0 / 256};

const std::vector<Path> kCpuPaths = {kCpuFusedF64, kCpuUnfusedF64, kCpuFusedF32, kCpuUnfusedF32};
const std::vector<Path> kCudaPaths = {kCudaFusedF32, kCudaUnfusedF32, kCudaFusedBF16, kCudaUnfusedBF16};

// The path's tolerance for rows of tk keys: float32 row sums add ~sqrt(tk) ulps.
double tolerance_for(const Path& p, int64_t tk) {
  if (p.dtype == DType::F64) return p.tolerance;
  return p.tolerance + 4.0 * std::sqrt(static_cast<double>(tk)) * std::ldexp(1.0, -24);
}

// Stores a float64 CPU tensor the way a path holds it.
Tensor to_path(const Tensor& t, const Path& p) { return t.to(p.dtype).to(p.device); }

struct PathRun {
  Tensor x_seen, dy_seen;  // the inputs as the path stored them, widened to F64
  Tensor y, dx;            // the path's outputs, widened to F64
};

// attention == false runs the plain softmax_forward (x of any rank).
PathRun run_path(const Path& p, const Tensor& x64, const Tensor& mask64, bool causal, double scale, const Tensor& dy64,
                 bool attention = true) {
  hg::KernelModeScope mode(p.mode);
  const Tensor x = to_path(x64, p), dy = to_path(dy64, p);
  hg::SoftmaxOptions options;
  if (mask64.defined()) options.mask = mask64.to(math_dtype(p.dtype)).to(p.device);
  options.causal = causal;
  options.scale = scale;
  const Tensor y = attention ? hg::attention_softmax_forward(x, options) : hg::softmax_forward(x);
  REQUIRE(y.shape() == x.shape());
  REQUIRE(y.dtype() == x.dtype());
  REQUIRE(y.device() == x.device());
  const Tensor dx = hg::softmax_backward(dy, y, scale);
  REQUIRE(dx.shape() == x.shape());
  REQUIRE(dx.dtype() == x.dtype());
  return {hg::test::f64(x), hg::test::f64(dy), hg::test::f64(y), hg::test::f64(dx)};
}

// A path's y against the float64 reference on the inputs it saw: bf16 in
// ulps of the reference rounded to bf16, other dtypes as a relative norm error.
void check_y(const Path& p, const Tensor& y, const Tensor& y_ref, double tolerance) {
  INFO("y");
  if (p.dtype == DType::BF16) {
    HG_CHECK_BF16(y.to_vector(), y_ref.to_vector(), hg::test::softmax_y_slack(y_ref.to_vector()));
  } else {
    CHECK(hg::test::rel_error(y, y_ref) < tolerance);
  }
}

// The same for dx; the reference backward takes the path's own y and dy.
void check_dx(const Path& p, const PathRun& run, double scale, double tolerance) {
  INFO("dx");
  const Tensor dx_ref = naive_softmax_backward(run.dy_seen, run.y, scale);
  if (p.dtype == DType::BF16) {
    HG_CHECK_BF16(run.dx.to_vector(), dx_ref.to_vector(),
                  hg::test::softmax_dx_slack(run.dy_seen.to_vector(), run.y.to_vector(), run.y.size(-1), scale));
  } else {
    CHECK(hg::test::rel_error(run.dx, dx_ref) < tolerance);
  }
}

// Runs one config on a path and checks y and dx against float64 on the very
// inputs the path saw; the backward reference takes the path's own y.
void check_path_agrees(const Path& p, const Config& c, uint64_t seed) {
  hg::Generator gen(seed);
  const Tensor x = Tensor::randn({c.b, c.h, c.tq, c.tk}, gen, DType::F64, Device::CPU, 0.0, 2.0);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  const Tensor mask = make_mask(c, gen);
  INFO(p.name << ": " << describe(c));
  const PathRun run = run_path(p, x, mask, c.causal, c.scale, dy);
  const Tensor y_ref =
      naive_softmax(run.x_seen, mask.defined() ? hg::test::f64(mask.to(math_dtype(p.dtype))) : mask, c.causal, c.scale);
  REQUIRE(hg::test::all_finite(run.y));
  REQUIRE(hg::test::all_finite(run.dx));
  const double tolerance = tolerance_for(p, c.tk);
  CAPTURE(tolerance, hg::test::rel_error(run.y, y_ref), hg::test::max_abs_diff(run.y, y_ref));
  check_y(p, run.y, y_ref, tolerance);
  check_dx(p, run, c.scale, tolerance);
  // y is a probability per element, so an absolute bound holds too.
  if (p.dtype != DType::BF16) CHECK(hg::test::max_abs_diff(run.y, y_ref) < 2 * tolerance);
}

std::vector<Config> agreement_configs(const std::vector<int64_t>& tks) {
  std::vector<Config> configs;
  for (int64_t tk : tks) {
    const bool long_row = tk > 2048;
    const int64_t b = long_row ? 1 : 2, h = long_row ? 2 : 3, tq = long_row ? 3 : 5;
    configs.push_back({b, h, tq, tk});
    configs.push_back({b, h, tq, tk, MaskForm::KeyPadding, false, 0.125});
    configs.push_back({b, h, tq, tk, MaskForm::Full, true, 0.7});
    configs.push_back({b, h, tq, tk, MaskForm::SharedKeyPadding, true, 1.0});
    configs.push_back({b, h, tq, tk, MaskForm::None, true, 2.0});
  }
  return configs;
}

// Returns the hg::Error message thrown by f, or fails the test. Any other
// exception type escapes and fails the test too.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hg::Error& e) {
    return e.what();
  }
  FAIL("expected hg::Error, nothing was thrown");
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// ===========================================================================

TEST_CASE("softmax float64 fused matches the naive reference", "[softmax]") {
  hg::Generator gen(11);
  const std::vector<Config> configs = {{2, 3, 4, 7, MaskForm::KeyPadding, false, 0.5},
                                       {2, 1, 3, 6, MaskForm::Full, true, 1.5},
                                       {1, 2, 3, 8, MaskForm::None, true, 1.0},
                                       {1, 1, 6, 4, MaskForm::None, true, 1.0},  // Tq > Tk
                                       {3, 2, 2, 5, MaskForm::SharedKeyPadding, false, -0.5}};
  for (const Config& c : configs) {
    INFO(describe(c));
    const Tensor x = Tensor::randn({c.b, c.h, c.tq, c.tk}, gen, DType::F64, Device::CPU, 0.0, 2.0);
    const Tensor mask = make_mask(c, gen);
    hg::SoftmaxOptions options{mask, c.causal, c.scale};
    hg::KernelModeScope mode(KernelMode::Fused);
    CHECK(hg::test::rel_error(hg::attention_softmax_forward(x, options), naive_softmax(x, mask, c.causal, c.scale)) <
          1e-13);
  }
  // Plain softmax over the last dim of tensors of rank 1 to 3.
  for (const Shape& shape : std::vector<Shape>{{1}, {9}, {4, 1}, {3, 2, 33}}) {
    const Tensor x = Tensor::randn(shape, gen, DType::F64, Device::CPU, 0.0, 3.0);
    hg::KernelModeScope mode(KernelMode::Fused);
    CHECK(hg::test::rel_error(hg::softmax_forward(x), naive_softmax(x, Tensor(), false, 1.0)) < 1e-13);
  }
}

TEST_CASE("softmax backward matches float64 finite differences", "[softmax][grad]") {
  // Tk = 1, 7, 33, 1000, with and without masks, causal with Tq < Tk and
  // Tq > Tk (whose first queries see no key), scale != 1. Few rows for long Tk.
  const std::vector<Config> configs = {
      {2, 2, 3, 1},
      {2, 1, 3, 1, MaskForm::KeyPadding, true, 0.5},
      {2, 1, 3, 7, MaskForm::KeyPadding, false, 0.5},
      {1, 2, 4, 7, MaskForm::Full, true, 1.3},
      {2, 1, 5, 3, MaskForm::None, true, 1.0},
      {1, 1, 3, 33, MaskForm::KeyPadding, true, 0.35},
      {2, 2, 2, 33, MaskForm::SharedKeyPadding, false, 1.0},
      {1, 1, 2, 1000, MaskForm::KeyPadding, false, 1.0},
      {1, 1, 1, 1000, MaskForm::None, true, 0.25},
  };
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    hg::KernelModeScope scope(mode);
    for (const Config& c : configs) {
      INFO(hg::kernel_mode_name(mode) << ": " << describe(c));
      hg::Generator gen(1234 + c.tk);
      Tensor x = Tensor::randn({c.b, c.h, c.tq, c.tk}, gen, DType::F64, Device::CPU, 0.0, 2.0);
      const Tensor w = Tensor::randn(x.shape(), gen, DType::F64);  // loss = sum(y * w), so dL/dy = w
      const Tensor mask = make_mask(c, gen);
      const hg::SoftmaxOptions options{mask, c.causal, c.scale};
      const auto loss = [&] { return hg::test::weighted_sum(hg::attention_softmax_forward(x, options), w); };

      const Tensor y = hg::attention_softmax_forward(x, options);
      const Tensor dx = hg::softmax_backward(w, y, c.scale);
      // h = 1e-5 balances truncation (h^2) against rounding (eps / h) for |x| ~ 1.
      const Tensor dx_fd = hg::test::numerical_grad(loss, x, 1e-5);
      const double err = hg::test::rel_error(dx, dx_fd);
      CAPTURE(err);
      CHECK(err < 1e-6);
      REQUIRE(hg::test::all_finite(dx));
    }
    // The plain form, on a 3-D tensor.
    hg::Generator gen(99);
    Tensor x = Tensor::randn({3, 2, 7}, gen, DType::F64, Device::CPU, 0.0, 2.0);
    const Tensor w = Tensor::randn(x.shape(), gen, DType::F64);
    const auto loss = [&] { return hg::test::weighted_sum(hg::softmax_forward(x), w); };
    const Tensor dx = hg::softmax_backward(w, hg::softmax_forward(x));
    CHECK(hg::test::rel_error(dx, hg::test::numerical_grad(loss, x, 1e-5)) < 1e-6);
  }
}

TEST_CASE("softmax CPU paths agree with float64", "[softmax]") {
  uint64_t seed = 500;
  for (const Config& c : agreement_configs({1, 7, 33, 128, 1000, 4097}))
    for (const Path& p : kCpuPaths) check_path_agrees(p, c, seed++);
}

TEST_CASE("softmax CPU paths agree with float64 at Tk = 65536 and 65537", "[softmax]") {
  // Long rows: float32 row sums of 65536 terms (tolerance_for grows with
  // sqrt(Tk)); few rows, so the float64 reference stays quick.
  uint64_t seed = 600;
  for (int64_t tk : {65536, 65537}) {
    const std::vector<Config> configs = {{1, 1, 2, tk, MaskForm::KeyPadding, false, 0.125},
                                         {1, 2, 2, tk, MaskForm::None, true, 1.0}};
    for (const Config& c : configs)
      for (const Path& p : kCpuPaths) check_path_agrees(p, c, seed++);
  }
}

TEST_CASE("softmax CPU paths agree with float64 at every visible row length up to 130", "[softmax]") {
  // Causal with Tq = Tk: query q sees q + 1 keys, so the float32 kernel runs
  // rows held in 1 to 8 vectors (full and partial last ones) and, past 128
  // keys, the streaming rows; with each mask form.
  uint64_t seed = 700;
  for (MaskForm mask : {MaskForm::None, MaskForm::KeyPadding, MaskForm::Full})
    for (const Path& p : kCpuPaths) check_path_agrees(p, {1, 2, 130, 130, mask, true, 0.3}, seed++);
}

// The CPU stands in for the CUDA bf16 paths (which skip here): float32 math
// on bf16-stored x and dy, y rounded to bf16 before the backward reads it,
// and the outputs rounded once to bf16, by the library's round-to-nearest-even
// cast (what those paths do) and by truncation (a packing bug). The check of
// the bf16 paths (check_y / check_dx) must pass the first and fail the
// second; the old bound, a relative norm error below 8e-3, passed both.
TEST_CASE("softmax bf16 bound: float32 results rounded to nearest pass, truncated ones fail", "[softmax][bf16]") {
  uint64_t seed = 800;
  const std::vector<Config> configs = {{2, 2, 5, 33, MaskForm::KeyPadding, true, 0.7},
                                       {1, 2, 3, 1000, MaskForm::None, false, 1.0},
                                       {1, 1, 2, 4097, MaskForm::Full, true, 0.125}};
  for (const Config& c : configs)
    for (const Path& p : {kCpuFusedF32, kCpuUnfusedF32}) {
      INFO(p.name << ": " << describe(c));
      hg::Generator gen(seed++);
      const Tensor x = Tensor::randn({c.b, c.h, c.tq, c.tk}, gen, DType::F32, Device::CPU, 0.0, 2.0).to(DType::BF16);
      const Tensor dy = Tensor::randn(x.shape(), gen, DType::F32).to(DType::BF16);
      const Tensor mask = make_mask(c, gen);
      hg::KernelModeScope mode(p.mode);
      hg::SoftmaxOptions options;
      if (mask.defined()) options.mask = mask.to(DType::F32);
      options.causal = c.causal;
      options.scale = c.scale;
      const Tensor y32 = hg::attention_softmax_forward(x.to(DType::F32), options);
      const Tensor y_bf16 = y32.to(DType::BF16);
      const Tensor dx32 = hg::softmax_backward(dy.to(DType::F32), y_bf16.to(DType::F32), c.scale);
      const std::vector<double> y_ref =
          naive_softmax(hg::test::f64(x), mask.defined() ? hg::test::f64(options.mask) : mask, c.causal, c.scale)
              .to_vector();
      const std::vector<double> dx_ref =
          naive_softmax_backward(hg::test::f64(dy), hg::test::f64(y_bf16), c.scale).to_vector();
      const std::vector<double> y_slack = hg::test::softmax_y_slack(y_ref);
      const std::vector<double> dx_slack =
          hg::test::softmax_dx_slack(hg::test::f64(dy).to_vector(), hg::test::f64(y_bf16).to_vector(), c.tk, c.scale);
      const hg::test::Bf16Comparison y_nearest =
          hg::test::compare_bf16(hg::test::f64(y_bf16).to_vector(), y_ref, y_slack);
      const hg::test::Bf16Comparison dx_nearest =
          hg::test::compare_bf16(hg::test::f64(dx32.to(DType::BF16)).to_vector(), dx_ref, dx_slack);
      const std::vector<double> y_trunc = hg::test::truncate_to_bf16(y32.to_vector());
      const std::vector<double> dx_trunc = hg::test::truncate_to_bf16(dx32.to_vector());
      const hg::test::Bf16Comparison y_t = hg::test::compare_bf16(y_trunc, y_ref, y_slack);
      const hg::test::Bf16Comparison dx_t = hg::test::compare_bf16(dx_trunc, dx_ref, dx_slack);
      CAPTURE(y_nearest.not_nearest, dx_nearest.not_nearest, y_t.not_nearest, dx_t.not_nearest, y_t.n);
      CHECK(y_nearest.ok());
      CHECK(dx_nearest.ok());
      CHECK_FALSE(y_t.ok());
      CHECK_FALSE(dx_t.ok());
      CHECK(y_t.beyond == 0);  // each truncated element is within 1 ulp: only the count catches it
      CHECK(dx_t.beyond == 0);
      CHECK(hg::test::rel_error(Tensor::from_vector(y_trunc, x.shape(), DType::F64),
                                Tensor::from_vector(y_ref, x.shape(), DType::F64)) < 8e-3);
    }
}

TEST_CASE("softmax CUDA paths agree with float64", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 900;
  // Tk 2048 and 3000 with a (B,1,1,Tk) mask: the staged forward that keeps the mask row.
  std::vector<Config> configs = agreement_configs({1, 7, 33, 128, 1000, 2048, 3000, 4097, 16384});
  configs.push_back({8, 8, 64, 128, MaskForm::KeyPadding, false, 0.125});      // many short rows
  configs.push_back({2, 4, 48, 1024, MaskForm::Full, true, 0.125});            // many long rows
  configs.push_back({2, 2, 8, 2048, MaskForm::SharedKeyPadding, false, 0.5});  // one mask row for every row
  for (const Config& c : configs)
    for (const Path& p : kCudaPaths) check_path_agrees(p, c, seed++);
}

// Rows longer than the block layout's 16384 take the streaming kernels (online
// max/sum over chunks), up to Tk = 100003; an odd Tk also forces the scalar
// (W = 1) access path.
// Few rows: the float64 reference of 20001 keys per row is cheap. Both
// calls go through the public ops (attention_softmax_forward, softmax_backward).
TEST_CASE("softmax CUDA streaming rows (Tk > 16384) agree with float64", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 1700;
  const int64_t tk = 20001;
  const std::vector<Config> configs = {
      {1, 2, 2, tk, MaskForm::KeyPadding, false, 0.125},
      {2, 1, 3, tk, MaskForm::Full, true, 0.7},  // causal with Tq < Tk: visible prefix ~Tk
      {1, 1, 2, tk, MaskForm::SharedKeyPadding, true, 1.0},
      {1, 1, 3, tk, MaskForm::None, true, 2.0},
      {1, 2, 2, tk - 1, MaskForm::KeyPadding, true, 0.125},  // even Tk: the vector (W > 1) streaming path
  };
  for (const Config& c : configs)
    for (const Path& p : {kCudaFusedF32, kCudaFusedBF16}) check_path_agrees(p, c, seed++);
  // Rows of 65536 and more (odd and even): the streaming kernels over many chunks.
  for (int64_t long_tk : {65536, 65537, 100003}) {
    const std::vector<Config> long_configs = {{1, 1, 2, long_tk, MaskForm::KeyPadding, false, 0.125},
                                              {1, 2, 2, long_tk, MaskForm::None, true, 1.0}};
    for (const Config& c : long_configs)
      for (const Path& p : kCudaPaths) check_path_agrees(p, c, seed++);
  }
}

// ---------------------------------------------------------------------------
// Hostile inputs, on every path the machine has.

// Without a GPU the CUDA paths are reported as skipped (a failure under
// HG_REQUIRE_CUDA=1), never dropped silently.
std::vector<Path> available_paths(const std::string& test_name) {
  std::vector<Path> paths = kCpuPaths;
  if (hg::test::cuda_paths_run(test_name)) paths.insert(paths.end(), kCudaPaths.begin(), kCudaPaths.end());
  return paths;
}

TEST_CASE("softmax logits of +-1e4 give exact answers", "[softmax][hostile]") {
  const double e = std::exp(1.0);
  // Without the max subtraction every exp here over- or underflows.
  const Tensor x = Tensor::from_vector({1e4, 0, -1e4, -1e4,        //
                                        1e4, 1e4, -1e4, -1e4,      //
                                        -1e4, -1e4, -1e4, -1e4,    //
                                        -1e4, -9999, -1e4, -1e4},  //
                                       {4, 4}, DType::F64);
  const Tensor expected = Tensor::from_vector({1, 0, 0, 0,              //
                                               0.5, 0.5, 0, 0,          //
                                               0.25, 0.25, 0.25, 0.25,  //
                                               1 / (3 + e), e / (3 + e), 1 / (3 + e), 1 / (3 + e)},
                                              {4, 4}, DType::F64);
  hg::Generator gen(3);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  for (const Path& p : available_paths("softmax +-1e4 logits")) {
    INFO(p.name);
    const PathRun run = run_path(p, x, Tensor(), false, 1.0, dy, /*attention=*/false);
    REQUIRE(hg::test::all_finite(run.y));
    REQUIRE(hg::test::all_finite(run.dx));
    // bf16 stores -9999 as -9984 (= the stored -1e4), so its last row is uniform.
    const int64_t rows = p.dtype == DType::BF16 ? 3 : 4;
    // A few float32 ulps (exp(-1) and one division); 0, 0.25, 0.5, 1 come out exact in every dtype.
    const double tol = p.dtype == DType::F64 ? 1e-15 : 5e-7;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < 4; ++k) CHECK(std::abs(run.y.at({r, k}) - expected.at({r, k})) <= tol);
    if (p.dtype == DType::BF16)
      for (int64_t k = 0; k < 4; ++k) CHECK(run.y.at({3, k}) == 0.25);
    check_dx(p, run, 1.0, p.tolerance);
  }
}

TEST_CASE("softmax fully masked rows give zeros and zero gradient", "[softmax][hostile]") {
  // Scores (2, 2, 3, 5), mask (2, 1, 3, 5): batch 0 query 1 is all -inf,
  // batch 1 query 2 is all -1e9; the other rows keep some keys.
  hg::Generator gen(21);
  const Tensor x = Tensor::randn({2, 2, 3, 5}, gen, DType::F64, Device::CPU, 0.0, 2.0);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  Tensor mask = Tensor::zeros({2, 1, 3, 5}, DType::F64);
  for (int64_t k = 0; k < 5; ++k) {
    mask.set({0, 0, 1, k}, -kInf);
    mask.set({1, 0, 2, k}, -1e9);
  }
  mask.set({0, 0, 0, 3}, -kInf);
  mask.set({1, 0, 0, 1}, -1e9);
  // Scores (1, 1, 6, 4), causal, Tq > Tk: queries 0 and 1 see no key.
  const Tensor xc = Tensor::randn({1, 1, 6, 4}, gen, DType::F64);
  const Tensor dyc = Tensor::randn(xc.shape(), gen, DType::F64);
  // A key-padding mask of -1e9 everywhere: the whole output is zeros.
  const Tensor all_masked = Tensor::full({2, 1, 1, 5}, -1e9, DType::F64);

  for (const Path& p : available_paths("softmax fully masked rows")) {
    INFO(p.name);
    {
      const PathRun run = run_path(p, x, mask, false, 0.5, dy);
      REQUIRE(hg::test::all_finite(run.y));
      REQUIRE(hg::test::all_finite(run.dx));
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t k = 0; k < 5; ++k) {
          CHECK(run.y.at({0, h, 1, k}) == 0.0);
          CHECK(run.dx.at({0, h, 1, k}) == 0.0);
          CHECK(run.y.at({1, h, 2, k}) == 0.0);
          CHECK(run.dx.at({1, h, 2, k}) == 0.0);
        }
      // A key masked outright has weight exactly 0 in a row that is not fully
      // masked (this needs the primitive exp to give exp(-inf) == 0 exactly).
      CHECK(run.y.at({0, 1, 0, 3}) == 0.0);
      CHECK(run.y.at({1, 0, 0, 1}) == 0.0);
      const Tensor mask_seen = hg::test::f64(mask.to(math_dtype(p.dtype)));
      check_y(p, run.y, naive_softmax(run.x_seen, mask_seen, false, 0.5), p.tolerance);
      check_dx(p, run, 0.5, p.tolerance);
    }
    {
      const PathRun run = run_path(p, xc, Tensor(), true, 1.0, dyc);
      REQUIRE(hg::test::all_finite(run.y));
      REQUIRE(hg::test::all_finite(run.dx));
      for (int64_t q = 0; q < 2; ++q)
        for (int64_t k = 0; k < 4; ++k) {
          CHECK(run.y.at({0, 0, q, k}) == 0.0);
          CHECK(run.dx.at({0, 0, q, k}) == 0.0);
        }
      CHECK(run.y.at({0, 0, 2, 0}) == 1.0);   // query 2 sees exactly key 0
      CHECK(run.dx.at({0, 0, 2, 0}) == 0.0);  // and a one-hot row has zero gradient
    }
    {
      const PathRun run = run_path(p, x, all_masked, true, 1.0, dy);
      for (double v : run.y.to_vector()) CHECK(v == 0.0);
      for (double v : run.dx.to_vector()) CHECK(v == 0.0);
    }
  }
}

TEST_CASE("softmax causal with Tq < Tk hides exactly the future keys", "[softmax][hostile]") {
  hg::Generator gen(31);
  const int64_t tq = 3, tk = 6;
  const Tensor x = Tensor::randn({1, 2, tq, tk}, gen, DType::F64, Device::CPU, 0.0, 2.0);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  for (const Path& p : available_paths("softmax causal Tq < Tk")) {
    INFO(p.name);
    const PathRun run = run_path(p, x, Tensor(), true, 1.0, dy);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t q = 0; q < tq; ++q) {
        double row_sum = 0.0;
        for (int64_t k = 0; k < tk; ++k) {
          const double v = run.y.at({0, h, q, k});
          row_sum += v;
          if (k > q + (tk - tq)) {
            CHECK(v == 0.0);  // key k is in query q's future
            CHECK(run.dx.at({0, h, q, k}) == 0.0);
          } else {
            CHECK(v > 0.0);
          }
        }
        CHECK(std::abs(row_sum - 1.0) < (p.dtype == DType::BF16 ? 1 : 4) * p.tolerance);
      }
    check_y(p, run.y, naive_softmax(run.x_seen, Tensor(), true, 1.0), p.tolerance);
    check_dx(p, run, 1.0, p.tolerance);
  }
}

TEST_CASE("softmax NaN in the input propagates to its row only", "[softmax][hostile]") {
  hg::Generator gen(41);
  Tensor x = Tensor::randn({1, 2, 3, 7}, gen, DType::F64);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  Tensor mask = Tensor::zeros({1, 1, 1, 7}, DType::F64);
  mask.set({0, 0, 0, 5}, -kInf);
  x.set({0, 1, 2, 1}, kNaN);  // a visible key: every path must propagate it
  // The rows whose key 1 is NaN: head 1, query 2 only.
  const auto in_nan_row = [](int64_t h, int64_t q) { return h == 1 && q == 2; };
  for (const Path& p : available_paths("softmax NaN propagation (attention form)")) {
    INFO(p.name);
    for (bool causal : {false, true}) {
      const PathRun run = run_path(p, x, mask, causal, 1.0, dy);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t q = 0; q < 3; ++q)
          for (int64_t k = 0; k < 7; ++k) {
            const double y = run.y.at({0, h, q, k}), dx = run.dx.at({0, h, q, k});
            if (in_nan_row(h, q)) {
              CHECK(std::isnan(y));
              CHECK(std::isnan(dx));
            } else {
              CHECK(std::isfinite(y));
              CHECK(std::isfinite(dx));
            }
          }
    }
  }
  // The plain form: NaN at (1, 2) of a (3, 5) tensor.
  Tensor xp = Tensor::randn({3, 5}, gen, DType::F64);
  xp.set({1, 2}, kNaN);
  const Tensor dyp = Tensor::randn(xp.shape(), gen, DType::F64);
  for (const Path& p : available_paths("softmax NaN propagation (plain form)")) {
    INFO(p.name);
    const PathRun run = run_path(p, xp, Tensor(), false, 1.0, dyp, /*attention=*/false);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t k = 0; k < 5; ++k) CHECK(std::isnan(run.y.at({r, k})) == (r == 1));
  }
}

TEST_CASE("softmax NaN at a masked key: propagates; at a causally hidden key: path-defined", "[softmax][hostile]") {
  // Masks are additive (z = scale*x + mask), so NaN + (-inf) is NaN: a key
  // masked by the mask does not hide a NaN score, on every path. Causally
  // hidden keys are never read by the fused paths (CPU and CUDA), so a NaN
  // there does not reach the row; the unfused path adds -inf to every score
  // and so does propagate it (docs/softmax.md, "What is computed").
  hg::Generator gen(43);
  Tensor x = Tensor::randn({1, 1, 2, 4}, gen, DType::F64);
  const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
  Tensor mask = Tensor::zeros({1, 1, 2, 4}, DType::F64);
  mask.set({0, 0, 1, 2}, -kInf);
  x.set({0, 0, 1, 2}, kNaN);  // row 1: NaN at a key that the mask hides
  x.set({0, 0, 0, 3}, kNaN);  // row 0: NaN at a key that causality hides (k = 3 > 0 + 2)
  for (const Path& p : available_paths("softmax NaN at masked keys")) {
    INFO(p.name);
    const PathRun run = run_path(p, x, mask, /*causal=*/true, 1.0, dy);
    for (int64_t k = 0; k < 4; ++k) {
      CHECK(std::isnan(run.y.at({0, 0, 1, k})));
      if (p.mode == KernelMode::Fused) CHECK(std::isfinite(run.y.at({0, 0, 0, k})));
      else CHECK(std::isnan(run.y.at({0, 0, 0, k})));
    }
    if (p.mode == KernelMode::Fused)
      check_y(p, run.y.reshape({2, 4}).slice(0, 1),
              naive_softmax(run.x_seen, hg::test::f64(mask), true, 1.0).reshape({2, 4}).slice(0, 1), p.tolerance);
  }
}

TEST_CASE("softmax NaN in a row whose other keys are all masked: the row is NaN", "[softmax][hostile]") {
  // The max of the other scores is -inf here, the case the fused CPU kernel
  // checks for NaN separately. Rows of 5, 100 (held in registers) and 300
  // keys (streamed): row 0 has a NaN score, row 1 a NaN mask value, row 2 no
  // NaN (all masked: zeros).
  for (int64_t tk : {5, 100, 300}) {
    hg::Generator gen(static_cast<uint64_t>(47 + tk));
    Tensor x = Tensor::randn({1, 1, 3, tk}, gen, DType::F64);
    const Tensor dy = Tensor::randn(x.shape(), gen, DType::F64);
    Tensor mask = Tensor::full({1, 1, 3, tk}, -kInf, DType::F64);
    x.set({0, 0, 0, tk / 2}, kNaN);
    mask.set({0, 0, 1, tk - 1}, kNaN);
    for (const Path& p : available_paths("softmax NaN in an all-masked row")) {
      INFO(p.name << ", tk " << tk);
      const PathRun run = run_path(p, x, mask, false, 1.0, dy);
      for (int64_t k = 0; k < tk; ++k) {
        CHECK(std::isnan(run.y.at({0, 0, 0, k})));
        CHECK(std::isnan(run.y.at({0, 0, 1, k})));
        CHECK(run.y.at({0, 0, 2, k}) == 0.0);
      }
    }
  }
}

TEST_CASE("softmax bad inputs throw hg::Error naming op and shapes", "[softmax][errors]") {
  const Tensor scores = Tensor::zeros({2, 3, 4, 5});
  const auto attention = [&](const Tensor& s, const Tensor& mask, double scale = 1.0) {
    return [=] { hg::attention_softmax_forward(s, hg::SoftmaxOptions{mask, false, scale}); };
  };
  for (const Shape& bad :
       std::vector<Shape>{{2, 1, 1, 6}, {2, 3, 4, 5}, {3, 1, 1, 5}, {2, 1, 2, 5}, {5}, {2, 1, 4, 5, 1}}) {
    INFO(hg::shape_str(bad));
    const std::string msg = error_of(attention(scores, Tensor::zeros(bad)));
    CHECK(contains(msg, "attention_softmax_forward"));
    CHECK(contains(msg, hg::shape_str(bad)));
    CHECK(contains(msg, "(2, 3, 4, 5)"));
  }
  {  // the accepted forms, for contrast
    for (const Shape& good : std::vector<Shape>{{2, 1, 1, 5}, {2, 1, 4, 5}, {1, 1, 1, 5}, {1, 1, 4, 5}})
      CHECK_NOTHROW(hg::attention_softmax_forward(scores, hg::SoftmaxOptions{Tensor::zeros(good), true, 1.0}));
  }
  std::string msg = error_of(attention(scores, Tensor::zeros({2, 1, 1, 5}, DType::F64)));
  CHECK(contains(msg, "attention_softmax_forward"));
  CHECK(contains(msg, "f64"));
  CHECK(contains(msg, "(2, 1, 1, 5)"));

  msg = error_of(attention(Tensor::zeros({3, 4, 5}), Tensor()));
  CHECK(contains(msg, "attention_softmax_forward"));
  CHECK(contains(msg, "(3, 4, 5)"));

  for (double scale : {kInf, kNaN, 1e300}) {
    msg = error_of(attention(scores, Tensor(), scale));
    CHECK(contains(msg, "scale"));
  }
  CHECK_NOTHROW(hg::attention_softmax_forward(scores.to(DType::F64), hg::SoftmaxOptions{Tensor(), false, 1e300}));

  msg = error_of([] { hg::softmax_forward(Tensor::empty({3, 0})); });
  CHECK(contains(msg, "softmax_forward"));
  CHECK(contains(msg, "(3, 0)"));
  msg = error_of([] { hg::softmax_forward(Tensor::zeros({})); });
  CHECK(contains(msg, "softmax_forward"));
  msg = error_of([] { hg::softmax_forward(Tensor()); });
  CHECK(contains(msg, "softmax_forward"));
  msg = error_of([] { hg::softmax_forward(Tensor::empty({2, 3}, DType::BF16)); });
  CHECK(contains(msg, "BF16"));
  CHECK(contains(msg, "(2, 3)"));

  msg = error_of([] { hg::softmax_backward(Tensor::zeros({2, 3}), Tensor::zeros({2, 4})); });
  CHECK(contains(msg, "softmax_backward"));
  CHECK(contains(msg, "(2, 3)"));
  CHECK(contains(msg, "(2, 4)"));
  msg = error_of([] { hg::softmax_backward(Tensor::zeros({2, 3}, DType::F64), Tensor::zeros({2, 3})); });
  CHECK(contains(msg, "softmax_backward"));
  CHECK(contains(msg, "(2, 3)"));
  msg = error_of([] { hg::softmax_backward(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}), kNaN); });
  CHECK(contains(msg, "softmax_backward"));
}

TEST_CASE("softmax bad devices throw hg::Error", "[softmax][errors][cuda]") {
  HG_REQUIRE_GPU();
  const Tensor scores = Tensor::zeros({2, 3, 4, 5}, DType::F32, Device::CUDA);
  std::string msg = error_of([&] {
    hg::attention_softmax_forward(scores, hg::SoftmaxOptions{Tensor::zeros({2, 1, 1, 5}), false, 1.0});
  });
  CHECK(contains(msg, "attention_softmax_forward"));
  CHECK(contains(msg, "(2, 1, 1, 5)"));
  CHECK(contains(msg, "(2, 3, 4, 5)"));
  // bf16 scores take an F32 mask, not a bf16 one.
  msg = error_of([&] {
    hg::attention_softmax_forward(
        scores.to(DType::BF16), hg::SoftmaxOptions{Tensor::zeros({2, 1, 1, 5}, DType::BF16, Device::CUDA), false, 1.0});
  });
  CHECK(contains(msg, "mask"));
  msg = error_of([&] { hg::softmax_backward(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}, DType::F32, Device::CUDA)); });
  CHECK(contains(msg, "softmax_backward"));
  CHECK(contains(msg, "(2, 3)"));
}

TEST_CASE("softmax _into variants write what the allocating ones return, and check their outputs", "[softmax][into]") {
  hg::Generator gen(21);
  const Tensor scores = Tensor::randn({2, 2, 3, 5}, gen, DType::F64);
  const Tensor dy = Tensor::randn({2, 2, 3, 5}, gen, DType::F64);
  hg::SoftmaxOptions o;
  o.mask = random_mask({2, 1, 1, 5}, gen);
  o.causal = true;
  o.scale = 0.7;
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    hg::KernelModeScope scope(mode);
    const Tensor y_want = hg::attention_softmax_forward(scores, o);
    const Tensor dx_want = hg::softmax_backward(dy, y_want, o.scale);
    Tensor y = Tensor::empty(scores.shape(), DType::F64), dx = Tensor::empty(scores.shape(), DType::F64);
    hg::attention_softmax_forward_into(scores, o, y);
    hg::softmax_backward_into(dy, y, o.scale, dx);
    CHECK(hg::test::max_abs_diff(y, y_want) == 0.0);
    CHECK(hg::test::max_abs_diff(dx, dx_want) == 0.0);

    Tensor wrong = Tensor::empty(scores.shape(), DType::F32);
    CHECK(contains(error_of([&] { hg::attention_softmax_forward_into(scores, o, wrong); }), "output y"));
    Tensor flat = Tensor::empty({60}, DType::F64);
    CHECK(contains(error_of([&] { hg::softmax_backward_into(dy, y, o.scale, flat); }), "output dx"));
  }
}
