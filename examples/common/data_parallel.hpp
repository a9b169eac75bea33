#pragma once
// Data-parallel training of a DecoderLM for the programs (train, bench_ddp):
// the flags, the rank's GPU, the gradient reducer wired to the model's
// backward and to TrainStep (models/train_step.hpp: it calls begin_step and
// end_backward), the optimizer (AdamW, or ZeRO-1's ShardedAdamW), the global
// loss and the cross-rank parameter check. docs/distributed.md.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/optim.hpp"
#include "dist/collectives.hpp"
#include "dist/grad_reducer.hpp"
#include "dist/sparse_rows.hpp"
#include "dist/world.hpp"
#include "models/decoder_lm.hpp"
#include "models/train_step.hpp"

namespace hg::cli {

struct DataParallelFlags {
  bool force = false;     // --ddp: the data-parallel path even with one rank
  double bucket_mb = 50;  // --bucket-mb: 50 scaled best on 2 x H200 (bench 1.920x, gpt2s 1.890x; 25: 1.906x, 1.860x)
  std::string grad_dtype = dtype_flag(dist::kDefaultGradDType);  // --grad-dtype fp32|bf16: the reduction's dtype
  int zero = 0;                                                  // --zero 0|1
  // --zero-gather step|forward: ZeRO-1's parameter all-gathers waited for by
  // the optimizer's step or by the next forward, module by module; "" (not
  // given): dist::kDefaultForwardWaits.
  std::string zero_gather;
  double comm_timeout = 300;  // --comm-timeout seconds (0: none)
  bool check_sync = false;    // --check-sync: parameter hash across ranks after every step
  // --sparse-embedding-grad auto|on|off: the token table's gradient reduced by its rows (dist/sparse_rows.hpp)
  std::string sparse_embedding_grad = "auto";

  static std::string dtype_flag(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }
  // True when ZeRO-1's gathers are waited for in the forward (zero_gather, or its default).
  bool forward_waits() const { return zero_gather.empty() ? dist::kDefaultForwardWaits : zero_gather == "forward"; }
  // "step" or "forward", the default resolved.
  std::string zero_gather_mode() const { return forward_waits() ? "forward" : "step"; }
};
// bench_ddp measures several settings in one run: --bucket-mb, --grad-dtype,
// --zero and --zero-gather then take comma-separated lists, one run per combination.
struct DataParallelSweep {
  std::vector<double> bucket_mb{DataParallelFlags{}.bucket_mb};
  std::vector<std::string> grad_dtype{DataParallelFlags::dtype_flag(dist::kDefaultGradDType)};
  std::vector<int> zero{0};
  std::vector<std::string> zero_gather;  // empty: the default; only with a 1 in zero
  std::vector<std::string> sparse_embedding_grad{"auto"};
  // Every combination, the bucket size varying fastest; the other fields from
  // `base`; --zero-gather only for --zero 1. A UsageError for --zero-gather
  // without --zero 1, or a value listed twice.
  std::vector<DataParallelFlags> combinations(const DataParallelFlags& base) const;
};
// With `sweep`, --bucket-mb, --grad-dtype, --zero, --zero-gather and --sparse-embedding-grad fill its lists
// instead of f's single values.
void add_data_parallel_flags(CLI::App& app, DataParallelFlags& f, DataParallelSweep* sweep = nullptr);

// Starts the world (MPI when launched by mpirun) and, on CUDA, makes GPU
// `local rank` this process's device (before any other GPU work). A usage
// error when this host has more ranks than GPUs.
// A UsageError for --zero-gather without --zero 1.
const dist::World& start_world(Device device, const DataParallelFlags& f);

// What --sparse-embedding-grad auto weighs: the token ids one rank's step
// scatters (batch x sequence length x micro-batches; 0: unknown, so auto
// stays dense) and the micro-batches per step (accumulation reduces densely).
struct StepRows {
  int64_t tokens = 0;
  int64_t grad_accum = 1;
};

class DataParallel : public DataParallelHook {
 public:
  // After model.to(device) (the gradients become views of the buckets).
  // A usage error when --sparse-embedding-grad on cannot be honoured.
  DataParallel(DecoderLM& model, Device device, const DataParallelFlags& f, StepRows rows = {});
  ~DataParallel() override;

  // AdamW over the model, or with --zero 1 the sharded one; both clip by
  // options.max_grad_norm inside their step (ZeRO-1 by the global norm).
  std::unique_ptr<Optimizer> make_optimizer(const AdamWOptions& options);
  bool sharded() const { return flags_.zero == 1; }
  bool sparse_embedding() const { return sparse_ != nullptr; }  // the token table's gradient reduced by rows

  // weight: this rank's share of the global batch's loss terms (tokens_r / tokens_all).
  void begin_step(double weight) override;
  // After model.backward(): gradients reduced. On CUDA the host then waits
  // for the collectives, under the watchdog (a hung peer must not hang this
  // rank forever); the step reads its loss right after anyway.
  void end_backward() override;
  double global_loss(double local_loss);  // sum over ranks of weight_r * loss_r
  void check_sync(long long step);        // throws when ranks hold different parameters (settles first)
  // ZeRO-1 with --zero-gather forward: the last step's parameter all-gathers
  // may still run after the step (the next forward waits for them module by
  // module). Call before any other read or write of the parameters (saving,
  // hashing, a manual edit); a no-op otherwise.
  void settle();

  dist::CommStats last_step_stats() const { return reducer_->last_step_stats(); }
  dist::CommStats take_total_stats() { return reducer_->take_total_stats(); }  // since the last call
  int64_t reduced_steps() const { return reducer_->steps(); }
  size_t bucket_count() const { return reducer_->buckets().size(); }
  std::string describe() const;

 private:
  DecoderLM& model_;
  DataParallelFlags flags_;
  dist::Collectives comm_;
  std::unique_ptr<dist::GradReducer> reducer_;
  std::unique_ptr<dist::SparseRowsReducer> sparse_;  // null: the token table is in the dense buckets
  double weight_ = 1;
  bool in_step_ = false;  // between begin_step and end_backward
};

}  // namespace hg::cli
