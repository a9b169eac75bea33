// Cross-entropy over BF16 (and F32) logits with float32 math that keeps no
// probabilities (cuda/cross_entropy_lse.cu): loss and dlogits against a
// float64 reference on the same (already rounded) logits; vocabularies that
// are not a multiple of the 256-thread tile (1, 7, 1000, 1025, 50304);
// ignored rows, every row ignored, logits offset by 1e3; the on-device
// variant (no host checks, device-side count) and its NaN for bad targets.
//
// Bounds: each of the 256 threads of a row sums ~V/256 terms exp(x - m) <= 1
// in sequence, then a tree: the relative error of the sum, hence the absolute
// error of log s and of every row loss, is <= (V/256 + 8) 2^-24 <= 1.3e-5
// for V = 50304, plus expf / logf's 2 ulp: loss within 4e-5 + 1e-5 |loss|.
// dlogits = (p - onehot) / n: p inherits that relative error, so
// |got - ref| <= 4e-5 p / n + 1e-6 / n; BF16 dlogits add one rounding, 2^-9
// |ref| (bound 2^-8 |ref|).
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "core/kernel_mode.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::f64;

namespace {

constexpr int64_t kIgnore = -100;

struct Reference {
  double loss = 0;
  std::vector<double> dlogits, p;
  int64_t n_valid = 0;
};

Reference reference(const Tensor& logits, const std::vector<double>& targets, int64_t V) {
  const auto x = f64(logits).to_vector();
  Reference r;
  r.dlogits.assign(x.size(), 0);
  r.p.assign(x.size(), 0);
  for (double t : targets) r.n_valid += t != kIgnore;
  const double inv = r.n_valid > 0 ? 1.0 / static_cast<double>(r.n_valid) : 0.0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == kIgnore) continue;
    const double* row = x.data() + i * V;
    double m = row[0];
    for (int64_t j = 1; j < V; ++j) m = std::max(m, row[j]);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(row[j] - m);
    const auto t = static_cast<int64_t>(targets[i]);
    r.loss += (std::log(s) - (row[t] - m)) * inv;
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(row[j] - m) / s;
      r.p[i * V + j] = p;
      r.dlogits[i * V + j] = (p - (j == t ? 1.0 : 0.0)) * inv;
    }
  }
  return r;
}

// Random targets, every third row ignored (or all of them).
std::vector<double> make_targets(int64_t rows, int64_t V, bool all_ignored, Generator& gen) {
  std::vector<double> t(rows);
  for (int64_t i = 0; i < rows; ++i)
    t[i] = all_ignored || i % 3 == 1 ? double(kIgnore) : double(gen.next_u64() % uint64_t(V));
  return t;
}

void check_case(DType dtype, KernelMode mode, bool on_device, int64_t rows, int64_t V, double offset,
                bool all_ignored) {
  INFO(dtype_name(dtype) << " " << kernel_mode_name(mode) << (on_device ? " on_device" : "") << " rows " << rows
                         << " V " << V << " offset " << offset << " all_ignored " << all_ignored);
  Generator gen(31 * V + rows);
  const Tensor logits = Tensor::randn({rows, V}, gen, DType::F64, Device::CPU, offset, 3.0).to(dtype).to(Device::CUDA);
  const std::vector<double> t = make_targets(rows, V, all_ignored, gen);
  const Tensor targets = Tensor::from_vector(t, {rows}, DType::F32, Device::CUDA);
  KernelModeScope scope(mode);
  CrossEntropySaved saved;
  const Tensor loss = on_device ? cross_entropy_forward_on_device(logits, targets, kIgnore, &saved)
                                : cross_entropy_forward(logits, targets, kIgnore, &saved);
  const Tensor dlogits = cross_entropy_backward(saved);
  REQUIRE(dlogits.dtype() == dtype);
  REQUIRE(dlogits.shape() == logits.shape());
  const Reference r = reference(logits, t, V);
  CHECK(std::abs(loss.item() - r.loss) <= 4e-5 + 1e-5 * std::abs(r.loss));
  const auto d = f64(dlogits).to_vector();
  const double inv = r.n_valid > 0 ? 1.0 / double(r.n_valid) : 0.0;
  const double rel = dtype == DType::BF16 ? std::ldexp(1.0, -8) : 1e-5;
  double worst = 0;
  for (size_t k = 0; k < d.size(); ++k) {
    const double bound = rel * std::abs(r.dlogits[k]) + (4e-5 * r.p[k] + 1e-6) * inv;
    if (!(std::abs(d[k] - r.dlogits[k]) <= bound)) worst = std::max(worst, std::abs(d[k] - r.dlogits[k]) / bound);
  }
  CHECK(worst == 0.0);
  // An upstream gradient of 2 doubles every element exactly (a power of two).
  const auto twice = f64(cross_entropy_backward(saved, 2.0)).to_vector();
  for (size_t k = 0; k < d.size(); ++k) CHECK(twice[k] == 2 * d[k]);
  // Written over the logits (the caller's last use of them): the same values,
  // in the logits' own storage where the log-sum-exp path saved them.
  const Tensor over = cross_entropy_backward_over_logits(saved);
  CHECK(f64(over).to_vector() == d);
  if (saved.row_stats.defined()) CHECK(over.shares_storage_with(logits));
}

}  // namespace

TEST_CASE("cross_entropy: BF16 logits are refused on the CPU; the on-device variant is the plain op there",
          "[cross_entropy]") {
  Generator gen(2);
  const Tensor logits = Tensor::randn({4, 9}, gen);
  const Tensor targets = Tensor::from_vector({0, 8, double(kIgnore), 3}, {4});
  CrossEntropySaved a, b;
  CHECK(cross_entropy_forward_on_device(logits, targets, kIgnore, &a).item() ==
        cross_entropy_forward(logits, targets, kIgnore, &b).item());
  CHECK(hg::test::max_abs_diff(cross_entropy_backward(a), cross_entropy_backward(b)) == 0.0);
  try {
    cross_entropy_forward(logits.to(DType::BF16), targets, kIgnore, nullptr);
    FAIL("BF16 logits on the CPU were accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("BF16 on CUDA") != std::string::npos);
  }
}

TEST_CASE("cross_entropy over BF16 / F32 logits on CUDA matches float64", "[cross_entropy][cuda]") {
  HG_REQUIRE_GPU();
  for (const auto& [rows, V] : {std::pair<int64_t, int64_t>{5, 1}, {9, 7}, {17, 1000}, {8, 1025}, {3, 50304}})
    for (const double offset : {0.0, 1e3}) {
      check_case(DType::BF16, KernelMode::Fused, false, rows, V, offset, false);
      check_case(DType::BF16, KernelMode::Fused, true, rows, V, offset, false);
      check_case(DType::F32, KernelMode::Fused, true, rows, V, offset, false);
      check_case(DType::BF16, KernelMode::Unfused, false, rows, V, offset, false);
    }
  check_case(DType::BF16, KernelMode::Fused, true, 6, 1000, 0.0, true);  // loss 0, grads 0
  check_case(DType::BF16, KernelMode::Fused, false, 6, 1000, 0.0, true);
}

TEST_CASE("cross_entropy on device: a bad target gives a NaN loss, the checked op throws", "[cross_entropy][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(4);
  const Tensor logits = Tensor::randn({3, 10}, gen, DType::BF16, Device::CUDA);
  const Tensor bad = Tensor::from_vector({1, 10, 2}, {3}, DType::F32, Device::CUDA);
  CHECK(std::isnan(cross_entropy_forward_on_device(logits, bad, kIgnore, nullptr).item()));
  CHECK_THROWS_AS(cross_entropy_forward(logits, bad, kIgnore, nullptr), Error);
  // Deterministic: two runs, same bits.
  const Tensor targets = Tensor::from_vector({1, 9, 2}, {3}, DType::F32, Device::CUDA);
  CrossEntropySaved s1, s2;
  const double l1 = cross_entropy_forward_on_device(logits, targets, kIgnore, &s1).item();
  const double l2 = cross_entropy_forward_on_device(logits, targets, kIgnore, &s2).item();
  CHECK(l1 == l2);
  CHECK(hg::test::max_abs_diff(cross_entropy_backward(s1), cross_entropy_backward(s2)) == 0.0);
}
