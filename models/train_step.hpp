#pragma once
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "models/decoder_lm.hpp"

namespace hg {

struct TrainStepOptions {
  double clip_norm = 1.0;       // global gradient-norm clip; <= 0 turns clipping off
  int64_t ignore_index = -100;  // targets equal to it do not count in the loss
  bool use_graph = true;        // capture and replay the step as a CUDA graph when it can be (see graph_note())
};

// What one step measured, read back after the step has run.
struct StepResult {
  int64_t step = 0;         // 1-based count of steps run by this TrainStep
  double loss = 0;          // mean cross-entropy of the batch
  double grad_norm = 0;     // global L2 norm of the gradients before clipping (0 when clipping is off)
};

// Thrown when a step's loss or gradient norm is not finite. The optimizer
// has NOT been applied: the parameters are those before the step, so a
// caller that stops here never saves a poisoned checkpoint.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// One training step of a DecoderLM, in the model's precision
// (docs/mixed_precision.md): zero grads -> forward -> cross-entropy ->
// backward -> clip -> optimizer. The model and optimizer are borrowed and
// must outlive the TrainStep. ids and targets are (B, T) F32 tensors on the
// model's device.
class TrainStep {
 public:
  TrainStep(DecoderLM& model, Optimizer& optimizer, TrainStepOptions options = {});

  StepResult run(const Tensor& ids, const Tensor& targets);

  Precision precision() const { return precision_; }
  // Whether steps replay a captured CUDA graph, and if not, why not.
  bool graph_active() const { return false; }
  const std::string& graph_note() const { return graph_note_; }

 private:
  DecoderLM& model_;
  Optimizer& optimizer_;
  TrainStepOptions options_;
  Precision precision_;
  int64_t steps_ = 0;
  std::string graph_note_;
};

}  // namespace hg
