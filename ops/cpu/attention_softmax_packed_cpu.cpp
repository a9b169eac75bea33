#include "ops/cpu/attention_softmax_packed_cpu.hpp"

#include <algorithm>

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

// Under the causal rule query q sees keys k <= q: a block of query rows
// [r0, r1) needs keys [0, r1) only, a block of key rows [r0, r1) queries
// [r0, T) only. The products over keys (context, dq) or queries (dv, dk)
// then run a block at a time and leave the hidden ones out: their
// probabilities, and so their score gradients, are exactly 0, so the terms
// left out add nothing (for finite v and dout). Blocks of 64 rows, the last
// one taking the rest (T = 128: two blocks, a quarter of those products'
// work saved). Each kept term is summed in the same order as in the full
// product: 64 is a multiple of Eigen's 8-step k loop and 4-row panels, every
// block is far above the size where Eigen switches to its coefficient-wise
// product, and `skips_hidden` asks that the full product's depth be one
// depth block (else Eigen's depth blocks would fall elsewhere and round
// differently). So the results are the full products' bit for bit
// (tests/test_attention_softmax_packed.cpp).
constexpr int64_t kCausalBlock = 64;

template <class T>
const PackedGemm<T>& packed_gemm();
template <>
const PackedGemm<float>& packed_gemm() {
  return packed_gemm_f32();
}
template <>
const PackedGemm<double>& packed_gemm() {
  return packed_gemm_f64();
}

template <class T>
bool skips_hidden(const Heads& s, bool causal) {
  return causal && s.t >= 2 * kCausalBlock && packed_gemm<T>().depth_block(s.t, s.dh, s.t) >= s.t;
}

// body(b, h, r0, r1) for every (b, h) and every block of rows [r0, r1): all
// T rows at once, or the blocks above when `skip`. One task per (b, h), its
// blocks in order: the results do not depend on the threads.
template <class Body>
void for_heads(const Heads& s, bool skip, const Body& body) {
  const int64_t blocks = skip ? s.t / kCausalBlock : 1;
  parallel_for(s.batch * s.heads, s.batch * s.heads * s.t * s.t * s.dh, [&](int64_t task) {
    for (int64_t i = 0; i < blocks; ++i)
      body(task / s.heads, task % s.heads, i * kCausalBlock, i + 1 == blocks ? s.t : (i + 1) * kCausalBlock);
  });
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
  for_heads(s, false, [&](int64_t b, int64_t h, int64_t, int64_t) {
    gemm(product<T>(s.t, s.t, s.dh, x + s.qkv_at(b, h, 0), ld, false, x + s.qkv_at(b, h, 1), ld, true,
                    out + s.square_at(b, h), s.t));
  });
}

// Query rows [r0, r1) of `square` (B, H, T, T) times the keys they see
// (`skip`: only those), rows of `keys` (ld apart): context = P v, dq = dS k.
template <class T>
void over_keys(const Heads& s, bool skip, const T* square, const T* keys, int64_t ld, T* out, int64_t ldo, int64_t b,
               int64_t h, int64_t r0, int64_t r1) {
  const int64_t depth = skip ? r1 : s.t;
  gemm(product<T>(r1 - r0, s.dh, depth, square + s.square_at(b, h) + r0 * s.t, s.t, false, keys, ld, false,
                  out + r0 * ldo, ldo));
}

// Key rows [r0, r1) of `square`^T times the queries that see them (`skip`:
// only those), rows of `queries` (ld apart): dv = P^T dO, dk = dS^T q.
template <class T>
void over_queries(const Heads& s, bool skip, const T* square, const T* queries, int64_t ld, T* out, int64_t ldo,
                  int64_t b, int64_t h, int64_t r0, int64_t r1) {
  const int64_t q0 = skip ? r0 : 0;
  gemm(product<T>(r1 - r0, s.dh, s.t - q0, square + s.square_at(b, h) + q0 * s.t + r0, s.t, true, queries + q0 * ld, ld,
                  false, out + r0 * ldo, ldo));
}

template <class T>
void context_typed(const Tensor& probs, const Tensor& qkv, const Heads& s, bool causal, Tensor& out) {
  const T* p = probs.data<T>();
  const T* x = qkv.data<T>();
  T* o = out.data<T>();
  const bool skip = skips_hidden<T>(s, causal);
  for_heads(s, skip, [&](int64_t b, int64_t h, int64_t r0, int64_t r1) {
    over_keys<T>(s, skip, p, x + s.qkv_at(b, h, 2), 3 * s.width(), o + s.merged_at(b, h), s.width(), b, h, r0, r1);
  });
}

template <class T>
void value_grads_typed(const Tensor& dout, const Tensor& probs, const Tensor& qkv, const Heads& s, bool causal,
                       Tensor& dprobs, Tensor& dqkv) {
  const T* dy = dout.data<T>();
  const T* p = probs.data<T>();
  const T* x = qkv.data<T>();
  T* dp = dprobs.data<T>();
  T* dx = dqkv.data<T>();
  const int64_t ld = 3 * s.width();
  // dP = dO v^T in full: the softmax backward reads every entry.
  for_heads(s, false, [&](int64_t b, int64_t h, int64_t, int64_t) {
    gemm(product<T>(s.t, s.t, s.dh, dy + s.merged_at(b, h), s.width(), false, x + s.qkv_at(b, h, 2), ld, true,
                    dp + s.square_at(b, h), s.t));
  });
  const bool skip = skips_hidden<T>(s, causal);
  for_heads(s, skip, [&](int64_t b, int64_t h, int64_t r0, int64_t r1) {  // dv = P^T dO
    over_queries<T>(s, skip, p, dy + s.merged_at(b, h), s.width(), dx + s.qkv_at(b, h, 2), ld, b, h, r0, r1);
  });
}

template <class T>
void query_key_grads_typed(const Tensor& dscores, const Tensor& qkv, const Heads& s, bool causal, Tensor& dqkv) {
  const T* ds = dscores.data<T>();
  const T* x = qkv.data<T>();
  T* dx = dqkv.data<T>();
  const int64_t ld = 3 * s.width();
  const bool skip = skips_hidden<T>(s, causal);
  for_heads(s, skip, [&](int64_t b, int64_t h, int64_t r0, int64_t r1) {  // dq = dS k
    over_keys<T>(s, skip, ds, x + s.qkv_at(b, h, 1), ld, dx + s.qkv_at(b, h, 0), ld, b, h, r0, r1);
  });
  for_heads(s, skip, [&](int64_t b, int64_t h, int64_t r0, int64_t r1) {  // dk = dS^T q
    over_queries<T>(s, skip, ds, x + s.qkv_at(b, h, 0), ld, dx + s.qkv_at(b, h, 1), ld, b, h, r0, r1);
  });
}

}  // namespace

void packed_scores(const Tensor& qkv, int64_t heads, Tensor& scores) {
  if (qkv.dtype() == DType::F32) scores_typed<float>(qkv, heads_of(qkv, heads), scores);
  else scores_typed<double>(qkv, heads_of(qkv, heads), scores);
}

void packed_context(const Tensor& probs, const Tensor& qkv, int64_t heads, bool causal, Tensor& out) {
  if (qkv.dtype() == DType::F32) context_typed<float>(probs, qkv, heads_of(qkv, heads), causal, out);
  else context_typed<double>(probs, qkv, heads_of(qkv, heads), causal, out);
}

void packed_value_grads(const Tensor& dout, const Tensor& probs, const Tensor& qkv, int64_t heads, bool causal,
                        Tensor& dprobs, Tensor& dqkv) {
  const Heads s = heads_of(qkv, heads);
  if (qkv.dtype() == DType::F32) value_grads_typed<float>(dout, probs, qkv, s, causal, dprobs, dqkv);
  else value_grads_typed<double>(dout, probs, qkv, s, causal, dprobs, dqkv);
}

void packed_query_key_grads(const Tensor& dscores, const Tensor& qkv, int64_t heads, bool causal, Tensor& dqkv) {
  if (qkv.dtype() == DType::F32) query_key_grads_typed<float>(dscores, qkv, heads_of(qkv, heads), causal, dqkv);
  else query_key_grads_typed<double>(dscores, qkv, heads_of(qkv, heads), causal, dqkv);
}

}  // namespace hg::cpu
