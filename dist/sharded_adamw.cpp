#include "dist/sharded_adamw.hpp"

#include <cmath>
#include <string>

#include "core/backend.hpp"
#include "core/checkpoint.hpp"
#include "core/error.hpp"
#include "dist/world.hpp"

namespace hg::dist {

ShardedAdamW::ShardedAdamW(GradReducer& reducer, Collectives& comm, std::vector<Parameter*> model_params,
                           AdamWOptions options)
    : Optimizer(model_params), reducer_(reducer), comm_(comm), options_(options) {
  const char* op = "ShardedAdamW";
  lr_ = options.lr;
  size_t held = 0;
  const int64_t rank = world().rank;
  for (const GradReducer::Bucket& b : reducer.buckets()) {
    HG_CHECK(b.values.defined(), op, "the GradReducer must be in sharded mode (ReducerOptions::sharded)");
    const int64_t n = b.shard_grads.numel();
    parts_.push_back(Parameter{b.values.slice(rank * n, (rank + 1) * n), b.shard_grads, Tensor()});
    held += b.params.size();
  }
  for (size_t i = 0; i < model_params.size(); ++i) index_[model_params[i]] = i;
  HG_CHECK(held == model_params.size(), op, "the reducer holds ", held, " parameters, the model ", model_params.size());
  AdamWOptions inner = options;
  inner.max_grad_norm = 0;  // clipped here, by the global norm
  for (Parameter& p : parts_) inners_.push_back(std::make_unique<AdamW>(std::vector<Parameter*>{&p}, inner));
}

int64_t ShardedAdamW::state_elements() const {
  int64_t n = 0;
  for (const Parameter& p : parts_) n += 2 * p.value.numel();
  return n;
}

void ShardedAdamW::step() {
  const Device dev = comm_.device();
  // The global norm: every rank sums its parts, one all-reduce. Every rank
  // then takes the same decision to clip or to skip a non-finite step.
  std::vector<Tensor> grads;
  for (const Parameter& p : parts_) grads.push_back(p.grad);
  Tensor sumsq = Tensor::zeros({1}, DType::F64, dev);
  backend_for(dev).sum_of_squares(grads, sumsq);
  comm_.all_reduce_sum_f64(sumsq, "all-reduce of the gradient norm");
  last_norm_ = std::sqrt(sumsq.item());
  last_skipped_ = !std::isfinite(last_norm_);
  if (!last_skipped_) {
    if (options_.max_grad_norm > 0 && last_norm_ > options_.max_grad_norm) {
      const Tensor factor = Tensor::full({1}, options_.max_grad_norm / last_norm_, DType::F32, dev);
      for (Tensor& g : grads) backend_for(dev).zip(BinaryOp::Mul, g, factor, g);
    }
    // Last bucket first: the buckets fill in backward order, so the last
    // holds the embeddings and the first layers, which the next forward
    // reads first; its gather runs while the next bucket is updated.
    for (size_t k = inners_.size(); k-- > 0;) {
      inners_[k]->set_lr(lr_);
      inners_[k]->step();
      reducer_.start_gather(k);
    }
    // Otherwise the next forward waits bucket by bucket (GradReducer::values_needed);
    // either wait refreshes the bf16 compute copies of the gathered values.
    if (!reducer_.forward_waits()) reducer_.finish_gather();
  }
  ++steps_;
}

// ---- checkpoints: the unsharded per-parameter format ----

void ShardedAdamW::save_state(const std::string& path) {
  const World& w = world();
  std::vector<CheckpointRecord> records;
  records.push_back({"steps", Tensor::from_vector({static_cast<double>(steps_)}, {1}, DType::F64)});
  const auto& buckets = reducer_.buckets();
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto state = inners_[k]->named_state();  // m.0, v.0: bucket k's part
    for (const char* moment : {"m.", "v."}) {
      const Tensor* part = nullptr;
      for (const auto& [name, t] : state)
        if (name == std::string(moment) + "0") part = t;
      HG_CHECK(part != nullptr, "ShardedAdamW::save_state", "no state '", moment, "0' in bucket ", k);
      const Tensor host = part->to(Device::CPU);
      const std::vector<float> full =
          gather_to(0, host.data<float>(), static_cast<size_t>(host.numel()), "gather of the AdamW moments");
      if (w.rank != 0) continue;
      const GradReducer::Bucket& b = buckets[k];
      for (size_t j = 0; j < b.params.size(); ++j) {
        Tensor t = Tensor::empty(b.params[j]->value.shape(), DType::F32);
        std::copy(full.begin() + b.offsets[j], full.begin() + b.offsets[j] + t.numel(), t.data<float>());
        records.push_back({moment + std::to_string(index_.at(b.params[j])), t});
      }
    }
  }
  if (w.rank == 0) write_checkpoint_file(path, records, "ShardedAdamW::save_state");
}

void ShardedAdamW::load_state(const std::string& path) {
  constexpr const char* kOp = "ShardedAdamW::load_state";
  reducer_.finish_gather();  // no gather of the last step may land on values loaded next
  const std::map<std::string, Tensor> entries = read_checkpoint_file(path, kOp);
  const int64_t rank = world().rank;
  const auto& buckets = reducer_.buckets();
  std::vector<std::map<std::string, Tensor>> parts(buckets.size());  // per bucket: steps, m.0, v.0
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (entries.count("steps")) parts[k]["steps"] = entries.at("steps");
    const GradReducer::Bucket& b = buckets[k];
    for (const char* moment : {"m.", "v."}) {
      std::vector<float> full(static_cast<size_t>(b.grads.numel()), 0.0f);
      for (size_t j = 0; j < b.params.size(); ++j) {
        const std::string name = moment + std::to_string(index_.at(b.params[j]));
        const auto it = entries.find(name);
        HG_CHECK(it != entries.end(), kOp, path, ": state tensor '", name, "' missing from the file");
        HG_CHECK(it->second.shape() == b.params[j]->value.shape() && it->second.dtype() == DType::F32, kOp, path, ": '",
                 name, "' is ", dtype_name(it->second.dtype()), " of shape ", it->second.shape(),
                 " in the file but f32 of shape ", b.params[j]->value.shape(), " here");
        const float* src = it->second.data<float>();
        std::copy(src, src + it->second.numel(), full.begin() + b.offsets[j]);
      }
      const int64_t n = b.shard_grads.numel();
      std::vector<double> mine(full.begin() + rank * n, full.begin() + (rank + 1) * n);
      parts[k][std::string(moment) + "0"] = Tensor::from_vector(mine, {n}, DType::F32);
    }
  }
  HG_CHECK(entries.size() == 1 + 2 * index_.size(), kOp, path, ": expected 'steps' and ", 2 * index_.size(),
           " state tensors, the file has ", entries.size());
  for (size_t k = 0; k < buckets.size(); ++k) inners_[k]->restore_state(parts[k], path);
  steps_ = inners_.empty() ? 0 : inners_.front()->steps();
}

}  // namespace hg::dist
