#include "ops/softmax_unfused.hpp"

#include <limits>

#include "core/tensor_functions.hpp"
#include "ops/softmax.hpp"

// Each line below is one primitive pass (its own loop / kernel). Pass and byte
// counts versus the fused kernels: docs/softmax.md.
namespace hg::unfused {
namespace {

Tensor scalar_like(double value, const Tensor& like) { return Tensor::full({1}, value, like.dtype(), like.device()); }

// 1 where query q may see key k (k <= q + tk - tq), else 0; shape (tq, tk).
// Built on x's device from two index vectors, once per call: k < q + (tk - tq)
// + 0.5 is the same test on integers, and exact in F32 up to 2^24 keys.
Tensor causal_visibility(int64_t tq, int64_t tk, DType dtype, Device device) {
  const Tensor limit = add_scalar(Tensor::arange(tq, dtype, device).reshape({tq, 1}), double(tk - tq) + 0.5);
  const Tensor key = Tensor::arange(tk, dtype, device).reshape({1, tk});
  return zip(BinaryOp::Gt, limit, key);
}

// The additive term of z: the mask value where a key is visible, -inf where
// it is masked (mask <= kSoftmaxMaskThreshold, or causally hidden). It is
// computed at the mask's size (H times smaller than the scores). log of a 0/1
// visibility is 0/-inf: the primitive way to get -inf without 0 * inf = NaN,
// and mask + (-inf) keeps a NaN mask value NaN.
Tensor additive_term(const Tensor& mask, bool causal, const Tensor& z) {
  Tensor visible;  // undefined: every key visible
  if (mask.defined()) visible = zip(BinaryOp::Gt, mask, scalar_like(kSoftmaxMaskThreshold, mask));
  if (causal) {
    Tensor c = causal_visibility(z.size(-2), z.size(-1), z.dtype(), z.device());
    visible = visible.defined() ? mul(visible, c) : c;
  }
  Tensor blocked = log(visible);
  return mask.defined() ? add(mask, blocked) : blocked;
}

// Lowest finite value of the math dtype. The row max is clamped to it, so a
// fully masked row computes (-inf) - lowest = -inf, not (-inf) - (-inf) = NaN.
double lowest_finite(DType dtype) {
  return dtype == DType::F64 ? std::numeric_limits<double>::lowest()
                             : static_cast<double>(std::numeric_limits<float>::lowest());
}

Tensor forward_math(const Tensor& x, const Tensor& mask, bool causal, double scale, Tensor* lse) {
  const int last = x.ndim() - 1;
  Tensor z = scale == 1.0 ? x : mul_scalar(x, scale);
  if (mask.defined() || causal) z = add(z, additive_term(mask, causal, z));
  const Tensor raw_max = max(z, last, /*keepdim=*/true);
  const Tensor row_max = maximum(raw_max, scalar_like(lowest_finite(z.dtype()), z));
  const Tensor e = exp(sub(z, row_max));  // the max key gives exactly 1 unless the row is fully masked
  const Tensor total = sum(e, last, /*keepdim=*/true);
  // log-sum-exp of z: row_max + log(total); a fully masked row gets log(0) = -inf.
  if (lse != nullptr) *lse = add(row_max, log(total));
  // Row factor visible / total, applied with one multiply: 1 / total for a
  // row with a visible key, 0 for a fully masked row (whose max is -inf).
  // Its total is 0 (or tiny, where exp(-inf) is not exactly 0): adding
  // (total == 0) turns 0 / 0 into 0 / 1. A NaN row has a NaN total, so its
  // factor, and the whole row, stays NaN.
  const Tensor visible = zip(BinaryOp::Gt, raw_max, scalar_like(-std::numeric_limits<double>::infinity(), z));
  const Tensor safe_total = add(total, zip(BinaryOp::Eq, total, scalar_like(0.0, total)));
  return mul(e, div(visible, safe_total));
}

Tensor backward_math(const Tensor& dy, const Tensor& y, double scale) {
  const int last = y.ndim() - 1;
  const Tensor dot = sum(mul(dy, y), last, /*keepdim=*/true);
  const Tensor dx = mul(y, sub(dy, dot));
  return scale == 1.0 ? dx : mul_scalar(dx, scale);
}

}  // namespace

Tensor softmax_forward(const Tensor& x, const Tensor& mask, bool causal, double scale, Tensor* lse) {
  if (x.dtype() == DType::BF16) return forward_math(x.to(DType::F32), mask, causal, scale, lse).to(DType::BF16);
  return forward_math(x, mask, causal, scale, lse);
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y, double scale) {
  if (y.dtype() == DType::BF16) return backward_math(dy.to(DType::F32), y.to(DType::F32), scale).to(DType::BF16);
  return backward_math(dy, y, scale);
}

}  // namespace hg::unfused
