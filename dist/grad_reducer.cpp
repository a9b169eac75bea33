#include "dist/grad_reducer.hpp"

#include <string>

#include "core/error.hpp"
#include "dist/world.hpp"

namespace hg::dist {
namespace {

constexpr int64_t kAlign = 64;  // elements: every view starts 256-byte aligned (vector loads, NCCL)

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// The parameter's tensor re-made as a view of `flat` at `offset`, keeping its values.
void move_into(Tensor& t, Tensor& flat, int64_t offset) {
  Tensor view = flat.slice(offset, offset + t.numel()).reshape(t.shape());
  view.copy_(t);
  t = view;
}

}  // namespace

GradReducer::GradReducer(Collectives& comm, std::vector<Parameter*> params, ReducerOptions options)
    : comm_(comm), options_(options) {
  const char* op = "GradReducer";
  HG_CHECK(options.bucket_bytes >= 4, op, "bucket size must be at least 4 bytes, got ", options.bucket_bytes);
  HG_CHECK(options.grad_dtype == DType::F32 || options.grad_dtype == DType::BF16, op,
           "gradients are reduced in f32 or bf16, not ", dtype_name(options.grad_dtype));
  HG_CHECK(options.sharded || !options.forward_waits, op,
           "forward_waits applies to the sharded (ZeRO-1) layout only: without it nothing is gathered");
  const bool bf16 = options.grad_dtype == DType::BF16;
  const int64_t world_size = world().size;
  const int64_t capacity = static_cast<int64_t>(options.bucket_bytes / sizeof(float));
  Bucket current;
  int64_t size = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    const int64_t total = round_up(size, options.sharded ? kAlign * world_size : kAlign);
    current.grads = Tensor::zeros({total}, DType::F32, comm.device());
    if (options.sharded) {
      current.values = Tensor::zeros({total}, DType::F32, comm.device());
      current.shard_grads = Tensor::zeros({total / world_size}, DType::F32, comm.device());
      if (bf16) current.wire_shard = Tensor::zeros({total / world_size}, DType::BF16, comm.device());
    }
    if (bf16) current.wire = Tensor::zeros({total}, DType::BF16, comm.device());
    for (size_t i = 0; i < current.params.size(); ++i) {
      move_into(current.params[i]->grad, current.grads, current.offsets[i]);
      if (options.sharded) move_into(current.params[i]->value, current.values, current.offsets[i]);
      bucket_of_[current.params[i]] = buckets_.size();
    }
    buckets_.push_back(std::move(current));
    current = Bucket{};
    size = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter* p = params[i];
    HG_CHECK(p != nullptr && p->value.defined() && p->grad.defined(), op, "parameter ", i, " is undefined");
    HG_CHECK(p->value.dtype() == DType::F32 && p->grad.dtype() == DType::F32, op, "parameter ", i, " ",
             p->value.describe(), ": data parallelism reduces F32 gradients only");
    HG_CHECK(p->value.device() == comm.device() && p->grad.device() == comm.device(), op, "parameter ", i, " ",
             p->value.describe(), " is not on ", device_name(comm.device()), ", the device of the collectives");
    HG_CHECK(!bucket_of_.count(p), op, "parameter ", i, " is listed twice");
    if (!current.params.empty() && size + p->value.numel() > capacity) close();
    current.params.push_back(p);
    current.offsets.push_back(size);
    size += round_up(p->value.numel(), kAlign);
    bucket_of_[p] = buckets_.size();
  }
  close();
}

void GradReducer::begin_step(double premul) {
  HG_CHECK(!in_step_, "GradReducer::begin_step", "the previous step was not finished (finish())");
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.started = false;
  }
  premul_ = premul;
  in_step_ = true;
}

void GradReducer::collect_stats() {
  const CommStats s = comm_.take_stats();
  if (s.collectives == 0 && s.busy_ms == 0) return;
  last_stats_ = s;
  total_stats_.busy_ms += s.busy_ms;
  total_stats_.exposed_ms += s.exposed_ms;
  total_stats_.collectives += s.collectives;
}

CommStats GradReducer::take_total_stats() {
  HG_CHECK(!in_step_, "GradReducer::take_total_stats", "inside a step (call it after finish())");
  collect_stats();
  const CommStats s = total_stats_;
  total_stats_ = CommStats{};
  return s;
}

void GradReducer::start(Bucket& b) {
  b.started = true;
  if (options_.sharded) comm_.reduce_scatter_sum(b.grads, b.shard_grads, premul_, b.wire, b.wire_shard);
  else comm_.all_reduce_sum(b.grads, premul_, b.wire);
}

void GradReducer::grads_ready(const std::vector<Parameter*>& params) {
  if (!in_step_) return;  // a backward outside a data-parallel step (none today) reduces nothing
  for (const Parameter* p : params) {
    const auto it = bucket_of_.find(p);
    HG_CHECK(it != bucket_of_.end(), "GradReducer::grads_ready", "a parameter ", p->value.describe(),
             " that the reducer does not hold");
    Bucket& b = buckets_[it->second];
    HG_CHECK(b.pending > 0, "GradReducer::grads_ready", "parameter ", p->value.describe(),
             " reported final twice in one step");
    if (--b.pending == 0) start(b);
  }
  comm_.progress();
}

void GradReducer::finish() {
  HG_CHECK(in_step_, "GradReducer::finish", "no step begun (begin_step())");
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  finish_gather();  // a bucket the forward did not ask for (none in a DecoderLM step)
  comm_.wait(options_.sharded ? "gradient reduce-scatter" : "gradient all-reduce");
  in_step_ = false;
  ++steps_;
}

void GradReducer::gather_values() {
  for (size_t k = 0; k < buckets_.size(); ++k) start_gather(k);
  finish_gather();
}

void GradReducer::start_gather(size_t bucket) {
  const char* op = "GradReducer::start_gather";
  HG_CHECK(options_.sharded, op, "only in sharded (ZeRO-1) mode");
  HG_CHECK(bucket < buckets_.size(), op, "bucket ", bucket, " of ", buckets_.size());
  Bucket& b = buckets_[bucket];
  HG_CHECK(!b.gathering, op, "bucket ", bucket, "'s previous gather was not waited for");
  b.gather_ticket = comm_.all_gather(b.values);
  b.gathering = true;
  ++gathering_;
  comm_.progress();
}

void GradReducer::await_gather(Bucket& b) {
  if (!b.gathering) return;
  comm_.wait_for(b.gather_ticket, "parameter all-gather");
  for (Parameter* p : b.params) refresh_compute_copy(*p);  // queued after the wait, on the handgrad stream
  b.gathering = false;
  --gathering_;
}

void GradReducer::finish_gather() {
  for (Bucket& b : buckets_) await_gather(b);
}

void GradReducer::values_needed(const std::vector<Parameter*>& params) {
  if (gathering_ == 0) return;
  for (const Parameter* p : params) {
    const auto it = bucket_of_.find(p);
    HG_CHECK(it != bucket_of_.end(), "GradReducer::values_needed", "a parameter ", p->value.describe(),
             " that the reducer does not hold");
    await_gather(buckets_[it->second]);
  }
}

}  // namespace hg::dist
