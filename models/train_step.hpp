#pragma once
#include <cstdint>
#include <string>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "models/decoder_lm.hpp"

namespace hg {

// Gradient clipping is the optimizer's: AdamWOptions::max_grad_norm (inside
// the same multi-tensor launches as the update).
struct TrainStepOptions {
  int64_t ignore_index = -100;  // targets equal to it do not count in the loss
  bool use_graph = true;        // capture the step as a CUDA graph and replay it, when it can be (graph_note())
  int warmup_steps = 2;         // plain steps before the capture (cuBLASLt plans, allocator cache)
};

// What one step measured, read back after the step has run.
struct StepResult {
  int64_t step = 0;      // 1-based count of steps run by this TrainStep
  double loss = 0;       // mean cross-entropy of the batch
  double grad_norm = 0;  // global L2 norm of the gradients before clipping
};

// Thrown when a step's loss or gradient norm is not finite. The optimizer
// has not been applied: the parameters are those before the step, so a
// caller that stops here never saves a poisoned checkpoint.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// One training step of a DecoderLM in the model's precision
// (docs/mixed_precision.md): zero grads -> forward -> cross-entropy ->
// backward -> clip + AdamW (one multi-tensor update, which skips itself on a
// non-finite gradient norm). The model and optimizer are borrowed and must
// outlive the TrainStep; set the optimizer's lr before run(). ids and
// targets are (B, T) F32 tensors on the model's device.
//
// CUDA graphs: after warmup_steps plain steps, the next step is captured
// (inputs first copied into tensors the TrainStep owns) and every later step
// replays the graph, each batch checked on the host before it is copied in
// (the captured embedding and loss check nothing on the host). Capture is
// attempted only without dropout (each mask's stream position is a launch
// argument, so a replay would repeat the captured masks); if the captured
// work still synchronizes, the capture is dropped and the steps stay plain, with the
// reason in graph_note(). Plain and replayed steps run the same arithmetic
// in the same order (the device-built embedding CSR has the host one's
// order), so their results are bitwise equal.
class TrainStep {
 public:
  TrainStep(DecoderLM& model, AdamW& optimizer, TrainStepOptions options = {});

  StepResult run(const Tensor& ids, const Tensor& targets);

  Precision precision() const { return precision_; }
  bool graph_active() const { return graph_.ready(); }
  const std::string& graph_note() const { return graph_note_; }

 private:
  // Queues forward, loss and backward; the loss lands in loss_.
  void enqueue_gradients(const Tensor& ids, const Tensor& targets);
  StepResult plain_step(const Tensor& ids, const Tensor& targets, StepResult r);
  StepResult graph_step(const Tensor& ids, const Tensor& targets, StepResult r);
  // Reads the loss and norm back; throws NonFiniteError when either is not finite.
  StepResult finish(StepResult r, bool stepped, bool update_applied_if_loss_bad) const;
  // ids and targets checked on the host (the step itself checks them only on the device).
  void check_batch(const Tensor& ids, const Tensor& targets) const;

  DecoderLM& model_;
  AdamW& optimizer_;
  TrainStepOptions options_;
  Precision precision_;
  int64_t steps_ = 0;
  bool try_graph_ = false;
  gpu::Graph graph_;
  std::string graph_note_;
  Tensor ids_in_, targets_in_;  // graph mode: the inputs every replay reads
  Tensor loss_;                 // 0-d, written by the step
};

}  // namespace hg
