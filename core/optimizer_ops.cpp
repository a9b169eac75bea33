#include "core/optimizer_ops.hpp"

#include <algorithm>
#include <cmath>

#include "core/parallel.hpp"
#include "core/simd.hpp"

namespace hg {
namespace {

void check_float(const Tensor& t, const char* what, size_t i, bool allow_f64, const char* op) {
  t.check_defined(op);
  HG_CHECK(t.dtype() == DType::F32 || (allow_f64 && t.dtype() == DType::F64), op, what, "[", i, "] ", t.shape(),
           " has dtype ", dtype_name(t.dtype()), allow_f64 ? "; expected f32 or f64" : "; expected f32");
}

void check_twin(const Tensor& t, const Tensor& ref, const char* what, size_t i, const char* op) {
  t.check_defined(op);
  HG_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype() && t.device() == ref.device(), op, what, "[", i,
           "] is ", t.describe(), " but params[", i, "] is ", ref.describe());
}

// The optimizer's CPU work is cut into pieces of this many elements of one
// tensor, from the shapes alone: threads, same bits at any count.
constexpr int64_t kChunk = int64_t(1) << 14;

struct Piece {
  size_t tensor;
  int64_t begin, end;
};

std::vector<Piece> pieces_of(const std::vector<Tensor>& xs) {
  std::vector<Piece> out;
  for (size_t i = 0; i < xs.size(); ++i)
    for (int64_t b = 0; b < xs[i].numel(); b += kChunk) out.push_back({i, b, std::min(xs[i].numel(), b + kChunk)});
  return out;
}

int64_t total_numel(const std::vector<Tensor>& xs) {
  int64_t n = 0;
  for (const Tensor& x : xs) n += x.numel();
  return n;
}

// Eight running sums in a fixed order (vectorised by the compiler, same bits
// on every ISA), then added together.
template <class T>
HG_SIMD_INLINE double sum_sq(const T* x, int64_t n) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  for (; i < n; ++i) lane[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  double s = 0;
  for (double v : lane) s += v;
  return s;
}
HG_SIMD_CLONES double sum_sq_f32(const float* x, int64_t n) { return sum_sq(x, n); }
HG_SIMD_CLONES double sum_sq_f64(const double* x, int64_t n) { return sum_sq(x, n); }

double sum_of_squares_of(const std::vector<Tensor>& xs) {
  const std::vector<Piece> ps = pieces_of(xs);
  std::vector<double> part(ps.size(), 0.0);
  parallel_for(static_cast<int64_t>(ps.size()), total_numel(xs), [&](int64_t t) {
    const Piece& p = ps[static_cast<size_t>(t)];
    const Tensor& x = xs[p.tensor];
    part[static_cast<size_t>(t)] = x.dtype() == DType::F32 ? sum_sq_f32(x.data<float>() + p.begin, p.end - p.begin)
                                                           : sum_sq_f64(x.data<double>() + p.begin, p.end - p.begin);
  });
  double total = 0;
  for (double v : part) total += v;
  return total;
}

// The arithmetic of hg::AdamW on the CPU, grads scaled by `scale`. The loops
// have no cross-element dependence: the compiler vectorises them, and IEEE
// arithmetic (sqrt and division included, no FMA contraction) gives the same
// bits on every ISA.
struct AdamWScalars {
  double lr, bc1, bc2, scale;
};

// f64 parameters: double throughout.
HG_SIMD_CLONES void adamw_f64(double* p, const double* g, double* m, double* v, int64_t n, const AdamWConfig& o,
                              const AdamWScalars& k) {
  const double decay = 1.0 - k.lr * o.weight_decay, b1 = o.beta1, b2 = o.beta2, eps = o.eps;
  const double lr = k.lr, bc1 = k.bc1, bc2 = k.bc2, scale = k.scale;
  for (int64_t i = 0; i < n; ++i) {
    double param = p[i] * decay;  // decoupled decay
    const double grad = g[i] * scale;
    const double m1 = b1 * m[i] + (1.0 - b1) * grad;
    const double v1 = b2 * v[i] + (1.0 - b2) * grad * grad;
    m[i] = m1;
    v[i] = v1;
    param -= lr * (m1 / bc1) / (std::sqrt(v1 / bc2) + eps);
    p[i] = param;
  }
}

// f32 parameters: float, in PyTorch's form (the bias corrections folded into
// a step size and 1 / sqrt(bc2)): one sqrt and one division per element.
// Double lanes with three divisions and a sqrt were the step's second-largest
// cost on a Xeon core at 1 thread (1.86 ms for 0.5M parameters).
struct AdamWFloats {
  float decay, b1, b2, one_minus_b1, one_minus_b2, eps, step, inv_sqrt_bc2, scale;
};

AdamWFloats adamw_floats(const AdamWConfig& o, const AdamWScalars& k) {
  return {static_cast<float>(1.0 - k.lr * o.weight_decay),
          static_cast<float>(o.beta1),
          static_cast<float>(o.beta2),
          static_cast<float>(1.0 - o.beta1),
          static_cast<float>(1.0 - o.beta2),
          static_cast<float>(o.eps),
          static_cast<float>(k.lr / k.bc1),
          static_cast<float>(1.0 / std::sqrt(k.bc2)),
          static_cast<float>(k.scale)};
}

HG_SIMD_CLONES void adamw_f32(float* p, const float* g, float* m, float* v, int64_t n, const AdamWFloats& k) {
  for (int64_t i = 0; i < n; ++i) {
    const float grad = g[i] * k.scale;
    const float m1 = k.b1 * m[i] + k.one_minus_b1 * grad;
    const float v1 = k.b2 * v[i] + k.one_minus_b2 * (grad * grad);
    m[i] = m1;
    v[i] = v1;
    p[i] = p[i] * k.decay - k.step * m1 / (std::sqrt(v1) * k.inv_sqrt_bc2 + k.eps);
  }
}

}  // namespace

void check_adamw_group(const AdamWGroup& g, const AdamWConfig& c, const Tensor& state, bool allow_f64, const char* op) {
  const size_t n = g.params.size();
  HG_CHECK(g.grads.size() == n && g.m.size() == n && g.v.size() == n &&
               (g.compute_copies.empty() || g.compute_copies.size() == n),
           op, "the group's lists differ in length: params ", n, ", grads ", g.grads.size(), ", m ", g.m.size(), ", v ",
           g.v.size(), ", compute_copies ", g.compute_copies.size(), " (0 or ", n, ")");
  HG_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.eps > 0 && c.weight_decay >= 0 &&
               c.max_grad_norm >= 0 && std::isfinite(c.max_grad_norm),
           op, "bad config: beta1 ", c.beta1, ", beta2 ", c.beta2, " (each in [0, 1)), eps ", c.eps,
           " (> 0), weight_decay ", c.weight_decay, " (>= 0), max_grad_norm ", c.max_grad_norm,
           " (finite, >= 0; 0 = no clipping)");
  state.check_defined(op);
  HG_CHECK(state.dtype() == DType::F64 && state.shape() == Shape{kAdamWStateSize}, op, "state is ", state.describe(),
           ", expected f64 (", int(kAdamWStateSize), ",)");
  for (size_t i = 0; i < n; ++i) {
    check_float(g.params[i], "params", i, allow_f64, op);
    HG_CHECK(g.params[i].device() == state.device(), op, "params[", i, "] is on ", device_name(g.params[i].device()),
             " but state is on ", device_name(state.device()));
    check_twin(g.grads[i], g.params[i], "grads", i, op);
    check_twin(g.m[i], g.params[i], "m", i, op);
    check_twin(g.v[i], g.params[i], "v", i, op);
    if (!g.compute_copies.empty() && g.compute_copies[i].defined()) {
      const Tensor& c16 = g.compute_copies[i];
      HG_CHECK(c16.dtype() == DType::BF16 && c16.shape() == g.params[i].shape() && c16.device() == g.params[i].device(),
               op, "compute_copies[", i, "] is ", c16.describe(), ", expected bf16 like params[", i, "] ",
               g.params[i].describe());
    }
  }
}

void check_sum_of_squares(const std::vector<Tensor>& xs, const Tensor& out, bool allow_f64, const char* op) {
  out.check_defined(op);
  HG_CHECK(out.dtype() == DType::F64 && out.shape() == Shape{1}, op, "out is ", out.describe(), ", expected f64 (1,)");
  for (size_t i = 0; i < xs.size(); ++i) {
    check_float(xs[i], "xs", i, allow_f64, op);
    HG_CHECK(xs[i].device() == out.device(), op, "xs[", i, "] is on ", device_name(xs[i].device()), " but out is on ",
             device_name(out.device()));
  }
}

void check_sgd_update(const Tensor& p, const Tensor& g, const Tensor* velocity, bool allow_f64, const char* op) {
  check_float(p, "p", 0, allow_f64, op);
  check_twin(g, p, "g", 0, op);
  if (velocity) check_twin(*velocity, p, "velocity", 0, op);
}

namespace cpu {

void adamw_multi(const AdamWGroup& g, const AdamWConfig& c, Tensor& state) {
  double* s = state.data<double>();
  const double norm = std::sqrt(sum_of_squares_of(g.grads));
  s[kAdamWStep] += 1;
  s[kAdamWGradNorm] = norm;
  s[kAdamWSkipped] = std::isfinite(norm) ? 0 : 1;
  s[kAdamWClipScale] = c.max_grad_norm > 0 && norm > c.max_grad_norm ? c.max_grad_norm / norm : 1.0;
  s[5] = 1.0 - std::pow(c.beta1, s[kAdamWStep]);
  s[6] = 1.0 - std::pow(c.beta2, s[kAdamWStep]);
  if (s[kAdamWSkipped] != 0) return;
  const AdamWScalars k{s[kAdamWLr], s[5], s[6], s[kAdamWClipScale]};
  const AdamWFloats kf = adamw_floats(c, k);
  const std::vector<Piece> ps = pieces_of(g.params);
  parallel_for(static_cast<int64_t>(ps.size()), total_numel(g.params), [&](int64_t t) {
    const Piece& piece = ps[static_cast<size_t>(t)];
    const size_t i = piece.tensor;
    const int64_t b = piece.begin, n = piece.end - piece.begin;
    const bool f32 = g.params[i].dtype() == DType::F32;
    if (f32)
      adamw_f32(g.params[i].data<float>() + b, g.grads[i].data<float>() + b, g.m[i].data<float>() + b,
                g.v[i].data<float>() + b, n, kf);
    else
      adamw_f64(g.params[i].data<double>() + b, g.grads[i].data<double>() + b, g.m[i].data<double>() + b,
                g.v[i].data<double>() + b, n, c, k);
    if (g.compute_copies.empty() || !g.compute_copies[i].defined()) return;
    bf16_t* copy = g.compute_copies[i].data<bf16_t>() + b;
    for (int64_t j = 0; j < n; ++j)
      copy[j] =
          float_to_bf16(f32 ? g.params[i].data<float>()[b + j] : static_cast<float>(g.params[i].data<double>()[b + j]));
  });
}

void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out) { out.data<double>()[0] = sum_of_squares_of(xs); }

template <class T>
void sgd_typed(T* p, const T* g, T* v, int64_t n, double lr, double momentum, double wd) {
  for (int64_t i = 0; i < n; ++i) {
    const double grad = static_cast<double>(g[i]) + wd * static_cast<double>(p[i]);
    double step = grad;
    if (v != nullptr) {
      v[i] = static_cast<T>(momentum * static_cast<double>(v[i]) + grad);
      step = v[i];
    }
    p[i] = static_cast<T>(static_cast<double>(p[i]) - lr * step);
  }
}

void sgd_update(Tensor& p, const Tensor& g, Tensor* v, double lr, double momentum, double wd) {
  if (p.dtype() == DType::F32)
    sgd_typed(p.data<float>(), g.data<float>(), v ? v->data<float>() : nullptr, p.numel(), lr, momentum, wd);
  else sgd_typed(p.data<double>(), g.data<double>(), v ? v->data<double>() : nullptr, p.numel(), lr, momentum, wd);
}

}  // namespace cpu
}  // namespace hg
