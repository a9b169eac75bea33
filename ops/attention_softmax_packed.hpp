#pragma once
// Softmax attention that keeps its probabilities, on the packed layouts:
// q, k, v read in place from the QKV projection's output (B, T, 3 H dh), the
// output written as (B, T, H dh), the gradient as (B, T, 3 H dh). The fused
// mode's CPU path for AttentionImpl::Softmax (models/attention.hpp) where it
// suits the shape: the same products and softmax as the composed path,
// without its head split and merge copies
// (ops/cpu/attention_softmax_packed_cpu.hpp). CPU, F32 or F64.
#include <cstdint>

#include "core/tensor.hpp"
#include "ops/softmax.hpp"

namespace hg {

// Whether the packed path runs (batch, heads, T, head_dim) as matmul runs the
// composed path's products, one GEMM a head with the heads on the threads,
// so bit for bit the same results: false where matmul cuts each product into
// tiles (fewer than 16 heads in all, long rows), which the composed path
// keeps for those shapes.
bool attention_softmax_packed_suits(int64_t batch, int64_t heads, int64_t t, int64_t head_dim);

// The output; probs (B, H, T, T) = softmax(scale q k^T + mask (+ causal)) for
// the backward.
Tensor attention_softmax_packed_forward(const Tensor& qkv, int64_t heads, const SoftmaxOptions& options, Tensor& probs);

// d qkv from dout (B, T, H dh), the forward's qkv and probs, its scale and
// whether it was causal (the products then leave out the hidden keys, whose
// probabilities are 0: bit for bit the full products for finite inputs).
Tensor attention_softmax_packed_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                                         double scale, bool causal);

}  // namespace hg
