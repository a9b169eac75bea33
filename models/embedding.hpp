#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "core/random.hpp"

namespace hg {

// Token embedding plus a learned position embedding:
//   out[b, t, :] = token.weight[ids[b, t], :] + position.weight[t, :]
// ids is (B, T) of integer token ids stored as F32, on the module's device.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab_size, int64_t max_positions, int64_t dim, Generator& gen, DType dtype = DType::F32,
            double init_std = 0.02);

  Tensor forward(const Tensor& ids);  // (B, T) -> (B, T, dim)
  // Accumulates into both tables; ids are not differentiable, so nothing is returned.
  void backward(const Tensor& dy);

  Parameter token;     // (vocab, dim)
  Parameter position;  // (max_positions, dim)

 private:
  Tensor ids_;  // saved by forward
};

}  // namespace hg
