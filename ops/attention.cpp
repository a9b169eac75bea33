#include "ops/attention.hpp"

#include <cmath>

#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/attention_kernels.hpp"
#include "ops/attention_unfused.hpp"
#include "ops/cpu/attention_cpu.hpp"
#include "ops/dispatch_log.hpp"

// Validation and dispatch: CPU fused (Eigen, tiled), unfused (primitives, any
// device), CUDA fused (cuda/attention.cu). Both the contiguous (B, H, T, dh)
// form and the packed (B, T, 3, H, dh) form reach the same fused kernels,
// which address every operand through strides (core/attention_layout.hpp).
namespace hg {
namespace {

constexpr const char* kForwardOp = "attention_forward";
constexpr const char* kBackwardOp = "attention_backward";
constexpr const char* kPackedForwardOp = "attention_forward_packed";
constexpr const char* kPackedBackwardOp = "attention_backward_packed";
constexpr const char* kCachedForwardOp = "attention_forward_kv_cache";

void check_operand(const Tensor& t, const char* name, const char* op) {
  HG_CHECK(t.defined(), op, name, " is undefined");
  HG_CHECK(t.ndim() == 4, op, name, " must be 4-D (B, H, T, dh), got shape ", t.shape());
  HG_CHECK(t.numel() > 0, op, name, " is empty, shape ", t.shape());
}

// What both forms check alike. x (q, or the packed qkv) names the dtype,
// device and shape in the messages; batch and tk size the mask.
void check_common(const char* op, const Tensor& x, const char* name, int64_t batch, int64_t tk, int64_t dh,
                  const AttentionOptions& options) {
  const DType t = x.dtype();
  HG_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16, op, name, " ", x.shape(), " has dtype ",
           dtype_name(t), "; attention takes F32, F64, or BF16 on CUDA");
  HG_CHECK(t != DType::BF16 || x.is_cuda(), op, name, " ", x.shape(),
           " is BF16 on the CPU; BF16 attention runs only on CUDA (F32 math)");
  if (x.is_cuda() && kernel_mode() == KernelMode::Fused) {
    HG_CHECK(t != DType::F64, op, name, " ", x.shape(),
             " is F64 on CUDA; the fused CUDA kernel takes F32/BF16 (use the unfused mode or the CPU for F64)");
    HG_CHECK(dh == 32 || dh == 64 || dh == 128, op, "head dim ", dh, " of ", name, " ", x.shape(),
             " has no fused CUDA kernel: allowed 32, 64, 128 (the unfused mode takes any)");
  }
  if (options.scale) {
    const double s = *options.scale;
    HG_CHECK(t == DType::F64 ? std::isfinite(s) : std::isfinite(static_cast<float>(s)), op, "scale ", s,
             " is not finite in ", dtype_name(math_dtype(t)));
  }
  const Tensor& m = options.mask;
  if (!m.defined()) return;
  HG_CHECK(
      m.ndim() == 4 && (m.size(0) == batch || m.size(0) == 1) && m.size(1) == 1 && m.size(2) == 1 && m.size(3) == tk,
      op, "mask shape ", m.shape(), " must be (B, 1, 1, Tk) = (", batch, ", 1, 1, ", tk, ") (B may be 1) for ", name,
      " ", x.shape());
  HG_CHECK(m.dtype() == math_dtype(t), op, "mask ", m.shape(), " has dtype ", dtype_name(m.dtype()), "; ", name, " ",
           x.shape(), " of dtype ", dtype_name(t), " needs a ", dtype_name(math_dtype(t)), " mask");
  HG_CHECK(m.device() == x.device(), op, "mask ", m.shape(), " is on ", device_name(m.device()), " but ", name, " ",
           x.shape(), " is on ", device_name(x.device()));
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
  check_common(kForwardOp, q, "q", q.size(0), k.size(2), q.size(3), options);
}

// The packed qkv's own shape (B, T, 3 * heads * dh), for the packed and the cached forms.
void check_packed_shape(const char* op, const Tensor& qkv, int64_t heads) {
  HG_CHECK(qkv.defined(), op, "qkv is undefined");
  HG_CHECK(heads > 0, op, "heads must be positive, got ", heads);
  HG_CHECK(qkv.ndim() == 3 && qkv.size(2) % (3 * heads) == 0, op, "qkv must be (B, T, 3 * heads * dh) with heads ",
           heads, ", got shape ", qkv.shape());
  HG_CHECK(qkv.numel() > 0, op, "qkv is empty, shape ", qkv.shape());
}

void check_packed(const Tensor& qkv, int64_t heads, const AttentionOptions& options) {
  check_packed_shape(kPackedForwardOp, qkv, heads);
  check_common(kPackedForwardOp, qkv, "qkv", qkv.size(0), qkv.size(1), qkv.size(2) / (3 * heads), options);
}

// A time-major cache (capacity, B, H, dh) that the new tokens' qkv can attend over its first tk positions.
void check_cache(const Tensor& qkv, int64_t heads, const Tensor& cache, const char* name, int64_t tk) {
  const char* op = kCachedForwardOp;
  const int64_t b = qkv.size(0), tq = qkv.size(1), dh = qkv.size(2) / (3 * heads);
  HG_CHECK(cache.defined(), op, name, " is undefined");
  HG_CHECK(cache.ndim() == 4 && cache.size(1) == b && cache.size(2) == heads && cache.size(3) == dh, op, name, " ",
           cache.shape(), " must be (capacity, B, H, dh) = (capacity, ", b, ", ", heads, ", ", dh, ") for qkv ",
           qkv.shape(), " with ", heads, " heads");
  HG_CHECK(tk >= tq && tk <= cache.size(0), op, "tk ", tk, " must lie in [Tq, capacity] = [", tq, ", ", cache.size(0),
           "]: the cache must hold the new tokens (qkv ", qkv.shape(), ", ", name, " ", cache.shape(), ")");
  check_same_dtype(op, qkv, cache);
  check_same_device(op, qkv, cache);
}

// The mask, causality and scale of a layout whose sizes are set.
void set_options(AttentionLayout& l, const Tensor& mask, bool causal, double scale) {
  l.mask = mask.defined() ? mask.raw_data() : nullptr;
  l.mask_batch_stride = mask.defined() && mask.size(0) > 1 ? l.tk : 0;
  l.causal = causal;
  l.scale = scale;
}

AttentionLayout layout_of(const AttentionSaved& s) {
  AttentionLayout l;
  if (s.qkv.defined()) {  // packed: (B, T, 3, H, dh) in, (B, T, H, dh) out
    l.batch = s.qkv.size(0);
    l.heads = s.heads;
    l.tq = l.tk = s.qkv.size(1);
    l.head_dim = s.qkv.size(2) / (3 * s.heads);
    const int64_t width = l.heads * l.head_dim;
    l.q = l.kv = HeadStrides::packed(l.tq, l.head_dim, 3 * width);
    l.o = HeadStrides::packed(l.tq, l.head_dim, width);
  } else {
    l.batch = s.q.size(0);
    l.heads = s.q.size(1);
    l.tq = s.q.size(2);
    l.tk = s.k.size(2);
    l.head_dim = s.q.size(3);
    l.q = l.o = HeadStrides::contiguous(l.heads, l.tq, l.head_dim);
    l.kv = HeadStrides::contiguous(l.heads, l.tk, l.head_dim);
  }
  set_options(l, s.mask, s.causal, s.scale);
  return l;
}

double scale_of(const AttentionOptions& options, int64_t dh) {
  return options.scale.value_or(1.0 / std::sqrt(static_cast<double>(dh)));
}

void save_options(AttentionSaved& s, const AttentionOptions& options, int64_t dh) {
  s.mask = options.mask;
  s.causal = options.causal;
  s.scale = scale_of(options, dh);
}

// `elements` past t's first element (the k and v slices of a packed qkv).
const void* at(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.raw_data()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}
void* at(Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw_data()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

// The fused kernels on s.o (allocated) and s.lse, s.softmax_stats (allocated here).
void fused_forward(AttentionSaved& s, const void* q, const void* k, const void* v, const Device device) {
  const AttentionLayout l = layout_of(s);
  const DType t = s.o.dtype();
  s.lse = Tensor::empty({l.batch, l.heads, l.tq}, math_dtype(t), device);
  if (device == Device::CUDA) {
    s.softmax_stats = Tensor::empty({l.batch, l.heads, l.tq, 2}, DType::F32, device);
    gpu::attention_forward(t, q, k, v, l, s.o.raw_data(), s.lse, s.softmax_stats);
  } else {
    cpu::attention_forward(t, q, k, v, l, s.o.raw_data(), s.lse);
  }
}

// qkv_sums (CUDA only): gpu::attention_backward's; returns whether it added them.
bool fused_backward(const Tensor& dout, const AttentionSaved& s, const void* q, const void* k, const void* v, void* dq,
                    void* dk, void* dv, const Tensor* qkv_sums = nullptr) {
  const AttentionLayout l = layout_of(s);
  if (dout.is_cuda())
    return gpu::attention_backward(dout.dtype(), dout.raw_data(), q, k, v, s.o.raw_data(), s.softmax_stats, l, dq, dk,
                                   dv, qkv_sums);
  cpu::attention_backward(dout.dtype(), dout.raw_data(), q, k, v, l, dq, dk, dv);
  return false;
}

void check_backward(const char* op, const Tensor& dout, const AttentionSaved& saved) {
  HG_CHECK(saved.o.defined() && saved.lse.defined(), op, "saved state is empty: run attention_forward first");
  HG_CHECK(dout.defined(), op, "dout is undefined");
  HG_CHECK(dout.shape() == saved.o.shape(), op, "dout shape ", dout.shape(), " differs from the output's ",
           saved.o.shape());
  check_same_dtype(op, dout, saved.o);
  check_same_device(op, dout, saved.o);
}

}  // namespace

Tensor split_heads(const Tensor& x, int64_t slots, int64_t heads) {
  const int64_t b = x.size(0), t = x.size(1), dh = x.size(2) / (slots * heads);
  const Tensor bh = transpose(x.reshape({b, t, slots * heads, dh}), 1, 2);  // (B, S H, T, dh)
  if (slots == 1) return bh.reshape({1, b, heads, t, dh});
  // (B, S, H T dh) -> (S, B, H T dh): the slots lead.
  return transpose(bh.reshape({b, slots, heads * t * dh}), 0, 1).reshape({slots, b, heads, t, dh});
}

Tensor merge_heads(const Tensor& x) {
  const bool one = x.ndim() == 4;
  const int64_t s = one ? 1 : x.size(0), b = x.size(one ? 0 : 1), h = x.size(-3), t = x.size(-2), dh = x.size(-1);
  const Tensor bh = one ? x : transpose(x.reshape({s, b, h * t * dh}), 0, 1).reshape({b, s * h, t, dh});
  return transpose(bh, 1, 2).reshape({b, t, s * h * dh});
}

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         AttentionSaved* saved) {
  HG_PROFILE("attention", q.device());
  check_inputs(q, k, v, options);
  AttentionSaved s;
  s.q = q;
  s.k = k;
  s.v = v;
  save_options(s, options, q.size(3));
  log_dispatch(kForwardOp, dispatch_path(q, kernel_mode() == KernelMode::Unfused), q);
  if (kernel_mode() == KernelMode::Unfused) {
    unfused::attention_forward(q, k, v, s);
  } else {
    s.o = Tensor::empty(q.shape(), q.dtype(), q.device());
    fused_forward(s, q.raw_data(), k.raw_data(), v.raw_data(), q.device());
  }
  Tensor o = s.o;
  if (saved != nullptr) *saved = std::move(s);
  return o;
}

AttentionGrads attention_backward(const Tensor& dout, const AttentionSaved& saved) {
  HG_PROFILE("attention", dout.device());
  HG_CHECK(!saved.qkv.defined(), kBackwardOp,
           "the saved state is of attention_forward_packed: use attention_backward_packed");
  check_backward(kBackwardOp, dout, saved);
  log_dispatch(kBackwardOp, dispatch_path(dout, saved.probs.defined()), dout);
  if (saved.probs.defined()) return unfused::attention_backward(dout, saved);
  AttentionGrads g{Tensor::empty(saved.q.shape(), saved.q.dtype(), saved.q.device()),
                   Tensor::empty(saved.k.shape(), saved.k.dtype(), saved.k.device()),
                   Tensor::empty(saved.v.shape(), saved.v.dtype(), saved.v.device())};
  fused_backward(dout, saved, saved.q.raw_data(), saved.k.raw_data(), saved.v.raw_data(), g.dq.raw_data(),
                 g.dk.raw_data(), g.dv.raw_data());
  return g;
}

Tensor attention_forward_packed(const Tensor& qkv, int64_t heads, const AttentionOptions& options,
                                AttentionSaved* saved) {
  check_packed(qkv, heads, options);
  const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
  if (kernel_mode() == KernelMode::Unfused) {
    // The unfused composition works on (B, H, T, dh) operands: split, run, merge.
    const Tensor split = split_heads(qkv, 3, heads);
    AttentionSaved s;
    const Tensor o = attention_forward(split[0], split[1], split[2], options, &s);
    s.heads = heads;
    if (saved != nullptr) *saved = std::move(s);
    return merge_heads(o);
  }
  HG_PROFILE("attention", qkv.device());
  log_dispatch(kPackedForwardOp, dispatch_path(qkv, false), qkv);
  AttentionSaved s;
  s.qkv = qkv;
  s.heads = heads;
  save_options(s, options, width / heads);
  s.o = Tensor::empty({b, t, width}, qkv.dtype(), qkv.device());
  fused_forward(s, qkv.raw_data(), at(qkv, width), at(qkv, 2 * width), qkv.device());
  Tensor o = s.o;
  if (saved != nullptr) *saved = std::move(s);
  return o;
}

Tensor kv_cache_heads(const Tensor& cache, int64_t length) {
  HG_CHECK(cache.defined() && cache.ndim() == 4 && length >= 1 && length <= cache.size(0), "kv_cache_heads",
           "needs a (capacity, B, H, dh) cache and a length in [1, capacity], got ",
           cache.defined() ? cache.shape() : Shape{}, " and ", length);
  const int64_t b = cache.size(1), h = cache.size(2), dh = cache.size(3);
  return transpose(cache.slice(0, length).reshape({length, b * h, dh}), 0, 1).reshape({b, h, length, dh});
}

Tensor attention_forward_kv_cache(const Tensor& qkv, int64_t heads, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t tk, const AttentionOptions& options) {
  const char* op = kCachedForwardOp;
  HG_CHECK(heads > 0, op, "heads must be positive, got ", heads);
  check_packed_shape(op, qkv, heads);
  check_cache(qkv, heads, k_cache, "k_cache", tk);
  check_cache(qkv, heads, v_cache, "v_cache", tk);
  const int64_t b = qkv.size(0), tq = qkv.size(1), width = qkv.size(2) / 3, dh = width / heads;
  check_common(op, qkv, "qkv", b, tk, dh, options);
  if (kernel_mode() == KernelMode::Unfused) {
    const Tensor q = split_heads(qkv, 3, heads)[0];
    return merge_heads(
        attention_forward(q, kv_cache_heads(k_cache, tk), kv_cache_heads(v_cache, tk), options, nullptr));
  }
  HG_PROFILE("attention", qkv.device());
  log_dispatch(op, dispatch_path(qkv, false), qkv);
  AttentionLayout l;
  l.batch = b;
  l.heads = heads;
  l.tq = tq;
  l.tk = tk;
  l.head_dim = dh;
  l.q = HeadStrides::packed(tq, dh, 3 * width);
  l.kv = HeadStrides::time_major(b, heads, dh);
  l.o = HeadStrides::packed(tq, dh, width);
  set_options(l, options.mask, options.causal, scale_of(options, dh));
  const DType t = qkv.dtype();
  Tensor o = Tensor::empty({b, tq, width}, t, qkv.device());
  Tensor lse = Tensor::empty({b, heads, tq}, math_dtype(t), qkv.device());
  if (qkv.is_cuda()) {
    Tensor stats = Tensor::empty({b, heads, tq, 2}, DType::F32, qkv.device());
    gpu::attention_forward(t, qkv.raw_data(), k_cache.raw_data(), v_cache.raw_data(), l, o.raw_data(), lse, stats);
  } else {
    cpu::attention_forward(t, qkv.raw_data(), k_cache.raw_data(), v_cache.raw_data(), l, o.raw_data(), lse);
  }
  return o;
}

namespace {

// qkv_bias_grad: attention_backward_packed_bias's (null: none).
PackedAttentionGrads backward_packed(const Tensor& dout, const AttentionSaved& saved, Tensor* qkv_bias_grad) {
  const char* op = kPackedBackwardOp;
  HG_CHECK(saved.heads > 0, op, "the saved state is not of attention_forward_packed (run it first)");
  if (!saved.qkv.defined()) {  // unfused: the contiguous backward between a split and a merge
    HG_CHECK(dout.defined() && dout.ndim() == 3, op, "dout must be (B, T, H * dh), got ",
             dout.defined() ? dout.shape() : Shape{});
    const AttentionGrads g = attention_backward(split_heads(dout, 1, saved.heads)[0], saved);
    Tensor dheads =
        Tensor::empty({3, g.dq.size(0), g.dq.size(1), g.dq.size(2), g.dq.size(3)}, g.dq.dtype(), g.dq.device());
    for (int i = 0; i < 3; ++i) dheads[i].copy_(i == 0 ? g.dq : i == 1 ? g.dk : g.dv);
    return {merge_heads(dheads), false};
  }
  HG_PROFILE("attention", dout.device());
  check_backward(op, dout, saved);
  log_dispatch(op, dispatch_path(dout, false), dout);
  const Tensor& qkv = saved.qkv;
  const int64_t width = qkv.size(2) / 3;
  PackedAttentionGrads g{Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device())};
  Tensor& dqkv = g.dqkv;
  if (qkv_bias_grad != nullptr)
    HG_CHECK(qkv_bias_grad->defined() && qkv_bias_grad->shape() == Shape({3 * width}) &&
                 qkv_bias_grad->device() == qkv.device(),
             op, "the QKV bias gradient must be (3 * H * dh) = (", 3 * width, ") on ", device_name(qkv.device()),
             ", got ", qkv_bias_grad->defined() ? qkv_bias_grad->shape() : Shape{}, " on ",
             qkv_bias_grad->defined() ? device_name(qkv_bias_grad->device()) : "no device");
  // The kernels' sums go straight into an F32 grad on CUDA; any other is left to the caller.
  const bool sums = qkv_bias_grad != nullptr && qkv_bias_grad->is_cuda() && qkv_bias_grad->dtype() == DType::F32;
  g.bias_summed = fused_backward(dout, saved, qkv.raw_data(), at(qkv, width), at(qkv, 2 * width), dqkv.raw_data(),
                                 at(dqkv, width), at(dqkv, 2 * width), sums ? qkv_bias_grad : nullptr);
  return g;
}

}  // namespace

Tensor attention_backward_packed(const Tensor& dout, const AttentionSaved& saved) {
  return backward_packed(dout, saved, nullptr).dqkv;
}

PackedAttentionGrads attention_backward_packed_bias(const Tensor& dout, const AttentionSaved& saved,
                                                    Tensor& qkv_bias_grad) {
  return backward_packed(dout, saved, &qkv_bias_grad);
}

}  // namespace hg
