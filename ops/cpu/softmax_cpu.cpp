#include "ops/cpu/softmax_cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/parallel.hpp"
#include "core/simd.hpp"
#include "core/softmax_layout.hpp"
#include "ops/softmax.hpp"

namespace hg::cpu {
namespace {

template <class T>
using RowArray = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using ConstRow = Eigen::Map<const RowArray<T>>;
template <class T>
using Row = Eigen::Map<RowArray<T>>;

// Keys [0, n) are visible to query q under the causal rule k <= q + (tk - tq).
// n can be 0 when tq > tk: the first queries then see nothing.
int64_t causally_visible_keys(const SoftmaxRows& l, int64_t q) {
  if (!l.causal) return l.tk;
  return std::clamp<int64_t>(q + (l.tk - l.tq) + 1, 0, l.tk);
}

// Exponents are floored at kExpFloor (-80 float, -700 double) before the
// exp, and any weight at or below twice exp(kExpFloor) is then set to exactly
// 0: no subnormal arithmetic (~100x slower on x86), and a masked key (-inf)
// weighs exactly 0. A key dropped this way weighs < 4e-35 (float) next to a
// row sum >= 1 (the max key gives exactly 1): far below one rounding of the
// sum. NaN passes through (max(NaN, f) is NaN here).
template <class T>
constexpr T kExpFloor = sizeof(T) == 4 ? T(-80) : T(-700);

// Rows per task: about 16K elements, whole rows.
template <class Body>
void for_row_tasks(int64_t rows, int64_t len, const Body& body) {
  const int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, len));
  parallel_for(pieces(rows, per), rows * len, [&](int64_t t) { body(t * per, std::min(rows, (t + 1) * per)); });
}

// ---------------------------------------------------------------- float32
// SIMD rows (core/simd.hpp: vectorised exp, fixed lane order), same rules as
// the float64 path below.
using simd::Floats;
using simd::kLanes;

using simd::load_n;
using simd::store_n;

// A row whose every visible score is -inf (or NaN): its visible keys are NaN
// if any score is NaN (NaN propagates), else the row is zeros, not
// (-inf) - (-inf) = NaN. Hidden keys are 0 either way.
void write_masked_row(float* z, int64_t visible, int64_t tk, bool has_nan) {
  std::fill(z, z + visible, has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.f);
  std::fill(z + visible, z + tk, 0.f);
}

// Rows of up to kRegisterVectors vectors are held in registers: the scores
// are read once and the weights written once (docs/cpu.md).
constexpr int kRegisterVectors = 8;

// One row of NV vectors (the last one holding `last` <= kLanes keys) in
// registers. scores(i, k): the score vector at key i, lanes >= k at -inf;
// weight(v, max): its unnormalised weights. Returns false, leaving z
// untouched, when every score is -inf or NaN.
template <int NV, class Scores, class Weight>
HG_SIMD_INLINE bool row_in_registers(int64_t last, const Scores& scores, const Weight& weight, float* z,
                                     bool& has_nan) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  Floats v[NV];
  Floats vmax = simd::splat(-inf);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    v[j] = scores(j * kLanes, j < NV - 1 ? kLanes : last);
    vmax = v[j] > vmax ? v[j] : vmax;  // skips NaN: a NaN reaches the row through the sum below
  }
  const float max = simd::max_lanes(vmax);
  if (max == -inf) {
    simd::Ints nan{};
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) nan |= v[j] != v[j];
    has_nan = simd::any(nan);
    return false;
  }
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) v[j] = weight(v[j], max);
  // Pairwise: v[0] += v[1], v[2] += v[3], ..., then v[0] += v[2], ...
  Floats s[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) s[j] = v[j];
#pragma GCC unroll 8
  for (int w = 1; w < NV; w *= 2)
#pragma GCC unroll 8
    for (int j = 0; j + w < NV; j += 2 * w) s[j] += s[j + w];
  const float inv_sum = 1.f / simd::sum_lanes(s[0]);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) store_n(z + j * kLanes, v[j] * inv_sum, j < NV - 1 ? kLanes : last);
  return true;
}

// Rows [r0, r1); xs and ys point at row r0.
HG_SIMD_CLONES void forward_rows_f32(const float* xs, const float* mask, const SoftmaxRows& l, int64_t r0, int64_t r1,
                                     float* ys) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float scale = static_cast<float>(l.scale), threshold = static_cast<float>(kSoftmaxMaskThreshold);
  const float drop_at = 2 * std::exp(kExpFloor<float>);
  // Row r is query q of batch b; both are stepped, not divided out per row.
  const int64_t batch_rows = l.heads * l.tq;
  int64_t b = r0 / batch_rows, in_batch = r0 % batch_rows, q = r0 % l.tq;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t visible = causally_visible_keys(l, q);
    const float* xr = xs + (r - r0) * l.tk;
    const float* mr = mask ? mask + b * l.mask_batch_stride + q * l.mask_query_stride : nullptr;
    float* z = ys + (r - r0) * l.tk;
    if (++q == l.tq) q = 0;
    if (++in_batch == batch_rows) in_batch = 0, ++b;
    // z = scale * x (+ mask: a value at or below the threshold masks its key
    // outright; adding (m - inf) rather than assigning -inf keeps a NaN mask NaN).
    auto scores = [&](int64_t i, int64_t k) HG_SIMD_LAMBDA {
      Floats v = scale * load_n(xr + i, k, 0.f);
      if (mr) {
        const Floats m = load_n(mr + i, k, 0.f);
        v += m > threshold ? m : m - inf;
      }
      return k == kLanes ? v : simd::keep_first(v, k, -inf);
    };
    // Weights in [0, 1], floored and dropped as described at kExpFloor. The
    // max skips NaN scores: a NaN score gives a NaN weight, hence a NaN sum,
    // and every weight of its row becomes NaN when normalised.
    auto weight = [&](Floats v, float max) HG_SIMD_LAMBDA {
      const Floats e = v - max;
      const Floats w = simd::exp_normal_range(e < kExpFloor<float> ? simd::splat(kExpFloor<float>) : e);
      return w <= drop_at ? Floats{} : w;
    };
    bool has_nan = false;
    if (visible > 0 && visible <= kRegisterVectors * kLanes) {
      const int64_t vectors = (visible + kLanes - 1) / kLanes, last = visible - (vectors - 1) * kLanes;
      bool done = false;
      switch (vectors) {
        case 1: done = row_in_registers<1>(last, scores, weight, z, has_nan); break;
        case 2: done = row_in_registers<2>(last, scores, weight, z, has_nan); break;
        case 3: done = row_in_registers<3>(last, scores, weight, z, has_nan); break;
        case 4: done = row_in_registers<4>(last, scores, weight, z, has_nan); break;
        case 5: done = row_in_registers<5>(last, scores, weight, z, has_nan); break;
        case 6: done = row_in_registers<6>(last, scores, weight, z, has_nan); break;
        case 7: done = row_in_registers<7>(last, scores, weight, z, has_nan); break;
        default: done = row_in_registers<8>(last, scores, weight, z, has_nan); break;
      }
      if (done) std::fill(z + visible, z + l.tk, 0.f);
      else write_masked_row(z, visible, l.tk, has_nan);
      continue;
    }
    // Longer rows: y's row holds z until it is normalised.
    Floats vmax = simd::splat(-inf);
    int64_t i = 0;
    for (; i + kLanes <= visible; i += kLanes) {
      const Floats v = scores(i, kLanes);
      simd::store(z + i, v);
      vmax = v > vmax ? v : vmax;
    }
    if (i < visible) {
      const Floats v = scores(i, visible - i);  // padded lanes are -inf
      simd::store_partial(z + i, v, visible - i);
      vmax = v > vmax ? v : vmax;
    }
    const float max = simd::max_lanes(vmax);
    if (max == -inf) {
      write_masked_row(z, visible, l.tk, std::any_of(z, z + visible, [](float v) { return v != v; }));
      continue;
    }
    const float sum = simd::sum(visible, [&](int64_t j, int64_t k) HG_SIMD_LAMBDA {
      const Floats e = weight(load_n(z + j, k, -inf), max);
      store_n(z + j, e, k);
      return e;
    });
    // One division per row: a vector division per 16 weights cost about a
    // cycle per element, a quarter of the row's work (docs/cpu.md).
    const float inv_sum = 1.f / sum;
    simd::transform(z, z, visible, [&](Floats e) HG_SIMD_LAMBDA { return e * inv_sum; });
    // Causally hidden keys are not read at all (as in the CUDA kernel): weight 0.
    std::fill(z + visible, z + l.tk, 0.f);
  }
}

HG_SIMD_CLONES void backward_rows_f32(const float* dys, const float* ys, int64_t tk, float s, int64_t r0, int64_t r1,
                                      float* dxs) {
  for (int64_t r = r0; r < r1; ++r) {
    const float *dy = dys + r * tk, *y = ys + r * tk;
    auto both = [&](int64_t i, int64_t k, auto f) HG_SIMD_LAMBDA {
      return k == kLanes ? f(simd::load(dy + i), simd::load(y + i))
                         : f(simd::load_partial(dy + i, k, 0.f), simd::load_partial(y + i, k, 0.f));
    };
    const float dot = simd::sum(tk, [&](int64_t i, int64_t k) HG_SIMD_LAMBDA {
      return both(i, k, [](Floats d, Floats v) HG_SIMD_LAMBDA { return d * v; });
    });
    float* dx = dxs + r * tk;
    int64_t i = 0;
    for (; i + kLanes <= tk; i += kLanes) simd::store(dx + i, s * simd::load(y + i) * (simd::load(dy + i) - dot));
    if (i < tk)
      simd::store_partial(dx + i, both(i, tk - i, [&](Floats d, Floats v) HG_SIMD_LAMBDA { return s * v * (d - dot); }),
                          tk - i);
  }
}

// ---------------------------------------------------------------- float64
// Rows [r0, r1); xs and ys point at row r0.
template <class T>
void forward_rows(const T* xs, const SoftmaxRows& l, int64_t r0, int64_t r1, T* ys) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  const T* mask = l.mask ? l.mask->data<T>() : nullptr;
  const T scale = static_cast<T>(l.scale);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t b = r / (l.heads * l.tq), q = r % l.tq;
    ConstRow<T> xr(xs + (r - r0) * l.tk, l.tk);
    Row<T> z(ys + (r - r0) * l.tk, l.tk);  // y's row holds z until it is normalised

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
    // Weights in (0, 1], floored and dropped as described at kExpFloor.
    // Causally hidden keys get 0 without an exp.
    const T floor = kExpFloor<T>;
    const T drop_at = 2 * std::exp(floor);
    auto head = z.head(visible);
    T* zp = z.data();
    for (int64_t k = 0; k < visible; ++k) {
      const T e = zp[k] - max;
      zp[k] = e < floor ? floor : e;
    }
    head = head.exp();
    for (int64_t k = 0; k < visible; ++k) zp[k] = zp[k] <= drop_at ? T(0) : zp[k];
    z.tail(l.tk - visible).setZero();
    z.head(visible) /= head.sum();
  }
}

template <class T>
void backward_rows(const T* dys, const T* ys, int64_t tk, double scale, int64_t r0, int64_t r1, T* dxs) {
  const T s = static_cast<T>(scale);
  for (int64_t r = r0; r < r1; ++r) {
    ConstRow<T> dyr(dys + r * tk, tk), yr(ys + r * tk, tk);
    Row<T> dxr(dxs + r * tk, tk);
    const T dot = (dyr * yr).sum();
    dxr = s * yr * (dyr - dot);
  }
}

}  // namespace

void softmax_forward_rows(const float* x, const SoftmaxRows& layout, int64_t r0, int64_t r1, float* y) {
  forward_rows_f32(x, layout.mask ? layout.mask->data<float>() : nullptr, layout, r0, r1, y);
}

void softmax_forward_rows(const double* x, const SoftmaxRows& layout, int64_t r0, int64_t r1, double* y) {
  forward_rows<double>(x, layout, r0, r1, y);
}

void softmax_backward_rows(const float* dy, const float* y, int64_t rows, int64_t tk, double scale, float* dx) {
  backward_rows_f32(dy, y, tk, static_cast<float>(scale), 0, rows, dx);
}

void softmax_backward_rows(const double* dy, const double* y, int64_t rows, int64_t tk, double scale, double* dx) {
  backward_rows<double>(dy, y, tk, scale, 0, rows, dx);
}

void softmax_forward(const Tensor& x, const SoftmaxRows& layout, Tensor& y) {
  switch (x.dtype()) {
    case DType::F32:
      return for_row_tasks(layout.rows, layout.tk, [&](int64_t r0, int64_t r1) {
        softmax_forward_rows(x.data<float>() + r0 * layout.tk, layout, r0, r1, y.data<float>() + r0 * layout.tk);
      });
    case DType::F64:
      return for_row_tasks(layout.rows, layout.tk, [&](int64_t r0, int64_t r1) {
        softmax_forward_rows(x.data<double>() + r0 * layout.tk, layout, r0, r1, y.data<double>() + r0 * layout.tk);
      });
    default: fail("softmax (cpu)", "dtype ", dtype_name(x.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

void softmax_backward(const Tensor& dy, const Tensor& y, int64_t tk, double scale, Tensor& dx) {
  switch (y.dtype()) {
    case DType::F32:
      return for_row_tasks(y.numel() / tk, tk, [&](int64_t r0, int64_t r1) {
        backward_rows_f32(dy.data<float>(), y.data<float>(), tk, static_cast<float>(scale), r0, r1, dx.data<float>());
      });
    case DType::F64:
      return for_row_tasks(y.numel() / tk, tk, [&](int64_t r0, int64_t r1) {
        backward_rows<double>(dy.data<double>(), y.data<double>(), tk, scale, r0, r1, dx.data<double>());
      });
    default: fail("softmax_backward (cpu)", "dtype ", dtype_name(y.dtype()), " is not supported on the CPU (F32/F64)");
  }
}

}  // namespace hg::cpu
