#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"

namespace hg {

// Fully connected layer y = x W^T + b for x of shape (..., in).
// W is (out, in), so each output feature is a contiguous row of W;
// W and b start uniform in [-1/sqrt(in), 1/sqrt(in)].
// bf16 x (bf16 precision, CUDA): the GEMM reads the bf16 copy of W
// (Parameter::compute), the output is bf16, dW and db accumulate in f32.
// Fused mode folds the bias into the GEMM (and db into the dW GEMM); unfused
// mode adds it with a separate pass.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool with_bias = true, DType dtype = DType::F32);

  // Caches x (shares its storage, no copy) for backward.
  Tensor forward(const Tensor& x);
  // Adds dL/dW and dL/db into the parameter grads and returns dL/dx.
  Tensor backward(const Tensor& dy);

  // The weight as the GEMM reads it for input x: W itself, or its bf16 copy for bf16 x.
  const Tensor& weight_for(const Tensor& x);

  Parameter weight;
  Parameter bias;  // undefined value when built with bias = false

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

 private:
  int64_t in_, out_;
  bool has_bias_;
  Tensor x_;  // the last forward input
};

}  // namespace hg
