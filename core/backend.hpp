#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// The primitive backend, miniTorch's TensorOps: every higher op that is not
// fused is written on these four kinds of pass. One implementation per device
// (cpu_backend.cpp on Eigen, cuda/cuda_backend.cu on CUDA kernels + cuBLAS).

enum class UnaryOp { Identity, Neg, Exp, Log, Sqrt, Rsqrt, Reciprocal, Square, Abs, Relu, ReluGrad, Gelu, GeluGrad, Tanh, Sigmoid };
enum class BinaryOp { Add, Sub, Mul, Div, Max, Min, Pow, Eq, Gt };
enum class ReduceOp { Sum, Max, Min, Mean };

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);

class Backend {
 public:
  virtual ~Backend() = default;

  // out = op(x), elementwise. Same shape/dtype (F32 or F64), same device.
  // ReluGrad(x) = x > 0 ? 1 : 0 ; GeluGrad(x) = d gelu / dx (tanh approximation, as Gelu).
  virtual void map(UnaryOp op, const Tensor& x, Tensor& out) = 0;

  // out = op(a, b) with NumPy broadcasting: out.shape() == broadcast_shapes(a, b).
  // Eq/Gt produce 1.0 or 0.0. out may alias an operand of out's own shape
  // (in-place accumulate, e.g. grad += g); never a broadcast operand.
  virtual void zip(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // out = op over `dim` of x; out has x's shape with size 1 at `dim` (keepdim form).
  virtual void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out) = 0;

  // Batched matmul, out[..., m, n] = sum_k op(a)[..., m, k] * op(b)[..., k, n],
  // where op transposes the last two dims when the flag is set. a and b have
  // the same leading (batch) dims, or b is 2-D and shared by every batch.
  // When accumulate is true, out += product instead of out = product.
  virtual void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a,
                      bool transpose_b, bool accumulate = false) = 0;

  // out = value everywhere / out = src converted to out's dtype (same device, same numel).
  virtual void fill(Tensor& out, double value) = 0;
  virtual void cast(const Tensor& src, Tensor& out) = 0;

  // out = x with dims dim0 and dim1 (already normalised) swapped, as a
  // contiguous copy. The default stages through the host so every backend has
  // it; a device backend overrides it with a kernel to avoid the round trip.
  virtual void transpose(const Tensor& x, int dim0, int dim1, Tensor& out);

  // Embedding rows (core/indexing.hpp validates and calls these). ids holds
  // the row ids as F32 on this device; host_ids is the same list on the host,
  // every id already checked to be in [0, V). table / grad_table (V, D) and
  // out / grad (N, D), N = host_ids.size(), all F32 or all F64.
  // out[i, :] = table[ids[i], :].
  virtual void gather_rows(const Tensor& table, const Tensor& ids, const std::vector<int32_t>& host_ids,
                           Tensor& out) = 0;
  // grad_table[ids[i], :] += grad[i, :], summed in increasing i for each row
  // (deterministic, no float atomics).
  virtual void scatter_add_rows(const Tensor& grad, const std::vector<int32_t>& host_ids, Tensor& grad_table) = 0;
};

Backend& cpu_backend();
Backend& cuda_backend();  // throws hg::Error when built without CUDA
Backend& backend_for(Device device);

}  // namespace hg
