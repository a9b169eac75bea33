#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "ops/layernorm.hpp"

namespace hg {

// LayerNorm over the last dim as a module: y = gamma * xhat + beta with
// gamma = 1 and beta = 0 at init. forward caches x and the per-row mean/rstd
// (O(rows)); backward accumulates into gamma.grad / beta.grad and returns dx.
// Runs whichever path hg::kernel_mode() and the device select (ops/layernorm.hpp).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dtype = DType::F32);

  Tensor forward(const Tensor& x);    // (..., dim) -> (..., dim)
  Tensor backward(const Tensor& dy);  // dy like the last x -> dx

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }

  Parameter gamma;  // (dim,)
  Parameter beta;   // (dim,)

 private:
  int64_t dim_;
  double eps_;
  Tensor x_;  // saved by forward
  LayerNormSaved saved_;
};

}  // namespace hg
