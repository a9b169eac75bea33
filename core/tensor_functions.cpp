// Validated, allocating wrappers over the primitive backend, and the
// hand-written backward of each primitive. Nothing here is device-specific:
// every pass goes through backend_for(device). Derivations: docs/primitive_grads.md.
#include "core/tensor_functions.hpp"

#include "core/matmul_shape.hpp"
#include "core/profiler.hpp"

namespace hg {
namespace {

// f32 and f64 on any device; bf16 storage (f32 math) on CUDA only.
void check_float(const Tensor& t, const char* op, const char* role) {
  HG_CHECK(t.defined(), op, role, " is an undefined tensor");
  const DType d = t.dtype();
  HG_CHECK(d == DType::F32 || d == DType::F64 || d == DType::BF16, op, role, " ", t.shape(), " has dtype ",
           dtype_name(d), ", arithmetic needs f32, f64, or bf16 on CUDA");
  HG_CHECK(d != DType::BF16 || t.is_cuda(), op, role, " ", t.shape(),
           " is bf16 on the CPU; bf16 arithmetic runs only on CUDA (the CPU computes in f32 or f64)");
}

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  check_float(a, op, "a");
  check_float(b, op, "b");
  HG_CHECK(a.device() == b.device(), op, "a ", a.shape(), " is on ", device_name(a.device()), " but b ", b.shape(),
           " is on ", device_name(b.device()));
  HG_CHECK(a.dtype() == b.dtype(), op, "a ", a.shape(), " is ", dtype_name(a.dtype()), " but b ", b.shape(), " is ",
           dtype_name(b.dtype()));
}

bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    const int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

Tensor empty_like(const Tensor& t, const Shape& shape) { return Tensor::empty(shape, t.dtype(), t.device()); }

// A 0-d tensor holding `value`, ready to broadcast against `like`.
Tensor scalar_like(const Tensor& like, double value) {
  return Tensor::full(Shape{}, value, like.dtype(), like.device());
}

Shape keepdim_shape(const Shape& s, int dim) {
  Shape k = s;
  k[dim] = 1;
  return k;
}

// Copies `t` out to `shape` along broadcast dims (0 + t, one zip pass).
Tensor expand_to(const Tensor& t, const Shape& shape) {
  const Tensor zeros = Tensor::zeros(shape, t.dtype(), t.device());
  Tensor out = empty_like(t, shape);
  backend_for(t.device()).zip(BinaryOp::Add, zeros, t, out);
  return out;
}

// dout of a reduction over `dim`, in keepdim form, after checking its shape.
Tensor reduced_grad_keepdim(const Tensor& dout, const Shape& x_shape, int dim, bool keepdim, const char* op) {
  check_float(dout, op, "dout");
  Shape reduced = keepdim_shape(x_shape, dim);
  if (!keepdim) reduced.erase(reduced.begin() + dim);
  HG_CHECK(dout.shape() == reduced, op, "dout shape ", dout.shape(), " should be ", reduced, " for x ", x_shape,
           " reduced over dim ", dim, keepdim ? " (keepdim)" : "");
  return dout.reshape(keepdim_shape(x_shape, dim));
}

}  // namespace

// ---------------------------------------------------------------- map

Tensor map(UnaryOp op, const Tensor& x) {
  check_float(x, unary_op_name(op), "x");
  Tensor out = empty_like(x, x.shape());
  backend_for(x.device()).map(op, x, out);
  return out;
}

Tensor neg(const Tensor& x) { return map(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return map(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return map(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return map(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return map(UnaryOp::Rsqrt, x); }
Tensor relu(const Tensor& x) { return map(UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return map(UnaryOp::Gelu, x); }
Tensor tanh(const Tensor& x) { return map(UnaryOp::Tanh, x); }

// ---------------------------------------------------------------- zip

Tensor zip(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_pair(a, b, name);
  HG_CHECK(broadcastable(a.shape(), b.shape()), name, "shapes a ", a.shape(), " and b ", b.shape(),
           " do not broadcast");
  Tensor out = empty_like(a, broadcast_shapes(a.shape(), b.shape(), name));
  backend_for(a.device()).zip(op, a, b, out);
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return zip(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return zip(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return zip(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return zip(BinaryOp::Div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return zip(BinaryOp::Max, a, b); }

Tensor add_scalar(const Tensor& a, double s) {
  check_float(a, "add_scalar", "a");
  return zip(BinaryOp::Add, a, scalar_like(a, s));
}

Tensor mul_scalar(const Tensor& a, double s) {
  check_float(a, "mul_scalar", "a");
  return zip(BinaryOp::Mul, a, scalar_like(a, s));
}

// ---------------------------------------------------------------- reduce

Tensor reduce(ReduceOp op, const Tensor& x, int dim, bool keepdim) {
  const char* name = reduce_op_name(op);
  check_float(x, name, "x");
  const int d = normalize_dim(dim, x.ndim(), name);
  HG_CHECK(x.shape()[d] > 0 || op == ReduceOp::Sum, name, "cannot reduce the empty dim ", d, " of x ", x.shape());
  const Shape kept = keepdim_shape(x.shape(), d);
  Tensor out = empty_like(x, kept);
  backend_for(x.device()).reduce(op, x, d, out);
  if (keepdim) return out;
  Shape dropped = kept;
  dropped.erase(dropped.begin() + d);
  return out.reshape(dropped);
}

Tensor sum(const Tensor& x, int dim, bool keepdim) { return reduce(ReduceOp::Sum, x, dim, keepdim); }
Tensor mean(const Tensor& x, int dim, bool keepdim) { return reduce(ReduceOp::Mean, x, dim, keepdim); }
Tensor max(const Tensor& x, int dim, bool keepdim) { return reduce(ReduceOp::Max, x, dim, keepdim); }

Tensor sum_all(const Tensor& x) {
  check_float(x, "sum_all", "x");
  return sum(x.reshape(Shape{x.numel()}), 0, false);  // shape ()
}

// ---------------------------------------------------------------- matmul

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  HG_PROFILE("matmul", a.device());
  check_pair(a, b, "matmul");
  const MatmulShape s = matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b, "matmul");
  Tensor out = empty_like(a, s.out);
  backend_for(a.device()).matmul(a, b, out, transpose_a, transpose_b, false);
  return out;
}

void matmul_into(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b) {
  HG_PROFILE("matmul", a.device());
  check_pair(a, b, "matmul_into");
  out.check_defined("matmul_into");
  HG_CHECK(out.device() == a.device() && out.dtype() == a.dtype(), "matmul_into", "out ", out.shape(), " must be a ",
           dtype_name(a.dtype()), " tensor on ", device_name(a.device()), " like a ", a.shape());
  const MatmulShape s = matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b, "matmul_into");
  HG_CHECK(out.shape() == s.out, "matmul_into", "out has shape ", out.shape(), ", expected ", s.out, " for a ",
           a.shape(), " b ", b.shape());
  backend_for(a.device()).matmul(a, b, out, transpose_a, transpose_b, false);
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  HG_PROFILE("layout", x.device());
  HG_CHECK(x.defined(), "transpose", "x is an undefined tensor");
  const int d0 = normalize_dim(dim0, x.ndim(), "transpose");
  const int d1 = normalize_dim(dim1, x.ndim(), "transpose");
  Shape shape = x.shape();
  std::swap(shape[d0], shape[d1]);
  Tensor out = empty_like(x, shape);
  backend_for(x.device()).transpose(x, d0, d1, out);
  return out;
}

// ---------------------------------------------------------------- backward

// Leading dims that broadcasting added are summed in one pass (after a
// reshape to (lead, rest)); dims that were 1 are summed keepdim one by one.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  check_float(grad, "sum_to_shape", "grad");
  const Shape& g = grad.shape();
  HG_CHECK(shape.size() <= g.size() && broadcastable(shape, g) && broadcast_shapes(shape, g, "sum_to_shape") == g,
           "sum_to_shape", "grad ", g, " is not a broadcast of shape ", shape);
  if (g == shape) return grad;
  Tensor t = grad;
  const size_t lead = g.size() - shape.size();
  if (lead > 0) {
    int64_t lead_numel = 1;
    for (size_t i = 0; i < lead; ++i) lead_numel *= g[i];
    const Shape rest(g.begin() + lead, g.end());
    t = sum(t.reshape(Shape{lead_numel, shape_numel(rest)}), 0, false).reshape(rest);
  }
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && t.shape()[i] != 1) t = sum(t, static_cast<int>(i), true);
  return t.reshape(shape);
}

std::pair<Tensor, Tensor> add_backward(const Tensor& dout, const Shape& a_shape, const Shape& b_shape) {
  return {sum_to_shape(dout, a_shape), sum_to_shape(dout, b_shape)};
}

std::pair<Tensor, Tensor> sub_backward(const Tensor& dout, const Shape& a_shape, const Shape& b_shape) {
  return {sum_to_shape(dout, a_shape), sum_to_shape(neg(dout), b_shape)};
}

std::pair<Tensor, Tensor> mul_backward(const Tensor& dout, const Tensor& a, const Tensor& b) {
  return {sum_to_shape(mul(dout, b), a.shape()), sum_to_shape(mul(dout, a), b.shape())};
}

// d(a/b)/da = 1/b ; d(a/b)/db = -a/b^2
std::pair<Tensor, Tensor> div_backward(const Tensor& dout, const Tensor& a, const Tensor& b) {
  const Tensor da = div(dout, b);
  const Tensor db = neg(div(mul(dout, a), map(UnaryOp::Square, b)));
  return {sum_to_shape(da, a.shape()), sum_to_shape(db, b.shape())};
}

// `out` = map(op, x) from the forward pass; ops whose derivative is cheapest
// in terms of out use it (it is recomputed when left undefined).
Tensor map_backward(UnaryOp op, const Tensor& dout, const Tensor& x, const Tensor& out) {
  const char* name = "map_backward";
  check_float(dout, name, "dout");
  check_float(x, name, "x");
  HG_CHECK(dout.shape() == x.shape(), name, "(", unary_op_name(op), ") dout shape ", dout.shape(),
           " differs from x shape ", x.shape());
  auto y = [&]() {
    if (!out.defined()) return map(op, x);
    HG_CHECK(out.shape() == x.shape(), name, "(", unary_op_name(op), ") out shape ", out.shape(),
             " differs from x shape ", x.shape());
    return out;
  };
  switch (op) {
    case UnaryOp::Identity: return dout;
    case UnaryOp::Neg: return neg(dout);
    case UnaryOp::Exp: return mul(dout, y());                    // e^x
    case UnaryOp::Log: return div(dout, x);                      // 1/x
    case UnaryOp::Sqrt: return div(dout, mul_scalar(y(), 2.0));  // 1/(2 sqrt x)
    case UnaryOp::Rsqrt: {                                       // -1/2 x^-3/2 = -y^3/2
      const Tensor r = y();
      return mul(dout, mul_scalar(mul(r, map(UnaryOp::Square, r)), -0.5));
    }
    case UnaryOp::Reciprocal: return neg(mul(dout, map(UnaryOp::Square, y())));  // -1/x^2
    case UnaryOp::Square: return mul(dout, mul_scalar(x, 2.0));
    case UnaryOp::Abs: {  // sign(x), 0 at x = 0 (the subgradient we pick)
      const Tensor zero = scalar_like(x, 0.0);
      return mul(dout, sub(zip(BinaryOp::Gt, x, zero), zip(BinaryOp::Gt, zero, x)));
    }
    case UnaryOp::Relu: return mul(dout, map(UnaryOp::ReluGrad, x));  // 0 at x = 0
    case UnaryOp::Gelu: return mul(dout, map(UnaryOp::GeluGrad, x));
    case UnaryOp::Tanh: {  // 1 - y^2
      const Tensor one_minus = add_scalar(neg(map(UnaryOp::Square, y())), 1.0);
      return mul(dout, one_minus);
    }
    case UnaryOp::Sigmoid: {  // y (1 - y)
      const Tensor s = y();
      return mul(dout, mul(s, add_scalar(neg(s), 1.0)));
    }
    case UnaryOp::ReluGrad:
    case UnaryOp::GeluGrad: fail(name, unary_op_name(op), " is not differentiable here (it is itself a derivative)");
  }
  fail(name, "unknown unary op ", static_cast<int>(op));
}

Tensor sum_backward(const Tensor& dout, const Shape& x_shape, int dim, bool keepdim) {
  const int d = normalize_dim(dim, static_cast<int>(x_shape.size()), "sum_backward");
  return expand_to(reduced_grad_keepdim(dout, x_shape, d, keepdim, "sum_backward"), x_shape);
}

Tensor mean_backward(const Tensor& dout, const Shape& x_shape, int dim, bool keepdim) {
  const int d = normalize_dim(dim, static_cast<int>(x_shape.size()), "mean_backward");
  HG_CHECK(x_shape[d] > 0, "mean_backward", "empty dim ", d, " of x ", x_shape);
  const Tensor g = reduced_grad_keepdim(dout, x_shape, d, keepdim, "mean_backward");
  return expand_to(mul_scalar(g, 1.0 / static_cast<double>(x_shape[d])), x_shape);
}

// The whole gradient of each reduced slice goes to the FIRST position that
// attains the maximum (ties are not split), like an argmax. Done with
// primitives only, so it runs on any device:
//   hit   = (x == max)                  1 at every maximum
//   index = position along dim          shape (len, 1, ..., 1)
//   first = min over dim of (index + len * (1 - hit))
//   dx    = (index == first) * dout
// A slice containing NaN has no position equal to its max and gets no gradient.
Tensor max_backward(const Tensor& dout, const Tensor& x, const Tensor& out, int dim, bool keepdim) {
  const char* name = "max_backward";
  check_pair(dout, x, name);
  const int d = normalize_dim(dim, x.ndim(), name);
  const int64_t len = x.shape()[d];
  HG_CHECK(len > 0, name, "empty dim ", d, " of x ", x.shape());
  const Tensor g = reduced_grad_keepdim(dout, x.shape(), d, keepdim, name);
  Tensor m = out.defined() ? out : max(x, d, keepdim);
  HG_CHECK(m.shape() == dout.shape(), name, "out shape ", m.shape(), " differs from dout shape ", dout.shape());
  m = m.reshape(g.shape());

  Shape index_shape(x.ndim() - d, 1);
  index_shape[0] = len;
  const Tensor index = Tensor::arange(len, x.dtype(), x.device()).reshape(index_shape);
  const Tensor hit = zip(BinaryOp::Eq, x, m);
  const Tensor miss_penalty = add_scalar(mul_scalar(hit, -static_cast<double>(len)), static_cast<double>(len));
  const Tensor first = reduce(ReduceOp::Min, add(miss_penalty, index), d, true);
  return mul(zip(BinaryOp::Eq, index, first), g);
}

// C = op(A) op(B). With dC the incoming gradient:
//   A B     : dA = dC B^T      dB = A^T dC
//   A B^T   : dA = dC B        dB = dC^T A
//   A^T B   : dA = B dC^T      dB = A dC
//   A^T B^T : dA = B^T dC^T    dB = dC^T A^T
// A shared 2-D b receives the sum over batches of its per-batch gradients.
std::pair<Tensor, Tensor> matmul_backward(const Tensor& dout, const Tensor& a, const Tensor& b, bool transpose_a,
                                          bool transpose_b) {
  const char* name = "matmul_backward";
  check_pair(a, b, name);
  check_pair(dout, a, name);
  const MatmulShape s = matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b, name);
  HG_CHECK(dout.shape() == s.out, name, "dout shape ", dout.shape(), " should be ", s.out, " for a ", a.shape(), " b ",
           b.shape());
  const bool ta = transpose_a, tb = transpose_b;

  if (s.b_shared && !ta) {
    // op(A) rows of every batch stack into one (batch*m, k) matrix: a plain 2-D matmul.
    const Tensor a2 = a.reshape(Shape{s.batch * s.m, s.k});
    const Tensor d2 = dout.reshape(Shape{s.batch * s.m, s.n});
    auto [da2, db] = matmul_backward(d2, a2, b, false, tb);
    return {da2.reshape(a.shape()), db};
  }
  if (s.b_shared) {
    // dA^T = dC op(B)^T per batch, then swap back; dB summed over the batch.
    const Tensor da = transpose(matmul(dout, b, false, !tb), -2, -1);
    const Tensor per_batch = tb ? matmul(dout, a, true, true) : matmul(a, dout, false, false);
    const Tensor db = sum(per_batch.reshape(Shape{s.batch, b.shape()[0], b.shape()[1]}), 0, false);
    return {da, db};
  }
  if (!ta && !tb) return {matmul(dout, b, false, true), matmul(a, dout, true, false)};
  if (!ta && tb) return {matmul(dout, b, false, false), matmul(dout, a, true, false)};
  if (ta && !tb) return {matmul(b, dout, false, true), matmul(a, dout, false, false)};
  return {matmul(b, dout, true, true), matmul(dout, a, true, true)};
}

}  // namespace hg
