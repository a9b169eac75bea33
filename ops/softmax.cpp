#include "ops/softmax.hpp"

#include <cmath>
#include <limits>

#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "cuda/softmax_kernels.hpp"
#include "ops/cpu/softmax_cpu.hpp"
#include "ops/dispatch_log.hpp"
#include "ops/softmax_unfused.hpp"

// Validation and dispatch: CPU fused (Eigen), unfused (primitive backend, any
// device), CUDA fused. The math of each path lives in its own file.
namespace hg {
namespace {

constexpr const char* kPlainOp = "softmax_forward";
constexpr const char* kAttentionOp = "attention_softmax_forward";
constexpr const char* kBackwardOp = "softmax_backward";

// x is a tensor a softmax path can take: defined, non-empty, a supported
// dtype on a device that has a kernel for it.
void check_softmax_input(const Tensor& x, const char* name, const char* op) {
  HG_CHECK(x.defined(), op, name, " is undefined");
  HG_CHECK(x.ndim() >= 1, op, name, " must have at least one dim, got shape ", x.shape());
  HG_CHECK(x.numel() > 0, op, name, " is empty, shape ", x.shape());
  const DType t = x.dtype();
  HG_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16, op, name, " ", x.shape(), " has dtype ",
           dtype_name(t), "; softmax takes F32, F64, or BF16 on CUDA");
  HG_CHECK(t != DType::BF16 || x.is_cuda(), op, name, " ", x.shape(),
           " is BF16 on the CPU; BF16 softmax runs only on CUDA (F32 math)");
  HG_CHECK(!(t == DType::F64 && x.is_cuda() && kernel_mode() == KernelMode::Fused), op, name, " ", x.shape(),
           " is F64 on CUDA; the fused CUDA kernels take F32/BF16 (use the unfused mode or the CPU for F64)");
}

void check_scale(double scale, DType dtype, const char* op) {
  // A scale finite in double can still overflow to inf when the kernel rounds it to float.
  const bool finite = dtype == DType::F64 ? std::isfinite(scale) : std::isfinite(static_cast<float>(scale));
  HG_CHECK(finite, op, "scale ", scale, " is not finite in ", dtype_name(math_dtype(dtype)));
}

// The mask must broadcast to scores (B, H, Tq, Tk) as (B, 1, 1, Tk) or
// (B, 1, Tq, Tk); a batch dim of 1 is also accepted (one mask shared by every
// batch, batch stride 0). Anything else would be a silent broadcast.
void check_mask(const Tensor& mask, const Tensor& scores) {
  const Shape& s = scores.shape();
  const Shape& m = mask.shape();
  const bool broadcasts =
      m.size() == 4 && (m[0] == s[0] || m[0] == 1) && m[1] == 1 && (m[2] == 1 || m[2] == s[2]) && m[3] == s[3];
  HG_CHECK(broadcasts, kAttentionOp, "mask shape ", m, " does not broadcast to scores ", s,
           " as (B, 1, 1, Tk) or (B, 1, Tq, Tk) (B may be 1)");
  const DType want = math_dtype(scores.dtype());
  HG_CHECK(mask.dtype() == want, kAttentionOp, "mask ", m, " has dtype ", dtype_name(mask.dtype()), "; scores ", s,
           " of dtype ", dtype_name(scores.dtype()), " need a ", dtype_name(want), " mask");
  HG_CHECK(mask.device() == scores.device(), kAttentionOp, "mask ", m, " is on ", device_name(mask.device()),
           " but scores ", s, " are on ", device_name(scores.device()));
}

// One validated forward call: x viewed as rows of tk; attention calls also
// carry (heads, tq) so each row can find its mask row and causal limit.
struct ForwardCall {
  Tensor x;
  Tensor mask;  // undefined: none
  int64_t tk = 0, tq = 1, heads = 1;
  bool causal = false;
  double scale = 1.0;

  int64_t rows() const { return x.numel() / tk; }
  int64_t mask_batch_stride() const { return mask.defined() && mask.size(0) > 1 ? mask.size(2) * tk : 0; }
  int64_t mask_query_stride() const { return mask.defined() && mask.size(2) > 1 ? tk : 0; }
};

// The row layout both fused paths take (core/softmax_layout.hpp).
SoftmaxRows layout_of(const ForwardCall& c) {
  SoftmaxRows l;
  l.rows = c.rows();
  l.tk = c.tk;
  l.tq = c.tq;
  l.heads = c.heads;
  l.mask = c.mask.defined() ? &c.mask : nullptr;
  l.mask_batch_stride = c.mask_batch_stride();
  l.mask_query_stride = c.mask_query_stride();
  l.causal = c.causal;
  l.scale = c.scale;
  return l;
}

void fused_forward(const ForwardCall& c, Tensor& y) {
  if (c.x.is_cuda()) gpu::softmax_forward_fused(c.x, layout_of(c), y);
  else cpu::softmax_forward(c.x, layout_of(c), y);
}

// Logs the path taken; true for the unfused (primitive) one.
bool dispatch_unfused(const char* op, const Tensor& x) {
  const bool unfused = kernel_mode() == KernelMode::Unfused;
  log_dispatch(op, dispatch_path(x, unfused), x);
  return unfused;
}

Tensor run_forward(const ForwardCall& c) {
  if (dispatch_unfused(kPlainOp, c.x)) return unfused::softmax_forward(c.x, c.mask, c.causal, c.scale);
  Tensor y = Tensor::empty(c.x.shape(), c.x.dtype(), c.x.device());
  fused_forward(c, y);
  return y;
}

void run_forward_into(const ForwardCall& c, Tensor& y) {
  check_output(kAttentionOp, "y", y, c.x.shape(), c.x.dtype(), c.x.device());
  if (dispatch_unfused(kPlainOp, c.x)) y.copy_(unfused::softmax_forward(c.x, c.mask, c.causal, c.scale));
  else fused_forward(c, y);
}

ForwardCall attention_call(const Tensor& scores, const SoftmaxOptions& options) {
  check_softmax_input(scores, "scores", kAttentionOp);
  HG_CHECK(scores.ndim() == 4, kAttentionOp, "scores must be 4-D (B, H, Tq, Tk), got shape ", scores.shape());
  check_scale(options.scale, scores.dtype(), kAttentionOp);
  if (options.mask.defined()) check_mask(options.mask, scores);
  ForwardCall c;
  c.x = scores;
  c.mask = options.mask;
  c.heads = scores.size(1);
  c.tq = scores.size(2);
  c.tk = scores.size(3);
  c.causal = options.causal;
  c.scale = options.scale;
  return c;
}

void check_backward(const Tensor& dy, const Tensor& y, double scale) {
  check_softmax_input(y, "y", kBackwardOp);
  check_softmax_input(dy, "dy", kBackwardOp);
  HG_CHECK(dy.shape() == y.shape(), kBackwardOp, "dy shape ", dy.shape(), " differs from y shape ", y.shape());
  HG_CHECK(dy.dtype() == y.dtype(), kBackwardOp, "dy ", dy.shape(), " has dtype ", dtype_name(dy.dtype()), " but y ",
           y.shape(), " has ", dtype_name(y.dtype()));
  HG_CHECK(dy.device() == y.device(), kBackwardOp, "dy ", dy.shape(), " is on ", device_name(dy.device()), " but y ",
           y.shape(), " is on ", device_name(y.device()));
  check_scale(scale, y.dtype(), kBackwardOp);
}

void fused_backward(const Tensor& dy, const Tensor& y, double scale, Tensor& dx) {
  const int64_t tk = y.size(-1);
  if (y.is_cuda()) gpu::softmax_backward_fused(dy, y, y.numel() / tk, tk, static_cast<float>(scale), dx);
  else cpu::softmax_backward(dy, y, tk, scale, dx);
}

}  // namespace

Tensor softmax_forward(const Tensor& x) {
  HG_PROFILE("softmax", x.device());
  check_softmax_input(x, "x", kPlainOp);
  ForwardCall c;
  c.x = x;
  c.tk = x.size(-1);
  return run_forward(c);
}

Tensor attention_softmax_forward(const Tensor& scores, const SoftmaxOptions& options) {
  HG_PROFILE("softmax", scores.device());
  return run_forward(attention_call(scores, options));
}

void attention_softmax_forward_into(const Tensor& scores, const SoftmaxOptions& options, Tensor& y) {
  HG_PROFILE("softmax", scores.device());
  run_forward_into(attention_call(scores, options), y);
}

SoftmaxRows attention_softmax_rows(const Tensor& scores, const SoftmaxOptions& options) {
  SoftmaxRows layout = layout_of(attention_call(scores, options));
  layout.mask = options.mask.defined() ? &options.mask : nullptr;  // the call's copy goes with it
  return layout;
}

void check_softmax_backward_scale(double scale, DType dtype) { check_scale(scale, dtype, kBackwardOp); }

Tensor softmax_backward(const Tensor& dy, const Tensor& y, double scale) {
  HG_PROFILE("softmax", y.device());
  check_backward(dy, y, scale);
  if (dispatch_unfused(kBackwardOp, y)) return unfused::softmax_backward(dy, y, scale);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  fused_backward(dy, y, scale, dx);
  return dx;
}

void softmax_backward_into(const Tensor& dy, const Tensor& y, double scale, Tensor& dx) {
  HG_PROFILE("softmax", y.device());
  check_backward(dy, y, scale);
  check_output(kBackwardOp, "dx", dx, y.shape(), y.dtype(), y.device());
  if (dispatch_unfused(kBackwardOp, y)) dx.copy_(unfused::softmax_backward(dy, y, scale));
  else fused_backward(dy, y, scale, dx);
}

}  // namespace hg
