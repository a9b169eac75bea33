#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "ops/layernorm.hpp"
#include "ops/residual_layernorm.hpp"

namespace hg {

// The residual stream of a pre-LN model with its last add still pending: the
// value is h + branch (branch undefined: h alone). The next LayerNorm forms
// the sum in its own pass (LayerNorm::forward_stream), so no add runs alone.
struct ResidualStream {
  Tensor h;
  Tensor branch;
};

// LayerNorm over the last dim as a module: y = gamma * xhat + beta with
// gamma = 1 and beta = 0 at init. forward caches x and the per-row mean/rstd
// (O(rows)); backward accumulates into gamma.grad / beta.grad and returns dx.
// Runs whichever path hg::kernel_mode() and the device select (ops/layernorm.hpp).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dtype = DType::F32);

  Tensor forward(const Tensor& x);    // (..., dim) -> (..., dim)
  Tensor apply(const Tensor& x);      // the forward for inference: nothing kept for a backward
  Tensor backward(const Tensor& dy);  // dy like the last x -> dx

  // The residual seam in one pass (ops/residual_layernorm.hpp): h = x + r
  // and y = LN(h); h is this module's input for backward.
  ResidualLayerNormOutput forward_residual(const Tensor& x, const Tensor& r);
  ResidualLayerNormOutput apply_residual(const Tensor& x, const Tensor& r);  // for inference
  // LN of the stream's value: forward_residual(s.h, s.branch) where a branch
  // is pending, else forward(s.h) (out.h is then s.h itself). Pass s with
  // std::move: the branch, summed into out.h, is then freed on return.
  ResidualLayerNormOutput forward_stream(ResidualStream s);
  // The gradient of the input (x, or h): dh_in (the residual path; may be
  // undefined) plus the LayerNorm backward of dy, in one pass; accumulates
  // dgamma / dbeta. After either forward: both keep the same statistics
  // (mean and rstd of the input rows), which is all the op reads.
  Tensor backward_residual(const Tensor& dy, const Tensor& dh_in);

  // The last forward's output again, from the kept input (x, or h of
  // forward_residual) and nothing saved: for a consumer that did not keep it
  // (TransformerLayer's recompute_layernorm). The forward's own op runs again
  // (layernorm_forward, or residual_layernorm_output on h), so the output is
  // bitwise the forward's. Before the backward only (it releases the input).
  Tensor recompute_output();

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }

  Parameter gamma;  // (dim,)
  Parameter beta;   // (dim,)

 private:
  int64_t dim_;
  double eps_;
  Tensor x_;               // saved by forward (h for forward_residual)
  bool residual_ = false;  // whether x_ is forward_residual's h
  LayerNormSaved saved_;
  LayerNormParamGrads param_grads() const;  // where the backwards add dgamma / dbeta
  void release();                           // backward has used the saved state: free it for the rest of the backward
};

}  // namespace hg
