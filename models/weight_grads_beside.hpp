#pragma once
// Weight gradients beside the backward (CUDA). While a WeightGradsBeside
// scope is open, Linear's backward queues its dW GEMM (with the bias
// gradient's column sums) on a second stream (gpu::Beside) and goes on with
// dx on handgrad's stream, so the weight gradient runs next to the input
// gradients and the memory-bound kernels that follow them. Each Linear's
// work is joined when the next Linear queues its own (one Beside is open at
// a time), and the last when the scope finishes. The operands it reads are
// kept alive until then: the caching allocator reuses memory in the order of
// handgrad's stream only. Each dW and db is computed by the same kernels in
// the same order as without the scope: the gradients are bit for bit the same.
#include <functional>
#include <optional>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/tensor.hpp"

namespace hg {

class WeightGradsBeside {
 public:
  WeightGradsBeside();  // one scope at a time; hg::Error otherwise
  ~WeightGradsBeside();
  WeightGradsBeside(const WeightGradsBeside&) = delete;
  WeightGradsBeside& operator=(const WeightGradsBeside&) = delete;
  // Joins the last queued work: the gradients are complete in stream order
  // after it. The scope stays open for more work (the next micro-batch).
  void finish();

  // For Linear's backward: queues `work` beside when a scope is open and
  // returns true, keeping `keep` alive until it is joined; false (nothing
  // queued) when none is open. `work` must allocate nothing from the
  // caching allocator (core/cuda_runtime.hpp, Beside).
  static bool run(const std::function<void()>& work, std::vector<Tensor> keep);

 private:
  std::optional<gpu::Beside> pending_;
  std::vector<Tensor> kept_;
};

}  // namespace hg
