#pragma once
#include "core/module.hpp"

namespace hg {

// GELU (tanh approximation) as a module: forward saves x and y, backward
// applies the primitive's hand-written derivative.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x);
  Tensor apply(const Tensor& x);  // for inference: nothing kept
  Tensor backward(const Tensor& dy);

 private:
  Tensor x_, y_;
};

}  // namespace hg
