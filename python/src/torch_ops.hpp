#pragma once
// What handgrad.torch's drop-ins do once their arguments are handgrad views,
// shared by handgrad._C's _torch_* entry points (torch_ops.cpp) and the
// bridge to handgrad._torch_ext (torch_bridge.cpp).
#include "core/tensor.hpp"
#include "ops/softmax.hpp"

namespace hg::python {

// Attention softmax of scores (B, H, Tq, Tk) into y; without a mask and
// causal, scores of any shape, as rows of its last dim. Throws hg::Error naming `op`.
void torch_softmax_forward(Tensor scores, const SoftmaxOptions& options, Tensor y, const char* op);

}  // namespace hg::python
