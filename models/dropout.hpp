#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "core/random.hpp"

namespace hg {

// Inverted dropout: in training, each element is kept with probability 1 - p
// and scaled by 1 / (1 - p), so eval is the identity. The mask is drawn from
// the module's own seeded Generator stream on the tensor's device
// (Backend::dropout_mask: a kernel on CUDA, nothing per element on the host;
// the same seed gives the same masks on CPU and CUDA, bit for bit) and saved
// for backward, which applies the same mask.
class Dropout : public Module {
 public:
  explicit Dropout(double p, uint64_t seed = 0);

  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);

  double p() const { return p_; }
  // Restarts the mask stream (tests use it to replay the same mask).
  void reseed(uint64_t seed) { gen_.set_state(seed, 0); }
  const Tensor& mask() const { return mask_; }  // undefined when the last forward was the identity

 private:
  double p_;
  Generator gen_;
  Tensor mask_;  // 0 or 1 / (1 - p), like x
};

}  // namespace hg
