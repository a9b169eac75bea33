#include "ops/cpu/attention_softmax_packed_cpu.hpp"

#include <algorithm>
#include <vector>

#include "core/cpu_gemm.hpp"
#include "core/parallel.hpp"
#include "ops/cpu/softmax_cpu.hpp"

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

// body(r0, r1) for the blocks of rows [r0, r1): all T rows at once, or the
// blocks above when `skip`, in order.
template <class Body>
void for_blocks(const Heads& s, bool skip, const Body& body) {
  const int64_t blocks = skip ? s.t / kCausalBlock : 1;
  for (int64_t i = 0; i < blocks; ++i) body(i * kCausalBlock, i + 1 == blocks ? s.t : (i + 1) * kCausalBlock);
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

// A head's T x T `square` (P or dS) times the keys each query row sees
// (`skip`: only those; rows of `keys` ld apart), a block of rows at a time:
// context = P v, dq = dS k.
template <class T>
void over_keys(const Heads& s, bool skip, const T* square, const T* keys, int64_t ld, T* out, int64_t ldo) {
  for_blocks(s, skip, [&](int64_t r0, int64_t r1) {
    const int64_t depth = skip ? r1 : s.t;
    gemm(product<T>(r1 - r0, s.dh, depth, square + r0 * s.t, s.t, false, keys, ld, false, out + r0 * ldo, ldo));
  });
}

// `square`^T times the queries that see each key row (`skip`: only those;
// rows of `queries` ld apart), a block of key rows at a time: dv = P^T dO,
// dk = dS^T q.
template <class T>
void over_queries(const Heads& s, bool skip, const T* square, const T* queries, int64_t ld, T* out, int64_t ldo) {
  for_blocks(s, skip, [&](int64_t r0, int64_t r1) {
    const int64_t q0 = skip ? r0 : 0;
    gemm(product<T>(r1 - r0, s.dh, s.t - q0, square + q0 * s.t + r0, s.t, true, queries + q0 * ld, ld, false,
                    out + r0 * ldo, ldo));
  });
}

// A T x T buffer for one head. Up to kKeptHeadBytes it is the calling
// thread's own, kept for its next head (no allocation per head); a larger
// one (T past 1448 in f64, reached where batch x heads fills the threads)
// lives only as long as this object, so that one long-sequence call does
// not leave every pool thread holding T^2 elements.
constexpr size_t kKeptHeadBytes = size_t(16) << 20;
template <class T>
class HeadBuffer {
 public:
  explicit HeadBuffer(int64_t t) {
    const auto n = static_cast<size_t>(t * t);
    std::vector<T>& buffer = n * sizeof(T) <= kKeptHeadBytes ? kept() : own_;
    if (buffer.size() < n) buffer.resize(n);
    data_ = buffer.data();
  }
  T* data() const { return data_; }

 private:
  static std::vector<T>& kept() {
    thread_local std::vector<T> buffer;
    return buffer;
  }
  std::vector<T> own_;
  T* data_ = nullptr;
};

// One task per (batch, head), everything of that head in it.
template <class Body>
void for_heads(const Heads& s, const Body& body) {
  parallel_for(s.batch * s.heads, s.batch * s.heads * s.t * s.t * s.dh,
               [&](int64_t task) { body(task / s.heads, task % s.heads); });
}

template <class T>
void forward_typed(const Tensor& qkv, const Heads& s, const SoftmaxRows& layout, Tensor& probs, Tensor& out) {
  const T* x = qkv.data<T>();
  T* p = probs.data<T>();
  T* o = out.data<T>();
  const int64_t ld = 3 * s.width();
  const bool skip = skips_hidden<T>(s, layout.causal);
  for_heads(s, [&](int64_t b, int64_t h) {
    const HeadBuffer<T> buffer(s.t);
    T* scores = buffer.data();
    gemm(product<T>(s.t, s.t, s.dh, x + s.qkv_at(b, h, 0), ld, false, x + s.qkv_at(b, h, 1), ld, true, scores, s.t));
    const int64_t row = (b * s.heads + h) * s.t;  // the head's first row of probs
    softmax_forward_rows(scores, layout, row, row + s.t, p + s.square_at(b, h));
    over_keys<T>(s, skip, p + s.square_at(b, h), x + s.qkv_at(b, h, 2), ld, o + s.merged_at(b, h), s.width());
  });
}

template <class T>
void backward_typed(const Tensor& dout, const Tensor& qkv, const Tensor& probs, const Heads& s, double scale,
                    bool causal, Tensor& dqkv) {
  const T* dy = dout.data<T>();
  const T* x = qkv.data<T>();
  const T* p = probs.data<T>();
  T* dx = dqkv.data<T>();
  const int64_t ld = 3 * s.width();
  const bool skip = skips_hidden<T>(s, causal);
  for_heads(s, [&](int64_t b, int64_t h) {
    const T* ph = p + s.square_at(b, h);
    const T* dyh = dy + s.merged_at(b, h);
    const HeadBuffer<T> buffer(s.t);
    T* ds = buffer.data();
    // dP = dO v^T in full (the softmax backward reads every entry), then dS in place.
    gemm(product<T>(s.t, s.t, s.dh, dyh, s.width(), false, x + s.qkv_at(b, h, 2), ld, true, ds, s.t));
    over_queries<T>(s, skip, ph, dyh, s.width(), dx + s.qkv_at(b, h, 2), ld);  // dv = P^T dO
    softmax_backward_rows(ds, ph, s.t, s.t, scale, ds);
    over_keys<T>(s, skip, ds, x + s.qkv_at(b, h, 1), ld, dx + s.qkv_at(b, h, 0), ld);     // dq = dS k
    over_queries<T>(s, skip, ds, x + s.qkv_at(b, h, 0), ld, dx + s.qkv_at(b, h, 1), ld);  // dk = dS^T q
  });
}

}  // namespace

void packed_forward(const Tensor& qkv, int64_t heads, const SoftmaxRows& layout, Tensor& probs, Tensor& out) {
  if (qkv.dtype() == DType::F32) forward_typed<float>(qkv, heads_of(qkv, heads), layout, probs, out);
  else forward_typed<double>(qkv, heads_of(qkv, heads), layout, probs, out);
}

void packed_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads, double scale,
                     bool causal, Tensor& dqkv) {
  const Heads s = heads_of(qkv, heads);
  if (qkv.dtype() == DType::F32) backward_typed<float>(dout, qkv, probs, s, scale, causal, dqkv);
  else backward_typed<double>(dout, qkv, probs, s, scale, causal, dqkv);
}

}  // namespace hg::cpu
