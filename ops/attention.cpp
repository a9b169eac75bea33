#include "ops/attention.hpp"

#include <cmath>

#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "ops/dispatch_log.hpp"
#include "cuda/attention_kernels.hpp"
#include "ops/attention_unfused.hpp"
#include "ops/cpu/attention_cpu.hpp"

// Validation and dispatch: CPU fused (Eigen, tiled), unfused (primitives, any
// device), CUDA fused (cuda/attention.cu).
namespace hg {
namespace {

constexpr const char* kForwardOp = "attention_forward";
constexpr const char* kBackwardOp = "attention_backward";

void check_operand(const Tensor& t, const char* name, const char* op) {
  HG_CHECK(t.defined(), op, name, " is undefined");
  HG_CHECK(t.ndim() == 4, op, name, " must be 4-D (B, H, T, dh), got shape ", t.shape());
  HG_CHECK(t.numel() > 0, op, name, " is empty, shape ", t.shape());
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  check_operand(q, "q", kForwardOp);
  check_operand(k, "k", kForwardOp);
  check_operand(v, "v", kForwardOp);
  HG_CHECK(k.shape() == v.shape(), kForwardOp, "k ", k.shape(), " and v ", v.shape(), " must have one shape");
  HG_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), kForwardOp, "q ", q.shape(),
           " and k ", k.shape(), " must share B, H and dh");
  check_same_dtype(kForwardOp, q, k);
  check_same_dtype(kForwardOp, q, v);
  check_same_device(kForwardOp, q, k);
  check_same_device(kForwardOp, q, v);
  const DType t = q.dtype();
  HG_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16, kForwardOp, "q ", q.shape(), " has dtype ",
           dtype_name(t), "; attention takes F32, F64, or BF16 on CUDA");
  HG_CHECK(t != DType::BF16 || q.is_cuda(), kForwardOp, "q ", q.shape(),
           " is BF16 on the CPU; BF16 attention runs only on CUDA (F32 math)");
  if (q.is_cuda() && kernel_mode() == KernelMode::Fused) {
    HG_CHECK(t != DType::F64, kForwardOp, "q ", q.shape(),
             " is F64 on CUDA; the fused CUDA kernel takes F32/BF16 (use the unfused mode or the CPU for F64)");
    const int64_t dh = q.size(3);
    HG_CHECK(dh == 32 || dh == 64 || dh == 128, kForwardOp, "head dim ", dh, " of q ", q.shape(),
             " has no fused CUDA kernel: allowed 32, 64, 128 (the unfused mode takes any)");
  }
  if (options.scale) {
    const double s = *options.scale;
    HG_CHECK(t == DType::F64 ? std::isfinite(s) : std::isfinite(static_cast<float>(s)), kForwardOp, "scale ", s,
             " is not finite in ", dtype_name(math_dtype(t)));
  }
  const Tensor& m = options.mask;
  if (!m.defined()) return;
  HG_CHECK(m.ndim() == 4 && (m.size(0) == q.size(0) || m.size(0) == 1) && m.size(1) == 1 && m.size(2) == 1 &&
               m.size(3) == k.size(2),
           kForwardOp, "mask shape ", m.shape(), " must be (B, 1, 1, Tk) = (", q.size(0), ", 1, 1, ", k.size(2),
           ") (B may be 1) for q ", q.shape(), " k ", k.shape());
  HG_CHECK(m.dtype() == math_dtype(t), kForwardOp, "mask ", m.shape(), " has dtype ", dtype_name(m.dtype()), "; q ",
           q.shape(), " of dtype ", dtype_name(t), " needs a ", dtype_name(math_dtype(t)), " mask");
  HG_CHECK(m.device() == q.device(), kForwardOp, "mask ", m.shape(), " is on ", device_name(m.device()), " but q ",
           q.shape(), " is on ", device_name(q.device()));
}

AttentionLayout layout_of(const AttentionSaved& s) {
  AttentionLayout l;
  l.batch = s.q.size(0);
  l.heads = s.q.size(1);
  l.tq = s.q.size(2);
  l.tk = s.k.size(2);
  l.head_dim = s.q.size(3);
  l.mask = s.mask.defined() ? s.mask.raw_data() : nullptr;
  l.mask_batch_stride = s.mask.defined() && s.mask.size(0) > 1 ? l.tk : 0;
  l.causal = s.causal;
  l.scale = s.scale;
  return l;
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         AttentionSaved* saved) {
  HG_PROFILE("attention", q.device());
  check_inputs(q, k, v, options);
  AttentionSaved s;
  s.q = q;
  s.k = k;
  s.v = v;
  s.mask = options.mask;
  s.causal = options.causal;
  s.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  log_dispatch(kForwardOp, dispatch_path(q, kernel_mode() == KernelMode::Unfused), q);
  if (kernel_mode() == KernelMode::Unfused) {
    unfused::attention_forward(q, k, v, s);
  } else {
    s.o = Tensor::empty(q.shape(), q.dtype(), q.device());
    s.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, math_dtype(q.dtype()), q.device());
    const AttentionLayout l = layout_of(s);
    if (q.is_cuda()) {
      s.softmax_stats = Tensor::empty({q.size(0), q.size(1), q.size(2), 2}, DType::F32, q.device());
      gpu::attention_forward(q, k, v, l, s.o, s.lse, s.softmax_stats);
    } else {
      cpu::attention_forward(q, k, v, l, s.o, s.lse);
    }
  }
  Tensor o = s.o;
  if (saved != nullptr) *saved = std::move(s);
  return o;
}

AttentionGrads attention_backward(const Tensor& dout, const AttentionSaved& saved) {
  HG_PROFILE("attention", dout.device());
  HG_CHECK(saved.o.defined() && saved.lse.defined(), kBackwardOp, "saved state is empty: run attention_forward first");
  HG_CHECK(dout.defined(), kBackwardOp, "dout is undefined");
  HG_CHECK(dout.shape() == saved.o.shape(), kBackwardOp, "dout shape ", dout.shape(), " differs from the output's ",
           saved.o.shape());
  check_same_dtype(kBackwardOp, dout, saved.o);
  check_same_device(kBackwardOp, dout, saved.o);
  log_dispatch(kBackwardOp, dispatch_path(dout, saved.probs.defined()), dout);
  if (saved.probs.defined()) return unfused::attention_backward(dout, saved);
  AttentionGrads g{Tensor::empty(saved.q.shape(), saved.q.dtype(), saved.q.device()),
                   Tensor::empty(saved.k.shape(), saved.k.dtype(), saved.k.device()),
                   Tensor::empty(saved.v.shape(), saved.v.dtype(), saved.v.device())};
  const AttentionLayout l = layout_of(saved);
  if (dout.is_cuda()) {
    gpu::attention_backward(dout, saved.q, saved.k, saved.v, saved.o, saved.softmax_stats, l, g.dq, g.dk, g.dv);
  } else {
    cpu::attention_backward(dout, saved.q, saved.k, saved.v, saved.lse, l, g.dq, g.dk, g.dv);
  }
  return g;
}

}  // namespace hg
