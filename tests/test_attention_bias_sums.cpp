// The QKV projection's bias gradient summed by the attention backward's
// CUDA kernels as they store dq, dk and dv (attention_backward_packed_bias,
// cuda/attention_column_sums.cuh): against float64 column sums of the dqkv
// the same call returns, bitwise repeatable, left untouched wherever the
// kernels do not sum (mma.sync, CPU), and inside MultiHeadAttention against
// the softmax core.
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/kernel_mode.hpp"
#include "cuda/attention_kernels.hpp"
#include "models/attention.hpp"
#include "ops/attention.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::AttentionSaved;
using hg::Device;
using hg::DType;
using hg::KernelMode;
using hg::Tensor;

struct Case {
  int64_t b = 2, h = 3, t = 1, dh = 128;
  bool causal = false, mask = false;
  double dout_scale = 1.0;  // hostile magnitudes: the upstream gradient scaled
  bool nan_dout = false;    // one NaN in dout (token 1 of batch 0, head 0)
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "B " << c.b << " H " << c.h << " T " << c.t << " dh " << c.dh << (c.causal ? " causal" : "")
    << (c.mask ? " key mask" : "") << (c.dout_scale != 1.0 ? " dout x " + std::to_string(c.dout_scale) : "")
    << (c.nan_dout ? " NaN in dout" : "");
  return s.str();
}

// Whether the BF16 backward of c runs the wgmma kernels on this device, which
// sum the columns (cuda/attention_dispatch.hpp: dh 128; dh 64 with a key
// mask or from T 1024), on a compute capability 9.0 device.
bool kernels_sum(const Case& c) {
  return hg::gpu::compute_capability() == 90 && hg::gpu::wgmma_attention_allowed() &&
         (c.dh == 128 || c.mask || c.t >= 1024);
}

struct Inputs {
  Tensor qkv, dout;
  hg::AttentionOptions options;
};

Inputs make_inputs(const Case& c, uint64_t seed, Device device) {
  hg::Generator gen(seed);
  const int64_t width = c.h * c.dh;
  Inputs in;
  in.qkv = Tensor::randn({c.b, c.t, 3 * width}, gen, DType::F32).to(DType::BF16).to(device);
  std::vector<double> dout = Tensor::randn({c.b, c.t, width}, gen, DType::F64).to_vector();
  for (double& x : dout) x *= c.dout_scale;
  if (c.nan_dout) dout[static_cast<size_t>(std::min<int64_t>(1, c.t - 1) * width)] = std::nan("");
  in.dout = Tensor::from_vector(dout, {c.b, c.t, width}, DType::F64).to(DType::BF16).to(device);
  in.options.causal = c.causal;
  if (c.mask) {  // batch 1 loses its last third of keys (below the mask threshold), batch 0 none
    std::vector<double> m(static_cast<size_t>(c.b * c.t), 0.0);
    for (int64_t j = c.t - c.t / 3; j < c.t; ++j) m[static_cast<size_t>(c.t + j)] = -1e30;
    in.options.mask = Tensor::from_vector(m, {c.b, 1, 1, c.t}, DType::F32).to(device);
  }
  return in;
}

// Equal element for element, NaN matching NaN.
bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// A bias gradient already holding values, as one accumulated earlier would.
Tensor prior_grad(int64_t n, Device device) {
  hg::Generator gen(77);
  return Tensor::randn({n}, gen, DType::F32).to(device);
}

// want[j] = prior[j] + sum over the rows of dqkv, in float64; scale[j] the
// sum of the magnitudes (the bound of a float32 sum's error is a multiple).
void column_sums(const Tensor& dqkv, const std::vector<double>& prior, std::vector<double>& want,
                 std::vector<double>& scale) {
  const std::vector<double> d = dqkv.to(Device::CPU).to_vector();
  const size_t cols = prior.size(), rows = d.size() / cols;
  want = prior;
  scale.assign(cols, 0.0);
  for (size_t j = 0; j < cols; ++j) scale[j] = std::fabs(prior[j]);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < cols; ++j) {
      want[j] += d[r * cols + j];
      scale[j] += std::fabs(d[r * cols + j]);
    }
}

// Runs c's forward and backward with the bias sums; checks them against the
// returned dqkv, and dqkv against attention_backward_packed's. Returns the
// bias gradient after the call.
std::vector<double> check_case(const Case& c, uint64_t seed) {
  INFO(describe(c));
  hg::KernelModeScope fused(KernelMode::Fused);
  const Inputs in = make_inputs(c, seed, Device::CUDA);
  AttentionSaved saved;
  hg::attention_forward_packed(in.qkv, c.h, in.options, &saved);
  const int64_t n = 3 * c.h * c.dh;
  Tensor grad = prior_grad(n, Device::CUDA);
  const std::vector<double> prior = grad.to_vector();
  const hg::PackedAttentionGrads g = hg::attention_backward_packed_bias(in.dout, saved, grad);
  CHECK(g.bias_summed == kernels_sum(c));
  CHECK(same(g.dqkv.to_vector(), hg::attention_backward_packed(in.dout, saved).to_vector()));  // the same gradients
  const std::vector<double> got = grad.to_vector();
  if (!g.bias_summed) {
    CHECK(got == prior);  // untouched: the caller sums
    return got;
  }
  std::vector<double> want, scale;
  column_sums(g.dqkv, prior, want, scale);
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t j = 0; j < want.size(); ++j) {
    // float32 sums of up to a few thousand terms in a tree of fixed shape:
    // well inside 2^-17 of the magnitudes' sum (one row left out would be
    // about 1 / (B T) of it).
    const bool ok = std::isnan(want[j]) ? std::isnan(got[j]) : std::fabs(got[j] - want[j]) <= 0x1p-17 * scale[j];
    if (!ok && ++bad <= 5) first << " column " << j << ": got " << got[j] << ", want " << want[j] << ";";
  }
  INFO(bad << " columns off:" << first.str());
  CHECK(bad == 0);
  return got;
}

}  // namespace

TEST_CASE("attention bias sums: CUDA wgmma kernels sum dq, dk, dv's columns as float64 does", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  if (hg::gpu::compute_capability() != 90)
    WARN("SKIPPED in part: the wgmma kernels (compute capability 9.0) do not run here; checked that nothing is summed");
  uint64_t seed = 9100;
  std::vector<Case> cases;
  for (int64_t t : {1, 67, 128, 129, 300})  // dh 128: one block, a partial block, whole blocks and more
    for (bool causal : {false, true})
      for (bool mask : {false, true}) {
        Case c;
        c.t = t, c.causal = causal, c.mask = mask;
        cases.push_back(c);
      }
  for (int64_t t : {1024, 1025, 2048})  // dh 64: the stored-ds pair (and its partial last block)
    for (bool causal : {false, true}) {
      Case c;
      c.dh = 64, c.t = t, c.causal = causal, c.b = t == 2048 ? 1 : 2, c.h = t == 2048 ? 2 : 3;
      cases.push_back(c);
    }
  Case masked64;  // dh 64 with a key mask: the wgmma kernels at any T
  masked64.dh = 64, masked64.t = 200, masked64.mask = true, masked64.causal = true;
  cases.push_back(masked64);
  Case small64;  // dh 64 at T 200: the mma.sync kernels, which leave the sums to the caller
  small64.dh = 64, small64.t = 200;
  cases.push_back(small64);
  for (const Case& c : cases) check_case(c, ++seed);
}

TEST_CASE("attention bias sums: the recomputing wgmma pair sums too, and repeats bitwise", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  Case c;
  c.dh = 64, c.t = 1100, c.causal = true, c.b = 2, c.h = 2;
  const std::vector<double> stored = check_case(c, 9200);
  CHECK(same(check_case(c, 9200), stored));  // bitwise: the sums' order is fixed
  hg::gpu::allow_stored_ds_attention(false);
  const std::vector<double> recomputed = check_case(c, 9200);
  CHECK(check_case(c, 9200) == recomputed);
  hg::gpu::allow_stored_ds_attention(true);
  c.dh = 128, c.t = 257;
  const std::vector<double> d128 = check_case(c, 9201);
  CHECK(check_case(c, 9201) == d128);
}

TEST_CASE("attention bias sums: hostile inputs: huge and tiny gradients, NaN", "[attention][cuda][hostile]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 9300;
  for (double s : {1e-30, 1e25}) {  // bf16 keeps both; the sums stay finite in float32
    Case c;
    c.t = 130, c.causal = true, c.dout_scale = s;
    check_case(c, ++seed);
  }
  Case c;  // a NaN in dout: the columns it reaches sum to NaN, as a column sum of dqkv does
  c.t = 130, c.nan_dout = true;
  const std::vector<double> got = check_case(c, ++seed);
  if (kernels_sum(c)) {
    int64_t nans = 0;
    for (double x : got) nans += std::isnan(x);
    CHECK(nans > 0);
  }
}

TEST_CASE("attention bias sums: the mma.sync kernels leave the bias gradient to the caller", "[attention][cuda]") {
  HG_REQUIRE_GPU();
  hg::gpu::allow_wgmma_attention(false);
  Case c;
  c.t = 300, c.causal = true;
  check_case(c, 9400);  // kernels_sum is false while wgmma is not allowed
  hg::gpu::allow_wgmma_attention(true);
}

TEST_CASE("attention bias sums: the CPU leaves the bias gradient to the caller; a wrong gradient is named",
          "[attention][errors]") {
  Case c;
  c.dh = 16, c.t = 9;
  hg::KernelModeScope fused(KernelMode::Fused);
  Inputs in = make_inputs(c, 9500, Device::CPU);
  in.qkv = in.qkv.to(DType::F32);
  in.dout = in.dout.to(DType::F32);
  AttentionSaved saved;
  hg::attention_forward_packed(in.qkv, c.h, in.options, &saved);
  Tensor grad = prior_grad(3 * c.h * c.dh, Device::CPU);
  const std::vector<double> prior = grad.to_vector();
  const hg::PackedAttentionGrads g = hg::attention_backward_packed_bias(in.dout, saved, grad);
  CHECK_FALSE(g.bias_summed);
  CHECK(grad.to_vector() == prior);
  CHECK(g.dqkv.to_vector() == hg::attention_backward_packed(in.dout, saved).to_vector());
  for (Tensor wrong : {Tensor::zeros({3 * c.h * c.dh + 1}), Tensor::zeros({3, c.h * c.dh}), Tensor()}) {
    try {
      hg::attention_backward_packed_bias(in.dout, saved, wrong);
      FAIL("no error for a QKV bias gradient of " << (wrong.defined() ? wrong.numel() : 0) << " elements");
    } catch (const hg::Error& e) {
      CHECK(std::string(e.what()).find("the QKV bias gradient must be (3 * H * dh) = (144)") != std::string::npos);
    }
  }
}

TEST_CASE("attention bias sums: MultiHeadAttention's QKV bias gradient from the kernels agrees with the softmax core",
          "[attention][models][cuda]") {
  HG_REQUIRE_GPU();
  // dh 128 (d 256, 2 heads): the wgmma kernels sum on a 9.0 device; the
  // softmax core's QKV backward takes the column sums of its own dqkv. Both
  // bf16: within the bf16 gradient bound of the attention tests.
  const auto run = [](hg::AttentionImpl impl) {
    hg::Generator gen(5);
    hg::MultiHeadAttention mha(256, 2, gen, DType::F32);
    mha.to(Device::CUDA);
    mha.set_impl(impl);
    hg::Generator data(6);
    const Tensor x = Tensor::randn({2, 140, 256}, data, DType::BF16, Device::CUDA);
    const Tensor dy = Tensor::randn({2, 140, 256}, data, DType::BF16, Device::CUDA);
    mha.forward(x, Tensor());
    mha.backward(dy);
    return std::vector<Tensor>{mha.qkv.bias.grad.to(DType::F64), mha.qkv.weight.grad.to(DType::F64)};
  };
  hg::KernelModeScope fused(KernelMode::Fused);
  const std::vector<Tensor> flash = run(hg::AttentionImpl::Flash), softmax = run(hg::AttentionImpl::Softmax);
  CHECK(hg::rel_error(flash[0], softmax[0]) < 2e-2);
  CHECK(hg::rel_error(flash[1], softmax[1]) < 2e-2);
}
