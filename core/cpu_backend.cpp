// The primitive backend on the CPU: Eigen arrays over the flat contiguous data.
// Arithmetic runs in F32 and F64; BF16/F16 appear only in fill and cast.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/backend.hpp"
#include "core/column_sums.hpp"
#include "core/cpu_gemm.hpp"
#include "core/cpu_math.hpp"
#include "core/cpu_matmul.hpp"
#include "core/gemm_check.hpp"
#include "core/half.hpp"
#include "core/indexing.hpp"
#include "core/matmul_shape.hpp"
#include "core/optimizer_ops.hpp"
#include "core/parallel.hpp"
#include "core/random_stream.hpp"
#include "core/transpose_plan.hpp"

namespace hg {
namespace {

template <class T>
using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using VecMap = Eigen::Map<Vec<T>>;
template <class T>
using ConstVecMap = Eigen::Map<const Vec<T>>;

void check_cpu_float(const Tensor& t, const char* op, const char* role) {
  HG_CHECK(t.defined(), op, role, " is an undefined tensor");
  HG_CHECK(t.device() == Device::CPU, op, role, " ", t.shape(), " is on ", device_name(t.device()), ", expected cpu");
  HG_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, role, " ", t.shape(), " has dtype ",
           dtype_name(t.dtype()), ", arithmetic needs f32 or f64");
}

void check_same_dtype_as(const Tensor& t, const Tensor& ref, const char* op, const char* role) {
  HG_CHECK(t.dtype() == ref.dtype(), op, role, " ", t.shape(), " has dtype ", dtype_name(t.dtype()), ", expected ",
           dtype_name(ref.dtype()));
}

// Elementwise work is cut into pieces of this many elements: the pieces
// depend on the size alone, so results do not depend on the thread count.
constexpr int64_t kElementChunk = int64_t(1) << 14;

// body(begin, end) over [0, n) in kElementChunk pieces, on the threads.
template <class Body>
void for_chunks(int64_t n, const Body& body) {
  parallel_for(pieces(n, kElementChunk), n, [&](int64_t t) {
    const int64_t begin = t * kElementChunk;
    body(begin, std::min(n, begin + kElementChunk));
  });
}

// body(r) for each of `rows` rows of `len` elements, in pieces of about
// kElementChunk elements (whole rows), on the threads.
template <class Body>
void for_rows(int64_t rows, int64_t len, const Body& body) {
  const int64_t per_task = std::max<int64_t>(1, kElementChunk / std::max<int64_t>(1, len));
  parallel_for(pieces(rows, per_task), rows * len, [&](int64_t t) {
    for (int64_t r = t * per_task; r < std::min(rows, (t + 1) * per_task); ++r) body(r);
  });
}

// ---------------------------------------------------------------- map

// GELU, tanh approximation: 0.5 x (1 + tanh(c (x + a x^3))), c = sqrt(2/pi).
constexpr double kGeluC = 0.7978845608028654;
constexpr double kGeluA = 0.044715;

template <class T>
T gelu_grad(T x) {
  const T c = T(kGeluC), a = T(kGeluA);
  const T t = std::tanh(c * (x + a * x * x * x));
  const T sech2 = T(1) - t * t;
  // Far in the tails sech2 is exactly 0 while x^2 may overflow: 0 * inf would be NaN.
  if (sech2 == T(0)) return T(0.5) * (T(1) + t);
  return T(0.5) * (T(1) + t) + T(0.5) * x * sech2 * c * (T(1) + T(3) * a * x * x);
}

// Eigen 3.4's vectorised exp clamps its argument near -88.7, so exp(-inf)
// comes out as ~3e-39 instead of 0 and masked softmax keys keep a weight.
// Recompute the deep-negative tail with std::exp (rare, so the branch is cheap).
template <class T>
void exp_with_exact_underflow(const T* xp, T* yp, int64_t n) {
  VecMap<T>(yp, n) = ConstVecMap<T>(xp, n).exp();
  for (int64_t i = 0; i < n; ++i)
    if (xp[i] < T(-80)) yp[i] = std::exp(xp[i]);
}

// Float32 exp, tanh and the functions built on them go through
// core/cpu_math (vectorised, no libm call per element); null otherwise.
using MathKernel = void (*)(const float*, float*, int64_t);
MathKernel vector_math_kernel(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp: return cpu_math::exp;
    case UnaryOp::Tanh: return cpu_math::tanh;
    case UnaryOp::Sigmoid: return cpu_math::sigmoid;
    case UnaryOp::Gelu: return cpu_math::gelu;
    case UnaryOp::GeluGrad: return cpu_math::gelu_grad;
    default: return nullptr;
  }
}

template <class T>
void map_typed(UnaryOp op, const T* xp, T* yp, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (const MathKernel kernel = vector_math_kernel(op)) return kernel(xp, yp, n);
  }
  const ConstVecMap<T> x(xp, n);
  VecMap<T> y(yp, n);
  switch (op) {
    case UnaryOp::Identity: y = x; return;
    case UnaryOp::Neg: y = -x; return;
    case UnaryOp::Exp: exp_with_exact_underflow(xp, yp, n); return;
    case UnaryOp::Log: y = x.log(); return;
    case UnaryOp::Sqrt: y = x.sqrt(); return;
    case UnaryOp::Rsqrt: y = x.rsqrt(); return;
    case UnaryOp::Reciprocal: y = x.inverse(); return;
    case UnaryOp::Square: y = x.square(); return;
    case UnaryOp::Abs: y = x.abs(); return;
    case UnaryOp::Relu: y = x.max(T(0)); return;
    case UnaryOp::ReluGrad: y = (x > T(0)).template cast<T>(); return;
    case UnaryOp::Gelu: y = T(0.5) * x * (T(1) + (T(kGeluC) * (x + T(kGeluA) * x.cube())).tanh()); return;
    case UnaryOp::GeluGrad: y = x.unaryExpr([](T v) { return gelu_grad(v); }); return;
    case UnaryOp::Tanh: y = x.tanh(); return;
    // exp(-x) overflows to inf for very negative x, giving exactly 0: no NaN.
    case UnaryOp::Sigmoid: y = T(1) / (T(1) + (-x).exp()); return;
  }
  fail("map", "unknown unary op ", static_cast<int>(op));
}

template <class T>
void map_threaded(UnaryOp op, const T* x, T* y, int64_t n) {
  for_chunks(n, [&](int64_t begin, int64_t end) { map_typed(op, x + begin, y + begin, end - begin); });
}

// ---------------------------------------------------------------- zip

// One Eigen expression per op; a and b are any array expressions of equal length.
template <class T, class A, class B>
void zip_arrays(BinaryOp op, const A& a, const B& b, VecMap<T> out) {
  switch (op) {
    case BinaryOp::Add: out = a + b; return;
    case BinaryOp::Sub: out = a - b; return;
    case BinaryOp::Mul: out = a * b; return;
    case BinaryOp::Div: out = a / b; return;
    case BinaryOp::Max: out = a.max(b); return;
    case BinaryOp::Min: out = a.min(b); return;
    case BinaryOp::Pow: out = a.pow(b); return;
    case BinaryOp::Eq: out = (a == b).template cast<T>(); return;
    case BinaryOp::Gt: out = (a > b).template cast<T>(); return;
  }
  fail("zip", "unknown binary op ", static_cast<int>(op));
}

template <class T>
T zip_scalar(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Max: return std::max(a, b);
    case BinaryOp::Min: return std::min(a, b);
    case BinaryOp::Pow: return std::pow(a, b);
    case BinaryOp::Eq: return a == b ? T(1) : T(0);
    case BinaryOp::Gt: return a > b ? T(1) : T(0);
  }
  return T(0);
}

// True when `s` (ignoring leading 1s) equals the trailing dims of `full`,
// i.e. a tensor of shape s repeats unchanged over full's leading rows.
bool is_trailing_block(const Shape& s, const Shape& full) {
  size_t first = 0;
  while (first < s.size() && s[first] == 1) ++first;
  const size_t len = s.size() - first;
  if (len > full.size()) return false;
  return std::equal(s.begin() + first, s.end(), full.end() - len);
}

// Strides (in elements) of `s` laid against the broadcast shape `out`: 0 on
// dims that are broadcast (missing or of size 1).
std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  const Shape own = contiguous_strides(s);
  std::vector<int64_t> strides(out.size(), 0);
  const size_t lead = out.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1) strides[lead + i] = own[i];
  return strides;
}

// Any broadcast: walk the output row by row (its last dim), carrying an index
// counter for the rest. Within a row each operand is contiguous (stride 1) or
// one repeated value (stride 0), so every row is again one Eigen pass.
template <class T>
void zip_general(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
                 const Shape& out_shape) {
  const int nd = static_cast<int>(out_shape.size());
  const auto sa = broadcast_strides(a_shape, out_shape);
  const auto sb = broadcast_strides(b_shape, out_shape);
  const int64_t inner = out_shape[nd - 1];
  const int64_t ia = sa[nd - 1], ib = sb[nd - 1];
  const int64_t rows = shape_numel(out_shape) / inner;
  std::vector<int64_t> index(nd, 0);
  int64_t offset_a = 0, offset_b = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* ra = a + offset_a;
    const T* rb = b + offset_b;
    VecMap<T> row(out + r * inner, inner);
    if (ia == 1 && ib == 1) zip_arrays<T>(op, ConstVecMap<T>(ra, inner), ConstVecMap<T>(rb, inner), row);
    else if (ia == 1) zip_arrays<T>(op, ConstVecMap<T>(ra, inner), Vec<T>::Constant(inner, *rb), row);
    else if (ib == 1) zip_arrays<T>(op, Vec<T>::Constant(inner, *ra), ConstVecMap<T>(rb, inner), row);
    else row.setConstant(zip_scalar(op, *ra, *rb));
    // advance the counter over dims nd-2 .. 0
    for (int d = nd - 2; d >= 0; --d) {
      ++index[d];
      offset_a += sa[d];
      offset_b += sb[d];
      if (index[d] < out_shape[d]) break;
      offset_a -= sa[d] * index[d];
      offset_b -= sb[d] * index[d];
      index[d] = 0;
    }
  }
}

template <class T>
void zip_typed(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const Shape& os = out.shape();
  if (a.numel() == n && b.numel() == n) {  // same shape (up to leading 1s)
    for_chunks(n, [&](int64_t i, int64_t end) {
      zip_arrays<T>(op, ConstVecMap<T>(pa + i, end - i), ConstVecMap<T>(pb + i, end - i), VecMap<T>(po + i, end - i));
    });
  } else if (b.numel() == 1 && a.numel() == n) {
    for_chunks(n, [&](int64_t i, int64_t end) {
      zip_arrays<T>(op, ConstVecMap<T>(pa + i, end - i), Vec<T>::Constant(end - i, pb[0]), VecMap<T>(po + i, end - i));
    });
  } else if (a.numel() == 1 && b.numel() == n) {
    for_chunks(n, [&](int64_t i, int64_t end) {
      zip_arrays<T>(op, Vec<T>::Constant(end - i, pa[0]), ConstVecMap<T>(pb + i, end - i), VecMap<T>(po + i, end - i));
    });
  } else if (a.numel() == n && is_trailing_block(b.shape(), os)) {  // e.g. (N, D) + (D,)
    const int64_t d = b.numel();
    for_rows(n / d, d, [&](int64_t r) {
      zip_arrays<T>(op, ConstVecMap<T>(pa + r * d, d), ConstVecMap<T>(pb, d), VecMap<T>(po + r * d, d));
    });
  } else if (b.numel() == n && is_trailing_block(a.shape(), os)) {  // e.g. (D,) - (N, D)
    const int64_t d = a.numel();
    for_rows(n / d, d, [&](int64_t r) {
      zip_arrays<T>(op, ConstVecMap<T>(pa, d), ConstVecMap<T>(pb + r * d, d), VecMap<T>(po + r * d, d));
    });
  } else {
    zip_general(op, pa, a.shape(), pb, b.shape(), po, os);
  }
}

// ---------------------------------------------------------------- reduce

// Sums accumulate in double: a float32 running sum over a long slice with a
// large common offset loses ~len*eps (measured 3e-4 relative for the mean of
// 65536 values near 1e4, 1e-2 at 2^20), which would poison an unfused
// LayerNorm's mean. One contiguous run reduced to one value:
template <class T>
double reduce_run(ReduceOp op, const T* run, int64_t len) {
  const ConstVecMap<T> x(run, len);
  if (op == ReduceOp::Max) return static_cast<double>(x.maxCoeff());
  if (op == ReduceOp::Min) return static_cast<double>(x.minCoeff());
  return x.template cast<double>().sum();
}

// A single long run (a full sum) is cut into pieces of this many elements
// whose partial sums are added in order: threads, same bits at any count.
constexpr int64_t kReduceChunk = int64_t(1) << 16;
// Columns per task when reducing over a leading dim.
constexpr int64_t kReduceColumns = 256;

// float32 sums over a leading dim (bias gradients): core/column_sums.hpp,
// the same double sums as below, vectorised. Each column's sum does not
// depend on which task adds it, so the columns are cut per thread (at least
// kReduceColumns a task, multiples of 16): one thread reads whole rows in
// memory order (a 2048 x 1024 sum in half the time of 256-column blocks).
void float_column_sums(const float* x, float* y, int64_t outer, int64_t len, int64_t inner, double scale) {
  const int64_t per_thread = (inner + num_threads() - 1) / num_threads();
  const int64_t width = std::max(kReduceColumns, (per_thread + 15) / 16 * 16);
  const int64_t column_pieces = pieces(inner, width);
  parallel_for(outer * column_pieces, outer * len * inner, [&](int64_t t) {
    const int64_t o = t / column_pieces, c0 = (t % column_pieces) * width;
    cpu::column_sums(x + o * len * inner + c0, len, std::min(inner, c0 + width) - c0, inner, scale, y + o * inner + c0);
  });
}

// x viewed as (outer, len, inner). inner == 1 (the last dim) reduces each
// contiguous run at once; otherwise rows of length inner are combined one
// after another, so every pass reads memory in order.
template <class T>
void reduce_typed(ReduceOp op, const T* x, T* y, int64_t outer, int64_t len, int64_t inner) {
  if (len == 0) {  // only Sum gets here: an empty sum is 0
    VecMap<T>(y, outer * inner).setZero();
    return;
  }
  const bool is_sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
  const double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(len) : 1.0;
  if (inner == 1 && outer == 1 && len > kReduceChunk) {
    const int64_t n = pieces(len, kReduceChunk);
    std::vector<double> part(static_cast<size_t>(n));
    parallel_for(n, len, [&](int64_t t) {
      const int64_t begin = t * kReduceChunk;
      part[static_cast<size_t>(t)] = reduce_run(op, x + begin, std::min(len, begin + kReduceChunk) - begin);
    });
    double r = part[0];
    for (int64_t t = 1; t < n; ++t) {
      const double v = part[static_cast<size_t>(t)];
      r = is_sum ? r + v : (op == ReduceOp::Max ? std::max(r, v) : std::min(r, v));
      if (!is_sum && std::isnan(v)) r = v;  // like maxCoeff on one run: NaN is not skipped
    }
    y[0] = static_cast<T>(r * scale);
    return;
  }
  if (inner == 1) {
    for_rows(outer, len, [&](int64_t o) { y[o] = static_cast<T>(reduce_run(op, x + o * len, len) * scale); });
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    if (is_sum) return float_column_sums(x, y, outer, len, inner, scale);
  // Tasks own blocks of columns.
  const int64_t column_pieces = pieces(inner, kReduceColumns);
  parallel_for(outer * column_pieces, outer * len * inner, [&](int64_t t) {
    const int64_t o = t / column_pieces, c0 = (t % column_pieces) * kReduceColumns;
    const int64_t w = std::min(inner, c0 + kReduceColumns) - c0;
    const T* block = x + o * len * inner + c0;
    VecMap<T> out(y + o * inner + c0, w);
    if (is_sum) {
      Vec<double> acc = ConstVecMap<T>(block, w).template cast<double>();
      for (int64_t l = 1; l < len; ++l) acc += ConstVecMap<T>(block + l * inner, w).template cast<double>();
      out = (acc * scale).template cast<T>();
      return;
    }
    out = ConstVecMap<T>(block, w);
    for (int64_t l = 1; l < len; ++l) {
      const ConstVecMap<T> row(block + l * inner, w);
      if (op == ReduceOp::Max) out = out.max(row);
      else out = out.min(row);
    }
  });
}

// ---------------------------------------------------------------- fill / cast

double load_as_double(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16_t*>(p)[i]);
    case DType::F16: return half_to_float(static_cast<const f16_t*>(p)[i]);
  }
  return 0;
}

// Narrowing to 16 bits goes through float (one extra rounding from F64; the
// result can differ from a direct double->16-bit rounding only on exact ties).
void store_from_double(DType t, void* p, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::F64: static_cast<double*>(p)[i] = v; return;
    case DType::BF16: static_cast<bf16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::F16: static_cast<f16_t*>(p)[i] = float_to_half(static_cast<float>(v)); return;
  }
}

// ---------------------------------------------------------------- transpose

// x viewed as (A, n0, M, n1, B) becomes (A, n1, M, n0, B); Elem is any
// trivially copyable type of the element's size. A pure copy: the rows
// (a, i0) of x go to the threads (the attention's head splits and merges
// are such copies of whole activations, which one thread moves at a
// fraction of the memory's speed).
template <class Elem>
void transpose_typed(const Elem* x, Elem* y, int64_t A, int64_t n0, int64_t M, int64_t n1, int64_t B) {
  for_rows(A * n0, M * n1 * B, [&](int64_t row) {
    const int64_t a = row / n0, i0 = row % n0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i1 = 0; i1 < n1; ++i1) {
        const Elem* src = x + (((a * n0 + i0) * M + m) * n1 + i1) * B;
        Elem* dst = y + (((a * n1 + i1) * M + m) * n0 + i0) * B;
        std::copy(src, src + B, dst);
      }
  });
}

template <class T>
void gather_rows_typed(const Tensor& table, const std::vector<int32_t>& idx, Tensor& out) {
  const int64_t d = table.size(1);
  const T* src = table.data<T>();
  T* dst = out.data<T>();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j) dst[static_cast<int64_t>(i) * d + j] = src[idx[i] * d + j];
}

template <class T>
void scatter_add_rows_typed(const Tensor& grad, const std::vector<int32_t>& idx, Tensor& table) {
  const int64_t d = table.size(1);
  const T* src = grad.data<T>();
  T* dst = table.data<T>();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j) dst[idx[i] * d + j] += src[static_cast<int64_t>(i) * d + j];
}

// ---------------------------------------------------------------- dropout mask

template <class T>
void dropout_mask_typed(T* out, int64_t n, uint64_t seed, uint64_t counter, double p, T keep) {
  const uint64_t key = random_stream::key(seed);
  for_chunks(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = random_stream::uniform_at(key, counter + static_cast<uint64_t>(i)) >= p ? keep : T{};
  });
}

class CpuBackend final : public Backend {
 public:
  void map(UnaryOp op, const Tensor& x, Tensor& out) override {
    const char* name = unary_op_name(op);
    check_cpu_float(x, name, "x");
    check_cpu_float(out, name, "out");
    check_same_dtype_as(out, x, name, "out");
    HG_CHECK(out.shape() == x.shape(), name, "out shape ", out.shape(), " differs from x shape ", x.shape());
    if (x.dtype() == DType::F32) map_threaded(op, x.data<float>(), out.data<float>(), x.numel());
    else map_threaded(op, x.data<double>(), out.data<double>(), x.numel());
  }

  void zip(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    const char* name = binary_op_name(op);
    check_cpu_float(a, name, "a");
    check_cpu_float(b, name, "b");
    check_cpu_float(out, name, "out");
    check_same_dtype_as(b, a, name, "b");
    check_same_dtype_as(out, a, name, "out");
    const Shape expected = broadcast_shapes(a.shape(), b.shape(), name);
    HG_CHECK(out.shape() == expected, name, "out shape ", out.shape(), " is not the broadcast shape ", expected,
             " of a ", a.shape(), " and b ", b.shape());
    if (a.dtype() == DType::F32) zip_typed<float>(op, a, b, out);
    else zip_typed<double>(op, a, b, out);
  }

  void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out) override {
    const char* name = reduce_op_name(op);
    check_cpu_float(x, name, "x");
    check_cpu_float(out, name, "out");
    check_same_dtype_as(out, x, name, "out");
    const int d = normalize_dim(dim, x.ndim(), name);
    Shape expected = x.shape();
    expected[d] = 1;
    HG_CHECK(out.shape() == expected, name, "out shape ", out.shape(), " should be ", expected, " for x ", x.shape(),
             " reduced over dim ", d);
    const int64_t len = x.shape()[d];
    HG_CHECK(len > 0 || op == ReduceOp::Sum, name, "cannot reduce an empty dim ", d, " of x ", x.shape());
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; ++i) outer *= x.shape()[i];
    for (int i = d + 1; i < x.ndim(); ++i) inner *= x.shape()[i];
    if (x.dtype() == DType::F32) reduce_typed(op, x.data<float>(), out.data<float>(), outer, len, inner);
    else reduce_typed(op, x.data<double>(), out.data<double>(), outer, len, inner);
  }

  void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
              bool accumulate) override {
    check_cpu_float(a, "matmul", "a");
    check_cpu_float(b, "matmul", "b");
    check_cpu_float(out, "matmul", "out");
    check_same_dtype_as(b, a, "matmul", "b");
    check_same_dtype_as(out, a, "matmul", "out");
    const MatmulShape s = matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b, "matmul");
    HG_CHECK(out.shape() == s.out, "matmul", "out shape ", out.shape(), " should be ", s.out, " for a ", a.shape(),
             " b ", b.shape());
    if (a.dtype() == DType::F32)
      cpu::matmul(a.data<float>(), b.data<float>(), out.data<float>(), s, transpose_a, transpose_b, accumulate);
    else cpu::matmul(a.data<double>(), b.data<double>(), out.data<double>(), s, transpose_a, transpose_b, accumulate);
  }

  void fill(Tensor& out, double value) override {
    HG_CHECK(out.defined(), "fill", "out is an undefined tensor");
    out.check_device(Device::CPU, "fill");
    const int64_t n = out.numel();
    void* p = out.raw_data();
    switch (out.dtype()) {
      case DType::F32: VecMap<float>(static_cast<float*>(p), n).setConstant(static_cast<float>(value)); return;
      case DType::F64: VecMap<double>(static_cast<double*>(p), n).setConstant(value); return;
      case DType::BF16: std::fill_n(static_cast<bf16_t*>(p), n, float_to_bf16(static_cast<float>(value))); return;
      case DType::F16: std::fill_n(static_cast<f16_t*>(p), n, float_to_half(static_cast<float>(value))); return;
    }
  }

  void dropout_mask(Tensor& out, uint64_t seed, uint64_t counter, double p) override {
    HG_CHECK(out.defined(), "dropout_mask", "out is an undefined tensor");
    out.check_device(Device::CPU, "dropout_mask");
    HG_CHECK(p >= 0.0 && p < 1.0, "dropout_mask", "p must be in [0, 1), got ", p);
    const double keep = 1.0 / (1.0 - p);
    const int64_t n = out.numel();
    void* o = out.raw_data();
    switch (out.dtype()) {
      case DType::F32: return dropout_mask_typed(static_cast<float*>(o), n, seed, counter, p, static_cast<float>(keep));
      case DType::F64: return dropout_mask_typed(static_cast<double*>(o), n, seed, counter, p, keep);
      case DType::BF16:
        return dropout_mask_typed(static_cast<bf16_t*>(o), n, seed, counter, p,
                                  float_to_bf16(static_cast<float>(keep)));
      case DType::F16:
        return dropout_mask_typed(static_cast<f16_t*>(o), n, seed, counter, p, float_to_half(static_cast<float>(keep)));
    }
  }

  void cast(const Tensor& src, Tensor& out) override {
    HG_CHECK(src.defined() && out.defined(), "cast", "undefined tensor");
    src.check_device(Device::CPU, "cast");
    out.check_device(Device::CPU, "cast");
    HG_CHECK(src.numel() == out.numel(), "cast", "src ", src.shape(), " and out ", out.shape(),
             " differ in element count");
    const int64_t n = src.numel();
    if (src.dtype() == out.dtype()) {
      if (src.raw_data() != out.raw_data()) std::memcpy(out.raw_data(), src.raw_data(), src.nbytes());
    } else if (src.dtype() == DType::F32 && out.dtype() == DType::F64) {
      VecMap<double>(out.data<double>(), n) = ConstVecMap<float>(src.data<float>(), n).cast<double>();
    } else if (src.dtype() == DType::F64 && out.dtype() == DType::F32) {
      VecMap<float>(out.data<float>(), n) = ConstVecMap<double>(src.data<double>(), n).cast<float>();
    } else {
      for (int64_t i = 0; i < n; ++i)
        store_from_double(out.dtype(), out.raw_data(), i, load_as_double(src.dtype(), src.raw_data(), i));
    }
  }

  void transpose(const Tensor& x, int dim0, int dim1, Tensor& out) override {
    HG_CHECK(x.defined() && out.defined(), "transpose", "undefined tensor");
    x.check_device(Device::CPU, "transpose");
    out.check_device(Device::CPU, "transpose");
    HG_CHECK(out.dtype() == x.dtype(), "transpose", "out dtype ", dtype_name(out.dtype()), " differs from x ",
             dtype_name(x.dtype()));
    const TransposePlan p = transpose_plan(x.shape(), out.shape(), dim0, dim1, "transpose");
    if (x.numel() == 0) return;
    if (p.plain_copy) {  // same memory order
      if (out.raw_data() != x.raw_data()) std::memcpy(out.raw_data(), x.raw_data(), x.nbytes());
      return;
    }
    switch (dtype_size(x.dtype())) {
      case 2:
        transpose_typed(static_cast<const uint16_t*>(x.raw_data()), static_cast<uint16_t*>(out.raw_data()), p.A, p.n0,
                        p.M, p.n1, p.B);
        return;
      case 4:
        transpose_typed(static_cast<const uint32_t*>(x.raw_data()), static_cast<uint32_t*>(out.raw_data()), p.A, p.n0,
                        p.M, p.n1, p.B);
        return;
      case 8:
        transpose_typed(static_cast<const uint64_t*>(x.raw_data()), static_cast<uint64_t*>(out.raw_data()), p.A, p.n0,
                        p.M, p.n1, p.B);
        return;
    }
    fail("transpose", "unsupported element size for dtype ", dtype_name(x.dtype()));
  }

  // Bias, BiasGelu and GeluBackward in float32 (2-D, contiguous): applied to
  // each tile of C as the tiled matmul finishes it (core/cpu_matmul.hpp), in
  // cache, instead of as passes of their own over C. Each element gets the
  // same operations in the same order as the composed epilogues below.
  static void gemm_f32_tiles(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args) {
    const GemmEpilogue e = args.epilogue;
    const MatmulShape s = matmul_shape(a.shape(), b.shape(), args.transpose_a, args.transpose_b, "gemm");
    float* c = out.data<float>();
    const int64_t n = s.n;
    cpu::MatmulEpilogue<float> tile;
    if (e == GemmEpilogue::Bias || e == GemmEpilogue::BiasGelu) tile.bias = args.bias->data<float>();
    if (e == GemmEpilogue::BiasGelu) {  // aux = product + bias; out = gelu(aux)
      float* aux = args.aux->data<float>();
      tile.finish = [=](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
        for (int64_t r = r0; r < r0 + rows; ++r) {
          std::memcpy(aux + r * n + c0, c + r * n + c0, sizeof(float) * cols);
          cpu_math::gelu(aux + r * n + c0, c + r * n + c0, cols);
        }
      };
    }
    if (e == GemmEpilogue::GeluBackward) {  // out = product * gelu'(aux)
      const float* aux = args.aux->data<float>();
      tile.finish = [=](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
        constexpr int64_t kPiece = 256;
        float grad[kPiece];
        for (int64_t r = r0; r < r0 + rows; ++r)
          for (int64_t j0 = c0; j0 < c0 + cols; j0 += kPiece) {
            const int64_t len = std::min(kPiece, c0 + cols - j0);
            cpu_math::gelu_grad(aux + r * n + j0, grad, len);
            float* row = c + r * n + j0;
            for (int64_t j = 0; j < len; ++j) row[j] *= grad[j];
          }
      };
    }
    cpu::matmul(a.data<float>(), b.data<float>(), c, s, args.transpose_a, args.transpose_b, args.accumulate, &tile);
  }

  // bias_grad = the sums of x over `dim` (2-D x), or with bias_grad_accumulate
  // bias_grad += them: the sums first, then one addition.
  void sum_into_bias_grad(const Tensor& x, int dim, const GemmArgs& args) {
    const Shape keep = dim == 0 ? Shape{1, x.size(1)} : Shape{x.size(0), 1};
    Tensor target = args.bias_grad->reshape(keep);
    if (!args.bias_grad_accumulate) return reduce(ReduceOp::Sum, x, dim, target);
    Tensor sums = Tensor::empty(keep, target.dtype());
    reduce(ReduceOp::Sum, x, dim, sums);
    zip(BinaryOp::Add, target, sums, target);
  }

  // The epilogues composed from this backend's own passes: the reference the
  // cuBLASLt epilogues are tested against (tests/test_gemm.cpp), and the
  // float64 path.
  void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args) override {
    const char* name = "gemm";
    check_gemm(a, b, out, args, name);
    check_cpu_float(a, name, "a");  // F32 / F64 only on the CPU (so out, bias, aux match it)
    const GemmEpilogue e = args.epilogue;
    if (a.dtype() == DType::F32 &&
        (e == GemmEpilogue::Bias || e == GemmEpilogue::BiasGelu || e == GemmEpilogue::GeluBackward)) {
      gemm_f32_tiles(a, b, out, args);
      if (e == GemmEpilogue::GeluBackward && args.bias_grad) sum_into_bias_grad(out, 0, args);
      return;
    }
    if (e == GemmEpilogue::GeluBackward) {
      Tensor product = Tensor::empty(out.shape(), out.dtype());
      matmul(a, b, product, args.transpose_a, args.transpose_b, false);
      map(UnaryOp::GeluGrad, *args.aux, out);
      zip(BinaryOp::Mul, product, out, out);
      if (args.bias_grad) sum_into_bias_grad(out, 0, args);
      return;
    }
    matmul(a, b, out, args.transpose_a, args.transpose_b, args.accumulate);
    if (e == GemmEpilogue::Bias) zip(BinaryOp::Add, out, *args.bias, out);
    if (e == GemmEpilogue::BiasGelu) {
      zip(BinaryOp::Add, out, *args.bias, *args.aux);
      map(UnaryOp::Gelu, *args.aux, out);
    }
    if (e == GemmEpilogue::BiasGradA) sum_into_bias_grad(a, args.transpose_a ? 0 : 1, args);  // over k of op(a)
    if (e == GemmEpilogue::BiasGradB) sum_into_bias_grad(b, args.transpose_b ? 1 : 0, args);  // over k of op(b)
  }

  void gather_rows(const Tensor& table, const Tensor&, const std::vector<int32_t>& host_ids, Tensor& out) override {
    if (table.dtype() == DType::F32) gather_rows_typed<float>(table, host_ids, out);
    else gather_rows_typed<double>(table, host_ids, out);
  }

  void scatter_add_rows(const Tensor& grad, const std::vector<int32_t>& host_ids, Tensor& grad_table) override {
    if (grad.dtype() == DType::F32) scatter_add_rows_typed<float>(grad, host_ids, grad_table);
    else scatter_add_rows_typed<double>(grad, host_ids, grad_table);
  }

  // On the CPU the ids are on the host already: checked and scattered as usual.
  void scatter_add_rows_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table) override {
    scatter_add_rows(grad, read_indices(ids, grad_table.size(0), "scatter_add_rows"), grad_table);
  }

  std::vector<int64_t> count_bad_indices(const std::vector<IndexSet>& sets) override {
    std::vector<int64_t> counts;
    for (const IndexSet& s : sets) {
      const float* v = s.ids.data<float>();
      int64_t bad = 0;
      for (int64_t i = 0; i < s.ids.numel(); ++i) bad += double(v[i]) != s.except && !is_index(v[i], s.limit);
      counts.push_back(bad);
    }
    return counts;
  }

  void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state) override {
    check_adamw_group(group, config, state, /*allow_f64=*/true, "adamw_multi");
    state.check_device(Device::CPU, "adamw_multi");
    cpu::adamw_multi(group, config, state);
  }

  void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out) override {
    check_sum_of_squares(xs, out, /*allow_f64=*/true, "sum_of_squares");
    out.check_device(Device::CPU, "sum_of_squares");
    cpu::sum_of_squares(xs, out);
  }

  void sgd_update(Tensor& p, const Tensor& g, Tensor* velocity, double lr, double momentum,
                  double weight_decay) override {
    check_sgd_update(p, g, velocity, /*allow_f64=*/true, "sgd_update");
    p.check_device(Device::CPU, "sgd_update");
    cpu::sgd_update(p, g, velocity, lr, momentum, weight_decay);
  }
};

}  // namespace

Backend& cpu_backend() {
  // Eigen must not start threads of its own (it would, built with OpenMP):
  // hg::num_threads() decides, through the tiles above.
  static const bool eigen_serial = (Eigen::setNbThreads(1), true);
  (void)eigen_serial;
  static CpuBackend backend;
  return backend;
}

}  // namespace hg
