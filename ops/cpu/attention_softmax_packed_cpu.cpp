#include "ops/cpu/attention_softmax_packed_cpu.hpp"

#include "core/cpu_gemm.hpp"
#include "core/parallel.hpp"

namespace hg::cpu {
namespace {

// Where (batch b, head h) starts in each layout, and the row strides.
struct Heads {
  int64_t batch, heads, t, dh;
  int64_t width() const { return heads * dh; }
  int64_t qkv_at(int64_t b, int64_t h, int slot) const { return b * t * 3 * width() + slot * width() + h * dh; }
  int64_t merged_at(int64_t b, int64_t h) const { return b * t * width() + h * dh; }
  int64_t square_at(int64_t b, int64_t h) const { return (b * heads + h) * t * t; }
};

Heads heads_of(const Tensor& qkv, int64_t heads) {
  return {qkv.size(0), heads, qkv.size(1), qkv.size(2) / (3 * heads)};
}

// C = op(A) op(B) for every (b, h), the blocks from `block(b, h)`; each of
// the four products does T x T x dh multiply-adds a head.
template <class Block>
void for_heads(const Heads& s, const Block& block) {
  parallel_for(s.batch * s.heads, s.batch * s.heads * s.t * s.t * s.dh,
               [&](int64_t task) { gemm(block(task / s.heads, task % s.heads)); });
}

template <class T>
GemmBlock<T> product(int64_t rows, int64_t cols, int64_t depth, const T* a, int64_t lda, bool ta, const T* b,
                     int64_t ldb, bool tb, T* c, int64_t ldc) {
  GemmBlock<T> g;
  g.rows = rows, g.cols = cols, g.depth = depth;
  g.a = a, g.lda = lda, g.transpose_a = ta;
  g.b = b, g.ldb = ldb, g.transpose_b = tb;
  g.c = c, g.ldc = ldc;
  return g;
}

template <class T>
void scores_typed(const Tensor& qkv, const Heads& s, Tensor& scores) {
  const T* x = qkv.data<T>();
  T* out = scores.data<T>();
  const int64_t ld = 3 * s.width();
  for_heads(s, [&](int64_t b, int64_t h) {
    return product<T>(s.t, s.t, s.dh, x + s.qkv_at(b, h, 0), ld, false, x + s.qkv_at(b, h, 1), ld, true,
                      out + s.square_at(b, h), s.t);
  });
}

template <class T>
void context_typed(const Tensor& probs, const Tensor& qkv, const Heads& s, Tensor& out) {
  const T* p = probs.data<T>();
  const T* x = qkv.data<T>();
  T* o = out.data<T>();
  for_heads(s, [&](int64_t b, int64_t h) {
    return product<T>(s.t, s.dh, s.t, p + s.square_at(b, h), s.t, false, x + s.qkv_at(b, h, 2), 3 * s.width(), false,
                      o + s.merged_at(b, h), s.width());
  });
}

template <class T>
void value_grads_typed(const Tensor& dout, const Tensor& probs, const Tensor& qkv, const Heads& s, Tensor& dprobs,
                       Tensor& dqkv) {
  const T* dy = dout.data<T>();
  const T* p = probs.data<T>();
  const T* x = qkv.data<T>();
  T* dp = dprobs.data<T>();
  T* dx = dqkv.data<T>();
  const int64_t ld = 3 * s.width();
  for_heads(s, [&](int64_t b, int64_t h) {  // dP = dO v^T
    return product<T>(s.t, s.t, s.dh, dy + s.merged_at(b, h), s.width(), false, x + s.qkv_at(b, h, 2), ld, true,
                      dp + s.square_at(b, h), s.t);
  });
  for_heads(s, [&](int64_t b, int64_t h) {  // dv = P^T dO
    return product<T>(s.t, s.dh, s.t, p + s.square_at(b, h), s.t, true, dy + s.merged_at(b, h), s.width(), false,
                      dx + s.qkv_at(b, h, 2), ld);
  });
}

template <class T>
void query_key_grads_typed(const Tensor& dscores, const Tensor& qkv, const Heads& s, Tensor& dqkv) {
  const T* ds = dscores.data<T>();
  const T* x = qkv.data<T>();
  T* dx = dqkv.data<T>();
  const int64_t ld = 3 * s.width();
  for_heads(s, [&](int64_t b, int64_t h) {  // dq = dS k
    return product<T>(s.t, s.dh, s.t, ds + s.square_at(b, h), s.t, false, x + s.qkv_at(b, h, 1), ld, false,
                      dx + s.qkv_at(b, h, 0), ld);
  });
  for_heads(s, [&](int64_t b, int64_t h) {  // dk = dS^T q
    return product<T>(s.t, s.dh, s.t, ds + s.square_at(b, h), s.t, true, x + s.qkv_at(b, h, 0), ld, false,
                      dx + s.qkv_at(b, h, 1), ld);
  });
}

}  // namespace

void packed_scores(const Tensor& qkv, int64_t heads, Tensor& scores) {
  if (qkv.dtype() == DType::F32) scores_typed<float>(qkv, heads_of(qkv, heads), scores);
  else scores_typed<double>(qkv, heads_of(qkv, heads), scores);
}

void packed_context(const Tensor& probs, const Tensor& qkv, int64_t heads, Tensor& out) {
  if (qkv.dtype() == DType::F32) context_typed<float>(probs, qkv, heads_of(qkv, heads), out);
  else context_typed<double>(probs, qkv, heads_of(qkv, heads), out);
}

void packed_value_grads(const Tensor& dout, const Tensor& probs, const Tensor& qkv, int64_t heads, Tensor& dprobs,
                        Tensor& dqkv) {
  if (qkv.dtype() == DType::F32) value_grads_typed<float>(dout, probs, qkv, heads_of(qkv, heads), dprobs, dqkv);
  else value_grads_typed<double>(dout, probs, qkv, heads_of(qkv, heads), dprobs, dqkv);
}

void packed_query_key_grads(const Tensor& dscores, const Tensor& qkv, int64_t heads, Tensor& dqkv) {
  if (qkv.dtype() == DType::F32) query_key_grads_typed<float>(dscores, qkv, heads_of(qkv, heads), dqkv);
  else query_key_grads_typed<double>(dscores, qkv, heads_of(qkv, heads), dqkv);
}

}  // namespace hg::cpu
