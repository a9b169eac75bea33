// The fused classifier (ops/classifier.hpp): float64 finite differences of
// every gradient; against the composition it replaces (GEMM + bias,
// cross_entropy_forward / backward, the two backward GEMMs and the bias sum)
// at odd sizes, every chunk size from 1 row to all of them, ignored rows,
// every row ignored, a NaN in h, accumulation into existing gradients, dh
// written over h, bad input; on CUDA (F32 and BF16, checked and on-device
// targets) against the float64 CPU result with the bounds derived in
// docs/classifier.md.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "ops/classifier.hpp"
#include "ops/cross_entropy.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::f64;
using hg::test::rel_error;
using hg::test::thrown_message;

namespace {

constexpr int64_t kIgnore = -100;

struct Problem {
  Tensor h, weight, bias, targets;
};

// h ~ N(0, 1), W ~ N(0, 1/d) and b ~ N(0, 0.5) in float64 on the CPU, so the
// logits are about N(0, 1.25) at any d; every `ignore_every`th row ignored
// (0: none, 1: all).
Problem make_problem(int64_t n, int64_t d, int64_t vocab, int ignore_every, uint64_t seed) {
  Generator gen(seed);
  Problem p;
  p.h = Tensor::randn({n, d}, gen, DType::F64);
  p.weight = Tensor::randn({vocab, d}, gen, DType::F64, Device::CPU, 0.0, 1.0 / std::sqrt(double(d)));
  p.bias = Tensor::randn({vocab}, gen, DType::F64, Device::CPU, 0.0, 0.5);
  std::vector<double> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[i] = ignore_every > 0 && i % ignore_every == ignore_every - 1 ? double(kIgnore)
                                                                    : double(gen.next_u64() % uint64_t(vocab));
  p.targets = Tensor::from_vector(t, {n});
  return p;
}

struct Result {
  double loss = 0;
  Tensor dh, dw, db;  // float64 CPU copies
};

// The op, on `dev` in `dtype`, its gradients accumulated into zeros.
Result fused(const Problem& p, DType dtype, Device dev, int64_t chunk_rows, bool targets_on_device = false,
             double dloss = 1.0) {
  const DType grad_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
  const Tensor h = p.h.to(dtype).to(dev), w = p.weight.to(dtype).to(dev), b = p.bias.to(dtype).to(dev);
  Tensor dw = Tensor::zeros(p.weight.shape(), grad_dtype, dev), db = Tensor::zeros(p.bias.shape(), grad_dtype, dev);
  ClassifierOptions options;
  options.chunk_rows = chunk_rows;
  options.targets_on_device = targets_on_device;
  options.dloss = dloss;
  const ClassifierResult r = classifier_loss_and_grads(h, w, b, p.targets.to(dev), kIgnore, dw, db, options);
  REQUIRE(r.dh.dtype() == dtype);
  REQUIRE(r.dh.shape() == p.h.shape());
  return {r.loss.item(), f64(r.dh), f64(dw), f64(db)};
}

// The composition the op replaces, on the CPU in p's float64 (or `dtype`):
// full (N, V) logits, cross-entropy, then the head's backward.
Result composed(const Problem& p, DType dtype = DType::F64) {
  const Tensor h = p.h.to(dtype), w = p.weight.to(dtype), b = p.bias.to(dtype);
  Backend& be = cpu_backend();
  Tensor logits = Tensor::empty({h.size(0), w.size(0)}, dtype);
  GemmArgs fwd;
  fwd.transpose_b = true;
  be.gemm(h, w, logits, fwd);
  logits = add(logits, b);
  CrossEntropySaved saved;
  Result r;
  r.loss = cross_entropy_forward(logits, p.targets, kIgnore, &saved).item();
  const Tensor dlogits = cross_entropy_backward(saved);
  r.dh = Tensor::empty(h.shape(), dtype);
  be.gemm(dlogits, w, r.dh, GemmArgs{});
  r.dw = Tensor::empty(w.shape(), dtype);
  GemmArgs dw;
  dw.transpose_a = true;
  be.gemm(dlogits, h, r.dw, dw);
  r.db = sum(dlogits, 0, false);
  r.dh = f64(r.dh), r.dw = f64(r.dw), r.db = f64(r.db);
  return r;
}

double loss_only(const Problem& p, int64_t chunk_rows) {
  Tensor dw = Tensor::zeros(p.weight.shape(), DType::F64), db = Tensor::zeros(p.bias.shape(), DType::F64);
  ClassifierOptions options;
  options.chunk_rows = chunk_rows;
  return classifier_loss_and_grads(p.h, p.weight, p.bias, p.targets, kIgnore, dw, db, options).loss.item();
}

void check_close(const Result& got, const Result& want, double loss_tol, double grad_tol) {
  CHECK(std::abs(got.loss - want.loss) <= loss_tol * std::max(1.0, std::abs(want.loss)));
  CHECK(rel_error(got.dh, want.dh) <= grad_tol);
  CHECK(rel_error(got.dw, want.dw) <= grad_tol);
  CHECK(rel_error(got.db, want.db) <= grad_tol);
}

}  // namespace

TEST_CASE("classifier: float64 gradients match central differences (chunks of 2 rows, an ignored row)",
          "[classifier]") {
  Problem p = make_problem(5, 3, 7, 3, 1);  // row 2 ignored; the last chunk holds one row
  const Result r = fused(p, DType::F64, Device::CPU, 2);
  CHECK(rel_error(r.dh, numerical_grad([&] { return loss_only(p, 2); }, p.h)) < 1e-8);
  CHECK(rel_error(r.dw, numerical_grad([&] { return loss_only(p, 2); }, p.weight)) < 1e-8);
  CHECK(rel_error(r.db, numerical_grad([&] { return loss_only(p, 2); }, p.bias)) < 1e-8);
  // The ignored row's loss term and gradient are zero.
  for (int64_t j = 0; j < 3; ++j) CHECK(r.dh.at({2, j}) == 0.0);
}

TEST_CASE("classifier: equals the unchunked composition at every chunk size, odd sizes, ignored rows", "[classifier]") {
  // N 37 (prime: no chunk size but 1 and 37 divides it), V 101 (odd), d 16.
  const Problem p = make_problem(37, 16, 101, 4, 2);
  const Result want = composed(p);
  for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{8}, int64_t{36}, int64_t{37}, int64_t{1000}, int64_t{0}}) {
    INFO("chunk_rows " << chunk);
    // float64: only the order of the dW / db sums over chunks differs.
    check_close(fused(p, DType::F64, Device::CPU, chunk), want, 1e-13, 1e-13);
    // float32 against the float64 composition: float32 GEMMs over d = 16 and
    // V = 101 terms and the row pass's 1.2-ulp exp put every result within
    // a few 1e-7 relative; 1e-5 leaves margin and fails any O(1) error.
    check_close(fused(p, DType::F32, Device::CPU, chunk), want, 1e-5, 1e-5);
  }
  // And against today's float32 composition (what the model runs unfused).
  check_close(fused(p, DType::F32, Device::CPU, 8), composed(p, DType::F32), 1e-5, 1e-5);
}

TEST_CASE("classifier: gradients accumulate into the given ones; the loss is the same at any chunk size",
          "[classifier]") {
  const Problem p = make_problem(23, 8, 31, 5, 3);
  Generator gen(9);
  const Tensor dw0 = Tensor::randn(p.weight.shape(), gen, DType::F64),
               db0 = Tensor::randn(p.bias.shape(), gen, DType::F64);
  Tensor dw = dw0.clone(), db = db0.clone();
  ClassifierOptions options;
  options.chunk_rows = 4;
  classifier_loss_and_grads(p.h, p.weight, p.bias, p.targets, kIgnore, dw, db, options);
  const Result alone = fused(p, DType::F64, Device::CPU, 4);
  CHECK(rel_error(sub(dw, dw0), alone.dw) < 1e-14);
  CHECK(rel_error(sub(db, db0), alone.db) < 1e-14);
  // The row losses are summed in row order whatever the chunks: the same bits
  // as long as each row's logits are (float64 GEMM rows of one chunk or another).
  CHECK(std::abs(fused(p, DType::F64, Device::CPU, 1).loss - fused(p, DType::F64, Device::CPU, 23).loss) <= 1e-15);
}

namespace {

// dloss = 0.25 scales every gradient exactly (a power of two commutes with
// each rounding, of the row pass and of the GEMMs) and leaves the loss alone;
// dloss = 0.3 scales them up to one more rounding; dloss = 0 zeroes them.
void check_dloss(const Problem& p, DType dt, Device dev, bool on_device, double tol_03) {
  const Result one = fused(p, dt, dev, 7, on_device);
  const Result quarter = fused(p, dt, dev, 7, on_device, 0.25);
  CHECK(quarter.loss == one.loss);
  CHECK(rel_error(quarter.dh, mul_scalar(one.dh, 0.25)) == 0.0);
  CHECK(rel_error(quarter.dw, mul_scalar(one.dw, 0.25)) == 0.0);
  CHECK(rel_error(quarter.db, mul_scalar(one.db, 0.25)) == 0.0);
  const Result r03 = fused(p, dt, dev, 7, on_device, 0.3);
  CHECK(r03.loss == one.loss);
  CHECK(rel_error(r03.dh, mul_scalar(one.dh, 0.3)) <= tol_03);
  CHECK(rel_error(r03.dw, mul_scalar(one.dw, 0.3)) <= tol_03);
  CHECK(rel_error(r03.db, mul_scalar(one.db, 0.3)) <= tol_03);
  const Result zero = fused(p, dt, dev, 7, on_device, 0.0);
  CHECK(zero.loss == one.loss);
  for (const Tensor* g : {&zero.dh, &zero.dw, &zero.db})
    for (double v : g->to_vector()) CHECK(v == 0.0);
}

// dh written over h (ClassifierOptions::dh_over_h) is the dh of its own
// tensor bit for bit, at every chunk size, and takes h's storage.
void check_dh_over_h(const Problem& p, DType dt, Device dev) {
  const DType grad_dtype = dt == DType::F64 ? DType::F64 : DType::F32;
  for (int64_t chunk : {int64_t{1}, int64_t{7}, p.h.size(0)}) {
    INFO(dtype_name(dt) << " on " << device_name(dev) << ", chunk_rows " << chunk);
    std::vector<Tensor> dh, dw, db;
    std::vector<double> loss;
    for (bool over : {false, true}) {
      const Tensor h = p.h.to(dt).to(dev).clone();  // its own storage: p.h stays as it is
      Tensor w = p.weight.to(dt).to(dev), b = p.bias.to(dt).to(dev);
      dw.push_back(Tensor::zeros(p.weight.shape(), grad_dtype, dev));
      db.push_back(Tensor::zeros(p.bias.shape(), grad_dtype, dev));
      ClassifierOptions options;
      options.chunk_rows = chunk;
      options.dh_over_h = over;
      const ClassifierResult r =
          classifier_loss_and_grads(h, w, b, p.targets.to(dev), kIgnore, dw.back(), db.back(), options);
      CHECK(r.dh.shares_storage_with(h) == over);
      dh.push_back(f64(r.dh));
      loss.push_back(r.loss.item());
    }
    CHECK(loss[0] == loss[1]);
    CHECK(rel_error(dh[1], dh[0]) == 0.0);
    CHECK(rel_error(f64(dw[1]), f64(dw[0])) == 0.0);
    CHECK(rel_error(f64(db[1]), f64(db[0])) == 0.0);
  }
}

}  // namespace

TEST_CASE("classifier: dh written over h equals dh in a tensor of its own", "[classifier]") {
  const Problem p = make_problem(23, 8, 31, 5, 13);
  check_dh_over_h(p, DType::F64, Device::CPU);
  check_dh_over_h(p, DType::F32, Device::CPU);
}

TEST_CASE("classifier: dloss scales every gradient and not the loss; a non-finite dloss is refused", "[classifier]") {
  const Problem p = make_problem(23, 8, 31, 5, 12);
  check_dloss(p, DType::F64, Device::CPU, false, 1e-15);
  check_dloss(p, DType::F32, Device::CPU, false, 1e-6);  // 0.3 / n rounded to float once more
  Tensor dw = Tensor::zeros(p.weight.shape(), DType::F64), db = Tensor::zeros(p.bias.shape(), DType::F64);
  ClassifierOptions options;
  options.dloss = std::nan("");
  CHECK(contains(
      thrown_message([&] { classifier_loss_and_grads(p.h, p.weight, p.bias, p.targets, kIgnore, dw, db, options); }),
      "dloss nan is not finite"));
}

TEST_CASE("classifier: every row ignored gives loss 0 and zero gradients; no rows at all too", "[classifier]") {
  for (int64_t n : {int64_t{6}, int64_t{0}}) {
    INFO("rows " << n);
    const Problem p = make_problem(n, 4, 9, 1, 4);
    for (DType dt : {DType::F64, DType::F32}) {
      const Result r = fused(p, dt, Device::CPU, 4);
      CHECK(r.loss == 0.0);
      for (const Tensor* g : {&r.dh, &r.dw, &r.db})
        for (double v : g->to_vector()) CHECK(v == 0.0);
    }
  }
}

TEST_CASE("classifier: a NaN in h makes the loss NaN", "[classifier]") {
  Problem p = make_problem(9, 4, 11, 0, 5);
  p.h.set({6, 1}, std::numeric_limits<double>::quiet_NaN());
  for (DType dt : {DType::F64, DType::F32}) CHECK(std::isnan(fused(p, dt, Device::CPU, 4).loss));
}

TEST_CASE("classifier: bad input is refused with a message naming it", "[classifier]") {
  const Problem p = make_problem(4, 3, 5, 0, 6);
  Tensor dw = Tensor::zeros({5, 3}, DType::F64), db = Tensor::zeros({5}, DType::F64);
  Tensor none;
  auto call = [&](const Tensor& h, const Tensor& w, const Tensor& b, const Tensor& t, Tensor& gw, Tensor& gb,
                  int64_t chunk = 0) {
    ClassifierOptions o;
    o.chunk_rows = chunk;
    return thrown_message([&] { classifier_loss_and_grads(h, w, b, t, kIgnore, gw, gb, o); });
  };
  const Tensor bad_target = Tensor::from_vector({1, 5, 0, 2}, {4});
  CHECK(contains(call(p.h, p.weight, p.bias, bad_target, dw, db), "target 5 at flat position 1"));
  CHECK(contains(call(p.h, Tensor::zeros({5, 2}, DType::F64), p.bias, p.targets, dw, db),
                 "weight (5, 2) must be (V, 3)"));
  CHECK(contains(call(p.h, p.weight, p.bias, p.targets.slice(0, 3), dw, db), "targets (3)"));
  CHECK(contains(call(p.h, p.weight, p.bias, p.targets, dw, none), "both be given"));
  CHECK(contains(call(p.h, p.weight, p.bias, p.targets, dw, db, -1), "chunk_rows must be >= 0"));
  Tensor dw32 = Tensor::zeros({5, 3});
  CHECK(contains(call(p.h, p.weight, p.bias, p.targets, dw32, db), "weight_grad is"));
  CHECK(contains(call(p.h.to(DType::F32), p.weight, p.bias, p.targets, dw, db), "dtype"));
  CHECK(contains(call(p.h.to(DType::BF16), p.weight.to(DType::BF16), p.bias.to(DType::BF16), p.targets, dw32, db),
                 "F32 or F64 on the CPU"));
  // Without a bias the result is the one with a zero bias.
  Tensor dw_a = Tensor::zeros({5, 3}, DType::F64), dw_b = Tensor::zeros({5, 3}, DType::F64);
  Tensor db_b = Tensor::zeros({5}, DType::F64);
  const ClassifierResult a = classifier_loss_and_grads(p.h, p.weight, none, p.targets, kIgnore, dw_a, none);
  const ClassifierResult b =
      classifier_loss_and_grads(p.h, p.weight, Tensor::zeros({5}, DType::F64), p.targets, kIgnore, dw_b, db_b);
  CHECK(a.loss.item() == b.loss.item());
  CHECK(rel_error(a.dh, b.dh) == 0.0);
  CHECK(rel_error(dw_a, dw_b) == 0.0);
}

TEST_CASE("classifier: the default chunk bounds one chunk of logits", "[classifier]") {
  CHECK(default_classifier_chunk_rows(50304, DType::F32, Device::CPU) == 333);     // 64 MiB / (50304 * 4 bytes)
  CHECK(default_classifier_chunk_rows(50304, DType::BF16, Device::CUDA) == 2560);  // 2668 rounded down to 128s
  CHECK(default_classifier_chunk_rows(int64_t(1) << 30, DType::F64, Device::CPU) == 1);
  CHECK(default_classifier_chunk_rows(100, DType::BF16, Device::CUDA) * 100 * 2 <= int64_t(256) << 20);
}

// CUDA against the float64 CPU result. F32: the row kernel's float sums
// (loss within 4e-5 + 1e-5 |loss|: tests/test_cross_entropy_lse.cpp) give
// loss within 2e-5 relative (loss ~ log V >= 4.6 here); dh = g W sums V
// terms in exact FP32 and the target's -W_t / n dominates the running sum,
// whose rounding walks as sqrt(V) 2^-24 relative: gradients within
// 4 sqrt(V) 2^-24 + 1e-6 relative L2 (5.4e-5 at V = 50304). BF16: h, W and
// b are rounded to bf16 before both sides (the reference uses the rounded
// values), so what remains is docs/classifier.md's bound: the logits rounded
// (2^-9 relative, |logit| <= ~5 here: p off by <= 1%, typically 0.2%), dlogits
// and the GEMM outputs rounded (2^-9 each): loss and every gradient within
// 2e-2 relative, while a wrong transpose, chunk offset or missing 1/n is an
// O(1) error.
TEST_CASE("classifier on CUDA (F32, BF16) matches the float64 CPU result", "[classifier][cuda]") {
  HG_REQUIRE_GPU();
  // The row pass is staged up to the staging limit (bf16's is the larger),
  // strided above it: the last size runs the strided kernel in both dtypes.
  const int64_t above_staging = gpu::cross_entropy_staged_max_vocab(DType::BF16) + 3;
  for (const auto& [n, d, vocab] : {std::tuple<int64_t, int64_t, int64_t>{37, 16, 101},
                                    {300, 64, 1025},
                                    {130, 32, 50304},
                                    {21, 8, above_staging}}) {
    INFO("n " << n << " d " << d << " V " << vocab);
    Problem p = make_problem(n, d, vocab, 4, 7 + n);
    for (DType dt : {DType::F32, DType::BF16}) {
      // Both sides see the same (rounded) inputs.
      Problem q = p;
      q.h = p.h.to(dt).to(DType::F64), q.weight = p.weight.to(dt).to(DType::F64), q.bias = p.bias.to(dt).to(DType::F64);
      const Result want = fused(q, DType::F64, Device::CPU, 0);
      const double loss_tol = dt == DType::BF16 ? 2e-2 : 2e-5;
      const double grad_tol = dt == DType::BF16 ? 2e-2 : 4 * std::sqrt(double(vocab)) * std::ldexp(1.0, -24) + 1e-6;
      for (int64_t chunk : {int64_t{0}, int64_t{7}, n})
        for (bool on_device : {false, true}) {
          INFO(dtype_name(dt) << " chunk_rows " << chunk << (on_device ? " targets on device" : ""));
          check_close(fused(q, dt, Device::CUDA, chunk, on_device), want, loss_tol, grad_tol);
        }
    }
  }
}

TEST_CASE("classifier on CUDA: all ignored gives zeros; a bad on-device target gives NaN; deterministic",
          "[classifier][cuda]") {
  HG_REQUIRE_GPU();
  const Problem all = make_problem(10, 8, 33, 1, 8);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Result r = fused(all, dt, Device::CUDA, 3, true);
    CHECK(r.loss == 0.0);
    for (const Tensor* g : {&r.dh, &r.dw, &r.db})
      for (double v : g->to_vector()) CHECK(v == 0.0);
  }
  Problem bad = make_problem(10, 8, 33, 0, 9);
  bad.targets.set({4}, 33.0);
  CHECK(std::isnan(fused(bad, DType::BF16, Device::CUDA, 3, true).loss));
  CHECK(contains(thrown_message([&] { fused(bad, DType::BF16, Device::CUDA, 3, false); }), "target 33"));
  Problem nan_h = make_problem(10, 8, 33, 0, 10);
  nan_h.h.set({2, 0}, std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(fused(nan_h, DType::BF16, Device::CUDA, 3, true).loss));
  const Problem p = make_problem(50, 16, 77, 3, 11);
  // dloss (gradient accumulation's micro-batch share) as on the CPU; bf16
  // dlogits round 0.3 / n's products once more (2^-9 relative).
  for (bool on_device : {false, true}) {
    INFO("dloss, targets on device " << on_device);
    check_dloss(p, DType::F32, Device::CUDA, on_device, 1e-6);
    check_dloss(p, DType::BF16, Device::CUDA, on_device, 1e-2);
  }
  check_dh_over_h(p, DType::F32, Device::CUDA);
  check_dh_over_h(p, DType::BF16, Device::CUDA);
  const Result a = fused(p, DType::BF16, Device::CUDA, 16), b = fused(p, DType::BF16, Device::CUDA, 16);
  CHECK(a.loss == b.loss);
  CHECK(rel_error(a.dw, b.dw) == 0.0);
  CHECK(rel_error(a.dh, b.dh) == 0.0);
}
