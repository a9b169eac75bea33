#include "models/train_step.hpp"
#include "models/weight_grads_beside.hpp"

#include <cmath>

#include "core/indexing.hpp"
#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"
#include "ops/classifier.hpp"
#include "ops/cross_entropy.hpp"

namespace hg {

TrainStep::TrainStep(DecoderLM& model, Optimizer& optimizer, TrainStepOptions options)
    : model_(model), optimizer_(optimizer), options_(options), precision_(model.config().precision) {
  HG_CHECK(options.warmup_steps >= 1, "TrainStep", "warmup_steps must be >= 1, got ", options.warmup_steps);
  HG_CHECK(options.classifier_chunk_rows >= 0, "TrainStep", "classifier_chunk_rows must be >= 0 (0: the default), got ",
           options.classifier_chunk_rows);
  HG_CHECK(options.grad_accum >= 1, "TrainStep", "grad_accum must be >= 1 (1: no accumulation), got ",
           options.grad_accum);
  const std::vector<Parameter*> params = model.parameters();
  HG_CHECK(!params.empty(), "TrainStep", "the model has no parameters");
  device_ = params.front()->value.device();
  check_precision_supported(precision_, device_, "TrainStep");
  if (!options.use_graph) {
    graph_note_ = "off (use_graph = false / --no-graph)";
  } else if (device_ != Device::CUDA) {
    graph_note_ = "off: CUDA graphs need a CUDA model";
  } else if (model.config().dropout > 0) {
    graph_note_ = "off: dropout's mask stream advances each step (a launch argument)";
  } else if (options.data_parallel) {
    graph_note_ = "off: data parallel (gradient buckets are launched from the host during the backward)";
  } else if (options.grad_accum > 1) {
    // Plain steps: each micro-batch's share of the targets, counted on the
    // host for every batch, scales its loss gradient as a launch argument.
    graph_note_ = "off: gradient accumulation (each micro-batch's loss weight is set from the host every step)";
  } else if (!optimizer.capturable()) {
    graph_note_ = "off: the optimizer cannot be captured (it keeps per-step scalars on the host)";
  } else {
    try_graph_ = true;
    graph_note_ = "pending: captured after " + std::to_string(options.warmup_steps) + " plain step(s)";
  }
}

Tensor TrainStep::on_device(const Tensor& t) const {
  HG_PROFILE("upload", device_);
  return t.to(device_);
}

void TrainStep::enqueue_gradients(const Tensor& ids, const Tensor& targets, double weight,
                                  const std::vector<double>& shares) {
  if (work_beside() && options_.clear_grads_beside) clearing_.emplace([&] { model_.zero_grad(); });
  else model_.zero_grad();
  const int64_t n = static_cast<int64_t>(shares.size()), rows = ids.size(0) / n;
  const bool chunked = options_.chunked_classifier && kernel_mode() == KernelMode::Fused;
  std::optional<WeightGradsBeside> weight_grads;  // joined before anything reads the gradients
  if (work_beside() && options_.weight_grads_beside && !prof::enabled()) weight_grads.emplace();
  Tensor loss;  // grad_accum > 1: the sum of share * micro-batch loss, kept on the device
  for (int64_t m = 0; m < n; ++m) {
    // The data-parallel reduction runs during the last backward, once a step:
    // the gradients it reads then hold every micro-batch's share.
    if (m == n - 1 && options_.data_parallel) options_.data_parallel->begin_step(weight);
    const Tensor ids_m = n == 1 ? ids : ids.slice(m * rows, (m + 1) * rows);
    const Tensor targets_m = n == 1 ? targets : targets.slice(m * rows, (m + 1) * rows);
    if (chunked) loss_and_backward_chunked(ids_m, targets_m, shares[m]);
    else loss_and_backward_composed(ids_m, targets_m, shares[m]);
    if (n > 1) loss = m == 0 ? mul_scalar(loss_, shares[m]) : add(loss, mul_scalar(loss_, shares[m]));
  }
  if (weight_grads) weight_grads->finish();
  if (n > 1) loss_ = loss;
  if (options_.data_parallel) options_.data_parallel->end_backward();
}

void TrainStep::gradients_cleared() {
  if (!clearing_) return;
  clearing_->join();
  clearing_.reset();
}

void TrainStep::loss_and_backward_composed(const Tensor& ids, const Tensor& targets, double dloss) {
  Tensor dlogits;
  {
    const Tensor logits = model_.forward(ids);
    gradients_cleared();
    CrossEntropySaved saved;
    // The on-device form (rows counted on the GPU, nothing read back) in plain
    // and captured steps alike, so both run the same arithmetic; check_batch
    // has checked the targets on the host.
    loss_ = cross_entropy_forward_on_device(logits, targets, options_.ignore_index, &saved);
    dlogits = cross_entropy_backward_over_logits(saved, dloss);  // the logits are not needed again
  }  // the loss's saved state is released here, dlogits once the head's backward has run
  model_.backward(std::move(dlogits));
}

void TrainStep::loss_and_backward_chunked(const Tensor& ids, const Tensor& targets, double dloss) {
  Tensor dfeatures;
  {
    const Tensor features = model_.forward_features(ids);
    gradients_cleared();
    const int64_t rows = features.size(0) * features.size(1);
    const Tensor h = features.reshape({rows, features.size(2)});
    Linear& head = model_.head;
    const Tensor no_bias;
    ClassifierOptions options;
    options.chunk_rows = options_.classifier_chunk_rows;
    options.targets_on_device = true;  // as above: check_batch has checked them, nothing is read back
    options.dloss = dloss;
    options.dh_over_h = true;  // the features are not read again: their memory takes dh
    ClassifierResult r = classifier_loss_and_grads(h, head.weight_for(h), head.has_bias() ? head.bias_for(h) : no_bias,
                                                   targets.reshape({rows}), options_.ignore_index, head.weight.grad,
                                                   head.bias.grad, options);
    loss_ = r.loss;
    dfeatures = r.dh.reshape(features.shape());
  }  // dfeatures holds the features' memory (ln_f's backward keeps its own input)
  model_.backward_features(std::move(dfeatures));
}

StepResult TrainStep::finish(StepResult r, bool stepped, bool update_applied_if_loss_bad) const {
  r.loss = loss_.item();
  const Optimizer::StepReport report = stepped ? optimizer_.last_step_report() : Optimizer::StepReport{};
  r.grad_norm = report.grad_norm;
  const bool skipped = report.skipped;
  if (std::isfinite(r.loss) && stepped && !skipped) return r;
  const bool unchanged = !stepped || skipped || !update_applied_if_loss_bad;
  throw NonFiniteError("TrainStep: step " + std::to_string(r.step) + ": loss " + std::to_string(r.loss) +
                       (stepped ? ", gradient norm " + std::to_string(r.grad_norm) : std::string()) +
                       " is not finite; " +
                       (unchanged ? "the optimizer step was skipped, parameters are unchanged"
                                  : "the parameters were updated with finite gradients"));
}

StepResult TrainStep::plain_step(const Tensor& ids, const Tensor& targets, double weight, StepResult r) {
  const std::vector<double> shares = check_batch(ids, targets);
  enqueue_gradients(on_device(ids), on_device(targets), weight, shares);
  // Checked before the update, so a non-finite loss never reaches the parameters.
  if (!std::isfinite(loss_.item())) return finish(r, /*stepped=*/false, false);
  {
    HG_PROFILE("optimizer", device_);
    optimizer_.step();
  }
  return finish(r, /*stepped=*/true, false);
}

StepResult TrainStep::graph_step(const Tensor& ids, const Tensor& targets, StepResult r) {
  optimizer_.write_lr_to_device();  // outside the graph: the replay reads lr from the device
  // The captured step checks nothing: the batch is checked here, before it
  // runs. A batch on the GPU is checked there (only counts come back); the
  // host reads its values only to name a bad one.
  if (!batch_valid_on_device(ids, targets)) check_batch(ids, targets);
  if (!graph_.ready()) {
    ids_in_ = Tensor::empty(ids.shape(), DType::F32, device_);
    targets_in_ = Tensor::empty(targets.shape(), DType::F32, device_);
    ids_in_.copy_(ids);
    targets_in_.copy_(targets);
    model_.embed.set_id_check(IdCheck::Device);
    try {
      graph_.begin_capture();
      enqueue_gradients(ids_in_, targets_in_, 1.0, {1.0});  // no accumulation: one micro-batch
      optimizer_.step();
      graph_.end_capture();
    } catch (const std::exception& e) {
      graph_.abort_capture();
      model_.embed.set_id_check(IdCheck::Host);
      try_graph_ = false;
      graph_note_ = std::string("off: the capture failed: ") + e.what();
      return plain_step(ids, targets, 1.0, r);
    }
    model_.embed.set_id_check(IdCheck::Host);  // plain use of the model (evaluation) checks on the host
    graph_loss_ = loss_;                       // every replay writes its loss here, whatever plain steps ran in between
    graph_note_ = "on: captured at step " + std::to_string(r.step) + " for batches of shape " + shape_str(ids.shape());
  } else {
    {
      HG_PROFILE("upload", device_);
      ids_in_.copy_(ids);
      targets_in_.copy_(targets);
    }
    optimizer_.step_replayed();
  }
  graph_.replay();
  loss_ = graph_loss_;
  // A non-finite norm made the captured update skip itself; a non-finite
  // loss with a finite norm is reported as applied.
  return finish(r, /*stepped=*/true, /*update_applied_if_loss_bad=*/true);
}

bool TrainStep::batch_valid_on_device(const Tensor& ids, const Tensor& targets) const {
  const int64_t vocab = model_.config().vocab_size;
  if (!ids.is_cuda() || !targets.is_cuda()) return false;
  const std::vector<int64_t> bad =
      count_bad_indices({{ids, vocab, std::nan("")}, {targets, vocab, static_cast<double>(options_.ignore_index)}});
  return bad[0] == 0 && bad[1] == 0;
}

std::vector<double> TrainStep::check_batch(const Tensor& ids, const Tensor& targets) const {
  const char* op = "TrainStep::run";
  const int64_t vocab = model_.config().vocab_size;
  read_indices(ids, vocab, op);
  const std::vector<double> t = read_cross_entropy_targets(targets, vocab, options_.ignore_index, op);
  const int64_t n = options_.grad_accum;
  if (n == 1) return {1.0};
  // Micro-batch m holds the flat positions [m * per, (m + 1) * per).
  const size_t per = t.size() / static_cast<size_t>(n);
  std::vector<double> shares(static_cast<size_t>(n), 0.0);
  double all = 0;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != static_cast<double>(options_.ignore_index)) {
      shares[i / per] += 1;
      all += 1;
    }
  // No target counts anywhere: every loss and gradient is 0, whatever the shares.
  for (double& s : shares) s = all > 0 ? s / all : 1.0 / static_cast<double>(n);
  return shares;
}

StepResult TrainStep::run(const Tensor& ids, const Tensor& targets, double weight) {
  const char* op = "TrainStep::run";
  ids.check_defined(op);
  targets.check_defined(op);
  HG_CHECK(ids.shape() == targets.shape() && ids.ndim() == 2, op, "ids ", ids.shape(), " and targets ", targets.shape(),
           " must both be (B, T)");
  HG_CHECK(ids.size(0) % options_.grad_accum == 0, op, "a batch of ", ids.size(0), " rows does not split into ",
           options_.grad_accum, " micro-batches of equal size (grad_accum ", options_.grad_accum,
           "): B must be a multiple of it");
  for (const Tensor* t : {&ids, &targets})
    HG_CHECK(t->dtype() == DType::F32 && (t->device() == Device::CPU || t->device() == device_), op,
             t == &ids ? "ids" : "targets", " are ", t->describe(), "; expected F32 on the host or on the model's ",
             device_name(device_));
  HG_CHECK(std::isfinite(weight) && weight >= 0 && weight <= 1, op, "weight ", weight,
           " must be a share of the global batch, in [0, 1]");
  StepResult r;
  r.step = optimizer_.steps() + 1;  // a resumed optimizer continues its count
  ++steps_;
  // A graph replays the shapes it captured: a batch of another shape (padded
  // translation batches) runs plain, as does a profiled step, so that each op
  // is launched and timed on its own.
  const bool graph_fits = !graph_.ready() || ids.shape() == ids_in_.shape();
  if (try_graph_ && steps_ > options_.warmup_steps && graph_fits && !prof::enabled())
    return graph_step(ids, targets, r);
  return plain_step(ids, targets, weight, r);
}

}  // namespace hg
