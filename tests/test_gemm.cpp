// Backend::gemm (the GEMM with epilogue) against a float64 reference written
// here with plain loops: every epilogue, every transpose combination,
// accumulate, odd sizes (M, N, K not multiples of 8 or 16) and unaligned
// views; the validation messages. CPU F32 / F64 here, CUDA F32 / BF16 on the
// device.
//
// Bounds (and why), per element, against the float64 result of the same
// (already rounded) inputs; s = sum_k |op(a)[m,k]| |op(b)[k,n]|:
// - CPU F64: 1e-12 s. CPU F32 and CUDA F32 (exact FP32, CUBLAS_COMPUTE_32F):
//   1e-5 s (K <= 200 products: the float32 accumulation error is well under
//   K * 6e-8 * s). The GELU outputs are compared through the same bound
//   scaled by max |gelu'| ~ 1.13, plus 1e-6 for the tanh evaluation. On
//   the GPU the GELU epilogues also get the slack of a tanh accurate to
//   2^-10 relative (cuBLASLt may use the hardware tanh.approx, 2^-10.99):
//   0.5 |x| 2^-10 |t| for gelu, |product| |d gelu'/dt| 2^-10 |t| for gelu'.
//   That slack is as large as the erf-vs-tanh difference (<= 4.7e-4), so the
//   form is checked separately, by which of the two the results are nearer.
// - CUDA BF16 operands, fp32 accumulation: F32 out 1e-5 s + 1e-6; BF16 out
//   adds one rounding to bf16: 2^-8 |ref| (half an ulp is 2^-9; 2^-8 also
//   covers the rounded aux feeding the GELU derivative). And BF16 out may
//   see the fp32 product rounded to bf16 BEFORE the epilogue adds beta C or
//   the bias or multiplies by gelu': cuBLASLt's kernels for a bf16 D do
//   that (measured on the H100, cuBLASLt 13.1: for Bias at M 33 N 17 K 3 the
//   output equals rn(rn(product) + bias) bit for bit in every element, and
//   with accumulate rn(rn(product) + C); scripts/probe/gemm_probe.cu). So
//   BF16 out also gets 2^-8 (|P| + |P + beta C|) (|x| more for the GELU
//   input), times |gelu'| for GeluBackward: up to two such roundings of the
//   sum before the epilogue (Reference::pre). Bias with accumulate may also
//   add the bias before C (at M 192 N 256 K 96 on the H200, cuBLASLt 13.1,
//   the P + C model alone was exceeded by up to 1.44x), so there the
//   rounding of P + bias is allowed too. Where the bias cancels the
//   product, that is far above 2^-8 |ref|; a wrong index, transpose or
//   missing term is still an O(s) error.
// - TF32 (hg::set_allow_tf32): inputs cut to 10-bit mantissas (rounded or
//   truncated), so up to 2^-9 s; and the result must differ from exact FP32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.hpp"
#include "core/cpu_gemm.hpp"
#include "core/cuda_runtime.hpp"
#include "core/gemm_algorithm_file.hpp"
#include "core/gemm_algorithms.hpp"
#include "core/math_mode.hpp"
#include "core/matmul_shape.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::f64;

namespace {

constexpr double kGeluC = 0.7978845608028654, kGeluA = 0.044715;
double gelu(double x) { return 0.5 * x * (1 + std::tanh(kGeluC * (x + kGeluA * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluC * (1 + 3 * kGeluA * x * x);
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

// op(a)[m][k] from a stored row-major (M, K), or (K, M) when transposed.
double op_at(const std::vector<double>& x, bool t, int64_t rows, int64_t cols, int64_t i, int64_t j) {
  return t ? x[j * rows + i] : x[i * cols + j];
}

struct Reference {
  std::vector<double> out, aux, bias_grad, scale;  // scale: s = sum |a||b| per element
  // |P| + |P + beta C| (P the product, C the old out): what rounding the
  // product and the accumulated sum to out's dtype before the epilogue can
  // move (plus |x| for a GELU output, times |gelu'(aux)| for GeluBackward).
  std::vector<double> pre, pre_aux;
  // What a tanh accurate to 2^-10 relative (a hardware tanh.approx is within
  // 2^-10.99) may move each GELU output / its bias-gradient sum.
  std::vector<double> gelu_slack, bias_grad_slack;
};

constexpr double kTanhRel = 1.0 / 1024;

// The float64 result of gemm on the values of a, b, bias, aux and the old out.
Reference reference(const Case& c, const Tensor& a, const Tensor& b, const Tensor& old_out, const GemmArgs& args) {
  const auto av = f64(a).to_vector(), bv = f64(b).to_vector(), ov = f64(old_out).to_vector();
  const std::vector<double> bias = args.bias ? f64(*args.bias).to_vector() : std::vector<double>();
  const std::vector<double> aux_in = args.aux ? f64(*args.aux).to_vector() : std::vector<double>();
  Reference r;
  r.out.assign(c.m * c.n, 0);
  r.scale.assign(c.m * c.n, 0);
  r.aux.assign(c.m * c.n, 0);
  r.gelu_slack.assign(c.m * c.n, 0);
  r.bias_grad_slack.assign(c.n, 0);
  r.pre.assign(c.m * c.n, 0);
  r.pre_aux.assign(c.m * c.n, 0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, s = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = op_at(av, c.ta, c.m, c.k, i, p), y = op_at(bv, c.tb, c.k, c.n, p, j);
        sum += x * y;
        s += std::abs(x * y);
      }
      const double product = sum;
      if (args.accumulate) sum += ov[i * c.n + j];
      r.scale[i * c.n + j] = s + (args.accumulate ? std::abs(ov[i * c.n + j]) : 0);
      r.pre[i * c.n + j] = r.pre_aux[i * c.n + j] = std::abs(product) + std::abs(sum);
      double v = sum;
      switch (args.epilogue) {
        case GemmEpilogue::Bias:
          v = sum + bias[j];
          r.scale[i * c.n + j] += std::abs(bias[j]);
          // With accumulate, the bias may come before C: rn(rn(P) + bias) + C.
          if (args.accumulate) r.pre[i * c.n + j] += std::abs(product + bias[j]);
          break;
        case GemmEpilogue::BiasGelu: {
          r.scale[i * c.n + j] += std::abs(bias[j]);
          const double x = sum + bias[j];
          r.aux[i * c.n + j] = x;
          r.pre[i * c.n + j] += std::abs(x);
          v = gelu(x);
          const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
          r.gelu_slack[i * c.n + j] = 0.5 * std::abs(x) * (kTanhRel * std::abs(t) + 1e-7);
          break;
        }
        case GemmEpilogue::GeluBackward: {
          const double x = aux_in[i * c.n + j];
          v = sum * gelu_grad(x);
          r.pre[i * c.n + j] *= std::abs(gelu_grad(x));
          // d gelu' / d t = 0.5 - x t c (1 + 3 a x^2)
          const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
          const double slack = std::abs(sum) * std::abs(0.5 - x * t * kGeluC * (1 + 3 * kGeluA * x * x)) *
                               (kTanhRel * std::abs(t) + 1e-7);
          r.gelu_slack[i * c.n + j] = slack;
          r.bias_grad_slack[j] += slack;
          break;
        }
        default: break;
      }
      r.out[i * c.n + j] = v;
    }
  if (args.epilogue == GemmEpilogue::BiasGradA) {
    r.bias_grad.assign(c.m, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t p = 0; p < c.k; ++p) r.bias_grad[i] += op_at(av, c.ta, c.m, c.k, i, p);
  } else if (args.epilogue == GemmEpilogue::BiasGradB) {
    r.bias_grad.assign(c.n, 0);
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t p = 0; p < c.k; ++p) r.bias_grad[j] += op_at(bv, c.tb, c.k, c.n, p, j);
  } else if (args.epilogue == GemmEpilogue::GeluBackward) {
    r.bias_grad.assign(c.n, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) r.bias_grad[j] += r.out[i * c.n + j];
  }
  return r;
}

struct Tolerance {
  double per_scale;  // times s
  double rel;        // times |ref|
  double abs;
  double pre = 0;  // times Reference::pre (BF16 out: the product rounded before the epilogue)
};

// Worst violation ratio |got - want| / bound (<= 1 passes).
double worst_ratio(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& s,
                   const Tolerance& tol, const std::vector<double>& slack = {}, const std::vector<double>& pre = {}) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = tol.per_scale * (s.empty() ? 0 : s[i]) + tol.rel * std::abs(want[i]) + tol.abs +
                         (slack.empty() ? 0 : slack[i]) + (pre.empty() ? 0 : tol.pre * pre[i]);
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= bound)) worst = std::max(worst, std::isfinite(err) ? err / bound : 1e30);
  }
  return worst;
}

// The bias-gradient sums have their own scale: sum of |terms|.
std::vector<double> bias_grad_scale(const Reference& r, const Case& c, GemmEpilogue e, const Tensor& a,
                                    const Tensor& b) {
  const auto av = f64(a).to_vector(), bv = f64(b).to_vector();
  std::vector<double> s;
  if (e == GemmEpilogue::BiasGradA) {
    s.assign(c.m, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t p = 0; p < c.k; ++p) s[i] += std::abs(op_at(av, c.ta, c.m, c.k, i, p));
  } else if (e == GemmEpilogue::BiasGradB) {
    s.assign(c.n, 0);
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t p = 0; p < c.k; ++p) s[j] += std::abs(op_at(bv, c.tb, c.k, c.n, p, j));
  } else {
    s.assign(c.n, 0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) s[j] += std::abs(r.out[i * c.n + j]) + 1.13 * r.scale[i * c.n + j];
  }
  return s;
}

// The hg::Error message of f(), or "" when it does not throw one.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
#define CHECK_THAT_ERROR(call, needle)                \
  do {                                                \
    const std::string hg_msg_ = error_of(call);       \
    INFO("message: " << hg_msg_);                     \
    CHECK(hg_msg_.find(needle) != std::string::npos); \
  } while (0)

const GemmEpilogue kEpilogues[] = {GemmEpilogue::None,         GemmEpilogue::Bias,      GemmEpilogue::BiasGelu,
                                   GemmEpilogue::GeluBackward, GemmEpilogue::BiasGradA, GemmEpilogue::BiasGradB};

// Runs every epilogue x transpose x accumulate on one shape and checks it.
// in: operand dtype; out_dtype: out (and aux, bias, bias_grad) dtype.
void check_all_epilogues(Device dev, DType in, DType out_dtype, int64_t m, int64_t n, int64_t k, const Tolerance& tol,
                         bool gelu_epilogues = true) {
  Generator gen(1234 + m * 7 + n * 13 + k);
  for (const GemmEpilogue e : kEpilogues) {
    if (!gelu_epilogues && (e == GemmEpilogue::BiasGelu || e == GemmEpilogue::GeluBackward)) continue;
    for (int t = 0; t < 4; ++t)
      for (const bool acc : {false, true}) {
        if (acc && e == GemmEpilogue::GeluBackward) continue;
        const Case c{m, n, k, (t & 1) != 0, (t & 2) != 0};
        INFO("epilogue " << gemm_epilogue_name(e) << " M " << m << " N " << n << " K " << k << " ta " << c.ta << " tb "
                         << c.tb << " accumulate " << acc << " " << dtype_name(in) << " -> " << dtype_name(out_dtype));
        const Tensor a = Tensor::randn(c.ta ? Shape{k, m} : Shape{m, k}, gen, DType::F64).to(in).to(dev);
        const Tensor b = Tensor::randn(c.tb ? Shape{n, k} : Shape{k, n}, gen, DType::F64).to(in).to(dev);
        Tensor out = Tensor::randn({m, n}, gen, DType::F64).to(out_dtype).to(dev);
        const Tensor old_out = out.clone();
        Tensor bias = Tensor::randn({n}, gen, DType::F64).to(out_dtype).to(dev);
        Tensor aux = Tensor::randn({m, n}, gen, DType::F64, Device::CPU, 0.0, 2.0).to(out_dtype).to(dev);
        Tensor bias_grad = Tensor::full({e == GemmEpilogue::BiasGradA ? m : n}, 99.0, out_dtype, dev);
        GemmArgs args;
        args.transpose_a = c.ta;
        args.transpose_b = c.tb;
        args.accumulate = acc;
        args.epilogue = e;
        if (e == GemmEpilogue::Bias || e == GemmEpilogue::BiasGelu) args.bias = &bias;
        if (e == GemmEpilogue::BiasGelu || e == GemmEpilogue::GeluBackward) args.aux = &aux;
        if (e == GemmEpilogue::BiasGradA || e == GemmEpilogue::BiasGradB || e == GemmEpilogue::GeluBackward)
          args.bias_grad = &bias_grad;
        const Reference r = reference(c, a, b, old_out, args);
        backend_for(dev).gemm(a, b, out, args);
        // The GELU epilogues on the GPU may use an approximate tanh (see Reference).
        const bool approx_tanh = dev == Device::CUDA;
        const Tolerance out_tol{tol.per_scale * 1.13, tol.rel, tol.abs, tol.pre * 1.13};
        CHECK(worst_ratio(f64(out).to_vector(), r.out, r.scale, out_tol,
                          approx_tanh ? r.gelu_slack : std::vector<double>(), r.pre) <= 1.0);
        if (e == GemmEpilogue::BiasGelu)
          CHECK(worst_ratio(f64(aux).to_vector(), r.aux, r.scale, tol, {}, r.pre_aux) <= 1.0);
        if (args.bias_grad) {
          // GeluBackward's sum is of the rounded out values on the device: 2 x rel.
          const Tolerance bg_tol{tol.per_scale + tol.rel, tol.rel, tol.abs};
          const bool slack = approx_tanh && e == GemmEpilogue::GeluBackward;
          CHECK(worst_ratio(f64(bias_grad).to_vector(), r.bias_grad, bias_grad_scale(r, c, e, a, b), bg_tol,
                            slack ? r.bias_grad_slack : std::vector<double>()) <= 1.0);
        }
      }
  }
}

}  // namespace

TEST_CASE("gemm on the CPU: every epilogue, transpose and accumulate vs float64 loops", "[gemm]") {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {3, 40, 2}}) {
    check_all_epilogues(Device::CPU, DType::F64, DType::F64, m, n, k, {1e-12, 0, 1e-300});
    check_all_epilogues(Device::CPU, DType::F32, DType::F32, m, n, k, {1e-5, 0, 1e-6});
  }
}

TEST_CASE("gemm on the CPU, tiled: the float32 epilogues run per tile at every GEMM level", "[gemm]") {
  // Over the tiling threshold, with ragged edge tiles and several depth
  // blocks: the float32 Bias, BiasGelu and GeluBackward run on each tile of
  // C as it is finished (core/cpu_matmul.hpp), at every level's kernel.
  const std::string saved = cpu::gemm_level();
  for (const std::string& level : cpu::gemm_levels()) {
    INFO("GEMM level " << level);
    cpu::set_gemm_level(level);
    check_all_epilogues(Device::CPU, DType::F32, DType::F32, 130, 97, 300, {1e-5, 0, 1e-6});
  }
  cpu::set_gemm_level(saved);
  check_all_epilogues(Device::CPU, DType::F64, DType::F64, 130, 97, 300, {1e-12, 0, 1e-300});
}

TEST_CASE("gemm rejects what it cannot do with a clear message", "[gemm]") {
  Generator gen(7);
  const Tensor a = Tensor::randn({4, 3}, gen), b = Tensor::randn({3, 5}, gen);
  Tensor out = Tensor::zeros({4, 5});
  Tensor bias = Tensor::zeros({5}), aux = Tensor::zeros({4, 5}), bg = Tensor::zeros({5});
  Backend& be = cpu_backend();
  GemmArgs args;
  args.epilogue = GemmEpilogue::Bias;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "needs a bias");
  args.bias = &bias;
  args.aux = &aux;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "takes no aux");
  args = GemmArgs();
  args.epilogue = GemmEpilogue::GeluBackward;
  args.aux = &aux;
  args.accumulate = true;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "cannot accumulate");
  args = GemmArgs();
  args.epilogue = GemmEpilogue::BiasGradA;
  args.bias_grad = &bg;  // (5,) but BiasGradA sums to (M,) = (4,)
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "expected (4)");
  args = GemmArgs();
  args.epilogue = GemmEpilogue::Bias;
  Tensor bias_wrong = Tensor::zeros({4});
  args.bias = &bias_wrong;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "expected (5)");
  const Tensor a3 = Tensor::randn({2, 4, 3}, gen);
  Tensor out3 = Tensor::zeros({2, 4, 5});
  args.bias = &bias;
  CHECK_THAT_ERROR([&] { be.gemm(a3, b, out3, args); }, "needs 2-D operands");
  args = GemmArgs();
  Tensor out_f64 = Tensor::zeros({4, 5}, DType::F64);
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out_f64, args); }, "out has dtype f64");
  Tensor aux_alias = out;
  args.epilogue = GemmEpilogue::BiasGelu;
  args.bias = &bias;
  args.aux = &aux_alias;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "different tensors");
  const Tensor a_bf16 = a.to(DType::BF16), b_bf16 = b.to(DType::BF16);
  CHECK_THAT_ERROR([&] { be.gemm(a_bf16, b_bf16, out, GemmArgs()); }, "f32 or f64");
  args = GemmArgs();
  args.bias_grad_accumulate = true;
  CHECK_THAT_ERROR([&] { be.gemm(a, b, out, args); }, "no bias_grad to add to");
}

namespace {

// bias_grad_accumulate: bias_grad += the sums, bit for bit the sums written
// to a temp and then added to bias_grad by the backend's zip (what
// models/linear.cpp did before the GEMM added them itself); out unchanged.
void check_bias_grad_accumulate(Device dev, DType in, DType out_dtype, DType bg_dtype) {
  Generator gen(77);
  Backend& be = backend_for(dev);
  const int64_t m = 37, n = 24, k = 70;
  for (const GemmEpilogue e : {GemmEpilogue::BiasGradA, GemmEpilogue::BiasGradB, GemmEpilogue::GeluBackward})
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      INFO("epilogue " << gemm_epilogue_name(e) << " ta " << ta << " tb " << tb << " " << dtype_name(in) << " -> "
                       << dtype_name(out_dtype) << ", bias_grad " << dtype_name(bg_dtype));
      const Tensor a = Tensor::randn(ta ? Shape{k, m} : Shape{m, k}, gen, DType::F64).to(in).to(dev);
      const Tensor b = Tensor::randn(tb ? Shape{n, k} : Shape{k, n}, gen, DType::F64).to(in).to(dev);
      Tensor aux = Tensor::randn({m, n}, gen, DType::F64).to(out_dtype).to(dev);
      const int64_t len = e == GemmEpilogue::BiasGradA ? m : n;
      const Tensor start = Tensor::randn({len}, gen, DType::F64, Device::CPU, 0.0, 3.0).to(bg_dtype).to(dev);
      Tensor out_written = Tensor::zeros({m, n}, out_dtype, dev), out_added = out_written.clone();
      Tensor sums = Tensor::full({len}, 99.0, bg_dtype, dev), added = start.clone();
      GemmArgs args;
      args.transpose_a = ta;
      args.transpose_b = tb;
      args.epilogue = e;
      if (e == GemmEpilogue::GeluBackward) args.aux = &aux;
      args.bias_grad = &sums;
      be.gemm(a, b, out_written, args);
      Tensor composed = start.clone();
      be.zip(BinaryOp::Add, composed, sums, composed);
      args.bias_grad = &added;
      args.bias_grad_accumulate = true;
      be.gemm(a, b, out_added, args);
      CHECK(hg::test::same_bytes(added, composed));
      CHECK(hg::test::same_bytes(out_added, out_written));
    }
}

}  // namespace

TEST_CASE("gemm bias_grad_accumulate on the CPU: bitwise the written sums plus one add", "[gemm]") {
  check_bias_grad_accumulate(Device::CPU, DType::F32, DType::F32, DType::F32);
  check_bias_grad_accumulate(Device::CPU, DType::F64, DType::F64, DType::F64);
}

TEST_CASE("CUDA gemm bias_grad_accumulate: bitwise the written sums plus one add", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  check_bias_grad_accumulate(Device::CUDA, DType::F32, DType::F32, DType::F32);
  check_bias_grad_accumulate(Device::CUDA, DType::BF16, DType::BF16, DType::F32);
  check_bias_grad_accumulate(Device::CUDA, DType::BF16, DType::F32, DType::F32);
}

TEST_CASE("gemm with batched operands and no epilogue equals matmul", "[gemm]") {
  Generator gen(11);
  const Tensor a = Tensor::randn({3, 5, 7}, gen), b = Tensor::randn({7, 4}, gen);
  Tensor via_gemm = Tensor::zeros({3, 5, 4}), via_matmul = Tensor::zeros({3, 5, 4});
  cpu_backend().gemm(a, b, via_gemm, GemmArgs());
  cpu_backend().matmul(a, b, via_matmul, false, false);
  CHECK(hg::test::max_abs_diff(via_gemm, via_matmul) == 0.0);
}

TEST_CASE("CUDA gemm, exact FP32: every epilogue vs float64 (also shows cuBLASLt's GELU is the tanh form)",
          "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{7, 16, 5}, {33, 24, 65}, {130, 40, 200}})
    check_all_epilogues(Device::CUDA, DType::F32, DType::F32, m, n, k, {1e-5, 0, 1e-6});
  // N not a multiple of 8: every epilogue without a GELU aux.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {33, 17, 65}})
    check_all_epilogues(Device::CUDA, DType::F32, DType::F32, m, n, k, {1e-5, 0, 1e-6}, false);
}

TEST_CASE("CUDA gemm, BF16 operands with fp32 accumulation, BF16 or F32 out", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  // One rounding of the result, and of the product before the epilogue (see the top).
  const Tolerance kBf16Out{1e-5, std::ldexp(1.0, -8), 1e-6, std::ldexp(1.0, -8)};
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{7, 16, 5}, {33, 24, 65}, {130, 40, 200}, {192, 256, 96}}) {
    check_all_epilogues(Device::CUDA, DType::BF16, DType::F32, m, n, k, {1e-5, 0, 1e-6});
    check_all_epilogues(Device::CUDA, DType::BF16, DType::BF16, m, n, k, kBf16Out);
  }
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {33, 17, 3}}) {
    check_all_epilogues(Device::CUDA, DType::BF16, DType::F32, m, n, k, {1e-5, 0, 1e-6}, false);
    check_all_epilogues(Device::CUDA, DType::BF16, DType::BF16, m, n, k, kBf16Out, false);
  }
}

TEST_CASE("gemm algorithm choice: names parsed, anything else refused with the allowed names", "[gemm]") {
  CHECK(parse_gemm_algorithms("heuristic") == GemmAlgorithms::Heuristic);
  CHECK(parse_gemm_algorithms("measured") == GemmAlgorithms::Measured);
  CHECK(std::string(gemm_algorithms_name(GemmAlgorithms::Measured)) == "measured");
  CHECK_THAT_ERROR([] { parse_gemm_algorithms("fastest"); }, "unknown choice 'fastest'; allowed: heuristic, measured");
  CHECK(gemm_algorithms() == GemmAlgorithms::Heuristic);  // the default
}

// Sets the choice for one scope; the heuristic again after it.
struct MeasuredGemms {
  MeasuredGemms() { set_gemm_algorithms(GemmAlgorithms::Measured); }
  ~MeasuredGemms() { set_gemm_algorithms(GemmAlgorithms::Heuristic); }
};

TEST_CASE("CUDA gemm, measured algorithms: every epilogue within its bound, timing on scratch, repeatable",
          "[gemm][cuda][measured]") {
  HG_REQUIRE_GPU();
  MeasuredGemms measured;
  const size_t before = gemm_algorithm_choices().size();
  // Accumulating forms are among them: a timed launch that wrote the call's
  // own out would add the product more than once.
  const Tolerance kBf16Out{1e-5, std::ldexp(1.0, -8), 1e-6, std::ldexp(1.0, -8)};
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{33, 24, 65}, {130, 40, 200}, {192, 256, 96}}) {
    check_all_epilogues(Device::CUDA, DType::BF16, DType::BF16, m, n, k, kBf16Out);
    check_all_epilogues(Device::CUDA, DType::F32, DType::F32, m, n, k, {1e-5, 0, 1e-6});
  }
  const std::vector<GemmAlgorithmChoice> choices = gemm_algorithm_choices();
  REQUIRE(choices.size() > before);  // new shapes were measured
  for (size_t i = before; i < choices.size(); ++i) {
    const GemmAlgorithmChoice& c = choices[i];
    INFO(c.gemm << ": candidate " << c.chosen << " of " << c.candidates << " (" << c.algorithm << "), " << c.chosen_us
                << " us, first " << c.first_us << " us");
    CHECK(c.candidates >= 2);
    CHECK((c.chosen >= 0 && c.chosen < c.candidates));
    CHECK(c.chosen_us > 0.0);
    CHECK((c.first_us < 0.0 || c.chosen_us <= c.first_us));  // the first is refused, or no faster
  }
  // A shape whose first call accumulates: its candidates are timed before
  // that call, so into scratch, or out would hold the product many times.
  {
    Generator g(79);
    const Tensor a = Tensor::randn({256, 128}, g, DType::BF16, Device::CUDA);
    const Tensor b = Tensor::randn({128, 160}, g, DType::BF16, Device::CUDA);
    const Tensor old = Tensor::randn({256, 160}, g, DType::F32, Device::CUDA);
    Tensor out = old.clone();
    GemmArgs acc;
    acc.accumulate = true;
    const size_t measured_before = gemm_algorithm_choices().size();
    cuda_backend().gemm(a, b, out, acc);
    CHECK(gemm_algorithm_choices().size() == measured_before + 1);
    Tensor want = f64(old);
    cpu_backend().gemm(f64(a), f64(b), want, acc);
    // K = 128 products of N(0,1) bf16 values in fp32: far under 1e-3.
    CHECK(hg::test::max_abs_diff(f64(out), want) < 1e-3);
  }
  // The kept algorithm is the same on every later call: bitwise equal outputs.
  Generator gen(77);
  const Tensor a = Tensor::randn({320, 768}, gen, DType::BF16, Device::CUDA);
  const Tensor b = Tensor::randn({768, 1024}, gen, DType::BF16, Device::CUDA);
  Tensor first = Tensor::zeros({320, 1024}, DType::BF16, Device::CUDA), second = first.clone();
  cuda_backend().gemm(a, b, first, GemmArgs());
  cuda_backend().gemm(a, b, second, GemmArgs());
  CHECK(hg::test::max_abs_diff(first, second) == 0.0);
}

TEST_CASE("CUDA gemm, measured algorithms: a shape first seen in a graph capture keeps the heuristic's",
          "[gemm][cuda][measured]") {
  HG_REQUIRE_GPU();
  MeasuredGemms measured;
  Generator gen(78);
  const Tensor a = Tensor::randn({96, 72}, gen, DType::BF16, Device::CUDA);
  const Tensor b = Tensor::randn({72, 40}, gen, DType::BF16, Device::CUDA);
  Tensor got = Tensor::zeros({96, 40}, DType::F32, Device::CUDA);
  Tensor other = Tensor::zeros({40, 40}, DType::F32, Device::CUDA);  // the GEMM workspace exists before the capture
  cuda_backend().gemm(a.slice(0, 40), b, other, GemmArgs());
  const size_t before = gemm_algorithm_choices().size();
  gpu::Graph graph;
  graph.begin_capture();
  cuda_backend().gemm(a, b, got, GemmArgs());  // nothing may be timed while capturing
  graph.end_capture();
  graph.replay();
  CHECK(gemm_algorithm_choices().size() == before);
  Tensor want = Tensor::zeros({96, 40}, DType::F64);
  cpu_backend().matmul(f64(a), f64(b), want, false, false);
  // K = 72 products of N(0,1) bf16 values in fp32: far under 1e-3.
  CHECK(hg::test::max_abs_diff(f64(got), want) < 1e-3);
}

TEST_CASE("CUDA gemm, measured algorithms with a file: a saved shape is taken untimed, same bits; a stale entry is "
          "measured again",
          "[gemm][cuda][measured]") {
  HG_REQUIRE_GPU();
  MeasuredGemms measured;
  const auto dir = hg::test::make_temp_dir("gemm_file_cuda");
  const std::string path = (dir / "gemms.json").string();
  Generator gen(80);
  const Tensor a = Tensor::randn({288, 640}, gen, DType::BF16, Device::CUDA);
  const Tensor b = Tensor::randn({640, 576}, gen, DType::BF16, Device::CUDA);
  const auto run = [&] {
    Tensor out = Tensor::zeros({288, 576}, DType::BF16, Device::CUDA);
    cuda_backend().gemm(a, b, out, GemmArgs());
    return out;
  };
  set_gemm_algorithm_file(path);
  const Tensor measured_out = run();
  const GemmAlgorithmChoice timed = gemm_algorithm_choices().back();
  CHECK_FALSE(timed.from_file);
  CHECK(gemm_algorithm_file()->size() == 1);
  SavedGemmAlgorithm saved = gemm_algorithm_file()->entries().front();
  CHECK(saved.gemm == timed.gemm);
  CHECK(saved.device == gpu::device_name());
  CHECK(saved.candidate == timed.chosen);
  CHECK(saved.algorithm == timed.algorithm);

  set_gemm_algorithm_file(path);  // as a later process would: the shape is planned again, from the file
  const Tensor again = run();
  const GemmAlgorithmChoice reused = gemm_algorithm_choices().back();
  CHECK(reused.from_file);
  CHECK(reused.chosen == timed.chosen);
  CHECK(hg::test::max_abs_diff(measured_out, again) == 0.0);

  // An entry whose configuration no longer matches the candidate at its index is measured again and replaced.
  saved.algorithm = "id 999999";
  gemm_algorithm_file()->save(saved);
  set_gemm_algorithm_file(path);
  run();
  CHECK_FALSE(gemm_algorithm_choices().back().from_file);
  REQUIRE(gemm_algorithm_file()->size() == 1);
  CHECK(gemm_algorithm_file()->entries().front().algorithm != "id 999999");
  set_gemm_algorithm_file("");
  std::filesystem::remove_all(dir);
}

TEST_CASE("CUDA gemm: a bf16 bias with f32 out is refused, an f32 bias with bf16 out works", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(5);
  const Tensor a = Tensor::randn({9, 16}, gen, DType::BF16, Device::CUDA);
  const Tensor b = Tensor::randn({16, 24}, gen, DType::BF16, Device::CUDA);
  const Tensor bias = Tensor::randn({24}, gen, DType::F32, Device::CUDA);
  Tensor out = Tensor::zeros({9, 24}, DType::BF16, Device::CUDA);
  GemmArgs args;
  args.epilogue = GemmEpilogue::Bias;
  args.bias = &bias;
  cuda_backend().gemm(a, b, out, args);
  Tensor want = Tensor::zeros({9, 24}, DType::F64);
  GemmArgs ref_args = args;
  const Tensor bias64 = f64(bias);
  ref_args.bias = &bias64;
  cpu_backend().gemm(f64(a), f64(b), want, ref_args);
  // Fused with the F32 bias, or (where cuBLASLt has no such form) the GEMM
  // and bias add in F32: either way one rounding to bf16 at the end.
  const auto got = f64(out).to_vector(), w = want.to_vector();
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - w[i]) <= std::ldexp(std::abs(w[i]), -8) + 1e-4);
  Tensor out_f32 = Tensor::zeros({9, 24}, DType::F32, Device::CUDA);
  const Tensor bias_bf16 = bias.to(DType::BF16);
  args.bias = &bias_bf16;
  CHECK_THAT_ERROR([&] { cuda_backend().gemm(a, b, out_f32, args); }, "bias has dtype");
}

namespace {

// A bf16 GeluBackward on the device: out = (a b) * gelu'(pre) and its column
// sums into the f32 bias_grad (written, not added).
void gelu_backward_cuda(const Tensor& a, const Tensor& b, Tensor& pre, Tensor& out, Tensor& bias_grad) {
  GemmArgs args;
  args.epilogue = GemmEpilogue::GeluBackward;
  args.aux = &pre;
  args.bias_grad = &bias_grad;
  cuda_backend().gemm(a, b, out, args);
}

}  // namespace

// The first FFN linear's bias gradient (models/linear.cpp): GeluBackward
// with bf16 out and an f32 bias_grad sums the rounded out columns in f32 and
// writes them in f32. Against the float64 sums of the same bf16 out values:
// a float32 sum of M terms in any order is within (M + 8) 2^-24 sum |out|
// (at M 300 about 1.8e-5 of it); a bf16 rounding of the sum (2^-9 of the
// sum, whose magnitude is near sqrt(M) |out| beside sum |out| ~ M |out|)
// exceeds that bound in most columns.
TEST_CASE("CUDA gemm: GeluBackward's f32 bias gradient over bf16 out is the f32 sum of the out columns",
          "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(6);
  const int64_t m = 300, n = 72, k = 40;
  const Tensor a = Tensor::randn({m, k}, gen, DType::BF16, Device::CUDA);
  const Tensor b = Tensor::randn({k, n}, gen, DType::BF16, Device::CUDA);
  Tensor aux = Tensor::randn({m, n}, gen, DType::BF16, Device::CUDA);
  Tensor out = Tensor::zeros({m, n}, DType::BF16, Device::CUDA);
  Tensor bias_grad = Tensor::full({n}, 99.0, DType::F32, Device::CUDA);
  gelu_backward_cuda(a, b, aux, out, bias_grad);
  const auto o = f64(out).to_vector(), got = f64(bias_grad).to_vector();
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0, magnitude = 0;
    for (int64_t i = 0; i < m; ++i) sum += o[i * n + j], magnitude += std::abs(o[i * n + j]);
    INFO("column " << j << " sum " << sum << " got " << got[j]);
    CHECK(std::abs(got[j] - sum) <= double(m + 8) * std::ldexp(magnitude, -24));
  }
}

// NaN through GeluBackward (cuBLASLt's DGELU, then the column sums): a NaN
// in pre makes that element of out NaN and its column's bias gradient only;
// a NaN in a row of dy makes that row of out NaN and so every column's sum.
TEST_CASE("CUDA gemm GeluBackward: a NaN in pre or dy reaches the outputs that read it", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(22);
  const int64_t m = 200, n = 144, k = 96;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const bool in_dy : {false, true}) {
    INFO((in_dy ? "NaN in dy[150][5]" : "NaN in pre[10][20]"));
    Tensor a_host = Tensor::randn({m, k}, gen, DType::F64).to(DType::BF16);
    Tensor pre_host = Tensor::randn({m, n}, gen, DType::F64).to(DType::BF16);
    if (in_dy) a_host.set({150, 5}, nan);
    else pre_host.set({10, 20}, nan);
    const Tensor a = a_host.to(Device::CUDA);
    const Tensor b = Tensor::randn({k, n}, gen, DType::F64).to(DType::BF16).to(Device::CUDA);
    Tensor pre = pre_host.to(Device::CUDA);
    Tensor out = Tensor::zeros({m, n}, DType::BF16, Device::CUDA);
    Tensor bias_grad = Tensor::zeros({n}, DType::F32, Device::CUDA);
    gelu_backward_cuda(a, b, pre, out, bias_grad);
    const auto o = f64(out).to_vector(), s = f64(bias_grad).to_vector();
    int64_t nan_count = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const bool want_nan = in_dy ? i == 150 : (i == 10 && j == 20);
        nan_count += std::isnan(o[i * n + j]);
        if (want_nan != bool(std::isnan(o[i * n + j]))) FAIL_CHECK("out[" << i << "][" << j << "] = " << o[i * n + j]);
      }
    CHECK(nan_count == (in_dy ? n : 1));
    for (int64_t j = 0; j < n; ++j) CHECK(bool(std::isnan(s[j])) == (in_dy || j == 20));
  }
}

TEST_CASE("CUDA gemm: unaligned views (2-byte offsets) and batched operands", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(9);
  // Row 1 onward of a (10, 7) bf16 tensor starts 14 bytes in: no 16-byte alignment.
  const Tensor a_full = Tensor::randn({10, 7}, gen, DType::BF16, Device::CUDA);
  const Tensor a = a_full.slice(1, 10);
  const Tensor b = Tensor::randn({7, 5}, gen, DType::BF16, Device::CUDA);
  Tensor out = Tensor::zeros({9, 5}, DType::F32, Device::CUDA);
  cuda_backend().gemm(a, b, out, GemmArgs());
  Tensor want = Tensor::zeros({9, 5}, DType::F64);
  cpu_backend().matmul(f64(a), f64(b), want, false, false);
  CHECK(hg::test::max_abs_diff(f64(out), want) <= 1e-4);
  // Batched, shared b, through matmul: bf16 in, bf16 out.
  const Tensor x = Tensor::randn({3, 5, 24}, gen, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::randn({24, 8}, gen, DType::BF16, Device::CUDA);
  Tensor y = Tensor::zeros({3, 5, 8}, DType::BF16, Device::CUDA);
  cuda_backend().matmul(x, w, y, false, false);
  Tensor y_want = Tensor::zeros({3, 5, 8}, DType::F64);
  cpu_backend().matmul(f64(x), f64(w), y_want, false, false);
  const auto got = f64(y).to_vector(), ref = y_want.to_vector();
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - ref[i]) <= std::ldexp(std::abs(ref[i]), -8) + 1e-4);
}

TEST_CASE("CUDA gemm: TF32 only when allowed, within its bound", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  REQUIRE_FALSE(allow_tf32());
  Generator gen(3);
  const Case c{64, 48, 256, false, false};
  const Tensor a = Tensor::randn({64, 256}, gen, DType::F32, Device::CUDA);
  const Tensor b = Tensor::randn({256, 48}, gen, DType::F32, Device::CUDA);
  Tensor exact = Tensor::zeros({64, 48}, DType::F32, Device::CUDA), fast = exact.clone();
  cuda_backend().gemm(a, b, exact, GemmArgs());
  set_allow_tf32(true);
  cuda_backend().gemm(a, b, fast, GemmArgs());
  set_allow_tf32(false);
  const Reference r = reference(c, a, b, exact, GemmArgs());
  // TF32 keeps 10 mantissa bits of each operand: rounded, each is off by
  // 2^-11 relative, truncated by up to 2^-10, so each product by up to 2^-9:
  // 2^-9 s bounds the sum (plus the fp32 accumulation).
  CHECK(worst_ratio(f64(exact).to_vector(), r.out, r.scale, {1e-5, 0, 1e-6}) <= 1.0);
  CHECK(worst_ratio(f64(fast).to_vector(), r.out, r.scale, {std::ldexp(1.0, -9) + 1e-5, 0, 1e-6}) <= 1.0);
  CHECK(hg::test::max_abs_diff(exact, fast) > 0.0);  // the switch really changes the arithmetic
}

TEST_CASE("CUDA gemm: cuBLASLt's GELU epilogue is the tanh form (UnaryOp::Gelu), not erf", "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  // out = gelu(a * 1 + 0): K = 1 and b = 1, so the pre-activation is a exactly.
  const int64_t m = 65536, n = 8;
  std::vector<double> av(m);
  for (int64_t i = 0; i < m; ++i) av[i] = -5.0 + 10.0 * double(i) / double(m - 1);
  const Tensor a = Tensor::from_vector(av, {m, 1}, DType::F32, Device::CUDA);
  const Tensor b = Tensor::ones({1, n}, DType::F32, Device::CUDA);
  const Tensor bias = Tensor::zeros({n}, DType::F32, Device::CUDA);
  Tensor out = Tensor::zeros({m, n}, DType::F32, Device::CUDA), aux = out.clone();
  GemmArgs args;
  args.epilogue = GemmEpilogue::BiasGelu;
  args.bias = &bias;
  args.aux = &aux;
  cuda_backend().gemm(a, b, out, args);
  const auto got = f64(out).to_vector();
  // d = out - gelu_tanh, e = gelu_erf - gelu_tanh. The erf form would give
  // d ~ e; the tanh form gives d ~ the epilogue's own tanh error, which does
  // not follow e. So the projection beta = <d, e> / <e, e> is ~1 for erf and
  // ~0 for tanh, even when that error is as large as e (a hardware tanh).
  double de = 0, ee = 0, max_tanh = 0, max_erf = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double x = double(static_cast<float>(av[i]));
    const double erf_form = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    const double d = got[i * n] - gelu(x), e = erf_form - gelu(x);
    de += d * e;
    ee += e * e;
    max_tanh = std::max(max_tanh, std::abs(d));
    max_erf = std::max(max_erf, std::abs(got[i * n] - erf_form));
  }
  const double beta = de / ee;
  WARN("cuBLASLt GELU epilogue on [-5, 5]: max |out - gelu_tanh| " << max_tanh << ", max |out - gelu_erf| " << max_erf
                                                                   << ", beta " << beta);
  CHECK(std::abs(beta) < 0.3);
}

TEST_CASE("CUDA matmul through cuBLASLt: batched forms (strided, shared b folded, shared b transposed a)",
          "[gemm][cuda]") {
  HG_REQUIRE_GPU();
  Generator gen(21);
  struct Form {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Form> forms = {
      {{2, 3, 5, 7}, {2, 3, 7, 4}, false, false},  // strided batches (attention scores)
      {{2, 3, 5, 7}, {2, 3, 4, 7}, false, true},
      {{2, 3, 7, 5}, {2, 3, 7, 4}, true, false},
      {{4, 5, 7}, {7, 6}, false, false},  // shared b: folded into one GEMM of 20 rows
      {{4, 7, 5}, {7, 6}, true, false},   // shared b, transposed a: one GEMM per batch
      {{4, 7, 5}, {6, 7}, true, true},
  };
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const Form& f : forms) {
      INFO(dtype_name(dtype) << " a " << shape_str(f.a) << " b " << shape_str(f.b) << " ta " << f.ta << " tb " << f.tb);
      const Tensor a = Tensor::randn(f.a, gen, DType::F32, Device::CUDA).to(dtype);
      const Tensor b = Tensor::randn(f.b, gen, DType::F32, Device::CUDA).to(dtype);
      const Tensor a64 = f64(a), b64 = f64(b);
      Tensor want = Tensor::zeros(matmul_shape(f.a, f.b, f.ta, f.tb, "test").out, DType::F64);
      cpu_backend().matmul(a64, b64, want, f.ta, f.tb);
      Tensor got = Tensor::zeros(want.shape(), dtype, Device::CUDA);
      cuda_backend().matmul(a, b, got, f.ta, f.tb);
      // K = 7 products of N(0,1) values: |err| <= 1e-5 * 7 * 16 (f32), plus
      // the bf16 rounding of out, 2^-9 |want| (bound 2^-8).
      const auto g = f64(got).to_vector(), w = want.to_vector();
      for (size_t i = 0; i < g.size(); ++i)
        CHECK(std::abs(g[i] - w[i]) <= 1e-3 + (dtype == DType::BF16 ? std::ldexp(std::abs(w[i]), -8) : 0.0));
    }
}
