// Fused attention (ops/attention.hpp): float64 finite differences, every path
// against a plain-loop float64 reference on random and hostile inputs,
// repeatability, and bad-input errors.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "cuda/attention_dispatch.hpp"
#include "cuda/attention_kernels.hpp"
#include "ops/attention.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::AttentionGrads;
using hg::AttentionOptions;
using hg::AttentionSaved;
using hg::Device;
using hg::DType;
using hg::KernelMode;
using hg::Tensor;
using hg::test::f64;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  int64_t b = 2, h = 2, tq = 5, tk = 7, dh = 8;
  bool causal = false;
  bool mask = false;
  double scale = 0.35;
  double q_std = 1.0;  // large values make hostile logits
};

struct Inputs {
  Tensor q, k, v, dout, mask;  // F64 CPU
};

// Random q, k, v, dout; the mask (if any) removes a few keys per batch with
// -inf or -1e9, keeps others with ordinary biases, and removes every key of
// the last batch (a fully masked batch).
Inputs make_inputs(const Problem& p, uint64_t seed) {
  hg::Generator gen(seed);
  Inputs in;
  in.q = Tensor::randn({p.b, p.h, p.tq, p.dh}, gen, DType::F64, Device::CPU, 0.0, p.q_std);
  in.k = Tensor::randn({p.b, p.h, p.tk, p.dh}, gen, DType::F64);
  in.v = Tensor::randn({p.b, p.h, p.tk, p.dh}, gen, DType::F64);
  in.dout = Tensor::randn({p.b, p.h, p.tq, p.dh}, gen, DType::F64);
  // Values exactly representable in F32, so the reference sees the same inputs as an F32 path.
  for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout}) *t = t->to(DType::F32).to(DType::F64);
  if (p.mask) {
    std::vector<double> m(static_cast<size_t>(p.b * p.tk));
    for (int64_t bi = 0; bi < p.b; ++bi)
      for (int64_t j = 0; j < p.tk; ++j) {
        double& x = m[static_cast<size_t>(bi * p.tk + j)];
        const uint64_t r = gen.next_u64() % 5;
        x = r == 0 ? -kInf : r == 1 ? -1e9 : r == 2 ? -2.0 : 0.5;
        if (bi == p.b - 1 && p.b > 1) x = -kInf;
      }
    in.mask = Tensor::from_vector(m, {p.b, 1, 1, p.tk}, DType::F64);
  }
  return in;
}

struct Outputs {
  Tensor o, lse, dq, dk, dv;
};

// The inputs as flat float64 vectors, for the plain-loop reference.
struct Flat {
  std::vector<double> q, k, v, d, m;
  explicit Flat(const Inputs& in)
      : q(in.q.to_vector()),
        k(in.k.to_vector()),
        v(in.v.to_vector()),
        d(in.dout.to_vector()),
        m(in.mask.defined() ? in.mask.to_vector() : std::vector<double>()) {}
};

// Query row i of head bh by the definition, in float64: its lse, and its
// probabilities p and ds = p (dp - delta) over the keys (both empty when
// every key is removed: o, dq and the row's share of dk, dv are zero).
// delta is sum_j p_j dp_j, or do . o_i of a given (stored) output o.
struct Row {
  double lse = -kInf;
  std::vector<double> p, ds;
};
Row reference_row(const Problem& p, const Flat& x, int64_t bh, int64_t i,
                  const std::vector<double>* stored_o = nullptr) {
  const int64_t bi = bh / p.h;
  const double* qi = &x.q[static_cast<size_t>((bh * p.tq + i) * p.dh)];
  const double* di = &x.d[static_cast<size_t>((bh * p.tq + i) * p.dh)];
  const double* kh = &x.k[static_cast<size_t>(bh * p.tk * p.dh)];
  const double* vh = &x.v[static_cast<size_t>(bh * p.tk * p.dh)];
  std::vector<double> z(static_cast<size_t>(p.tk), -kInf);
  double mx = -kInf;
  for (int64_t j = 0; j < p.tk; ++j) {
    if (p.causal && j > i + p.tk - p.tq) continue;
    const double mj = x.m.empty() ? 0.0 : x.m[static_cast<size_t>(bi * p.tk + j)];
    if (mj <= -1e9) continue;
    double s = 0;
    for (int64_t c = 0; c < p.dh; ++c) s += qi[c] * kh[j * p.dh + c];
    z[static_cast<size_t>(j)] = p.scale * s + mj;
    mx = std::max(mx, z[static_cast<size_t>(j)]);
  }
  double total = 0;
  for (double zj : z) total += zj == -kInf ? 0.0 : std::exp(zj - mx);
  Row r;
  if (total == 0) return r;
  r.lse = mx + std::log(total);
  r.p.resize(static_cast<size_t>(p.tk));
  r.ds.resize(static_cast<size_t>(p.tk));
  double delta = 0;
  for (int64_t j = 0; j < p.tk; ++j) {
    const double zj = z[static_cast<size_t>(j)];
    r.p[static_cast<size_t>(j)] = zj == -kInf ? 0.0 : std::exp(zj - mx) / total;
    double dp = 0;
    for (int64_t c = 0; c < p.dh; ++c) dp += di[c] * vh[j * p.dh + c];
    r.ds[static_cast<size_t>(j)] = dp;  // dp for now
    delta += r.p[static_cast<size_t>(j)] * dp;
  }
  if (stored_o != nullptr) {
    delta = 0;
    for (int64_t c = 0; c < p.dh; ++c) delta += di[c] * (*stored_o)[static_cast<size_t>((bh * p.tq + i) * p.dh + c)];
  }
  for (size_t j = 0; j < r.ds.size(); ++j) r.ds[j] = r.p[j] * (r.ds[j] - delta);
  return r;
}

// The definition with plain loops in float64: shares no code with the op.
// With stored_o, delta is do . o of that output (see reference_row).
Outputs reference(const Problem& p, const Inputs& in, const Tensor* stored_o = nullptr) {
  const Flat x(in);
  const std::vector<double> o_given = stored_o != nullptr ? stored_o->to_vector() : std::vector<double>();
  std::vector<double> o(x.q.size(), 0.0), lse(static_cast<size_t>(p.b * p.h * p.tq)), dq(x.q.size(), 0.0),
      dk(x.k.size(), 0.0), dv(x.v.size(), 0.0);
  for (int64_t bh = 0; bh < p.b * p.h; ++bh)
    for (int64_t i = 0; i < p.tq; ++i) {
      const Row r = reference_row(p, x, bh, i, stored_o != nullptr ? &o_given : nullptr);
      lse[static_cast<size_t>(bh * p.tq + i)] = r.lse;
      const size_t qi = static_cast<size_t>((bh * p.tq + i) * p.dh);
      for (size_t j = 0; j < r.p.size(); ++j) {
        const size_t kj = static_cast<size_t>((bh * p.tk + int64_t(j)) * p.dh);
        for (size_t c = 0; c < static_cast<size_t>(p.dh); ++c) {
          o[qi + c] += r.p[j] * x.v[kj + c];
          dq[qi + c] += p.scale * r.ds[j] * x.k[kj + c];
          dk[kj + c] += p.scale * r.ds[j] * x.q[qi + c];
          dv[kj + c] += r.p[j] * x.d[qi + c];
        }
      }
    }
  Outputs r;
  r.o = Tensor::from_vector(o, in.q.shape(), DType::F64);
  r.lse = Tensor::from_vector(lse, {p.b, p.h, p.tq}, DType::F64);
  r.dq = Tensor::from_vector(dq, in.q.shape(), DType::F64);
  r.dk = Tensor::from_vector(dk, in.k.shape(), DType::F64);
  r.dv = Tensor::from_vector(dv, in.v.shape(), DType::F64);
  return r;
}

// Runs fn and checks that it throws hg::Error whose message contains `what`.
void expect_error(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    FAIL("no error; expected one containing: " << what);
  } catch (const hg::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}

// The problem's options, its mask (if any) in the math dtype of `dtype` on `device`.
AttentionOptions options_for(const Problem& p, const Inputs& in, Device device, DType dtype) {
  AttentionOptions opt;
  opt.causal = p.causal;
  opt.scale = p.scale;
  if (in.mask.defined()) opt.mask = in.mask.to(hg::math_dtype(dtype)).to(device);
  return opt;
}

// One run of the op on a path: inputs cast to `dtype` and moved to `device`
// (the mask in the math dtype), everything returned as F64 CPU.
Outputs run(const Problem& p, const Inputs& in, Device device, DType dtype, KernelMode mode) {
  hg::KernelModeScope scope(mode);
  auto put = [&](const Tensor& t) { return t.to(dtype).to(device); };
  const AttentionOptions opt = options_for(p, in, device, dtype);
  AttentionSaved saved;
  const Tensor o = hg::attention_forward(put(in.q), put(in.k), put(in.v), opt, &saved);
  const AttentionGrads g = hg::attention_backward(put(in.dout), saved);
  return {f64(o), f64(saved.lse), f64(g.dq), f64(g.dk), f64(g.dv)};
}

// ||a - ref|| / max(||ref||, 1): relative where the reference is large,
// absolute where it is near zero (a fully masked batch's rows).
double err(const Tensor& a, const Tensor& ref) {
  REQUIRE(a.shape() == ref.shape());
  const auto va = a.to_vector(), vr = ref.to_vector();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isinf(vr[i])) {  // lse of a fully masked row: must be -inf exactly
      if (va[i] != vr[i]) return kInf;
      continue;
    }
    diff += (va[i] - vr[i]) * (va[i] - vr[i]);
    norm += vr[i] * vr[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1.0);
}

void check_close(const Outputs& got, const Outputs& want, double tol_out, double tol_grad, const std::string& what) {
  INFO(what);
  CHECK(err(got.o, want.o) < tol_out);
  CHECK(err(got.lse, want.lse) < tol_out);
  CHECK(err(got.dq, want.dq) < tol_grad);
  CHECK(err(got.dk, want.dk) < tol_grad);
  CHECK(err(got.dv, want.dv) < tol_grad);
  for (const Tensor* t : {&got.o, &got.dq, &got.dk, &got.dv}) CHECK(hg::test::all_finite(*t));
}

std::vector<Problem> shapes() {
  std::vector<Problem> ps;
  for (bool causal : {false, true})
    for (bool mask : {false, true}) {
      Problem p;
      p.causal = causal;
      p.mask = mask;
      ps.push_back(p);                                   // Tq < Tk
      p.tq = 9, p.tk = 4, ps.push_back(p);               // Tq > Tk: causal hides whole rows
      p.tq = 1, p.tk = 1, ps.push_back(p);               // T = 1
      p.tq = 67, p.tk = 67, p.dh = 16, ps.push_back(p);  // more than one CPU query tile
    }
  return ps;
}

std::string describe(const Problem& p) {
  return "B" + std::to_string(p.b) + " H" + std::to_string(p.h) + " Tq" + std::to_string(p.tq) + " Tk" +
         std::to_string(p.tk) + " dh" + std::to_string(p.dh) + (p.causal ? " causal" : "") + (p.mask ? " mask" : "");
}

// Two runs of the same problem gave bitwise the same outputs and gradients.
void check_bitwise_repeat(const Outputs& a, const Outputs& b) {
  CHECK(a.o.to_vector() == b.o.to_vector());
  CHECK(a.dq.to_vector() == b.dq.to_vector());
  CHECK(a.dk.to_vector() == b.dk.to_vector());
  CHECK(a.dv.to_vector() == b.dv.to_vector());
}

}  // namespace

TEST_CASE("attention: float64 finite differences on the CPU, both modes", "[attention]") {
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    for (Problem p : {Problem{}, Problem{1, 2, 4, 4, 3, true, true, 0.7, 1.0}}) {
      INFO(describe(p) << (mode == KernelMode::Fused ? " fused" : " unfused"));
      Inputs in = make_inputs(p, 11);
      hg::KernelModeScope scope(mode);
      AttentionOptions opt;
      opt.causal = p.causal;
      opt.scale = p.scale;
      opt.mask = in.mask;
      auto loss = [&] { return hg::weighted_sum(hg::attention_forward(in.q, in.k, in.v, opt, nullptr), in.dout); };
      AttentionSaved saved;
      hg::attention_forward(in.q, in.k, in.v, opt, &saved);
      const AttentionGrads g = hg::attention_backward(in.dout, saved);
      CHECK(hg::rel_error(g.dq, hg::numerical_grad(loss, in.q)) < 1e-7);
      CHECK(hg::rel_error(g.dk, hg::numerical_grad(loss, in.k)) < 1e-7);
      CHECK(hg::rel_error(g.dv, hg::numerical_grad(loss, in.v)) < 1e-7);
    }
  }
}

TEST_CASE("attention: CPU paths agree with the float64 reference", "[attention]") {
  uint64_t seed = 100;
  for (const Problem& p : shapes()) {
    const Inputs in = make_inputs(p, ++seed);
    const Outputs want = reference(p, in);
    check_close(run(p, in, Device::CPU, DType::F64, KernelMode::Fused), want, 1e-12, 1e-12, describe(p) + " f64 fused");
    check_close(run(p, in, Device::CPU, DType::F64, KernelMode::Unfused), want, 1e-12, 1e-12,
                describe(p) + " f64 unfused");
    check_close(run(p, in, Device::CPU, DType::F32, KernelMode::Fused), want, 2e-6, 2e-5, describe(p) + " f32 fused");
    check_close(run(p, in, Device::CPU, DType::F32, KernelMode::Unfused), want, 2e-6, 2e-5,
                describe(p) + " f32 unfused");
  }
}

TEST_CASE("attention: hostile inputs stay finite and exact where they must", "[attention]") {
  SECTION("logits of 1e4 (scale * q.k): the softmax picks the max key, no overflow") {
    Problem p;
    p.q_std = 3000.0;
    p.scale = 1.0;
    const Inputs in = make_inputs(p, 7);
    const Outputs want = reference(p, in);
    check_close(run(p, in, Device::CPU, DType::F64, KernelMode::Fused), want, 1e-12, 1e-9, "f64 fused 1e4 logits");
    check_close(run(p, in, Device::CPU, DType::F32, KernelMode::Fused), want, 1e-5, 1e-3, "f32 fused 1e4 logits");
    check_close(run(p, in, Device::CPU, DType::F32, KernelMode::Unfused), want, 1e-5, 1e-3, "f32 unfused 1e4 logits");
  }
  SECTION("a fully masked batch gives zeros, lse -inf and zero gradients") {
    Problem p;
    p.mask = true;
    const Inputs in = make_inputs(p, 8);
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
      const Outputs got = run(p, in, Device::CPU, DType::F32, mode);
      const int64_t last = p.b - 1;
      CHECK(f64(got.o[last]).to_vector() == std::vector<double>(static_cast<size_t>(p.h * p.tq * p.dh), 0.0));
      for (double x : got.lse[last].to_vector()) CHECK(x == -kInf);
      CHECK(hg::test::all_finite(got.dq));
      CHECK(got.dk[last].to_vector() == std::vector<double>(static_cast<size_t>(p.h * p.tk * p.dh), 0.0));
    }
  }
}

TEST_CASE("attention: bad input names what is wrong", "[attention][errors]") {
  hg::Generator gen(3);
  const Tensor q = Tensor::randn({2, 2, 3, 4}, gen), k = Tensor::randn({2, 2, 5, 4}, gen);
  auto fails_with = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const AttentionOptions& o,
                        const std::string& what) {
    expect_error([&] { hg::attention_forward(qq, kk, vv, o, nullptr); }, what);
  };
  AttentionOptions none;
  fails_with(q, k, Tensor::randn({2, 2, 4, 4}, gen), none, "must have one shape");
  fails_with(q, Tensor::randn({2, 2, 5, 3}, gen), Tensor::randn({2, 2, 5, 3}, gen), none, "must share B, H and dh");
  fails_with(q.reshape({2, 6, 4}), k, k, none, "must be 4-D");
  fails_with(q, k.to(DType::F64), k.to(DType::F64), none, "dtype");
  AttentionOptions bad_mask;
  bad_mask.mask = Tensor::zeros({2, 1, 3, 5});
  fails_with(q, k, k, bad_mask, "mask shape (2, 1, 3, 5) must be (B, 1, 1, Tk)");
  bad_mask.mask = Tensor::zeros({2, 1, 1, 5}, DType::F64);
  fails_with(q, k, k, bad_mask, "needs a f32 mask");
  AttentionOptions inf_scale;
  inf_scale.scale = 1e300;
  fails_with(q, k, k, inf_scale, "is not finite");
  AttentionSaved empty;
  expect_error([&] { hg::attention_backward(q, empty); }, "run attention_forward first");
}

// The mma.sync kernels everywhere while it lives (`on` false: no change).
struct MmaSyncOnly {
  explicit MmaSyncOnly(bool on = true) : on_(on) {
    if (on_) hg::gpu::allow_wgmma_attention(false);
  }
  ~MmaSyncOnly() {
    if (on_) hg::gpu::allow_wgmma_attention(true);
  }
  MmaSyncOnly(const MmaSyncOnly&) = delete;
  MmaSyncOnly& operator=(const MmaSyncOnly&) = delete;

 private:
  bool on_;
};

// The wgmma backward recomputing s and dp for dq everywhere while it lives.
struct RecomputeDq {
  RecomputeDq() { hg::gpu::allow_stored_ds_attention(false); }
  ~RecomputeDq() { hg::gpu::allow_stored_ds_attention(true); }
  RecomputeDq(const RecomputeDq&) = delete;
  RecomputeDq& operator=(const RecomputeDq&) = delete;
};

// BF16 on CUDA against the reference on the bf16-rounded inputs: the kernel
// rounds p to bf16 before p v (relative 2^-9 per element) and o to bf16 once
// more, so o lands within ~2^-8 in norm; gradients pass through two more
// rounded products (2^-7). lse is fp32 math on exact bf16 products.
// How dq is checked. DeltaFromO: against the definition with delta = do . o
// of the kernel's own bf16 o, the quantity the kernel computes by design (rows
// near one-hot magnify o's rounding); FiniteOnly: see the moving-maxima test.
// dk and dv stay checked against the exact definition. On a device that
// runs the wgmma kernels the mma.sync kernels (every other GPU's) are checked
// too, on the same inputs.
enum class DqCheck { Exact, DeltaFromO, FiniteOnly };
void check_bf16_fused(const Problem& p, const Inputs& in, const std::string& what, DqCheck dq_check = DqCheck::Exact) {
  Inputs rounded = in;
  for (Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.dout}) *t = t->to(DType::BF16).to(DType::F64);
  const Outputs want16 = reference(p, rounded);
  for (bool mma_sync_only : {false, true}) {
    const MmaSyncOnly only(mma_sync_only);
    const Outputs got16 = run(p, rounded, Device::CUDA, DType::BF16, KernelMode::Fused);
    INFO(what << (mma_sync_only ? ", mma.sync kernels only" : ""));
    CHECK(err(got16.o, want16.o) < 8e-3);
    CHECK(err(got16.lse, want16.lse) < 1e-5);
    for (const Tensor* t : {&got16.o, &got16.dq, &got16.dk, &got16.dv}) CHECK(hg::test::all_finite(*t));
    // At logits of 1e4 the bf16 backward's delta = do . o (o rounded to
    // bf16) no longer matches sum p dp to the precision the near one-hot
    // rows need; flash attention shares this. Gradients are checked finite only.
    if (p.q_std > 1.0) continue;
    if (dq_check == DqCheck::DeltaFromO) CHECK(err(got16.dq, reference(p, rounded, &got16.o).dq) < 2e-2);
    else if (dq_check == DqCheck::Exact) CHECK(err(got16.dq, want16.dq) < 2e-2);
    CHECK(err(got16.dk, want16.dk) < 2e-2);
    CHECK(err(got16.dv, want16.dv) < 2e-2);
  }
}

TEST_CASE("attention: CUDA paths agree with the float64 reference", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 500;
  for (int64_t dh : {32, 64, 128}) {
    std::vector<Problem> ps = shapes();
    Problem big;
    big.b = 2, big.h = 3, big.tq = 200, big.tk = 333, big.dh = dh, big.causal = true, big.mask = true;
    ps.push_back(big);
    big.tq = 333, big.tk = 200, big.causal = true, big.mask = false;
    ps.push_back(big);
    Problem hostile;  // logits of 1e4
    hostile.q_std = 3000.0 / std::sqrt(double(dh));
    hostile.mask = true;
    ps.push_back(hostile);
    // The BF16 tiling: 128-query blocks, key tiles of 16 to 64, key blocks of
    // 64 or 128; tiles off the causal diagonal skip the per-element masking.
    // Tk not a multiple of 128, causal with Tq < Tk and Tq > Tk, T in 65..127.
    // Tiles staged in halves (dh 64: dq's 64-key tiles in 32-key steps, dk/dv's
    // 64-query tiles in 32-query steps): the second half partial (300, 96 +
    // causal), past the causal end (160, 200 x 72), past Tk (40 x 232) or past
    // Tq (96, 160), the first wholly above the causal end (300 x 130). The dh
    // 128 dk/dv blocks of 128 keys end one key short of a block (255), one
    // past (257) or reach past Tq with causal Tq < Tk (64 x 257).
    Problem tiled;
    tiled.b = 1, tiled.h = 2;
    for (const auto& [tq, tk, causal] : {std::tuple{300, 300, false},
                                         {520, 520, true},
                                         {130, 300, true},
                                         {300, 130, true},
                                         {100, 100, true},
                                         {100, 77, false},
                                         {129, 129, true},
                                         {160, 160, true},
                                         {96, 96, false},
                                         {200, 72, true},
                                         {40, 232, true},
                                         {257, 255, true},
                                         {255, 257, false},
                                         {64, 257, true}}) {
      tiled.tq = tq, tiled.tk = tk, tiled.causal = causal;
      ps.push_back(tiled);
    }
    Problem negative;  // scale < 0: the max of the logits is at the min of the scores
    negative.tq = negative.tk = 150, negative.scale = -0.2;
    ps.push_back(negative);
    for (Problem p : ps) {
      p.dh = dh;
      if (p.scale > 0) p.scale = p.q_std > 1.0 ? 1.0 : 1.0 / std::sqrt(double(dh));
      const double f32_grad_tol = p.q_std > 1.0 ? 1e-3 : 2e-5;
      const Inputs in = make_inputs(p, ++seed);
      const Outputs want = reference(p, in);
      const double f32_out_tol = p.q_std > 1.0 ? 1e-5 : 2e-6;
      check_close(run(p, in, Device::CUDA, DType::F32, KernelMode::Fused), want, f32_out_tol, f32_grad_tol,
                  describe(p) + " cuda f32 fused");
      check_close(run(p, in, Device::CUDA, DType::F32, KernelMode::Unfused), want, f32_out_tol, f32_grad_tol,
                  describe(p) + " cuda f32 unfused");
      check_bf16_fused(p, in, describe(p) + " cuda bf16 fused");
    }
  }
}

// Logits that grow (slope > 0) or fall along the keys: the row max moves at
// almost every key tile, by less than the forward's lazy-rescale threshold
// (2^8, docs/attention.md) in shallow rows, so later keys enter with p > 1,
// and by more in steep ones (several rescales a sweep). Query i's logit of
// key j is (i % 7 + 1) / 7 * slope * j plus the random part.
TEST_CASE("attention: CUDA BF16 with row maxima that move along the keys", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 3100;
  for (int64_t dh : {32, 64, 128})
    for (double slope : {0.05, 0.2, -0.2})
      for (bool causal : {false, true}) {
        Problem p;
        p.b = 1, p.h = 2, p.tq = 300, p.tk = 300, p.dh = dh, p.causal = causal;
        p.scale = 1.0 / std::sqrt(double(dh));
        Inputs in = make_inputs(p, ++seed);  // then column 0 of q and k set (F32 values, as make_inputs')
        std::vector<double> q = in.q.to_vector(), k = in.k.to_vector();
        for (int64_t r = 0; r < p.b * p.h * p.tq; ++r)
          q[static_cast<size_t>(r * dh)] = static_cast<float>(double(r % p.tq % 7 + 1) / 7);
        for (int64_t r = 0; r < p.b * p.h * p.tk; ++r)
          k[static_cast<size_t>(r * dh)] = static_cast<float>(slope * double(r % p.tk) / p.scale);
        in.q = Tensor::from_vector(q, in.q.shape(), DType::F64);
        in.k = Tensor::from_vector(k, in.k.shape(), DType::F64);
        // Rows end near one-hot, and column 0 of k (up to |slope| * 300 / scale)
        // multiplies delta's bf16 rounding of o into dq: checked as the kernel
        // defines it. At slope 0.2 the keys holding the mass sit where k's column
        // 0 is 340 to 680 while it changes by ~1 a key, so dq = sum ds k cancels
        // that column down to ~1/300 of it, and the bf16 rounding of ds
        // (2^-9, as in flash attention) alone leaves dq 3-5% off (H100,
        // 2026-11-26): finite only there, like the logits-of-1e4 case above.
        const DqCheck dq_check = slope > 0.1 ? DqCheck::FiniteOnly : DqCheck::DeltaFromO;
        check_bf16_fused(p, in, describe(p) + " slope " + std::to_string(slope), dq_check);
      }
}

TEST_CASE("attention: CUDA fused results repeat bitwise", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  // Without the mask, most mma.sync BF16 tiles take the path without logit2;
  // the wgmma kernels run where the device has them, the mma.sync ones also.
  for (bool mask : {true, false})
    for (bool mma_sync_only : {false, true}) {
      Problem p;
      p.b = 2, p.h = 4, p.tq = 300, p.tk = 300, p.dh = 64, p.causal = true, p.mask = mask;
      const Inputs in = make_inputs(p, 77);
      const MmaSyncOnly only(mma_sync_only);
      for (DType t : {DType::F32, DType::BF16}) {
        INFO((mask ? "mask " : "no mask ") << hg::dtype_name(t) << (mma_sync_only ? ", mma.sync kernels only" : ""));
        check_bitwise_repeat(run(p, in, Device::CUDA, t, KernelMode::Fused),
                             run(p, in, Device::CUDA, t, KernelMode::Fused));
      }
    }
}

// The F32 kernels (cuda/attention_f32.cu) tile 64 keys (or queries) per step
// against 64 or 128 rows per block: shapes at, one past and one short of
// those edges, a single query or key, causal offsets of a whole tile either
// way. (Logits of 1e4 stay at the small shape above: at T ~ 67 the float32
// rounding of the logits alone, in any kernel, can exceed that case's bounds.)
TEST_CASE("attention: CUDA F32 fused kernels at tile edges", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 2500;
  for (int64_t dh : {32, 64, 128})
    for (const auto& [tq, tk] : std::vector<std::pair<int64_t, int64_t>>{
             {128, 128}, {64, 64}, {129, 65}, {65, 129}, {1, 130}, {130, 1}, {127, 191}})
      for (bool causal : {false, true})
        for (bool mask : {false, true}) {
          Problem p;
          p.b = 3, p.h = 2, p.tq = tq, p.tk = tk, p.dh = dh, p.causal = causal, p.mask = mask;
          p.scale = 1.0 / std::sqrt(double(dh));
          const Inputs in = make_inputs(p, ++seed);
          check_close(run(p, in, Device::CUDA, DType::F32, KernelMode::Fused), reference(p, in), 2e-6, 2e-5,
                      describe(p) + " cuda f32 fused");
        }
  // Repeatability at every head dim (the 256-thread dh 128 kernels included).
  for (int64_t dh : {32, 128}) {
    Problem p;
    p.b = 2, p.h = 2, p.tq = 200, p.tk = 333, p.dh = dh, p.causal = true, p.mask = true;
    p.scale = 1.0 / std::sqrt(double(dh));
    const Inputs in = make_inputs(p, 88);
    const Outputs a = run(p, in, Device::CUDA, DType::F32, KernelMode::Fused);
    const Outputs b = run(p, in, Device::CUDA, DType::F32, KernelMode::Fused);
    INFO(describe(p));
    check_bitwise_repeat(a, b);
    CHECK(a.lse.to_vector() == b.lse.to_vector());
  }
}

namespace {

Inputs rounded_to_bf16(const Inputs& in) {
  Inputs r = in;
  for (Tensor* t : {&r.q, &r.k, &r.v, &r.dout}) *t = t->to(DType::BF16).to(DType::F64);
  return r;
}

// BF16 against the reference on the bf16-rounded inputs, at the bounds of
// "CUDA paths agree with the float64 reference".
void check_close_bf16(const Outputs& got, const Outputs& want, const std::string& what) {
  INFO(what);
  CHECK(err(got.o, want.o) < 8e-3);
  CHECK(err(got.lse, want.lse) < 1e-5);
  CHECK(err(got.dq, want.dq) < 2e-2);
  CHECK(err(got.dk, want.dk) < 2e-2);
  CHECK(err(got.dv, want.dv) < 2e-2);
  for (const Tensor* t : {&got.o, &got.dq, &got.dk, &got.dv}) CHECK(hg::test::all_finite(*t));
}

// Rows `rows` of every head of dq (B, H, Tq, dh), flattened.
std::vector<double> dq_rows(const Problem& p, const std::vector<double>& dq, const std::vector<int64_t>& rows) {
  std::vector<double> out;
  for (int64_t bh = 0; bh < p.b * p.h; ++bh)
    for (int64_t i : rows)
      for (int64_t c = 0; c < p.dh; ++c) out.push_back(dq[static_cast<size_t>((bh * p.tq + i) * p.dh + c)]);
  return out;
}

// dq of rows `rows` of every head by the definition (O(rows Tk dh): for
// shapes whose full reference would take too long), flattened as dq_rows.
std::vector<double> reference_dq_rows(const Problem& p, const Inputs& in, const std::vector<int64_t>& rows) {
  const Flat x(in);
  std::vector<double> out;
  for (int64_t bh = 0; bh < p.b * p.h; ++bh)
    for (int64_t i : rows) {
      const Row r = reference_row(p, x, bh, i);
      for (int64_t c = 0; c < p.dh; ++c) {
        double acc = 0;
        for (size_t j = 0; j < r.ds.size(); ++j) acc += p.scale * r.ds[j] * x.k[(bh * p.tk + int64_t(j)) * p.dh + c];
        out.push_back(acc);
      }
    }
  return out;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  return err(Tensor::from_vector(a, {int64_t(a.size())}, DType::F64),
             Tensor::from_vector(ref, {int64_t(ref.size())}, DType::F64));
}

}  // namespace

// The F32 backward adds the key tiles' dq in a fixed order per query tile
// (cuda/attention_dq_order.cuh); BF16 runs a dq kernel beside the dk, dv
// kernel. Both against float64 on six heads with a mask, causal with Tq != Tk,
// and bitwise equal on a second run.
TEST_CASE("attention: CUDA backward over several heads is right and repeatable", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 3100;
  for (int64_t dh : {32, 64, 128})
    for (const auto& [tq, tk, causal] : {std::tuple{300, 333, true}, {333, 200, true}, {257, 257, false}}) {
      Problem p;
      p.b = 2, p.h = 3, p.tq = tq, p.tk = tk, p.dh = dh, p.causal = causal, p.mask = true;
      p.scale = 1.0 / std::sqrt(double(dh));
      const Inputs in = make_inputs(p, ++seed), in16 = rounded_to_bf16(in);
      const Outputs f32 = run(p, in, Device::CUDA, DType::F32, KernelMode::Fused);
      const Outputs bf16 = run(p, in16, Device::CUDA, DType::BF16, KernelMode::Fused);
      check_close(f32, reference(p, in), 2e-6, 2e-5, describe(p) + " cuda f32 fused");
      check_close_bf16(bf16, reference(p, in16), describe(p) + " cuda bf16 fused");
      INFO(describe(p) << ": a second run");
      check_bitwise_repeat(f32, run(p, in, Device::CUDA, DType::F32, KernelMode::Fused));
      check_bitwise_repeat(bf16, run(p, in16, Device::CUDA, DType::BF16, KernelMode::Fused));
    }
}

// The dh 128 BF16 backward: dk, dv from the eight-warp kernel (128 keys a
// block, p^T and ds^T through shared memory; docs/attention.md, "Eight-warp
// dk/dv"), dq on a side stream. Shapes cross 128-key blocks (255, 257, 300),
// causal with Tq != Tk, the mask (a fully masked batch), T = 1 and a
// negative scale: against float64, finite, and bitwise equal on a second run.
TEST_CASE("attention: CUDA BF16 dh 128 backward at 128-key block edges", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  struct Case {
    int64_t tq, tk;
    bool causal, mask;
    double scale;
  };
  uint64_t seed = 3400;
  for (const Case& c :
       {Case{300, 300, true, false, 0.09}, Case{257, 255, true, false, 0.09}, Case{130, 300, true, true, 0.09},
        Case{255, 257, false, false, 0.09}, Case{1, 1, false, false, 0.09}, Case{150, 150, false, false, -0.2}}) {
    Problem p;
    p.b = 2, p.h = 2, p.tq = c.tq, p.tk = c.tk, p.dh = 128, p.causal = c.causal, p.mask = c.mask, p.scale = c.scale;
    const Inputs in = rounded_to_bf16(make_inputs(p, ++seed));
    const Outputs got = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
    const std::string what = describe(p) + " scale " + std::to_string(c.scale);
    check_close_bf16(got, reference(p, in), what);
    INFO(what << ": a second run");
    check_bitwise_repeat(got, run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused));
  }
}

// More key tiles per head (64 or 128 keys each) than an H100 holds blocks
// at once (264 at two a SM): blocks of a head wait on blocks that finished
// long ago, the head after waits for this one's tiles, and nothing may hang.
// Spot rows of dq against the definition (first, last, tile edges), every
// output finite, two runs bitwise equal. Tagged [large] (seconds, not
// milliseconds) so that sanitizer runs can leave it out.
TEST_CASE("attention: CUDA backward with more key tiles per head than resident blocks", "[attention][cuda][large]") {
  HG_REQUIRE_GPU();
  struct Case {
    DType dtype;
    int64_t tq, tk, dh;
    bool causal;
  };
  uint64_t seed = 3300;
  for (const Case& c : {Case{DType::BF16, 40000, 40000, 128, false}, Case{DType::BF16, 34000, 36000, 64, true},
                        Case{DType::F32, 20000, 33000, 32, true}}) {
    Problem p;
    p.b = 1, p.h = 2, p.tq = c.tq, p.tk = c.tk, p.dh = c.dh, p.causal = c.causal;
    p.scale = 1.0 / std::sqrt(double(c.dh));
    const Inputs raw = make_inputs(p, ++seed);
    const Inputs in = c.dtype == DType::BF16 ? rounded_to_bf16(raw) : raw;
    const std::string what = describe(p) + " " + hg::dtype_name(c.dtype);
    INFO(what);
    const Outputs a = run(p, in, Device::CUDA, c.dtype, KernelMode::Fused);
    const Outputs b = run(p, in, Device::CUDA, c.dtype, KernelMode::Fused);
    check_bitwise_repeat(a, b);
    for (const Tensor* t : {&a.o, &a.dq, &a.dk, &a.dv}) CHECK(hg::test::all_finite(*t));
    const std::vector<int64_t> rows{0, 1, 31, 32, 63, 64, 127, 128, p.tq / 2, p.tq - 65, p.tq - 64, p.tq - 1};
    CHECK(rel_err(dq_rows(p, a.dq.to_vector(), rows), reference_dq_rows(p, in, rows)) <
          (c.dtype == DType::BF16 ? 2e-2 : 2e-5));
  }
}

// ---------------------------------------------------------------------------
// The BF16 forward on sm_90a (cuda/attention_wgmma.cu) runs at head dim 128
// and at head dim 64 from T 256 (with a key mask at any T), any Tq and Tk,
// scale > 0, batch outermost and TMA-aligned operands, on a compute
// capability 9.0 device (cuda/attention.cu). Its shapes are checked to take
// it there, then against float64 (o, lse, and the backward run from its o
// and stats) and against the mma.sync kernels on the same inputs
// (allow_wgmma_attention(false) sends a call there).

namespace {

using hg::gpu::AttentionKernel;

// The layout of a call with contiguous operands, or with k and v as the KV
// cache's time-major (T, B, H, dh) block; a mask (only its presence counts).
hg::AttentionLayout layout_of(const Problem& p, bool time_major_kv = false) {
  static const float zero_mask[1] = {0.f};
  hg::AttentionLayout l;
  l.batch = p.b, l.heads = p.h, l.tq = p.tq, l.tk = p.tk, l.head_dim = p.dh;
  l.q = l.o = hg::HeadStrides::contiguous(p.h, p.tq, p.dh);
  l.kv = time_major_kv ? hg::HeadStrides::time_major(p.b, p.h, p.dh) : hg::HeadStrides::contiguous(p.h, p.tk, p.dh);
  l.causal = p.causal, l.scale = p.scale;
  l.mask = p.mask ? zero_mask : nullptr;
  return l;
}

// A 16-byte aligned address (nothing is read from it: the choice of kernel
// depends on the pointers' alignment only).
const char* aligned_address() {
  alignas(16) static const char buf[32] = {};
  return buf;
}

// One call of the dispatch table: the problem, where q, k, v start, and
// whether the wgmma forward takes it on a device that runs it.
struct DispatchCase {
  Problem p;
  const void* base;
  bool time_major_kv, wgmma;  // wgmma: both directions take the wgmma kernels
  bool forward_only = false;  // the forward takes the wgmma kernel, the backward the mma.sync ones
  bool wgmma_forward() const { return wgmma || forward_only; }
};

// Head dim 128 at several T, causal or not, and each rule broken once;
// head dim 64 on both sides of T 1024 and 2048, and with a key mask.
std::vector<DispatchCase> dispatch_cases() {
  const char* at = aligned_address();
  std::vector<DispatchCase> cases;
  Problem p;
  p.b = 2, p.h = 3, p.dh = 128, p.scale = 0.09;
  for (int64_t t : {1, 100, 128, 300, 4096})
    for (bool causal : {false, true}) {
      p.tq = p.tk = t, p.causal = causal;
      cases.push_back({p, at, false, true});
      cases.push_back({p, at + 2, false, false});  // not 16-byte aligned for TMA
      cases.push_back({p, at, true, false});       // time-major k, v
      Problem q = p;
      q.mask = true;  // a key mask
      cases.push_back({q, at, false, true});
      q = p, q.tk = t + 1;  // Tq != Tk (cross-attention, causal with the diagonal moved)
      cases.push_back({q, at, false, true});
      q = p, q.scale = -0.09;
      cases.push_back({q, at, false, false});
      q = p, q.scale = 1e-60;  // 0 as a float
      cases.push_back({q, at, false, false});
      q = p, q.dh = 32;
      cases.push_back({q, at, false, false});
    }
  p.dh = 64;
  // Head dim 64 without a mask: the forward from T 256 on; the backward
  // from T 1024 on where it stores ds (a head's ds at most 32 MiB), else
  // from T 2048, or from T 1024 in a call of at most 1536 query tiles of
  // 128 rows (B * H * ceil(Tq / 128)).
  for (const auto& [b, t, wgmma, forward_only] : {std::tuple{int64_t(2), int64_t(255), false, false},  // T < 256
                                                  {int64_t(2), int64_t(256), false, true},
                                                  {int64_t(2), int64_t(300), false, true},  // 18 tiles, T < 1024
                                                  {int64_t(2), int64_t(1023), false, true},
                                                  {int64_t(2), int64_t(1024), true, false},
                                                  {int64_t(192), int64_t(1024), true, false},  // 1536 tiles
                                                  {int64_t(192), int64_t(1025), true, false},  // 1728
                                                  {int64_t(256), int64_t(1024), true, false},  // 2048
                                                  {int64_t(256), int64_t(2047), true, false},
                                                  {int64_t(256), int64_t(2048), true, false},
                                                  {int64_t(2), int64_t(8192), true, false}}) {
    p.b = b, p.h = b == 2 ? 3 : 1, p.tq = p.tk = t;
    cases.push_back({p, at, false, wgmma, forward_only});
  }
  // Head dim 64 with a key mask: any T, any number of tiles.
  for (const auto& [tq, tk] : {std::pair{int64_t(300), int64_t(300)}, {int64_t(1), int64_t(8192)}}) {
    Problem q = p;
    q.b = 256, q.h = 1, q.tq = tq, q.tk = tk, q.mask = true;
    cases.push_back({q, at, false, true});
  }
  // Head dim 64 with Tq != Tk, no mask: the rules on the smaller of the two.
  p.b = 256, p.h = 1;
  for (const auto& [tq, tk, wgmma, forward_only] :
       {std::tuple{int64_t(2048), int64_t(2047), true, false},
        {int64_t(1), int64_t(8192), false, false},
        {int64_t(4096), int64_t(2048), true, false},
        {int64_t(768), int64_t(8192), false, true},       // 1536 tiles, Tq < 1024
        {int64_t(255), int64_t(8192), false, false},      // Tq < 256
        {int64_t(8192), int64_t(200), false, false},      // Tk < 256
        {int64_t(8192), int64_t(1024), true, false},      // 16384 tiles, 16 MiB of ds a head
        {int64_t(1024), int64_t(65536), false, true}}) {  // 2048 tiles, 128 MiB of ds a head
    p.tq = tq, p.tk = tk;
    cases.push_back({p, at, false, wgmma, forward_only});
  }
  p.b = 2, p.h = 3;
  for (const auto& [tq, tk] : {std::pair{int64_t(1024), int64_t(1100)}, {int64_t(1500), int64_t(1024)}})
    p.tq = tq, p.tk = tk, cases.push_back({p, at, false, true});  // 48 and 72 tiles
  p.tq = 1024, p.tk = 65536;                                      // 48 tiles, 128 MiB of ds a head: recomputing
  cases.push_back({p, at, false, true});
  return cases;
}

// Whether this device and build run the wgmma forward (a dh 128 call that
// meets every rule): compute capability 9.0 with the library built for 90
// (sm_90a code for cuda/attention_wgmma.cu), as every build preset is.
bool wgmma_runs_here() {
  Problem p;
  p.tq = p.tk = 64, p.dh = 128, p.scale = 0.1;
  const char* at = aligned_address();
  const bool runs = hg::gpu::attention_forward_kernel(DType::BF16, at, at, at, layout_of(p)) == AttentionKernel::Wgmma;
  if (hg::gpu::compute_capability() == 90) CHECK(runs);  // a build for 90 holds the sm_90a kernel
  return runs;
}

// wgmma_runs_here, with a note where it does not.
bool wgmma_test_runs() {
  if (wgmma_runs_here()) return true;
  WARN("SKIPPED: the wgmma forward does not run on this device (compute capability 9.0 only)");
  return false;
}

// The wgmma backward a call of p's shape takes where the wgmma kernels
// apply: the pair that stores ds, or (a head's ds past 32 MiB) the one that
// recomputes it.
AttentionKernel wgmma_backward_of(const hg::AttentionLayout& l) {
  return hg::gpu::wgmma_backward_stores_ds(l) ? AttentionKernel::WgmmaStoredDs : AttentionKernel::Wgmma;
}
AttentionKernel wgmma_backward_of(const Problem& p) { return wgmma_backward_of(layout_of(p)); }

// A BF16 call of p's shape (contiguous, TMA-aligned operands) takes
// `forward` forward and `backward` backward.
void require_kernels(const Problem& p, AttentionKernel forward, AttentionKernel backward) {
  const char* at = aligned_address();
  REQUIRE(hg::gpu::attention_forward_kernel(DType::BF16, at, at, at, layout_of(p)) == forward);
  REQUIRE(hg::gpu::attention_backward_kernel(DType::BF16, at, at, at, at, layout_of(p)) == backward);
}

// The same inputs through the mma.sync kernels.
Outputs run_mma_sync(const Problem& p, const Inputs& in) {
  MmaSyncOnly only;
  require_kernels(p, AttentionKernel::MmaSync, AttentionKernel::MmaSync);
  return run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
}

// got (the wgmma forward) against float64 and against the mma.sync
// forward: o within 8e-3 of each other (relative norm, the bf16 bound of
// the float64 checks: both round p and o to bf16, at different running
// maxima), lse within 4e-6 (fp32 arithmetic on the same exact products).
void check_wgmma_forward(const Problem& p, const Inputs& in16, const Outputs& got, const std::string& what) {
  check_close_bf16(got, reference(p, in16), what);
  const Outputs mma = run_mma_sync(p, in16);
  INFO(what << ": against the mma.sync forward");
  CHECK(err(got.o, mma.o) < 8e-3);
  CHECK(err(got.lse, mma.lse) < 4e-6);
}

// The stored-ds backward's gradients (got) against the recomputing pair's
// on the same inputs: dk and dv come from the same dk/dv kernel code, so
// bitwise equal; dq sums the same bf16 ds times k in the same order where
// both kernels round ds alike, and within 4e-3 (relative norm) wherever.
void check_against_recomputed_dq(const Problem& p, const Inputs& in, const Outputs& got) {
  const RecomputeDq recompute;
  require_kernels(p, AttentionKernel::Wgmma, AttentionKernel::Wgmma);
  const Outputs again = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
  INFO(describe(p) << ": stored ds against dq recomputed, dq error " << err(got.dq, again.dq));
  CHECK(got.dk.to_vector() == again.dk.to_vector());
  CHECK(got.dv.to_vector() == again.dv.to_vector());
  CHECK(err(got.dq, again.dq) < 4e-3);
}

// A call the wgmma forward and the `backward` kernels take (required; by
// default the wgmma backward its shape takes), run and checked: against
// float64 (unless against_float64 is false), against the mma.sync kernels
// on the same inputs (o and lse within the bf16 forward's 8e-3, gradients
// within 2e-2), bitwise on a second run, and a stored-ds backward against
// the recomputing one. Returns both runs' outputs.
struct WgmmaRun {
  Outputs got, mma_sync;
};
WgmmaRun check_wgmma_run(const Problem& p, const Inputs& in, std::optional<AttentionKernel> backward = std::nullopt,
                         bool against_float64 = true) {
  const std::string what = describe(p);
  INFO(what);
  const AttentionKernel taken = backward.value_or(wgmma_backward_of(p));
  require_kernels(p, AttentionKernel::Wgmma, taken);
  WgmmaRun r{run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused), run_mma_sync(p, in)};
  if (against_float64) check_close_bf16(r.got, reference(p, in), what);
  check_close(r.got, r.mma_sync, 8e-3, 2e-2, what + ": against the mma.sync forward and backward");
  {
    INFO(what << ": a second run");
    check_bitwise_repeat(r.got, run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused));
  }
  if (taken == AttentionKernel::WgmmaStoredDs) check_against_recomputed_dq(p, in, r.got);
  return r;
}

}  // namespace

TEST_CASE("attention: the BF16 forward and backward take the wgmma kernels exactly where their rules allow",
          "[attention]") {
  for (const DispatchCase& c : dispatch_cases()) {
    INFO(describe(c.p) << " scale " << c.p.scale << (c.time_major_kv ? " time-major k, v" : "")
                       << (c.base == aligned_address() ? "" : " misaligned"));
    const hg::AttentionLayout l = layout_of(c.p, c.time_major_kv);
    CHECK(hg::gpu::wgmma_forward_applies(l, c.base, c.base, c.base, /*device_ready=*/true) == c.wgmma_forward());
    CHECK_FALSE(hg::gpu::wgmma_forward_applies(l, c.base, c.base, c.base, /*device_ready=*/false));
    // The backward: its own cases, with do TMA-aligned too.
    CHECK(hg::gpu::wgmma_backward_applies(l, c.base, c.base, c.base, c.base, true) == c.wgmma);
    CHECK_FALSE(hg::gpu::wgmma_backward_applies(l, c.base, c.base, c.base, c.base, false));
    CHECK_FALSE(hg::gpu::wgmma_backward_applies(l, c.base, c.base, c.base, aligned_address() + 2, true));
  }
  // The packed (B, T, 3, H, dh) form training reads q, k, v from, o written (B, T, H, dh).
  Problem p;
  p.b = 2, p.h = 3, p.tq = p.tk = 300, p.dh = 128, p.scale = 0.09;
  hg::AttentionLayout l = layout_of(p);
  l.q = l.kv = hg::HeadStrides::packed(p.tq, p.dh, 3 * p.h * p.dh);
  l.o = hg::HeadStrides::packed(p.tq, p.dh, p.h * p.dh);
  alignas(16) static const char qkv[3 * 3 * 128 * 2] = {};  // one token's q, k, v of 3 heads, bf16
  CHECK(hg::gpu::wgmma_forward_applies(l, qkv, qkv + 2 * p.h * p.dh, qkv + 4 * p.h * p.dh, true));
}

TEST_CASE("attention: the wgmma backward stores ds up to 32 MiB a head, in chunks of 512 key tiles up to 256 MiB",
          "[attention]") {
  Problem p;
  p.dh = 128, p.scale = 0.09;
  const auto stores = [&](int64_t b, int64_t tq, int64_t tk, bool causal) {
    p.b = b, p.h = 1, p.tq = tq, p.tk = tk, p.causal = causal;
    return hg::gpu::wgmma_backward_stores_ds(layout_of(p));
  };
  CHECK(stores(1, 1, 1, false));
  CHECK(stores(1, 1, 1, true));
  CHECK(stores(64, 4096, 4096, false));  // 32 x 32 tiles of 32 KiB a head, chunks of 8 heads
  CHECK(stores(64, 4096, 4096, true));
  CHECK_FALSE(stores(1, 4097, 4096, false));
  CHECK_FALSE(stores(1, 4096, 4097, false));
  CHECK(stores(1, 1, 65536, false));  // one query tile
  CHECK_FALSE(stores(1, 8192, 8192, false));
  p.dh = 64;  // from T 1024
  CHECK_FALSE(stores(1, 1023, 1023, false));
  CHECK_FALSE(stores(1, 4096, 1023, true));
  CHECK(stores(1, 1024, 1024, false));
  CHECK(stores(1, 1024, 4096, true));
  CHECK(stores(1, 2048, 2048, true));
  CHECK(stores(1, 4096, 2048, false));
  CHECK_FALSE(stores(1, 4096, 4097, false));
  p.dh = 128, p.tq = 1000, p.tk = 129;
  CHECK(hg::gpu::stored_ds_bytes_per_head(layout_of(p)) == 8 * 2 * 32768);  // whole 128 x 128 tiles
  const auto chunk = [&](int64_t b, int64_t h, int64_t t) {
    p.b = b, p.h = h, p.tq = p.tk = t;
    return hg::gpu::stored_ds_heads_per_chunk(layout_of(p));
  };
  CHECK(chunk(8, 12, 1024) == 64);   // 8 key tiles a head: 64 and 32 heads
  CHECK(chunk(32, 16, 1024) == 64);  // 8 chunks of 64 heads, 128 MiB each
  CHECK(chunk(4, 16, 2048) == 32);   // 16 key tiles, 8 MiB a head: 256 MiB
  CHECK(chunk(2, 97, 1025) == 56);   // 9 key tiles: 56, 56, 56, 26
  CHECK(chunk(17, 1, 4096) == 8);    // 32 MiB a head: 8, 8, 1
  CHECK(hg::gpu::stored_ds_scratch_bytes(layout_of(p)) == 2 * 8 * (int64_t(32) << 20));  // a scratch a stream
  CHECK(chunk(1, 1, 1) == 1);
  CHECK(hg::gpu::stored_ds_scratch_bytes(layout_of(p)) == 32768);  // one chunk, one scratch
}

TEST_CASE("attention: CUDA BF16 forward and backward take the wgmma kernels exactly where they apply",
          "[attention][cuda]") {
  HG_REQUIRE_GPU();
  const bool wgmma = wgmma_runs_here();
  for (const DispatchCase& c : dispatch_cases()) {
    INFO(describe(c.p) << (c.time_major_kv ? " time-major k, v" : "")
                       << (c.base == aligned_address() ? "" : " misaligned"));
    const hg::AttentionLayout l = layout_of(c.p, c.time_major_kv);
    CHECK(hg::gpu::attention_forward_kernel(DType::BF16, c.base, c.base, c.base, l) ==
          (c.wgmma_forward() && wgmma ? AttentionKernel::Wgmma : AttentionKernel::MmaSync));
    CHECK(hg::gpu::attention_forward_kernel(DType::F32, c.base, c.base, c.base, l) == AttentionKernel::F32);
    CHECK(hg::gpu::attention_backward_kernel(DType::BF16, c.base, c.base, c.base, c.base, l) ==
          (c.wgmma && wgmma ? wgmma_backward_of(l) : AttentionKernel::MmaSync));
    CHECK(hg::gpu::attention_backward_kernel(DType::F32, c.base, c.base, c.base, c.base, l) == AttentionKernel::F32);
    const RecomputeDq recompute;
    CHECK(hg::gpu::attention_backward_kernel(DType::BF16, c.base, c.base, c.base, c.base, l) ==
          (c.wgmma && wgmma ? AttentionKernel::Wgmma : AttentionKernel::MmaSync));
  }
  CHECK(hg::gpu::wgmma_attention_allowed());
  {
    const MmaSyncOnly only;
    CHECK_FALSE(hg::gpu::wgmma_attention_allowed());
    for (const DispatchCase& c : dispatch_cases()) {
      INFO(describe(c.p) << ": wgmma not allowed");
      const hg::AttentionLayout l = layout_of(c.p, c.time_major_kv);
      CHECK(hg::gpu::attention_forward_kernel(DType::BF16, c.base, c.base, c.base, l) == AttentionKernel::MmaSync);
      CHECK(hg::gpu::attention_backward_kernel(DType::BF16, c.base, c.base, c.base, c.base, l) ==
            AttentionKernel::MmaSync);
    }
  }
  CHECK(hg::gpu::wgmma_attention_allowed());
}

// Head dim 128 at T from 1 to 300: a block of 128 queries (two warpgroups
// of 64), key tiles of 128; T short of, at and past both, causal or not,
// several batches and heads (the tensor maps' head and batch coordinates).
TEST_CASE("attention: CUDA BF16 wgmma forward at dh 128 against float64 and the mma.sync forward",
          "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5100;
  for (int64_t t : {1, 2, 17, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 300})
    for (bool causal : {false, true}) {
      Problem p;
      p.b = t == 300 ? 1 : 2, p.h = t == 300 ? 3 : 2, p.tq = p.tk = t, p.dh = 128, p.causal = causal;
      p.scale = 1.0 / std::sqrt(128.0);
      const Inputs in = rounded_to_bf16(make_inputs(p, ++seed));
      const Outputs got = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
      check_wgmma_forward(p, in, got, describe(p));
      INFO(describe(p) << ": a second run");
      check_bitwise_repeat(got, run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused));
      CHECK(got.lse.to_vector() == run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused).lse.to_vector());
    }
}

// The wgmma backward (cuda/attention_wgmma_backward_kernel.cuh) at head dim
// 128: blocks of 128 keys (dk/dv) or queries (dq) against streamed tiles of
// 64 queries or 128 keys, T short of, at and past each, causal or not,
// several batches and heads.
// Against float64, against the mma.sync kernels on the same inputs (o and
// lse within the bf16 forward's 8e-3, gradients within 2e-2), and bitwise
// equal on a second run.
TEST_CASE("attention: CUDA BF16 wgmma backward at dh 128 against float64 and the mma.sync backward",
          "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5600;
  for (int64_t t : {1, 2, 17, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 300, 1000})
    for (bool causal : {false, true}) {
      Problem p;
      p.b = t >= 300 ? 1 : 2, p.h = t >= 300 ? 3 : 2, p.tq = p.tk = t, p.dh = 128, p.causal = causal;
      p.scale = 1.0 / std::sqrt(128.0);
      check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)));
    }
}

// Head dim 64 takes both from T 1024 on (the forward on 64-key tiles, the
// backward on tiles of 128 streamed rows, storing ds): at 1024 and 2048
// causal, at 1025 and 2111 (a last tile of 1 and 63) not, Tq != Tk either
// way from 1024, against float64, the mma.sync kernels, the recomputing
// backward and a second run.
TEST_CASE("attention: CUDA BF16 wgmma forward and backward at dh 64 from T 1024", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5200;
  for (const auto& [tq, tk, causal] : {std::tuple{int64_t(1024), int64_t(1024), true},
                                       {int64_t(1025), int64_t(1025), false},
                                       {int64_t(1500), int64_t(1024), true},
                                       {int64_t(1024), int64_t(1300), false},
                                       {int64_t(2048), int64_t(2048), true},
                                       {int64_t(2111), int64_t(2111), false}}) {
    Problem p;
    p.b = 1, p.h = 2, p.tq = tq, p.tk = tk, p.dh = 64, p.causal = causal, p.scale = 0.125;
    const WgmmaRun r = check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)));
    INFO(describe(p) << ": lse against the mma.sync forward's (fp32 arithmetic on the same exact products)");
    CHECK(err(r.got.lse, r.mma_sync.lse) < 4e-6);
  }
}

// A stored-ds call cut into chunks of heads: 17 heads of T 4096 at dh 128
// (32 MiB of ds each) run as 8, 8 and 1 on two streams with a scratch
// each (the third chunk reuses the first's after it; each chunk reads its
// own ds), and 194 heads of T 1025 at dh 64 (9 key tiles, a last one of
// 1 key) as 56, 56, 56 and 26. Against the recomputing pair and the
// mma.sync kernels, not against float64 (minutes at this size on the CPU).
TEST_CASE("attention: CUDA BF16 wgmma backward with ds stored in chunks of heads", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5250;
  for (bool causal : {false, true}) {
    Problem p;
    p.b = 17, p.h = 1, p.tq = p.tk = 4096, p.dh = 128, p.causal = causal, p.scale = 1.0 / std::sqrt(128.0);
    REQUIRE(hg::gpu::stored_ds_heads_per_chunk(layout_of(p)) == 8);
    check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)), AttentionKernel::WgmmaStoredDs,
                    /*against_float64=*/false);
    p.b = 2, p.h = 97, p.tq = p.tk = 1025, p.dh = 64, p.scale = 0.125;
    REQUIRE(hg::gpu::stored_ds_heads_per_chunk(layout_of(p)) == 56);
    check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)), AttentionKernel::WgmmaStoredDs,
                    /*against_float64=*/false);
  }
}

// Where the stored ds finds no memory (here under gpu::set_memory_limit:
// the call's other tensors, about 33 MiB, fit in 48; its 64 MiB of ds do
// not), the backward runs the recomputing pair instead: the call completes
// within the limit with that pair's results, bit for bit.
TEST_CASE("attention: CUDA BF16 wgmma backward recomputes where the stored ds finds no memory", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  constexpr size_t kMiB = size_t(1) << 20;
  Problem p;
  p.b = 1, p.h = 8, p.tq = p.tk = 2048, p.dh = 128, p.causal = true, p.scale = 1.0 / std::sqrt(128.0);
  REQUIRE(wgmma_backward_of(p) == AttentionKernel::WgmmaStoredDs);
  REQUIRE(hg::gpu::stored_ds_scratch_bytes(layout_of(p)) == int64_t(64 * kMiB));
  const Inputs in = rounded_to_bf16(make_inputs(p, 5400));
  hg::gpu::empty_cache();
  const size_t base = hg::gpu::memory_stats().in_use;
  hg::gpu::reset_peak_memory();
  run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
  CHECK(hg::gpu::memory_stats().peak_in_use - base > 64 * kMiB);  // unlimited: the tensors and the ds
  Outputs recomputed;
  {
    const RecomputeDq recompute;
    recomputed = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
  }
  hg::gpu::empty_cache();
  hg::gpu::reset_peak_memory();
  Outputs got;
  {
    const hg::test::GpuMemoryLimit limit(hg::gpu::memory_stats().reserved + 48 * kMiB);
    got = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
    CHECK(hg::gpu::memory_stats().peak_in_use - base <= 48 * kMiB);
  }
  CHECK(got.o.to_vector() == recomputed.o.to_vector());
  CHECK(got.dq.to_vector() == recomputed.dq.to_vector());
  CHECK(got.dk.to_vector() == recomputed.dk.to_vector());
  CHECK(got.dv.to_vector() == recomputed.dv.to_vector());
}

// Head dim 64 from T 256 to 1023 takes the wgmma forward and the mma.sync
// backward, which rebuilds p from the wgmma forward's row stats: T 256;
// 257, a last key tile of 1; Tq != Tk either way: 319 queries on 700 keys,
// a last tile of 60, and 1000 on 300, of 44. Against float64, the mma.sync
// kernels in both directions on the same inputs (o and lse within the bf16
// forward's 8e-3 and 4e-6, gradients within 2e-2), and bitwise on a second
// run.
TEST_CASE("attention: CUDA BF16 wgmma forward before the mma.sync backward at dh 64", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5300;
  for (const auto& [b, h, tq, tk] : {std::tuple{int64_t(1), int64_t(2), int64_t(256), int64_t(256)},
                                     {int64_t(2), int64_t(1), int64_t(257), int64_t(257)},
                                     {int64_t(1), int64_t(2), int64_t(319), int64_t(700)},
                                     {int64_t(1), int64_t(2), int64_t(1000), int64_t(300)}})
    for (bool causal : {false, true}) {
      Problem p;
      p.b = b, p.h = h, p.tq = tq, p.tk = tk, p.dh = 64, p.causal = causal, p.scale = 0.125;
      const WgmmaRun r = check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)), AttentionKernel::MmaSync);
      INFO(describe(p) << ": lse against the mma.sync forward's");
      CHECK(err(r.got.lse, r.mma_sync.lse) < 4e-6);
    }
}

// Each shape (Tq, Tk, head dim), causal or not, through both wgmma kernels
// (required), checked by check_wgmma_run: two batches at dh 128, one at dh
// 64, and with a key mask one more (make_inputs masks the last batch fully).
struct WgmmaShape {
  int64_t tq, tk, dh;
};
void check_wgmma_shapes(std::initializer_list<WgmmaShape> shapes, bool mask, uint64_t seed) {
  for (const WgmmaShape& sh : shapes)
    for (bool causal : {false, true}) {
      Problem p;
      p.b = (sh.dh == 64 ? 1 : 2) + (mask ? 1 : 0), p.h = 2, p.tq = sh.tq, p.tk = sh.tk, p.dh = sh.dh;
      p.causal = causal, p.mask = mask, p.scale = 1.0 / std::sqrt(double(sh.dh));
      check_wgmma_run(p, rounded_to_bf16(make_inputs(p, ++seed)));
    }
}

// Tq != Tk: more keys than queries (the causal diagonal moved right), more
// queries than keys (the first Tq - Tk queries see no key: o zero, lse
// -inf, their dq zero; at 333 / 200 causal a whole block of 128 queries has
// no key tile, at 700 / 300 three and at 2560 / 2048 four, the first of
// them with key ends 255 and more below 0), one query, one key; head dim 64
// at 2048 and more either way.
TEST_CASE("attention: CUDA BF16 wgmma forward and backward with Tq != Tk", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  check_wgmma_shapes({{200, 77, 128},
                      {77, 200, 128},
                      {333, 200, 128},
                      {129, 300, 128},
                      {1, 300, 128},
                      {300, 1, 128},
                      {700, 300, 128},
                      {2048, 2300, 64},
                      {2300, 2048, 64},
                      {2560, 2048, 64}},
                     /*mask=*/false, 5700);
}

// The backward skips the unseen-pair test on interior tiles: causal with
// Tk - Tq one short of (62 mod 64) and exactly at (63 mod 64) the offset
// that makes a 64-row block of keys (dk/dv) or a tile of keys (dq) wholly
// seen by the first query of a tile, at both head dims.
TEST_CASE("attention: CUDA BF16 wgmma backward where tiles turn interior", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  check_wgmma_shapes({{200, 262, 128}, {200, 263, 128}, {2048, 2110, 64}, {2048, 2111, 64}}, /*mask=*/false, 6100);
}

// A key mask (biases of -2 and 0.5, keys removed by -inf or -1e9, the last
// batch fully masked: make_inputs): the forward's logits become s * scale +
// bias before the row max, dk/dv reads its resident keys' terms, dq its
// streamed keys'. Both head dims across tile edges and with Tq != Tk.
TEST_CASE("attention: CUDA BF16 wgmma forward and backward with a key mask", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  check_wgmma_shapes({{1, 1, 128},
                      {65, 65, 128},
                      {129, 129, 128},
                      {300, 300, 128},
                      {200, 333, 128},
                      {333, 200, 128},
                      {1, 1, 64},
                      {65, 65, 64},
                      {300, 300, 64},
                      {200, 333, 64},
                      {333, 200, 64},
                      {700, 300, 64},
                      {700, 300, 128},
                      {2111, 2300, 64}},
                     /*mask=*/true, 5800);
}

// A NaN mask value (batch 0, key 3; no causality, so every query reads it)
// makes the whole batch NaN through the wgmma kernels, as through the
// mma.sync ones: o, lse, dq, dk, dv; batch 1 stays finite.
TEST_CASE("attention: CUDA BF16 wgmma kernels turn a NaN mask value's batch NaN like the mma.sync kernels",
          "[attention][cuda][hostile]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  Problem p;
  p.b = 2, p.h = 2, p.tq = p.tk = 200, p.dh = 128, p.mask = true, p.scale = 1.0 / std::sqrt(128.0);
  Inputs in = rounded_to_bf16(make_inputs(p, 5900));
  std::vector<double> m(static_cast<size_t>(p.b * p.tk), 0.0);
  m[3] = std::numeric_limits<double>::quiet_NaN();
  in.mask = Tensor::from_vector(m, {p.b, 1, 1, p.tk}, DType::F64);
  const char* at = aligned_address();
  REQUIRE(hg::gpu::attention_forward_kernel(DType::BF16, at, at, at, layout_of(p)) == AttentionKernel::Wgmma);
  const Outputs wgmma = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused), mma = run_mma_sync(p, in);
  for (const auto& [got, name] : {std::pair{&wgmma, "wgmma"}, {&mma, "mma.sync"}})
    for (const Tensor* t : {&got->o, &got->lse, &got->dq, &got->dk, &got->dv}) {
      INFO(name);
      const std::vector<double> batch0 = (*t)[0].to_vector();
      CHECK(std::count_if(batch0.begin(), batch0.end(), [](double x) { return std::isnan(x); }) ==
            static_cast<std::ptrdiff_t>(batch0.size()));  // batch 0: NaN everywhere
      CHECK(hg::test::all_finite((*t)[1]));               // batch 1: untouched
    }
}

// Huge and tiny logits: 1e4 (rows one-hot: the max must be taken before the
// scale is applied without losing order) and 1e-9 (uniform rows).
TEST_CASE("attention: CUDA BF16 wgmma forward on huge and tiny logits", "[attention][cuda][hostile]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  uint64_t seed = 5300;
  for (double q_std : {3000.0 / std::sqrt(128.0), 1e-9})
    for (bool causal : {false, true}) {
      Problem p;
      p.b = 2, p.h = 2, p.tq = p.tk = 200, p.dh = 128, p.causal = causal, p.q_std = q_std, p.scale = 1.0;
      const Inputs in = rounded_to_bf16(make_inputs(p, ++seed));
      const std::string what = describe(p) + " q std " + std::to_string(q_std);
      // check_bf16_fused's bounds; at logits of 1e4 it checks the gradients finite only.
      check_bf16_fused(p, in, what);
      const Outputs got = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
      const Outputs mma = run_mma_sync(p, in);
      INFO(what << ": against the mma.sync forward and backward");
      CHECK(err(got.o, mma.o) < 8e-3);
      CHECK(err(got.lse, mma.lse) < 4e-6);
      if (q_std < 1) {  // uniform rows (at logits of 1e4 the bf16 gradients are not comparable)
        CHECK(err(got.dq, mma.dq) < 2e-2);
        CHECK(err(got.dk, mma.dk) < 2e-2);
        CHECK(err(got.dv, mma.dv) < 2e-2);
      }
    }
}

// A NaN in q reaches only its own row; a NaN in key j reaches every query
// that sees j (causal: rows j on), in o and lse; other heads stay finite.
TEST_CASE("attention: CUDA BF16 wgmma forward and backward propagate NaN scores to the rows that read them",
          "[attention][cuda][hostile]") {
  HG_REQUIRE_GPU();
  if (!wgmma_test_runs()) return;
  Problem p;
  p.b = 1, p.h = 2, p.tq = p.tk = 300, p.dh = 128, p.causal = true, p.scale = 1.0 / std::sqrt(128.0);
  const int64_t nan_query = 5, nan_key = 150;  // q row 5 of head 1, k row 150 of head 0
  Inputs in = rounded_to_bf16(make_inputs(p, 5400));
  std::vector<double> q = in.q.to_vector(), k = in.k.to_vector();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  q[static_cast<size_t>(((1 * p.tq) + nan_query) * p.dh + 7)] = nan;
  k[static_cast<size_t>(nan_key * p.dh + 100)] = nan;
  in.q = Tensor::from_vector(q, in.q.shape(), DType::F64);
  in.k = Tensor::from_vector(k, in.k.shape(), DType::F64);
  const Outputs got = run(p, in, Device::CUDA, DType::BF16, KernelMode::Fused);
  const std::vector<double> o = got.o.to_vector(), lse = got.lse.to_vector();
  for (int64_t head = 0; head < 2; ++head)
    for (int64_t i = 0; i < p.tq; ++i) {
      const bool nan_row = head == 0 ? i >= nan_key : i == nan_query;
      INFO("head " << head << " row " << i);
      CHECK(std::isnan(lse[static_cast<size_t>(head * p.tq + i)]) == nan_row);
      for (int64_t c = 0; c < p.dh; c += 31)
        CHECK(std::isnan(o[static_cast<size_t>((head * p.tq + i) * p.dh + c)]) == nan_row);
    }
  // The backward's NaNs fall where the mma.sync backward's do, and the rest agree.
  const Outputs mma = run_mma_sync(p, in);
  const auto nan_at = [](const Tensor& t) {
    std::vector<bool> at;
    for (double x : t.to_vector()) at.push_back(std::isnan(x));
    return at;
  };
  const auto zeroed_at = [](const Tensor& t, const std::vector<bool>& at) {
    std::vector<double> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      if (at[i]) v[i] = 0;
    return Tensor::from_vector(v, t.shape(), DType::F64);
  };
  for (const auto& [mine, theirs, name] :
       {std::tuple{&got.dq, &mma.dq, "dq"}, {&got.dk, &mma.dk, "dk"}, {&got.dv, &mma.dv, "dv"}}) {
    INFO(name);
    const std::vector<bool> nan = nan_at(*mine), their_nan = nan_at(*theirs);
    CHECK(nan == their_nan);
    CHECK(std::count(nan.begin(), nan.end(), true) > 0);
    CHECK(err(zeroed_at(*mine, their_nan), zeroed_at(*theirs, their_nan)) < 2e-2);
  }
}

TEST_CASE("attention: CUDA rejects head dims without a kernel", "[attention][cuda][errors]") {
  HG_REQUIRE_GPU();
  hg::Generator gen(4);
  const Tensor q = Tensor::randn({1, 1, 4, 48}, gen, DType::F32, Device::CUDA);
  expect_error([&] { hg::attention_forward(q, q, q, AttentionOptions{}, nullptr); }, "head dim 48");
  expect_error([&] { hg::attention_forward(q, q, q, AttentionOptions{}, nullptr); }, "allowed 32, 64, 128");
}

// ---------------------------------------------------------------------------
// The packed form: q, k, v read in place from a (B, T, 3, H, dh) tensor (the
// QKV projection's output), o written as (B, T, H, dh), dq, dk, dv into one
// (B, T, 3, H, dh) gradient. Same numbers as the contiguous form.

namespace {

// (B, H, T, dh) operands <-> the packed layouts, by plain loops (F64, CPU).
Tensor pack_qkv(const Inputs& in) {
  const int64_t b = in.q.size(0), h = in.q.size(1), t = in.q.size(2), dh = in.q.size(3);
  const std::vector<double> src[3] = {in.q.to_vector(), in.k.to_vector(), in.v.to_vector()};
  std::vector<double> out(static_cast<size_t>(b * t * 3 * h * dh));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int s3 = 0; s3 < 3; ++s3)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t c = 0; c < dh; ++c)
            out[static_cast<size_t>((((bi * t + ti) * 3 + s3) * h + hi) * dh + c)] =
                src[s3][static_cast<size_t>(((bi * h + hi) * t + ti) * dh + c)];
  return Tensor::from_vector(out, {b, t, 3 * h * dh}, DType::F64);
}

// (B, H, T, dh) -> (B, T, H * dh), or back (with `heads`).
Tensor to_tokens(const Tensor& x) {
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), dh = x.size(3);
  const std::vector<double> v = f64(x).to_vector();
  std::vector<double> out(v.size());
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t ti = 0; ti < t; ++ti)
        for (int64_t c = 0; c < dh; ++c)
          out[static_cast<size_t>(((bi * t + ti) * h + hi) * dh + c)] =
              v[static_cast<size_t>(((bi * h + hi) * t + ti) * dh + c)];
  return Tensor::from_vector(out, {b, t, h * dh}, DType::F64);
}
Tensor to_heads(const Tensor& y, int64_t h, int64_t slot = 0, int64_t slots = 1) {
  const int64_t b = y.size(0), t = y.size(1), dh = y.size(2) / (slots * h);
  const std::vector<double> v = f64(y).to_vector();
  std::vector<double> out(static_cast<size_t>(b * h * t * dh));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t ti = 0; ti < t; ++ti)
        for (int64_t c = 0; c < dh; ++c)
          out[static_cast<size_t>(((bi * h + hi) * t + ti) * dh + c)] =
              v[static_cast<size_t>((((bi * t + ti) * slots + slot) * h + hi) * dh + c)];
  return Tensor::from_vector(out, {b, h, t, dh}, DType::F64);
}

Outputs run_packed(const Problem& p, const Inputs& in, Device device, DType dtype, KernelMode mode) {
  hg::KernelModeScope scope(mode);
  auto put = [&](const Tensor& t) { return t.to(dtype).to(device); };
  const AttentionOptions opt = options_for(p, in, device, dtype);
  AttentionSaved saved;
  const Tensor o = hg::attention_forward_packed(put(pack_qkv(in)), p.h, opt, &saved);
  REQUIRE(o.shape() == hg::Shape({p.b, p.tq, p.h * p.dh}));
  const Tensor dqkv = hg::attention_backward_packed(put(to_tokens(in.dout)), saved);
  REQUIRE(dqkv.shape() == hg::Shape({p.b, p.tq, 3 * p.h * p.dh}));
  return {to_heads(o, p.h), f64(saved.lse), to_heads(dqkv, p.h, 0, 3), to_heads(dqkv, p.h, 1, 3),
          to_heads(dqkv, p.h, 2, 3)};
}

// Self-attention shapes (Tq = Tk): odd T, several heads, odd dh where the path allows it.
std::vector<Problem> packed_shapes(const std::vector<int64_t>& head_dims) {
  std::vector<Problem> ps;
  for (int64_t dh : head_dims)
    for (bool causal : {false, true})
      for (bool mask : {false, true})
        for (int64_t t : {1, 5, 67}) {
          Problem p;
          p.b = 2, p.h = 3, p.tq = p.tk = t, p.dh = dh, p.causal = causal, p.mask = mask;
          p.scale = 1.0 / std::sqrt(double(dh));
          ps.push_back(p);
        }
  return ps;
}

void check_same(const Outputs& a, const Outputs& b, const std::string& what) {
  INFO(what);
  CHECK(a.o.to_vector() == b.o.to_vector());
  CHECK(a.lse.to_vector() == b.lse.to_vector());
  CHECK(a.dq.to_vector() == b.dq.to_vector());
  CHECK(a.dk.to_vector() == b.dk.to_vector());
  CHECK(a.dv.to_vector() == b.dv.to_vector());
}

}  // namespace

TEST_CASE("attention: packed (B, T, 3, H, dh) form on the CPU vs the float64 reference and the contiguous form",
          "[attention]") {
  uint64_t seed = 900;
  for (const Problem& p : packed_shapes({3, 8, 16})) {
    const Inputs in = make_inputs(p, ++seed);
    const Outputs want = reference(p, in);
    const std::string what = describe(p);
    check_close(run_packed(p, in, Device::CPU, DType::F64, KernelMode::Fused), want, 1e-12, 1e-12, what + " f64 fused");
    check_close(run_packed(p, in, Device::CPU, DType::F64, KernelMode::Unfused), want, 1e-12, 1e-12,
                what + " f64 unfused");
    check_close(run_packed(p, in, Device::CPU, DType::F32, KernelMode::Fused), want, 2e-6, 2e-5, what + " f32 fused");
    check_close(run_packed(p, in, Device::CPU, DType::F32, KernelMode::Unfused), want, 2e-6, 2e-5,
                what + " f32 unfused");
    // The unfused packed path runs the contiguous op between transposes: the same numbers bit for bit.
    check_same(run_packed(p, in, Device::CPU, DType::F32, KernelMode::Unfused),
               run(p, in, Device::CPU, DType::F32, KernelMode::Unfused), what + " f32 unfused packed vs contiguous");
  }
}

TEST_CASE("attention: packed form, float64 finite differences on the CPU", "[attention]") {
  Problem p;
  p.b = 2, p.h = 2, p.tq = p.tk = 5, p.dh = 3, p.causal = true, p.mask = true;
  const Inputs in = make_inputs(p, 17);
  Tensor qkv = pack_qkv(in);
  const Tensor dout = to_tokens(in.dout);
  AttentionOptions opt;
  opt.causal = true;
  opt.scale = p.scale;
  opt.mask = in.mask;
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    hg::KernelModeScope scope(mode);
    auto loss = [&] { return hg::weighted_sum(hg::attention_forward_packed(qkv, p.h, opt, nullptr), dout); };
    AttentionSaved saved;
    hg::attention_forward_packed(qkv, p.h, opt, &saved);
    CHECK(hg::rel_error(hg::attention_backward_packed(dout, saved), hg::numerical_grad(loss, qkv)) < 1e-7);
  }
}

TEST_CASE("attention: packed form, bad input names what is wrong", "[attention][errors]") {
  hg::Generator gen(3);
  const Tensor qkv = Tensor::randn({2, 5, 18}, gen);
  AttentionOptions none;
  expect_error([&] { hg::attention_forward_packed(qkv, 4, none, nullptr); }, "must be (B, T, 3 * heads * dh)");
  expect_error([&] { hg::attention_forward_packed(qkv.reshape({10, 18}), 3, none, nullptr); }, "got shape (10, 18)");
  expect_error([&] { hg::attention_forward_packed(qkv, 0, none, nullptr); }, "heads must be positive");
  AttentionOptions bad_mask;
  bad_mask.mask = Tensor::zeros({2, 1, 1, 4});
  expect_error([&] { hg::attention_forward_packed(qkv, 3, bad_mask, nullptr); },
               "must be (B, 1, 1, Tk) = (2, 1, 1, 5)");
  AttentionSaved packed;
  const Tensor o = hg::attention_forward_packed(qkv, 3, none, &packed);
  expect_error([&] { hg::attention_backward(Tensor::zeros({2, 3, 5, 2}), packed); }, "use attention_backward_packed");
  AttentionSaved plain;
  const Tensor q = Tensor::randn({2, 3, 5, 2}, gen);
  hg::attention_forward(q, q, q, none, &plain);
  expect_error([&] { hg::attention_backward_packed(o, plain); }, "not of attention_forward_packed");
  expect_error([&] { hg::attention_backward_packed(Tensor::zeros({2, 5, 7}), packed); }, "differs from the output's");
}

TEST_CASE("attention: packed form on CUDA equals the contiguous form bit for bit, and the float64 reference",
          "[attention][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 1500;
  std::vector<Problem> ps = packed_shapes({32, 64, 128});
  Problem big;
  big.b = 2, big.h = 3, big.tq = big.tk = 201, big.causal = true, big.mask = true;
  for (int64_t dh : {32, 64, 128}) {
    big.dh = dh;
    big.scale = 1.0 / std::sqrt(double(dh));
    ps.push_back(big);
  }
  for (const Problem& p : ps) {
    const Inputs in = make_inputs(p, ++seed);
    const std::string what = describe(p);
    const Outputs want = reference(p, in);
    // F32: the same kernels reading through strides: bitwise the contiguous result.
    const Outputs got = run_packed(p, in, Device::CUDA, DType::F32, KernelMode::Fused);
    check_same(got, run(p, in, Device::CUDA, DType::F32, KernelMode::Fused), what + " cuda f32 packed vs contiguous");
    check_close(got, want, 2e-6, 2e-5, what + " cuda f32 packed");
    check_close(run_packed(p, in, Device::CUDA, DType::F32, KernelMode::Unfused), want, 2e-6, 2e-5,
                what + " cuda f32 unfused packed");
    Inputs rounded = in;
    for (Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.dout}) *t = t->to(DType::BF16).to(DType::F64);
    const Outputs got16 = run_packed(p, rounded, Device::CUDA, DType::BF16, KernelMode::Fused);
    check_same(got16, run(p, rounded, Device::CUDA, DType::BF16, KernelMode::Fused),
               what + " cuda bf16 packed vs contiguous");
    const Outputs want16 = reference(p, rounded);
    INFO(what << " cuda bf16 packed");  // bounds as in "CUDA paths agree with the float64 reference"
    CHECK(err(got16.o, want16.o) < 8e-3);
    CHECK(err(got16.lse, want16.lse) < 1e-5);
    CHECK(err(got16.dq, want16.dq) < 2e-2);
    CHECK(err(got16.dk, want16.dk) < 2e-2);
    CHECK(err(got16.dv, want16.dv) < 2e-2);
  }
}

// ---------------------------------------------------------------------------
// MultiHeadAttention runs the same math through the fused attention op
// (AttentionImpl::Flash) as through GEMM + softmax + GEMM (Softmax).

#include "models/attention.hpp"

namespace {

struct MhaRun {
  Tensor y, dx, dw_qkv, dw_proj;
};

MhaRun run_mha(hg::AttentionImpl impl, Device dev, DType dtype, int64_t d, int64_t heads, const Tensor& mask) {
  hg::Generator gen(5);
  hg::MultiHeadAttention mha(d, heads, gen, dtype);
  mha.to(dev);
  mha.set_impl(impl);
  hg::Generator data(6);
  const Tensor x = Tensor::randn({2, 9, d}, data, dtype, dev);
  const Tensor dy = Tensor::randn({2, 9, d}, data, dtype, dev);
  Tensor m = mask.defined() ? mask.to(hg::math_dtype(dtype)).to(dev) : Tensor();
  MhaRun r;
  r.y = f64(mha.forward(x, m));
  r.dx = f64(mha.backward(dy));
  r.dw_qkv = f64(mha.qkv.weight.grad);
  r.dw_proj = f64(mha.proj.weight.grad);
  return r;
}

}  // namespace

TEST_CASE("attention: MultiHeadAttention's flash and softmax cores agree", "[attention][models]") {
  const Tensor mask = Tensor::from_vector({0, 0, -kInf, 0, -1e9, 0, 0, 0, 0,  //
                                           0, 0, 0, 0, 0, 0, 0, 0, -kInf},
                                          {2, 1, 1, 9}, DType::F64);
  for (const Tensor& m : {Tensor(), mask}) {
    const MhaRun a = run_mha(hg::AttentionImpl::Flash, Device::CPU, DType::F64, 12, 3, m);
    const MhaRun b = run_mha(hg::AttentionImpl::Softmax, Device::CPU, DType::F64, 12, 3, m);
    CHECK(hg::rel_error(a.y, b.y) < 1e-12);
    CHECK(hg::rel_error(a.dx, b.dx) < 1e-12);
    CHECK(hg::rel_error(a.dw_qkv, b.dw_qkv) < 1e-12);
    CHECK(hg::rel_error(a.dw_proj, b.dw_proj) < 1e-12);
  }
  CHECK(hg::parse_attention_impl("flash") == hg::AttentionImpl::Flash);
  expect_error([] { hg::parse_attention_impl("fast"); }, "allowed auto, flash, softmax");
}

TEST_CASE("attention: MultiHeadAttention's flash core on CUDA agrees with the softmax core",
          "[attention][models][cuda]") {
  HG_REQUIRE_GPU();
  // F32 here; the BF16 flash core runs inside the bf16 model checks of test_mixed_precision.
  const MhaRun a = run_mha(hg::AttentionImpl::Flash, Device::CUDA, DType::F32, 64, 2, Tensor());
  const MhaRun b = run_mha(hg::AttentionImpl::Softmax, Device::CUDA, DType::F32, 64, 2, Tensor());
  CHECK(hg::rel_error(a.y, b.y) < 1e-5);
  CHECK(hg::rel_error(a.dx, b.dx) < 1e-5);
  CHECK(hg::rel_error(a.dw_qkv, b.dw_qkv) < 1e-5);
  CHECK(hg::rel_error(a.dw_proj, b.dw_proj) < 1e-5);
}

TEST_CASE("attention: large logits (scale 30, head dim 64), f32 fused gradients as close to float64 as the plain "
          "composition",
          "[attention]") {
  // Logits of a few hundred, nearly one-hot rows: dS = p (dp - D) cancels,
  // so any error in p that is not a plain rounding of the softmax (such as
  // a row that does not sum to one) shows up in dq and dk many times over.
  Problem p;
  p.b = 1, p.h = 2, p.tq = p.tk = 256, p.dh = 64, p.scale = 30.0;
  const Inputs in = make_inputs(p, 31);
  const Outputs want = reference(p, in);
  const Outputs fused = run(p, in, Device::CPU, DType::F32, KernelMode::Fused);
  const Outputs plain = run(p, in, Device::CPU, DType::F32, KernelMode::Unfused);
  INFO("dq fused " << err(fused.dq, want.dq) << " plain " << err(plain.dq, want.dq) << "; dk fused "
                   << err(fused.dk, want.dk) << " plain " << err(plain.dk, want.dk));
  // Measured 2026-11-28 (x86-64 CPU): fused 7.3e-5 (dq) and 7.6e-5 (dk),
  // plain 7.6e-5 and 8.0e-5; probabilities recomputed as exp(z - lse) gave
  // 1.5e-4 and 1.6e-4.
  CHECK(err(fused.dq, want.dq) < 1e-4);
  CHECK(err(fused.dk, want.dk) < 1e-4);
  CHECK(err(fused.dq, want.dq) < 1.2 * err(plain.dq, want.dq));
  CHECK(err(fused.dk, want.dk) < 1.2 * err(plain.dk, want.dk));
  CHECK(err(fused.dv, want.dv) < 1e-5);
}

TEST_CASE("attention: a NaN mask value makes the output NaN on every path, as a NaN score does",
          "[attention][hostile]") {
  // The mask is additive: NaN + score is NaN, for every query that reads the
  // key (no causality here, so all of them), in the forward and the backward.
  Problem p;
  p.b = 2, p.h = 2, p.tq = p.tk = 6, p.dh = 32;  // a head dim the fused CUDA kernel takes
  Inputs in = make_inputs(p, 41);
  std::vector<double> m(static_cast<size_t>(p.b * p.tk), 0.0);
  m[3] = std::numeric_limits<double>::quiet_NaN();  // batch 0, key 3
  in.mask = Tensor::from_vector(m, {p.b, 1, 1, p.tk}, DType::F64);
  std::vector<std::pair<Device, DType>> devices{{Device::CPU, DType::F32}, {Device::CPU, DType::F64}};
  if (hg::test::cuda_paths_run("attention NaN mask")) devices.push_back({Device::CUDA, DType::F32});
  for (const auto& [device, dtype] : devices)
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
      for (bool packed : {false, true}) {
        INFO(hg::device_name(device) << " " << hg::dtype_name(dtype)
                                     << (mode == KernelMode::Fused ? " fused" : " unfused")
                                     << (packed ? " packed" : ""));
        const Outputs got = packed ? run_packed(p, in, device, dtype, mode) : run(p, in, device, dtype, mode);
        for (const Tensor* t : {&got.o, &got.dq, &got.dk, &got.dv}) {
          for (double x : (*t)[0].to_vector()) CHECK(std::isnan(x));  // batch 0: NaN everywhere
          CHECK(hg::test::all_finite((*t)[1]));                       // batch 1: untouched
        }
      }
}
