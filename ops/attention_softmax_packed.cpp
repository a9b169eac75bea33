#include "ops/attention_softmax_packed.hpp"

#include "core/cpu_matmul.hpp"
#include "core/profiler.hpp"
#include "ops/cpu/attention_softmax_packed_cpu.hpp"

namespace hg {
namespace {

constexpr const char* kForward = "attention_softmax_packed_forward";
constexpr const char* kBackward = "attention_softmax_packed_backward";

void check_qkv(const char* op, const Tensor& qkv, int64_t heads) {
  qkv.check_defined(op);
  HG_CHECK(qkv.device() == Device::CPU, op, "runs on the CPU, got qkv on ", device_name(qkv.device()));
  HG_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == DType::F64, op, "qkv must be f32 or f64, got ",
           dtype_name(qkv.dtype()));
  HG_CHECK(heads > 0, op, "heads must be positive, got ", heads);
  HG_CHECK(qkv.ndim() == 3 && qkv.size(2) > 0 && qkv.size(2) % (3 * heads) == 0, op,
           "qkv must be (B, T, 3 * heads * head_dim) with heads ", heads, ", got ", qkv.shape());
}

}  // namespace

bool attention_softmax_packed_suits(int64_t batch, int64_t heads, int64_t t, int64_t head_dim) {
  return cpu::matmul_runs_whole_products(batch * heads, t, t, head_dim);
}

Tensor attention_softmax_packed_forward(const Tensor& qkv, int64_t heads, const SoftmaxOptions& options,
                                        Tensor& probs) {
  HG_PROFILE("attention", Device::CPU);
  check_qkv(kForward, qkv, heads);
  const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
  probs = Tensor::empty({b, heads, t, t}, qkv.dtype(), Device::CPU);
  const SoftmaxRows layout = attention_softmax_rows(probs, options);  // checks the mask against (B, H, T, T)
  Tensor out = Tensor::empty({b, t, width}, qkv.dtype(), Device::CPU);
  cpu::packed_forward(qkv, heads, layout, probs, out);
  return out;
}

Tensor attention_softmax_packed_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                                         double scale, bool causal) {
  HG_PROFILE("attention", Device::CPU);
  check_qkv(kBackward, qkv, heads);
  const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
  dout.check_defined(kBackward);
  probs.check_defined(kBackward);
  HG_CHECK(dout.shape() == Shape({b, t, width}) && dout.dtype() == qkv.dtype() && dout.device() == Device::CPU,
           kBackward, "dout must be a ", dtype_name(qkv.dtype()), " CPU tensor of shape ", Shape({b, t, width}),
           ", got ", dtype_name(dout.dtype()), " ", dout.shape(), " on ", device_name(dout.device()));
  HG_CHECK(probs.shape() == Shape({b, heads, t, t}) && probs.dtype() == qkv.dtype() && probs.device() == Device::CPU,
           kBackward, "probs must be the forward's ", Shape({b, heads, t, t}), " ", dtype_name(qkv.dtype()),
           " CPU tensor, got ", dtype_name(probs.dtype()), " ", probs.shape(), " on ", device_name(probs.device()));
  check_softmax_backward_scale(scale, qkv.dtype());
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), Device::CPU);
  cpu::packed_backward(dout, qkv, probs, heads, scale, causal, dqkv);
  return dqkv;
}

}  // namespace hg
