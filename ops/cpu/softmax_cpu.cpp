#include "ops/cpu/softmax_cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/softmax_layout.hpp"

namespace hg::cpu {
namespace {

template <class T> using RowArray = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T> using ConstRow = Eigen::Map<const RowArray<T>>;
template <class T> using Row = Eigen::Map<RowArray<T>>;

// Keys [0, n) are visible to query q under the causal rule k <= q + (tk - tq).
// n can be 0 when tq > tk: the first queries then see nothing.
int64_t causally_visible_keys(const SoftmaxRows& l, int64_t q) {
  if (!l.causal) return l.tk;
  return std::clamp<int64_t>(q + (l.tk - l.tq) + 1, 0, l.tk);
}

template <class T>
void forward_rows(const Tensor& x, const SoftmaxRows& l, Tensor& y) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  const T* xs = x.data<T>();
  T* ys = y.data<T>();
  const T* mask = l.mask ? l.mask->data<T>() : nullptr;
  const T scale = static_cast<T>(l.scale);
  for (int64_t r = 0; r < l.rows; ++r) {
    const int64_t b = r / (l.heads * l.tq), q = r % l.tq;
    ConstRow<T> xr(xs + r * l.tk, l.tk);
    Row<T> z(ys + r * l.tk, l.tk);  // y's row holds z until it is normalised

    // Causally hidden keys are not read at all (as in the CUDA kernel): they
    // are -inf whatever the score, so only [0, visible) is computed.
    const int64_t visible = causally_visible_keys(l, q);
    z.head(visible) = scale * xr.head(visible);
    z.tail(l.tk - visible).setConstant(-inf);
    if (mask) {
      // A mask value at or below the threshold masks its key outright (-inf);
      // adding (m - inf) rather than assigning -inf keeps a NaN mask NaN.
      ConstRow<T> mr(mask + b * l.mask_batch_stride + q * l.mask_query_stride, visible);
      z.head(visible) += (mr > static_cast<T>(kSoftmaxMaskThreshold)).select(mr, mr - inf);
    }

    // PropagateNaN: a NaN anywhere must reach the whole row, not be skipped.
    const T max = z.template maxCoeff<Eigen::PropagateNaN>();
    if (max == -inf) {  // every key masked: zeros, not (-inf) - (-inf) = NaN
      z.setZero();
      continue;
    }
    // In (0, 1]; the max key gives exactly 1, so sum >= 1. Exponents are
    // floored at kExpFloor (-80 float, -700 double) before the exp, and any
    // weight at or below twice exp(kExpFloor) is then set to exactly 0. Why:
    // Eigen 3.4's vectorised exp turns -inf (a masked key) into a subnormal
    // (~3e-39), which must be 0, and subnormal arithmetic is ~100x slower on
    // x86. A key dropped this way weighs < 4e-35 (float) next to a sum >= 1:
    // far below one rounding of the sum. NaN passes through (max(NaN, f) is
    // NaN here). Causally hidden keys get 0 without an exp.
    constexpr T kExpFloor = sizeof(T) == 4 ? T(-80) : T(-700);
    const T drop_at = 2 * std::exp(kExpFloor);
    auto head = z.head(visible);
    T* zp = z.data();
    for (int64_t k = 0; k < visible; ++k) {
      const T e = zp[k] - max;
      zp[k] = e < kExpFloor ? kExpFloor : e;
    }
    head = head.exp();
    for (int64_t k = 0; k < visible; ++k) zp[k] = zp[k] <= drop_at ? T(0) : zp[k];
    z.tail(l.tk - visible).setZero();
    z.head(visible) /= head.sum();
  }
}

template <class T>
void backward_rows(const Tensor& dy, const Tensor& y, int64_t tk, double scale, Tensor& dx) {
  const int64_t rows = y.numel() / tk;
  const T* dys = dy.data<T>();
  const T* ys = y.data<T>();
  T* dxs = dx.data<T>();
  const T s = static_cast<T>(scale);
  for (int64_t r = 0; r < rows; ++r) {
    ConstRow<T> dyr(dys + r * tk, tk), yr(ys + r * tk, tk);
    Row<T> dxr(dxs + r * tk, tk);
    const T dot = (dyr * yr).sum();
    dxr = s * yr * (dyr - dot);
  }
}

}  // namespace

void softmax_forward(const Tensor& x, const SoftmaxRows& layout, Tensor& y) {
  switch (x.dtype()) {
    case DType::F32: return forward_rows<float>(x, layout, y);
    case DType::F64: return forward_rows<double>(x, layout, y);
    default: fail("softmax (cpu)", "dtype ", dtype_name(x.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

void softmax_backward(const Tensor& dy, const Tensor& y, int64_t tk, double scale, Tensor& dx) {
  switch (y.dtype()) {
    case DType::F32: return backward_rows<float>(dy, y, tk, scale, dx);
    case DType::F64: return backward_rows<double>(dy, y, tk, scale, dx);
    default: fail("softmax_backward (cpu)", "dtype ", dtype_name(y.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

}  // namespace hg::cpu
