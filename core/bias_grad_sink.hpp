#pragma once
// Where a GEMM's bias-gradient sums go on their way into a parameter's
// gradient: straight in (GemmArgs::bias_grad_accumulate: grad += the sums,
// the one addition a temporary's add would make, so the same bits and no
// extra pass) where the sums share grad's dtype and it is f32 or f64;
// otherwise into a temporary that finish() adds to grad in grad's dtype.
// Linear's backward and the chunked classifier attach one to their GEMMs.
#include "core/backend.hpp"
#include "core/tensor.hpp"

namespace hg {

class BiasGradSink {
 public:
  BiasGradSink(Tensor& grad, DType sums_dtype) : grad_(grad) {
    if (!adds_directly(grad, sums_dtype)) temp_ = Tensor::empty(grad.shape(), sums_dtype, grad.device());
  }
  // Whether the sums go straight into grad (no temporary is allocated).
  static bool adds_directly(const Tensor& grad, DType sums_dtype) {
    return sums_dtype == grad.dtype() && (grad.dtype() == DType::F32 || grad.dtype() == DType::F64);
  }
  // Points the GEMM's bias_grad at the grad or the temporary.
  void attach(GemmArgs& args) {
    args.bias_grad = temp_.defined() ? &temp_ : &grad_;
    args.bias_grad_accumulate = !temp_.defined();
  }
  // After the GEMM: adds the temporary into grad, if there is one.
  void finish(Backend& be) {
    if (!temp_.defined()) return;
    const Tensor sums = temp_.dtype() == grad_.dtype() ? temp_ : temp_.to(grad_.dtype());
    be.zip(BinaryOp::Add, grad_, sums, grad_);  // elementwise, in place
  }

 private:
  Tensor& grad_;
  Tensor temp_;
};

}  // namespace hg
