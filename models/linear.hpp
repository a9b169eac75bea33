#pragma once
#include <cstdint>
#include <functional>

#include "core/module.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"

namespace hg {

// Fully connected layer y = x W^T + b for x of shape (..., in).
// W is (out, in), so each output feature is a contiguous row of W;
// W and b start uniform in [-1/sqrt(in), 1/sqrt(in)].
// bf16 x (bf16 precision, CUDA): the GEMM reads the bf16 copies of W and b
// (Parameter::compute, rewritten by every optimizer step), the output is
// bf16, dW and db accumulate in f32. Fused mode folds the bias into the GEMM
// (and db into the dW GEMM); unfused mode adds it with a separate pass.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool with_bias = true, DType dtype = DType::F32);

  // Caches x (shares its storage, no copy) for backward.
  Tensor forward(const Tensor& x);
  // The same product for inference: nothing is kept for a backward.
  Tensor apply(const Tensor& x);
  // Adds dL/dW and dL/db into the parameter grads and returns dL/dx.
  Tensor backward(const Tensor& dy);
  // backward() for a dy whose column sums (dL/db) the caller has already
  // added into bias.grad: the attention backward's kernels sum them as they
  // write the QKV projection's output gradient (MultiHeadAttention).
  Tensor backward_bias_summed(const Tensor& dy);

  // The weight / bias as the GEMM reads them for input x: the parameter
  // itself, or its bf16 copy (Parameter::compute) for bf16 x.
  const Tensor& weight_for(const Tensor& x);
  const Tensor& bias_for(const Tensor& x);

  // GELU fused into the GEMMs (FeedForward, fused mode; x 2-D, a bias, and
  // out_features % 8 == 0 as cuBLASLt's GELU epilogue needs: gelu_fusable()).
  // forward_gelu: gelu(x W^T + b) from one GEMM; the pre-activation x W^T + b
  // is written to `pre` for the backward.
  bool gelu_fusable() const { return has_bias_ && out_ % 8 == 0; }
  Tensor forward_gelu(const Tensor& x, Tensor& pre);
  Tensor apply_gelu(const Tensor& x, Tensor& pre);  // forward_gelu for inference: x is not kept
  // For the Linear that consumes gelu(pre): its dW and db as backward(), and
  // d pre = (dy W) * gelu'(pre) from one backend GEMM.
  Tensor backward_to_gelu_input(const Tensor& dy, const Tensor& pre);
  // Activation recomputation: drop the saved forward input; the backward
  // calls `recompute` when it starts for a tensor of the forward input's
  // shape and dtype, and releases it after its dW GEMM as a kept input is.
  // The next forward keeps its input again and drops a pending recompute.
  void forget_input(std::function<Tensor()> recompute);
  bool holds_input() const { return x_.defined(); }  // whether the forward input is in memory now

  Parameter weight;
  Parameter bias;  // undefined value when built with bias = false

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

 private:
  int64_t in_, out_;
  bool has_bias_;
  Tensor x_;                                 // the last forward input
  std::function<Tensor()> recompute_input_;  // forget_input's, until the backward or the next forward
  Shape x_shape_;
  DType x_dtype_ = DType::F32;

  void save_input(const Tensor& x);
  void restore_input(Tensor x);  // the recomputed input, checked against the forward's
  Tensor backward_impl(const Tensor& dy, const Tensor* gelu_pre, bool bias_summed = false);
};

}  // namespace hg
