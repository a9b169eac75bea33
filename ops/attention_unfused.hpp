#pragma once
// Internal to ops/: attention composed from primitive passes on any device,
// miniTorch style: scores = q k^T (GEMM), attention softmax, o = p v (GEMM).
// It writes the (B, H, Tq, Tk) scores and probabilities the fused paths avoid.
#include "ops/attention.hpp"

namespace hg::unfused {

// Fills saved->o, saved->lse and saved->probs (BF16 inputs: F32 math, o cast back).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionSaved& saved);

AttentionGrads attention_backward(const Tensor& dout, const AttentionSaved& saved);

}  // namespace hg::unfused
