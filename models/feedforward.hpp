#pragma once
#include <cstdint>

#include "core/module.hpp"
#include "core/random.hpp"
#include "models/dropout.hpp"
#include "models/gelu.hpp"
#include "models/linear.hpp"

namespace hg {

// Position-wise MLP: Linear(d, hidden) -> GELU -> Linear(hidden, d) -> Dropout.
// Fused mode with hidden % 8 == 0 runs GELU inside the GEMMs: fc1's bias+GELU
// epilogue keeps the pre-activation, and fc2's dx GEMM applies gelu' to it.
// Otherwise (unfused mode) the GELU module runs as its own passes.
//
// recompute_gelu (fused GELU only): fc2 does not keep its input gelu(pre)
// between the forward and the backward; its backward recomputes it from pre
// (one elementwise pass). That frees hidden values per token and layer, 2
// bytes each in bf16 (gpt2s at B32: 2.4 GB), for one read and one write of
// them in the backward. The recomputed value rounds gelu(pre) from the stored
// pre, where the forward's epilogue rounded it from the unrounded sum: the
// weight gradient of fc2 sees inputs within one rounding of the forward's.
class FeedForward : public Module {
 public:
  FeedForward(int64_t d_model, int64_t hidden, Generator& gen, double dropout = 0.0, uint64_t dropout_seed = 0,
              DType dtype = DType::F32);

  Tensor forward(const Tensor& x);  // (..., d) -> (..., d)
  Tensor apply(const Tensor& x);    // the forward for inference (dropout off): nothing kept for a backward
  Tensor backward(const Tensor& dy);

  void set_recompute_gelu(bool on) { recompute_gelu_ = on; }
  bool recompute_gelu() const { return recompute_gelu_; }

  Linear fc1;
  GELU act;
  Linear fc2;
  Dropout drop;

 private:
  Shape x_shape_;
  int64_t d_model_;
  Tensor pre_;  // fc1's pre-activation when GELU ran in the epilogue, else undefined
  bool recompute_gelu_ = false;
};

}  // namespace hg
