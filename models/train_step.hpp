#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/optim.hpp"
#include "core/precision.hpp"
#include "models/decoder_lm.hpp"

namespace hg {

// Data parallelism as the step sees it. The caller's gradient reducer
// implements it (examples/common/data_parallel.hpp, over dist/), so models/
// needs nothing from dist/. The reducer itself is driven by the model's
// GradsReadyHook during the backward; these two calls open and close a step.
class DataParallelHook {
 public:
  virtual ~DataParallelHook() = default;
  // Before the forward (with gradient accumulation: of the step's last
  // micro-batch, so the gradients are reduced once a step, when they hold
  // every micro-batch's share). weight: this rank's share of the global
  // batch's loss terms (tokens_r / tokens_all), by which its gradients enter
  // the reduction.
  virtual void begin_step(double weight) = 0;
  // After the backward: the gradients are reduced (or queued to be, in the
  // device's stream order) and the optimizer may read them.
  virtual void end_backward() = 0;
};

struct TrainStepOptions {
  int64_t ignore_index = -100;  // targets equal to it do not count in the loss
  bool use_graph = true;        // capture the step as a CUDA graph and replay it, when it can be (graph_note())
  int warmup_steps = 2;         // plain steps before the capture (cuBLASLt plans, allocator cache)
  DataParallelHook* data_parallel = nullptr;  // borrowed, must outlive the TrainStep; null: one process
  // Fused kernel mode: the loss and the head's gradients from the chunked
  // classifier (ops/classifier.hpp), so the (B, T, V) logits never exist;
  // false, or unfused mode: the head's logits, cross-entropy over them and
  // the head's backward, as DecoderLM::forward / backward compose them.
  bool chunked_classifier = true;
  int64_t classifier_chunk_rows = 0;  // rows per chunk; 0: default_classifier_chunk_rows
  // Gradient accumulation: run() splits its batch of B rows into grad_accum
  // micro-batches of B / grad_accum rows, runs forward and backward on each
  // in turn (one micro-batch's activations live at a time), the gradients
  // adding up, then clips and updates once. Each micro-batch's loss enters
  // with its share of the step's counted targets (tokens_m / tokens_all, as
  // data parallelism weighs ranks), so the step is the one step over all B
  // rows up to rounding. 1: no accumulation.
  int64_t grad_accum = 1;
  // CUDA without data parallelism: each Linear's weight gradient runs beside
  // the rest of the backward on a second stream (models/weight_grads_beside.hpp);
  // the gradients are the same bit for bit either way.
  bool weight_grads_beside = true;
  // CUDA without data parallelism: the gradients are cleared on a second
  // stream beside the forward (joined before the backward writes them).
  bool clear_grads_beside = true;
};

// What one step measured, read back after the step has run.
struct StepResult {
  int64_t step = 0;      // the optimizer's step count after this step (1-based; a resumed optimizer continues its own)
  double loss = 0;       // mean cross-entropy of this process's batch, every micro-batch (data parallel: the caller
                         // sums the ranks')
  double grad_norm = 0;  // global L2 norm of the gradients before clipping; NaN where not measured (SGD)
};

// Thrown when a step's loss or gradient norm is not finite. The optimizer
// has not been applied: the parameters are those before the step, so a
// caller that stops here never saves a poisoned checkpoint.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// One training step of a DecoderLM in the model's precision
// (docs/mixed_precision.md): zero grads -> [data parallel: begin_step] ->
// forward -> cross-entropy -> backward -> [end_backward] -> optimizer step;
// with grad_accum N, forward to backward runs N times, begin_step before the
// last of them.
// In fused kernel mode the head, the loss and their gradients are the
// chunked classifier's (TrainStepOptions::chunked_classifier, docs/classifier.md).
// Gradient clipping is the optimizer's (AdamWOptions::max_grad_norm, inside
// the same multi-tensor launches as the update; ZeRO-1's ShardedAdamW clips
// by the global norm), as is skipping an update whose gradient norm is not
// finite. The model and optimizer are borrowed and must outlive the
// TrainStep; the caller sets the optimizer's lr before run() (the schedule is
// the caller's). ids and targets are (B, T) F32 tensors on the host or on the
// model's device; a host batch is checked there and copied in.
//
// CUDA graphs: after warmup_steps plain steps, the next step is captured
// (inputs first copied into tensors the TrainStep owns) and every later step
// replays the graph, each batch checked on the host before it is copied in
// (the captured embedding and loss check nothing on the host). Capture is
// attempted only on CUDA, for a capturable optimizer (AdamW), without
// dropout (each mask's stream position is a launch argument, so a replay
// would repeat the captured masks), without a data-parallel hook (the
// gradient buckets are launched from the host as the backward is queued)
// and without gradient accumulation (each micro-batch's share of the step's
// targets is counted on the host and is a launch argument of its loss
// gradient: a replay would reuse the captured batch's shares);
// if the captured work still synchronizes, the capture is dropped and the
// steps stay plain. graph_note() says which. While the profiler is on
// (core/profiler.hpp) steps run plain, so each op is timed. Plain and
// replayed steps run the same arithmetic in the same order (the
// device-built embedding CSR has the host one's order), so their results
// are bitwise equal.
class TrainStep {
 public:
  TrainStep(DecoderLM& model, Optimizer& optimizer, TrainStepOptions options = {});

  // weight: this rank's share of the global batch's loss terms, handed to
  // the data-parallel hook (ignored without one). With grad_accum N, B must
  // be a multiple of N.
  StepResult run(const Tensor& ids, const Tensor& targets, double weight = 1.0);

  Precision precision() const { return precision_; }
  bool graph_active() const { return graph_.ready(); }
  const std::string& graph_note() const { return graph_note_; }

 private:
  // Queues forward, loss and backward of each micro-batch (the hook's two
  // calls around the last); shares: each micro-batch's share of the step's
  // counted targets. The loss (their shares' sum) lands in loss_.
  void enqueue_gradients(const Tensor& ids, const Tensor& targets, double weight, const std::vector<double>& shares);
  // The gradients cleared before the first write into any of them. On CUDA
  // without a data-parallel hook the clearing (one memory-bound launch over
  // every gradient) runs beside the first forward and is joined here, after
  // it; otherwise it ran in order before the forward and this does nothing.
  void gradients_cleared();
  // Loss and backward of the two forms, the gradients those of dloss * loss; the loss lands in loss_.
  void loss_and_backward_composed(const Tensor& ids, const Tensor& targets, double dloss);
  void loss_and_backward_chunked(const Tensor& ids, const Tensor& targets, double dloss);
  StepResult plain_step(const Tensor& ids, const Tensor& targets, double weight, StepResult r);
  StepResult graph_step(const Tensor& ids, const Tensor& targets, StepResult r);
  // Reads the loss and norm back; throws NonFiniteError when either is not finite.
  StepResult finish(StepResult r, bool stepped, bool update_applied_if_loss_bad) const;
  // ids and targets checked on the host (the step itself checks them only on
  // the device). Returns each micro-batch's share of the counted targets.
  std::vector<double> check_batch(const Tensor& ids, const Tensor& targets) const;
  // Whether both are on the GPU and hold only valid ids / targets, counted there.
  bool batch_valid_on_device(const Tensor& ids, const Tensor& targets) const;
  // A host batch copied to the model's device (the same tensor when already there).
  Tensor on_device(const Tensor& t) const;
  // CUDA without a data-parallel hook (whose buckets follow the backward on
  // handgrad's stream): work may run beside the step on a second stream.
  bool work_beside() const { return device_ == Device::CUDA && options_.data_parallel == nullptr; }

  DecoderLM& model_;
  Optimizer& optimizer_;
  TrainStepOptions options_;
  Precision precision_;
  Device device_;
  int64_t steps_ = 0;  // steps run by this TrainStep (the warm-up before a capture)
  bool try_graph_ = false;
  gpu::Graph graph_;
  std::string graph_note_;
  Tensor ids_in_, targets_in_;           // graph mode: the inputs every replay reads
  Tensor loss_;                          // 0-d, written by the step
  std::optional<gpu::Beside> clearing_;  // the gradients' clearing beside the forward, until gradients_cleared()
  Tensor graph_loss_;                    // 0-d, written by every replay of the captured step
};

}  // namespace hg
