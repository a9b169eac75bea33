#include "core/backend.hpp"

namespace hg {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Identity: return "identity";
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Square: return "square";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::ReluGrad: return "relu_grad";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::GeluGrad: return "gelu_grad";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
  }
  return "unknown_unary_op";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Max: return "maximum";
    case BinaryOp::Min: return "minimum";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Gt: return "gt";
  }
  return "unknown_binary_op";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Mean: return "mean";
  }
  return "unknown_reduce_op";
}

// Default for backends without their own kernel: copy to the host, let the
// CPU backend permute, copy back. Correct on any device, slow off the CPU.
void Backend::transpose(const Tensor& x, int dim0, int dim1, Tensor& out) {
  const Tensor host_x = x.to(Device::CPU);
  Tensor host_out = Tensor::empty(out.shape(), out.dtype(), Device::CPU);
  cpu_backend().transpose(host_x, dim0, dim1, host_out);
  out.copy_(host_out);
}

void Backend::zero_multi(const std::vector<Tensor>& outs) {
  for (Tensor t : outs) {  // a handle: the copy fills the same storage
    t.check_defined("Backend::zero_multi");
    if (t.numel() > 0) fill(t, 0.0);
  }
}

Backend& backend_for(Device device) {
  switch (device) {
    case Device::CPU: return cpu_backend();
    case Device::CUDA: return cuda_backend();
  }
  fail("backend_for", "unknown device ", static_cast<int>(device));
}

}  // namespace hg
