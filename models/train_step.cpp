#include "models/train_step.hpp"

#include <cmath>

#include "core/profiler.hpp"
#include "ops/cross_entropy.hpp"

namespace hg {

TrainStep::TrainStep(DecoderLM& model, Optimizer& optimizer, TrainStepOptions options)
    : model_(model), optimizer_(optimizer), options_(options), precision_(model.config().precision) {
  HG_CHECK(std::isfinite(options.clip_norm), "TrainStep", "clip_norm must be finite, got ", options.clip_norm);
  HG_CHECK(options.warmup_steps >= 1, "TrainStep", "warmup_steps must be >= 1, got ", options.warmup_steps);
  const std::vector<Parameter*> params = model.parameters();
  HG_CHECK(!params.empty(), "TrainStep", "the model has no parameters");
  const Device dev = params.front()->value.device();
  check_precision_supported(precision_, dev, "TrainStep");
  if (!options.use_graph) graph_note_ = "off (use_graph = false / --no-graph)";
  else if (dev != Device::CUDA) graph_note_ = "off: CUDA graphs need a CUDA model";
  else if (model.config().dropout > 0) graph_note_ = "off: dropout draws its masks on the host each step";
  else if (!optimizer.capturable()) graph_note_ = "off: the optimizer reads its step scalars on the host";
  else if (options.clip_norm > 0) graph_note_ = "off: clip_grad_norm reads the gradient norm on the host";
  else try_graph_ = true;
}

void TrainStep::enqueue(const Tensor& ids, const Tensor& targets) {
  model_.zero_grad();
  const Tensor logits = model_.forward(ids);
  CrossEntropySaved saved;
  loss_ = cross_entropy_forward(logits, targets, options_.ignore_index, &saved);
  model_.backward(cross_entropy_backward(saved));
  HG_PROFILE("optimizer", ids.device());
  host_norm_ = options_.clip_norm > 0 ? clip_grad_norm(optimizer_.parameters(), options_.clip_norm) : 0.0;
}

void TrainStep::non_finite(const StepResult& r) const {
  throw NonFiniteError("TrainStep: step " + std::to_string(r.step) + ": loss " + std::to_string(r.loss) +
                       ", gradient norm " + std::to_string(r.grad_norm) +
                       " is not finite; the optimizer step was skipped, parameters are unchanged");
}

StepResult TrainStep::plain_step(const Tensor& ids, const Tensor& targets, StepResult r) {
  enqueue(ids, targets);
  r.loss = loss_.item();
  r.grad_norm = host_norm_;
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) non_finite(r);
  HG_PROFILE("optimizer", ids.device());
  optimizer_.step();
  return r;
}

StepResult TrainStep::graph_step(const Tensor& ids, const Tensor& targets, StepResult r) {
  if (!graph_.ready()) {
    ids_in_ = ids.clone();
    targets_in_ = targets.clone();
    try {
      graph_.begin_capture();
      enqueue(ids_in_, targets_in_);
      optimizer_.step();
      graph_.end_capture();
    } catch (const std::exception& e) {
      graph_.abort_capture();
      try_graph_ = false;
      graph_note_ = std::string("off: the capture failed: ") + e.what();
      return plain_step(ids, targets, r);
    }
    graph_note_ = "on: captured at step " + std::to_string(r.step);
  } else {
    ids_in_.copy_(ids);
    targets_in_.copy_(targets);
  }
  graph_.replay();
  r.loss = loss_.item();
  r.grad_norm = host_norm_;
  // The captured optimizer skips its update when the norm is not finite
  // (Optimizer::capturable()), so the parameters are still those before the step.
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) non_finite(r);
  return r;
}

StepResult TrainStep::run(const Tensor& ids, const Tensor& targets) {
  const char* op = "TrainStep::run";
  ids.check_defined(op);
  targets.check_defined(op);
  HG_CHECK(ids.shape() == targets.shape() && ids.ndim() == 2, op, "ids ", ids.shape(), " and targets ",
           targets.shape(), " must both be (B, T)");
  HG_CHECK(!graph_.ready() || ids.shape() == ids_in_.shape(), op, "ids ", ids.shape(),
           " differ in shape from the captured step's ", ids_in_.shape(), "; a CUDA graph replays fixed shapes");
  StepResult r;
  r.step = ++steps_;
  if (try_graph_ && r.step > options_.warmup_steps) return graph_step(ids, targets, r);
  return plain_step(ids, targets, r);
}

}  // namespace hg
