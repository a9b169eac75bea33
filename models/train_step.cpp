#include "models/train_step.hpp"

#include <cmath>

#include "core/profiler.hpp"
#include "ops/cross_entropy.hpp"

namespace hg {

TrainStep::TrainStep(DecoderLM& model, Optimizer& optimizer, TrainStepOptions options)
    : model_(model), optimizer_(optimizer), options_(options), precision_(model.config().precision) {
  HG_CHECK(std::isfinite(options.clip_norm), "TrainStep", "clip_norm must be finite, got ", options.clip_norm);
  const std::vector<Parameter*> params = model.parameters();
  HG_CHECK(!params.empty(), "TrainStep", "the model has no parameters");
  check_precision_supported(precision_, params.front()->value.device(), "TrainStep");
  // Capture needs a step without host round trips; today the embedding and
  // cross-entropy read ids / targets on the host, and clip_grad_norm and
  // AdamW::step pass host scalars to their kernels (docs/mixed_precision.md).
  graph_note_ = options.use_graph ? "not captured: the step still reads ids/targets and the gradient norm on the host"
                                  : "off (--no-graph)";
}

StepResult TrainStep::run(const Tensor& ids, const Tensor& targets) {
  const char* op = "TrainStep::run";
  ids.check_defined(op);
  targets.check_defined(op);
  HG_CHECK(ids.shape() == targets.shape() && ids.ndim() == 2, op, "ids ", ids.shape(), " and targets ",
           targets.shape(), " must both be (B, T)");
  const Device dev = ids.device();
  StepResult r;
  r.step = ++steps_;

  model_.zero_grad();
  const Tensor logits = model_.forward(ids);
  CrossEntropySaved saved;
  Tensor loss, dlogits;
  {
    HG_PROFILE("cross_entropy", dev);
    loss = cross_entropy_forward(logits, targets, options_.ignore_index, &saved);
    dlogits = cross_entropy_backward(saved);
  }
  model_.backward(dlogits);
  {
    HG_PROFILE("optimizer", dev);
    if (options_.clip_norm > 0) r.grad_norm = clip_grad_norm(optimizer_.parameters(), options_.clip_norm);
  }
  r.loss = loss.item();
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    throw NonFiniteError(std::string(op) + ": step " + std::to_string(r.step) + ": loss " + std::to_string(r.loss) +
                         ", gradient norm " + std::to_string(r.grad_norm) +
                         " is not finite; the optimizer step was skipped, parameters are unchanged");
  HG_PROFILE("optimizer", dev);
  optimizer_.step();
  return r;
}

}  // namespace hg
