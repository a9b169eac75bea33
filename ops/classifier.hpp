#pragma once
#include <cstdint>

#include "core/tensor.hpp"

namespace hg {

// The fused classifier: a language model's head (logits = h W^T + b), the
// mean cross-entropy against integer targets and every gradient, computed a
// chunk of rows at a time, so the (N, V) logits never exist whole:
//
//   for each chunk c of rows:
//     logits_c  = h_c W^T + b                    (GEMM, bias epilogue)
//     row pass:   m, log s, loss terms; logits_c <- (softmax - onehot) / n  (in place)
//     dh_c      = logits_c W                     (GEMM)
//     dW       += logits_c^T h_c ; db += column sums of logits_c   (GEMM, beta = 1)
//   loss = (1 / n) sum of the row losses, in row order
//
// n (the targets that are not ignore_index) is counted before the first
// chunk, since every chunk's gradient needs 1 / n. Math, bounds and the
// choice of chunk size: docs/classifier.md. The unfused reference is the
// composition this replaces, Linear::forward + cross_entropy_forward /
// backward + Linear::backward (what DecoderLM runs for logits).
struct ClassifierOptions {
  // Rows of logits per chunk; 0: default_classifier_chunk_rows(V, dtype, device).
  int64_t chunk_rows = 0;
  // false: the targets are read to the host and checked (hg::Error for a bad
  // one). true: nothing is read back (the form a CUDA graph can capture): on
  // CUDA the count is made on the device and a target that is neither a class
  // nor ignore_index makes the loss NaN; the CPU always checks on the host.
  bool targets_on_device = false;
  // Upstream gradient of the loss: dh, weight_grad and bias_grad are those
  // of dloss * loss (a micro-batch's share of an accumulated step, as
  // cross_entropy_backward's dloss); the returned loss is not scaled.
  double dloss = 1.0;
  // The caller reads h no more after the call: dh is written over it, each
  // chunk's rows by the chunk's last GEMM, after every read of them (the
  // same values as into a tensor of its own, without the (N, d) of it).
  // ClassifierResult::dh then shares h's storage.
  bool dh_over_h = false;
};

struct ClassifierResult {
  Tensor loss;  // 0-d on h's device: F64 for F64 h, else F32
  Tensor dh;    // d loss / d h, (N, d) in h's dtype
};

// h (N, d) and weight (V, d) of one dtype: F32 or F64 on the CPU, F32 or
// BF16 on CUDA; bias (V,) of that dtype, or undefined for none; targets (N,)
// F32, classes in [0, V) or ignore_index. weight_grad (V, d) and bias_grad
// (V,) (defined exactly when bias is) are accumulated into (+=): F32, or F64
// for F64 h. When no target counts the loss is 0 and every gradient 0.
ClassifierResult classifier_loss_and_grads(const Tensor& h, const Tensor& weight, const Tensor& bias,
                                           const Tensor& targets, int64_t ignore_index, Tensor& weight_grad,
                                           Tensor& bias_grad, const ClassifierOptions& options = {});

// The default chunk: as many rows as keep one chunk of logits within 256 MiB
// on CUDA (a multiple of 128 rows when that leaves at least 128) and 64 MiB
// on the CPU; at least 1. docs/classifier.md says why.
int64_t default_classifier_chunk_rows(int64_t vocab, DType dtype, Device device);

}  // namespace hg
