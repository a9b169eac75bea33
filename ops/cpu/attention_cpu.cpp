#include "ops/cpu/attention_cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu_gemm.hpp"
#include "core/parallel.hpp"

namespace hg::cpu {
namespace {

constexpr int64_t kQueryTile = 64;

// C (rows x cols, leading dim ldc) [+]= alpha op(A) op(B) on the CPU GEMM of
// this machine's level (core/cpu_gemm.hpp); A, B row-major with leading dims.
template <class T>
void product(int64_t rows, int64_t cols, int64_t depth, const T* a, int64_t lda, bool ta, const T* b, int64_t ldb,
             bool tb, T* c, int64_t ldc, T alpha, bool accumulate) {
  cpu::GemmBlock<T> g;
  g.rows = rows, g.cols = cols, g.depth = depth;
  g.a = a, g.lda = lda, g.transpose_a = ta;
  g.b = b, g.ldb = ldb, g.transpose_b = tb;
  g.c = c, g.ldc = ldc;
  g.alpha = alpha, g.accumulate = accumulate;
  cpu::gemm(g);
}

// The (b, h) slices run as tasks: each writes only its own outputs, so the
// results are the same at any thread count.
template <class Body>
void for_heads(const AttentionLayout& l, const Body& body) {
  parallel_for(l.heads_total(), l.heads_total() * l.tq * l.tk * l.head_dim, body);
}

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// One (b, h) slice: rows `row` elements apart (the strides of core/attention_layout.hpp).
template <class T>
using ConstMap = Eigen::Map<const Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T>
ConstMap<T> slice(const void* base, const HeadStrides& s, int64_t bh, int64_t heads, int64_t rows, int64_t dh) {
  return ConstMap<T>(static_cast<const T*>(base) + s.offset(bh / heads, bh % heads), rows, dh,
                     Eigen::OuterStride<>(s.row));
}
template <class T>
MutMap<T> slice_mut(void* base, const HeadStrides& s, int64_t bh, int64_t heads, int64_t rows, int64_t dh) {
  return MutMap<T>(static_cast<T*>(base) + s.offset(bh / heads, bh % heads), rows, dh, Eigen::OuterStride<>(s.row));
}

// The (b, h) slice views and the logits of one query tile.
template <class T>
struct Head {
  const AttentionLayout& l;
  int64_t bh;
  const T* mask_row;  // nullptr: no mask

  Head(const AttentionLayout& layout, int64_t index)
      : l(layout),
        bh(index),
        mask_row(layout.mask == nullptr
                     ? nullptr
                     : static_cast<const T*>(layout.mask) + (index / layout.heads) * layout.mask_batch_stride) {}

  // z = scale * q k^T + mask for queries [i0, i0 + rows); removed keys get -inf.
  void logits(const ConstMap<T>& q, const ConstMap<T>& k, int64_t i0, int64_t rows, Mat<T>& z) const {
    const int64_t dh = q.cols();
    product<T>(rows, l.tk, dh, q.data() + i0 * q.outerStride(), q.outerStride(), false, k.data(), k.outerStride(), true,
               z.data(), l.tk, T(1), false);
    z *= static_cast<T>(l.scale);
    const T inf = std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t end = std::clamp<int64_t>(l.key_end(i0 + r), 0, l.tk);
      for (int64_t j = end; j < l.tk; ++j) z(r, j) = -inf;
      if (mask_row == nullptr) continue;
      // A value at or below the threshold removes its key; adding (m - inf)
      // rather than assigning -inf keeps a NaN mask value NaN (docs/reliability.md).
      for (int64_t j = 0; j < end; ++j) {
        const T m = mask_row[j];
        z(r, j) += m > static_cast<T>(kSoftmaxMaskThreshold) ? m : m - inf;
      }
    }
  }
};

// Row-wise softmax in place, p = exp(z - max) / sum, the plain composition's
// arithmetic: every row sums to one to rounding. (exp(z - lse) with a stored
// lse = max + log(sum) does not: at large logits lse's rounding, an ulp of
// the max, scales every p of the row, and the backward's dp - D cancellation
// amplifies it.) A row whose keys are all removed is zeros; a NaN logit makes
// its row NaN. Returns each row's log-sum-exp in lse (rows values).
template <class T>
void softmax_rows(Mat<T>& z, T* lse) {
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < z.rows(); ++r) {
    const T m = z.row(r).template maxCoeff<Eigen::PropagateNaN>();
    if (m == -inf) {
      z.row(r).setZero();
      lse[r] = -inf;
      continue;
    }
    z.row(r) = (z.row(r).array() - m).exp();
    const T sum = z.row(r).sum();
    z.row(r) *= T(1) / sum;
    lse[r] = m + std::log(sum);
  }
}

template <class T>
void forward(const void* q, const void* k, const void* v, const AttentionLayout& l, void* o, Tensor& lse) {
  const int64_t dh = l.head_dim, h = l.heads;
  for_heads(l, [&](int64_t bh) {
    const Head<T> head(l, bh);
    const ConstMap<T> qm = slice<T>(q, l.q, bh, h, l.tq, dh);
    const ConstMap<T> km = slice<T>(k, l.kv, bh, h, l.tk, dh);
    const ConstMap<T> vm = slice<T>(v, l.kv, bh, h, l.tk, dh);
    MutMap<T> om = slice_mut<T>(o, l.o, bh, h, l.tq, dh);
    T* lse_row = lse.data<T>() + bh * l.tq;
    Mat<T> z(std::min(kQueryTile, l.tq), l.tk);
    for (int64_t i0 = 0; i0 < l.tq; i0 += kQueryTile) {
      const int64_t rows = std::min(kQueryTile, l.tq - i0);
      z.resize(rows, l.tk);
      head.logits(qm, km, i0, rows, z);
      softmax_rows(z, lse_row + i0);
      product<T>(rows, dh, l.tk, z.data(), l.tk, false, vm.data(), vm.outerStride(), false,
                 om.data() + i0 * om.outerStride(), om.outerStride(), T(1), false);
    }
  });
}

template <class T>
void backward(const void* dout, const void* q, const void* k, const void* v, const AttentionLayout& l, void* dq,
              void* dk, void* dv) {
  const int64_t dh = l.head_dim, h = l.heads;
  const T scale = static_cast<T>(l.scale);
  for_heads(l, [&](int64_t bh) {
    const Head<T> head(l, bh);
    const ConstMap<T> qm = slice<T>(q, l.q, bh, h, l.tq, dh);
    const ConstMap<T> km = slice<T>(k, l.kv, bh, h, l.tk, dh);
    const ConstMap<T> vm = slice<T>(v, l.kv, bh, h, l.tk, dh);
    const ConstMap<T> dom = slice<T>(dout, l.o, bh, h, l.tq, dh);
    MutMap<T> dqm = slice_mut<T>(dq, l.q, bh, h, l.tq, dh);
    MutMap<T> dkm = slice_mut<T>(dk, l.kv, bh, h, l.tk, dh);
    MutMap<T> dvm = slice_mut<T>(dv, l.kv, bh, h, l.tk, dh);
    dkm.setZero();
    dvm.setZero();
    Mat<T> p, dp;
    Eigen::Matrix<T, Eigen::Dynamic, 1> lse_tile(std::min(kQueryTile, l.tq));
    for (int64_t i0 = 0; i0 < l.tq; i0 += kQueryTile) {
      const int64_t rows = std::min(kQueryTile, l.tq - i0);
      p.resize(rows, l.tk);
      head.logits(qm, km, i0, rows, p);
      softmax_rows(p, lse_tile.data());  // the forward's p, bit for bit
      const T* d_out = dom.data() + i0 * dom.outerStride();
      const int64_t ld_out = dom.outerStride();
      dp.resize(rows, l.tk);
      product<T>(l.tk, dh, rows, p.data(), l.tk, true, d_out, ld_out, false, dvm.data(), dvm.outerStride(), T(1),
                 true);  // dv += p^T do
      product<T>(rows, l.tk, dh, d_out, ld_out, false, vm.data(), vm.outerStride(), true, dp.data(), l.tk, T(1),
                 false);  // dp = do v^T
      // D_i = sum_j p_ij dp_ij (= do_i . o_i in exact arithmetic; summed over
      // the same p the gradient uses, so ds rows sum to zero to rounding even
      // where p is nearly one-hot: docs/attention.md).
      const Eigen::Matrix<T, Eigen::Dynamic, 1> d = (p.array() * dp.array()).rowwise().sum();
      p.array() *= (dp.array().colwise() - d.array());  // p now holds dS / scale
      product<T>(rows, dh, l.tk, p.data(), l.tk, false, km.data(), km.outerStride(), false,
                 dqm.data() + i0 * dqm.outerStride(), dqm.outerStride(), scale, false);  // dq = scale dS k
      product<T>(l.tk, dh, rows, p.data(), l.tk, true, qm.data() + i0 * qm.outerStride(), qm.outerStride(), false,
                 dkm.data(), dkm.outerStride(), scale, true);  // dk += scale dS^T q
    }
  });
}

}  // namespace

void attention_forward(DType dtype, const void* q, const void* k, const void* v, const AttentionLayout& layout, void* o,
                       Tensor& lse) {
  if (dtype == DType::F64) return forward<double>(q, k, v, layout, o, lse);
  forward<float>(q, k, v, layout, o, lse);
}

void attention_backward(DType dtype, const void* dout, const void* q, const void* k, const void* v,
                        const AttentionLayout& layout, void* dq, void* dk, void* dv) {
  if (dtype == DType::F64) return backward<double>(dout, q, k, v, layout, dq, dk, dv);
  backward<float>(dout, q, k, v, layout, dq, dk, dv);
}

}  // namespace hg::cpu
