#pragma once
#include <utility>

#include "core/backend.hpp"
#include "core/tensor.hpp"

// miniTorch's tensor_functions: validated, allocating wrappers over the
// primitive backend, plus the hand-written backward of each primitive that
// the models need. Inputs must share device and dtype (hg::Error otherwise).
// matmul / matmul_into are profiled as kind "matmul", transpose as "layout"
// (core/profiler.hpp); map/zip/reduce count toward the op that calls them.
namespace hg {

// ---- map ----
Tensor map(UnaryOp op, const Tensor& x);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor tanh(const Tensor& x);

// ---- zip (broadcasting) ----
Tensor zip(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);

// ---- reduce ----
Tensor reduce(ReduceOp op, const Tensor& x, int dim, bool keepdim = false);
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x, int dim, bool keepdim = false);
Tensor sum_all(const Tensor& x);  // scalar tensor of shape ()

// ---- matmul ----
// (..., m, k) x (..., k, n) -> (..., m, n); b may be 2-D (k, n) and shared.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// The same product written into an existing tensor of the product's shape
// (e.g. a slice of a larger buffer, so no concatenation copy follows).
void matmul_into(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a = false, bool transpose_b = false);

// Layout functions (copies): swap two dims of a contiguous tensor.
Tensor transpose(const Tensor& x, int dim0, int dim1);

// ---- backward of the primitives ----
// Sums a broadcast gradient back down to `shape` (the inverse of broadcasting).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);
std::pair<Tensor, Tensor> add_backward(const Tensor& dout, const Shape& a_shape, const Shape& b_shape);
std::pair<Tensor, Tensor> sub_backward(const Tensor& dout, const Shape& a_shape, const Shape& b_shape);
std::pair<Tensor, Tensor> mul_backward(const Tensor& dout, const Tensor& a, const Tensor& b);
std::pair<Tensor, Tensor> div_backward(const Tensor& dout, const Tensor& a, const Tensor& b);
Tensor map_backward(UnaryOp op, const Tensor& dout, const Tensor& x, const Tensor& out);
Tensor sum_backward(const Tensor& dout, const Shape& x_shape, int dim, bool keepdim);
Tensor mean_backward(const Tensor& dout, const Shape& x_shape, int dim, bool keepdim);
Tensor max_backward(const Tensor& dout, const Tensor& x, const Tensor& out, int dim, bool keepdim);
std::pair<Tensor, Tensor> matmul_backward(const Tensor& dout, const Tensor& a, const Tensor& b,
                                          bool transpose_a = false, bool transpose_b = false);

}  // namespace hg
