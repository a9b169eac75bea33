#pragma once
// ZeRO stage 1: AdamW whose moments are sharded across the ranks. With the
// GradReducer in sharded mode, rank r holds part r of every gradient bucket
// after the reduce-scatter; step() clips by the global norm (the parts' sums
// of squares all-reduced), runs AdamW over its parts (the moments are
// 1/world of the unsharded ones) bucket by bucket, the last bucket (the
// embeddings and first layers) first, and starts each bucket's all-gather of
// the updated values as soon as its part is updated, so the gather of one
// bucket runs while the next is updated; every rank then holds the whole
// model again. With the reducer's forward_waits the step returns with the
// gathers running and the next forward waits for each bucket as it reaches
// it; else the step waits for them. AdamW is elementwise: per bucket, in any
// order or in one launch, the same values.
//
// Checkpoints keep the unsharded format of AdamW over model.parameters()
// ("steps", "m.i", "v.i"): save_state gathers the parts to rank 0, which
// writes; load_state has every rank read the file and keep its parts. So a
// run resumes with any number of ranks, sharded or not.
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/optim.hpp"
#include "dist/grad_reducer.hpp"

namespace hg::dist {

class ShardedAdamW : public Optimizer {
 public:
  // model_params: model.parameters() (the checkpoint's m.i / v.i order); the
  // reducer holds the same parameters, in sharded mode. options.max_grad_norm
  // clips by the global norm.
  ShardedAdamW(GradReducer& reducer, Collectives& comm, std::vector<Parameter*> model_params, AdamWOptions options);
  // After reducer.finish().
  void step() override;
  // Collective: call on every rank; rank 0 writes.
  void save_state(const std::string& path) override;
  // Every rank reads the file.
  void load_state(const std::string& path) override;

  double last_grad_norm() const override { return last_norm_; }
  bool last_step_skipped() const override { return last_skipped_; }
  int64_t state_elements() const;  // this rank's moment elements (m and v)

 private:
  std::vector<std::pair<std::string, Tensor*>> state_buffers() override { return {}; }
  GradReducer& reducer_;
  Collectives& comm_;
  AdamWOptions options_;
  std::vector<Parameter> parts_;  // value: this rank's part of a value bucket; grad: the bucket's shard_grads
  std::vector<std::unique_ptr<AdamW>> inners_;          // one per bucket, over parts_[k]: state "m.0", "v.0"
  std::unordered_map<const Parameter*, size_t> index_;  // model parameter -> its index in model_params
  double last_norm_ = 0;
  bool last_skipped_ = false;
};

}  // namespace hg::dist
