// Cross-entropy over BF16 (and F32) logits with float32 math that keeps no
// probabilities (cuda/cross_entropy_lse.cu): loss and dlogits against a
// float64 reference on the same (already rounded) logits; vocabularies that
// are not a multiple of the 256-thread tile (1, 7, 1000, 1025, 50304);
// ignored rows, every row ignored, logits offset by 1e3; the on-device
// variant (no host checks, device-side count) and its NaN for bad targets.
// The classifier's row pass (gpu::cross_entropy_lse_rows_grad): the staged
// and strided kernels against float64 (and each run to run bit for bit) at
// vocabularies below and above the staging limit, unaligned rows, and rows
// that are ignored, NaN, -inf, all -inf, +inf, huge, flat, rising (the max
// late) or with a target out of range.
//
// Bounds: each of the 256 threads of a strided row sums ~V/256 terms
// exp(x - m) <= 1 in sequence, then a tree: the relative error of the sum,
// hence the absolute error of log s and of every row loss, is <=
// (V/256 + 8) 2^-24 <= 1.3e-5 for V = 50304, plus the exponential's error
// (cuda/exp_approx.cuh: 2^-22 relative, and 2^-24 |x| from scaling x by log2
// e, x - m down to about -20 where a term still counts) and logf's 2 ulp:
// loss within 4e-5 + 1e-5 |loss|. Each of the staged kernel's 512 threads
// sums ~V/512 terms the same way: inside the same bound.
// dlogits = (p - onehot) / n: p inherits that relative error, so
// |got - ref| <= 4e-5 p / n + 1e-6 / n; BF16 dlogits add one rounding, 2^-9
// |ref| (bound 2^-8 |ref|).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/kernel_mode.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "cuda/row_span.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::f64;
using hg::test::same_bytes;
using hg::test::thrown_message;

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

// The staged row pass's split of a row (cuda/row_span.hpp), on the CPU:
// against the 16-byte words counted from the byte addresses, at every start
// offset, for short rows and long ones.
TEST_CASE("row pass: a staged row's split covers it once, its body is every whole aligned word", "[cross_entropy]") {
  std::vector<int64_t> lengths = {50304, 50311};
  for (int64_t n = 1; n <= 80; ++n) lengths.push_back(n);
  for (const int64_t elem : {int64_t{2}, int64_t{4}})
    for (uint64_t start = 0; start < 48; start += elem)
      for (const int64_t n : lengths) {
        INFO("elem " << elem << " start " << start << " n " << n);
        const uint64_t address = 4096 + start, end = address + uint64_t(n * elem);
        const gpu::RowSpan span = gpu::row_span(address, n, elem);
        REQUIRE(0 <= span.head);
        REQUIRE(span.head <= span.body_end);
        REQUIRE(span.body_end <= n);
        const uint64_t first_word = (address + 15) / 16 * 16, last_word = end / 16 * 16;
        const int64_t words = last_word > first_word ? int64_t(last_word - first_word) / 16 : 0;
        CHECK((span.body_end - span.head) * elem == words * 16);
        if (words > 0) CHECK(address + uint64_t(span.head * elem) == first_word);
        // Edges: fewer than a word each, so a thread each of the first 16 / elem covers them.
        CHECK(span.head < 16 / elem);
        CHECK(n - span.body_end < 16 / elem);
        // The shared copy, placed at address mod 16, fits and has aligned words where the row has.
        CHECK(address % 16 + uint64_t(n * elem) <= gpu::staged_row_bytes(n, elem));
        if (words > 0) CHECK((address % 16 + uint64_t(span.head * elem)) % 16 == 0);
      }
}

namespace {

// Rows of the row-pass test: what each one holds. kRising: 16 j / V plus a
// little noise, the max late in the row (every thread's largest term comes
// last).
// kAllNegInf: every logit -inf (g and loss NaN). kPosInf: one +inf logit
// (the max): g NaN there, 0 elsewhere but -1/n at the target, loss +inf
// (NaN where the target is the +inf logit).
enum RowKind { kPlain, kIgnored, kNaN, kNegInf, kHuge, kBadTarget, kFlat, kRising, kAllNegInf, kPosInf, kRowKinds };

struct RowPassCase {
  Tensor logits;  // on CUDA, in the tested dtype; rows of kind row % kRowKinds
  Tensor targets;
  std::vector<double> t;
  int64_t shift = 0;
};

// A copy of x stored `shift` elements past the start of a fresh (256-byte
// aligned) buffer.
Tensor copy_at_shift(const Tensor& x, int64_t shift) {
  Tensor buffer = Tensor::zeros({x.numel() + shift}, x.dtype(), Device::CUDA);
  Tensor view = buffer.slice(shift, shift + x.numel()).reshape(x.shape());
  view.copy_(x);
  return view;
}

// `rows` rows of V logits ~ N(0, 3) with the hostile kinds above, stored
// `shift` elements past a 256-byte boundary (every row start unaligned for
// shift 1, whatever V).
RowPassCase row_pass_case(DType dt, int64_t rows, int64_t V, int64_t shift, uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::randn({rows, V}, gen, DType::F64, Device::CPU, 0.0, 3.0);
  RowPassCase c;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = static_cast<int64_t>(gen.next_u64() % uint64_t(V));
    const int kind = static_cast<int>(i % kRowKinds);
    c.t.push_back(kind == kIgnored ? double(kIgnore) : kind == kBadTarget ? double(V) : double(t));
    const double inf = std::numeric_limits<double>::infinity();
    if (kind == kNaN) x.set({i, (t + 1) % V}, std::numeric_limits<double>::quiet_NaN());
    if (kind == kPosInf) x.set({i, (t + 1) % V}, inf);  // V = 1: the target itself
    for (int64_t j = 0; j < V; ++j) {
      if (kind == kNegInf && j != t && j % 3 == 0) x.set({i, j}, -inf);
      if (kind == kHuge) x.set({i, j}, x.at({i, j}) * 1e34);  // ~1e35: exp underflows for all but the max
      if (kind == kFlat) x.set({i, j}, 2.5);                  // every element is the max
      if (kind == kRising) x.set({i, j}, 16.0 * double(j) / double(V) + 0.05 * x.at({i, j}));
      if (kind == kAllNegInf) x.set({i, j}, -inf);
    }
  }
  c.logits = copy_at_shift(x.to(dt), shift);
  c.shift = shift;
  c.targets = Tensor::from_vector(c.t, {rows}, DType::F32, Device::CUDA);
  return c;
}

struct RowPassOut {
  Tensor g, row_loss;
};

RowPassOut run_row_pass(const RowPassCase& c, gpu::RowPassKernel kernel) {
  RowPassOut out{copy_at_shift(c.logits, c.shift), Tensor::zeros({c.logits.size(0)}, DType::F32, Device::CUDA)};
  Tensor inv_count = Tensor::empty({1}, DType::F32, Device::CUDA);
  gpu::cross_entropy_count_targets(c.targets, kIgnore, inv_count);
  gpu::cross_entropy_lse_rows_grad(out.g, c.targets, kIgnore, inv_count, out.row_loss, kernel);
  return out;
}

// Each row against float64 on the same rounded logits (the bounds of this
// file's header), NaN where a NaN logit or a bad target must give one.
void check_row_pass_reference(const RowPassCase& c, const RowPassOut& got, DType dt) {
  const int64_t rows = c.logits.size(0), V = c.logits.size(1);
  const auto x = f64(c.logits).to_vector(), g = f64(got.g).to_vector(), loss = f64(got.row_loss).to_vector();
  int64_t counted = 0;
  for (double t : c.t) counted += t != kIgnore;
  const double inv = 1.0 / double(counted);
  const double rel = dt == DType::BF16 ? std::ldexp(1.0, -8) : 1e-5;
  for (int64_t i = 0; i < rows; ++i) {
    const int kind = static_cast<int>(i % kRowKinds);
    INFO("row " << i << " kind " << kind);
    const double* row = x.data() + i * V;
    const double* gi = g.data() + i * V;
    if (kind == kIgnored) {
      CHECK(loss[i] == 0.0);
      for (int64_t j = 0; j < V; ++j) CHECK(gi[j] == 0.0);
      continue;
    }
    if (kind == kNaN || kind == kAllNegInf) {  // as PyTorch: the whole row's gradient and its loss
      CHECK(std::isnan(loss[i]));
      int64_t nan = 0;
      for (int64_t j = 0; j < V; ++j) nan += std::isnan(gi[j]);
      CHECK(nan == V);
      continue;
    }
    const auto t = static_cast<int64_t>(c.t[i]);
    if (kind == kPosInf) {  // m = +inf: exp(x - m) is 0 but at the +inf logit, where it is NaN
      CHECK(std::isnan(loss[i]) == std::isinf(row[t]));
      if (!std::isinf(row[t])) CHECK(loss[i] == std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < V; ++j) {
        INFO("j " << j << " x " << row[j] << " g " << gi[j]);
        if (std::isinf(row[j])) CHECK(std::isnan(gi[j]));
        else CHECK(std::abs(gi[j] - (j == t ? -inv : 0.0)) <= rel * inv);
      }
      continue;
    }
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(row[j] - m);
    if (kind == kBadTarget) CHECK(std::isnan(loss[i]));
    else {
      const double want = std::log(s) - (row[t] - m);
      CHECK(std::abs(loss[i] - want) <= 4e-5 + 1e-5 * std::abs(want));
    }
    double worst = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(row[j] - m) / s, want = (p - (j == t ? 1.0 : 0.0)) * inv;
      const double bound = rel * std::abs(want) + (4e-5 * p + 1e-6) * inv;
      if (!(std::abs(gi[j] - want) <= bound)) worst = std::max(worst, std::abs(gi[j] - want) / bound);
    }
    CHECK(worst == 0.0);
  }
}

}  // namespace

TEST_CASE("row pass: the staged and strided kernels match float64 on hostile rows; staged above its limit is refused",
          "[cross_entropy][cuda]") {
  HG_REQUIRE_GPU();
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t limit = gpu::cross_entropy_staged_max_vocab(dt);
    INFO(dtype_name(dt) << " staging limit " << limit);
    REQUIRE(limit >= 50304);  // sm_90: 227 KiB of shared memory a block
    const int64_t least = gpu::cross_entropy_staged_min_vocab(dt);
    for (const int64_t V : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1024}, least - 1, least, int64_t{50304},
                            int64_t{50311}, limit, limit + 1, limit + 9})
      for (const int64_t shift : {int64_t{0}, int64_t{1}}) {
        const int64_t rows = V <= 2048 ? 3000 : V > 60000 ? kRowKinds : 2 * kRowKinds + 3;
        INFO("V " << V << " rows " << rows << " shift " << shift);
        const RowPassCase c = row_pass_case(dt, rows, V, shift, uint64_t(V) * 7 + shift);
        const RowPassOut strided = run_row_pass(c, gpu::RowPassKernel::Strided);
        const RowPassOut best = run_row_pass(c, gpu::RowPassKernel::Best);
        check_row_pass_reference(c, strided, dt);
        check_row_pass_reference(c, best, dt);
        // Deterministic: the same bits run to run.
        const RowPassOut again = run_row_pass(c, gpu::RowPassKernel::Best);
        CHECK(same_bytes(best.g, again.g));
        CHECK(same_bytes(best.row_loss, again.row_loss));
        if (V <= limit) {
          const RowPassOut staged = run_row_pass(c, gpu::RowPassKernel::Staged);
          check_row_pass_reference(c, staged, dt);
          // Best stages rows from the shortest that gives each thread a word.
          const RowPassOut& picked = V >= gpu::cross_entropy_staged_min_vocab(dt) ? staged : strided;
          CHECK(same_bytes(picked.g, best.g));
          CHECK(same_bytes(picked.row_loss, best.row_loss));
        } else {  // Best falls back to the strided kernel
          CHECK(same_bytes(best.g, strided.g));
          CHECK(same_bytes(best.row_loss, strided.row_loss));
          CHECK(thrown_message([&] { run_row_pass(c, gpu::RowPassKernel::Staged); }).find("does not fit") !=
                std::string::npos);
        }
      }
  }
}
