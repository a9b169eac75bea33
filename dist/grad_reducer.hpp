#pragma once
// Data-parallel gradient averaging in buckets (docs/distributed.md).
//
// The parameters' gradients are re-pointed into a few flat F32 buckets
// (Parameter::grad becomes a view; the modules accumulate into it as
// before), filled in the order the backward finalises them. The model calls
// grads_ready() as each module's backward returns (DecoderLM::
// set_grads_ready_hook); when the last gradient of a bucket is final, the
// bucket's reduction starts at once (NCCL on its own stream after the kernels
// queued so far; MPI_Iallreduce on the CPU) and runs while the rest of the
// backward computes. finish() starts what is left and waits.
//
// Sharded mode (ZeRO-1, dist/sharded_adamw.hpp): buckets are padded to a
// multiple of world x 64 elements, the parameter values become views of
// matching value buckets, and each bucket is reduce-scattered: rank r keeps
// part r of every bucket, the part its optimizer updates. After the update
// each bucket's values are all-gathered; with forward_waits the optimizer
// does not wait for them: the next forward asks for each module's values
// (values_needed, through DecoderLM's values-needed hook) and waits only for
// the buckets that hold them, so the gathers run behind the forward.
//
// Wire dtype: F32, or BF16 (each rank's weighted gradient rounded to bf16,
// summed in bf16, widened back into the F32 gradients: half the bytes, at
// most about 2^-7 relative error per element for 2 ranks; docs/distributed.md).
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "core/module.hpp"
#include "dist/collectives.hpp"

namespace hg::dist {

// The dtype gradients travel in by default. F32 until bf16 is measured
// faster on the GPUs; one constant to flip.
inline constexpr DType kDefaultGradDType = DType::F32;
// The programs' default for ZeRO-1's parameter all-gathers (--zero-gather):
// waited for by the optimizer's step (false: they overlap the update only) or
// by the next forward, module by module (true: ReducerOptions::forward_waits).
// false until the overlap with the forward is measured faster on the GPUs
// (scripts/gpu_ddp_check.sh prints the recommendation); one constant to flip.
inline constexpr bool kDefaultForwardWaits = false;

struct ReducerOptions {
  size_t bucket_bytes = size_t(25) << 20;  // a bucket closes once it holds this many bytes of gradients
  bool sharded = false;                    // ZeRO-1 layout and reduce-scatter
  DType grad_dtype = kDefaultGradDType;    // F32 or BF16: the dtype of the reduction
  // Sharded mode: the parameter all-gathers overlap the next forward (each
  // module waits for its buckets in values_needed) instead of being waited
  // for at the end of the optimizer's step. Every read of the parameters must
  // then go through values_needed or come after finish_gather().
  bool forward_waits = false;
};

class GradReducer {
 public:
  struct Bucket {
    std::vector<Parameter*> params;
    std::vector<int64_t> offsets;  // of each parameter in the flat buffers
    Tensor grads;                  // flat, padded; the parameters' grads are views of it
    Tensor values;                 // sharded mode: flat values (the parameters' values are views of it)
    Tensor shard_grads;            // sharded mode: this rank's part of the reduced grads
    Tensor wire, wire_shard;       // BF16 reduction: grads and shard_grads in bf16
    int pending = 0;
    bool started = false;
    bool gathering = false;  // sharded: the values' all-gather is started and not yet waited for
    uint64_t gather_ticket = 0;
  };

  // params: every parameter once, in the order the backward finalises them
  // (a DecoderLM: reverse registration order). All F32 on one device; their
  // current grads (and values, sharded) are copied into the buckets.
  GradReducer(Collectives& comm, std::vector<Parameter*> params, ReducerOptions options);

  // Before the backward: zeroes nothing (the caller's zero_grad does), records
  // this rank's weight: the reduced gradient is sum_r premul_r * g_r (1/world
  // averages; tokens_r / tokens_total weighs by tokens).
  void begin_step(double premul);
  // Called with the parameters whose gradients just became final.
  void grads_ready(const std::vector<Parameter*>& params);
  // After the backward: starts every bucket not yet started and waits.
  void finish();
  // Sharded mode, after this rank's parts of the values were updated: every
  // rank gets every part (started and waited).
  void gather_values();
  // The same bucket by bucket: start_gather(k) once bucket k's part is
  // updated (it runs while the next bucket's update computes), then
  // finish_gather(), or values_needed() for the parameters about to be read.
  // Waiting for a bucket's gather also refreshes its parameters' bf16
  // compute copies (Parameter::compute) from the gathered values.
  void start_gather(size_t bucket);
  void finish_gather();
  // Before `params` are read: waits for the gathers of the buckets holding
  // them (on CUDA the handgrad stream waits, not the host). Cheap when no
  // gather is outstanding.
  void values_needed(const std::vector<Parameter*>& params);
  size_t gathers_outstanding() const { return gathering_; }  // buckets whose gather was not waited for
  bool forward_waits() const { return options_.forward_waits; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Adds the timings of the collectives so far to the totals. On CUDA it
  // waits for them on the host: call it where the host has waited for the
  // step anyway (after finish() and a synchronize), not before a forward
  // whose gathers are still running.
  void collect_stats();
  // Totals since the last call, the last finished step included (CUDA: waits for its collectives).
  CommStats take_total_stats();
  CommStats last_step_stats() const { return last_stats_; }
  CommStats total_stats() const { return total_stats_; }
  int64_t steps() const { return steps_; }

 private:
  void start(Bucket& b);
  void await_gather(Bucket& b);
  Collectives& comm_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  double premul_ = 1.0;
  bool in_step_ = false;
  size_t gathering_ = 0;  // buckets whose gather has not been waited for
  CommStats last_stats_, total_stats_;
  int64_t steps_ = 0;
};

}  // namespace hg::dist
