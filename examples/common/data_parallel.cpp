#include "examples/common/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/cuda_runtime.hpp"
#include "core/logging.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/param_sync.hpp"
#include "dist/sharded_adamw.hpp"
#include "dist/watchdog.hpp"
#include "examples/common/cli.hpp"

namespace hg::cli {

void add_data_parallel_flags(CLI::App& app, DataParallelFlags& f, DataParallelSweep* sweep) {
  app.add_flag("--ddp", f.force, "data-parallel path even with one rank (mpirun -np N turns it on by itself)");
  const char* bucket_help = "data parallel: gradient bucket size in MiB (reduced as each fills)";
  const char* dtype_help = "data parallel: dtype of the gradient reduction (bf16: half the bytes, ~2^-7 relative "
                           "error per element; docs/distributed.md)";
  const char* zero_help = "data parallel: 1 shards the AdamW moments across ranks (ZeRO-1), 0 does not";
  const std::string gather_help =
      std::string("ZeRO-1: where the parameter all-gathers are waited for: step (the optimizer's step; they overlap "
                  "the update only) or forward (each module of the next forward waits for its bucket; they overlap "
                  "the forward too); default ") +
      (dist::kDefaultForwardWaits ? "forward" : "step");
  const auto dtypes = CLI::IsMember({"fp32", "bf16"});
  const auto gathers = CLI::IsMember({"step", "forward"});
  if (sweep) {
    app.add_option("--bucket-mb", sweep->bucket_mb, std::string(bucket_help) + "; a list (10,25,50) measures each")
        ->check(CLI::Range(0.001, 4096.0))
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--grad-dtype", sweep->grad_dtype, std::string(dtype_help) + "; a list (fp32,bf16) measures each")
        ->check(dtypes)
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--zero", sweep->zero, std::string(zero_help) + "; a list (0,1) measures each")
        ->check(CLI::Range(0, 1))
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--zero-gather", sweep->zero_gather, gather_help + "; a list (step,forward) measures each")
        ->check(gathers)
        ->delimiter(',');
  } else {
    app.add_option("--bucket-mb", f.bucket_mb, bucket_help)->check(CLI::Range(0.001, 4096.0))->capture_default_str();
    app.add_option("--grad-dtype", f.grad_dtype, dtype_help)->check(dtypes)->capture_default_str();
    app.add_option("--zero", f.zero, zero_help)->check(CLI::Range(0, 1))->capture_default_str();
    app.add_option("--zero-gather", f.zero_gather, gather_help)->check(gathers);
  }
  const char* sparse_help = "data parallel: reduce the token embedding's gradient by all-gathering the rows of the "
                            "batch's ids instead of all-reducing the table; auto: when that moves fewer bytes "
                            "(not with --zero 1 or --grad-accum > 1, which stay dense); docs/distributed.md";
  const auto sparse_choices = CLI::IsMember({"auto", "on", "off"});
  if (sweep)
    app.add_option("--sparse-embedding-grad", sweep->sparse_embedding_grad,
                   std::string(sparse_help) + "; a list (on,off) measures each")
        ->check(sparse_choices)
        ->delimiter(',')
        ->capture_default_str();
  else
    app.add_option("--sparse-embedding-grad", f.sparse_embedding_grad, sparse_help)
        ->check(sparse_choices)
        ->capture_default_str();
  app.add_option("--comm-timeout", f.comm_timeout,
                 "data parallel: seconds a collective may wait before every rank is stopped (0: no limit)")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  app.add_flag("--check-sync", f.check_sync,
               "data parallel: compare a hash of the parameters across ranks after every step (else at evaluations)");
}

namespace {

template <class T>
void check_no_repeats(const std::vector<T>& values, const std::string& flag) {
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (values[i] == values[j]) usage_error(flag, values[i], ": listed twice (each value is measured once)");
}

void check_zero_gather(const std::string& gather, bool zero1_runs) {
  if (!gather.empty() && !zero1_runs)
    usage_error("--zero-gather", gather,
                ": applies to ZeRO-1 only (--zero 1), where the updated parameters are all-gathered; without "
                "--zero 1 nothing is gathered");
}

}  // namespace

std::vector<DataParallelFlags> DataParallelSweep::combinations(const DataParallelFlags& base) const {
  check_no_repeats(bucket_mb, "--bucket-mb");
  check_no_repeats(grad_dtype, "--grad-dtype");
  check_no_repeats(zero, "--zero");
  check_no_repeats(zero_gather, "--zero-gather");
  check_no_repeats(sparse_embedding_grad, "--sparse-embedding-grad");
  const bool zero1 = std::find(zero.begin(), zero.end(), 1) != zero.end();
  if (!zero_gather.empty()) check_zero_gather(zero_gather.front(), zero1);
  const std::vector<std::string> gather_modes = zero_gather.empty() ? std::vector<std::string>{""} : zero_gather;
  std::vector<DataParallelFlags> all;
  for (const std::string& sparse : sparse_embedding_grad)
    for (int z : zero)
      for (const std::string& gather : z == 1 ? gather_modes : std::vector<std::string>{""})
        for (const std::string& dtype : grad_dtype)
          for (double mb : bucket_mb) {
            DataParallelFlags f = base;
            f.bucket_mb = mb;
            f.grad_dtype = dtype;
            f.zero = z;
            f.zero_gather = gather;
            f.sparse_embedding_grad = sparse;
            all.push_back(f);
          }
  return all;
}

const dist::World& start_world(Device device, const DataParallelFlags& f) {
  check_zero_gather(f.zero_gather, f.zero == 1);
  const dist::World& w = dist::init_world();
  dist::set_comm_timeout(f.comm_timeout);
  if (device == Device::CUDA && (w.distributed() || f.force)) {
    const int gpus = gpu::device_count();
    if (w.local_rank >= gpus)
      usage_error("mpirun -np", w.size, ": ", w.local_size, " ranks on host ", w.host, " but ", gpus,
                  " GPU(s) visible there; NCCL takes one GPU per rank, so launch at most ", gpus, " ranks per host");
    gpu::set_device(w.local_rank);
  }
  return w;
}

namespace {

// --sparse-embedding-grad resolved: whether the token table's gradient is reduced by rows.
bool sparse_rows_wanted(const DecoderLM& model, const DataParallelFlags& f, StepRows rows, DType grad_dtype) {
  const dist::SparseRows mode = dist::parse_sparse_rows(f.sparse_embedding_grad);
  if (mode == dist::SparseRows::Off) return false;
  const char* flag = "--sparse-embedding-grad";
  // ZeRO-1 shards every gradient bucket with the optimizer; accumulation
  // would have to keep every micro-batch's rows (the reducer learns of a step
  // only at its last micro-batch): both reduce the table densely.
  if (mode == dist::SparseRows::On && f.zero == 1)
    usage_error(flag, "on: not with --zero 1 (ZeRO-1 reduce-scatters the table's gradient with the other buckets); "
                      "use auto or off");
  if (mode == dist::SparseRows::On && rows.grad_accum > 1)
    usage_error(flag, "on: not with --grad-accum ", rows.grad_accum,
                " (the rows of every micro-batch would have to be kept until the step's last); use auto or off");
  if (mode == dist::SparseRows::On) return true;
  const DecoderLMConfig& c = model.config();
  return f.zero == 0 && rows.grad_accum == 1 && dist::world().distributed() &&
         dist::sparse_rows_pay(rows.tokens, dist::world().size, c.vocab_size, c.d_model, grad_dtype);
}

}  // namespace

DataParallel::DataParallel(DecoderLM& model, Device device, const DataParallelFlags& f, StepRows rows)
    : model_(model), flags_(f), comm_(device) {
  dist::ReducerOptions o;
  o.bucket_bytes = static_cast<size_t>(std::max(4.0, f.bucket_mb * 1024 * 1024));
  o.sharded = f.zero == 1;
  o.grad_dtype = f.grad_dtype == "bf16" ? DType::BF16 : DType::F32;
  o.forward_waits = o.sharded && f.forward_waits();
  // The backward finalises gradients in reverse registration order (head first).
  std::vector<Parameter*> order = model.parameters();
  std::reverse(order.begin(), order.end());
  Parameter* table = &model.embed.token;
  if (sparse_rows_wanted(model, f, rows, o.grad_dtype)) {
    order.erase(std::find(order.begin(), order.end(), table));
    sparse_ = std::make_unique<dist::SparseRowsReducer>(comm_, table);
    model.embed.set_token_rows_sink([this](const Tensor& ids, const Tensor& dy) { return sparse_->take(ids, dy); });
  }
  reducer_ = std::make_unique<dist::GradReducer>(comm_, order, o);
  model.set_grads_ready_hook([this, table](const std::vector<Parameter*>& ps) {
    if (!sparse_ || std::find(ps.begin(), ps.end(), table) == ps.end()) return reducer_->grads_ready(ps);
    std::vector<Parameter*> dense;
    std::copy_if(ps.begin(), ps.end(), std::back_inserter(dense), [table](Parameter* p) { return p != table; });
    reducer_->grads_ready(dense);
    if (in_step_) sparse_->start();
  });
  if (o.forward_waits && f.check_sync)
    spdlog::warn("--check-sync waits for ZeRO-1's parameter all-gathers after every step, so --zero-gather forward "
                 "overlaps nothing with the forward (the values are the same)");
  if (o.forward_waits)
    model.set_values_needed_hook([this](Module& m) {
      if (reducer_->gathers_outstanding() > 0) reducer_->values_needed(m.parameters());
    });
}

DataParallel::~DataParallel() {
  model_.set_grads_ready_hook(nullptr);
  model_.embed.set_token_rows_sink(nullptr);
  model_.set_values_needed_hook(nullptr);
  try {
    settle();  // the model outlives this: its parameters must hold the gathered values
  } catch (...) {
  }
}

void DataParallel::settle() { reducer_->finish_gather(); }

std::unique_ptr<Optimizer> DataParallel::make_optimizer(const AdamWOptions& options) {
  if (sharded()) return std::make_unique<dist::ShardedAdamW>(*reducer_, comm_, model_.parameters(), options);
  return std::make_unique<AdamW>(model_.parameters(), options);
}

void DataParallel::begin_step(double weight) {
  weight_ = weight;
  reducer_->begin_step(weight);
  if (sparse_) sparse_->begin_step(weight);
  in_step_ = true;
}

void DataParallel::end_backward() {
  reducer_->finish();
  if (sparse_) sparse_->finish();
  in_step_ = false;
  if (comm_.device() == Device::CUDA) {
    const dist::Watch watch("the step's gradient collectives");
    gpu::synchronize();
  }
  reducer_->collect_stats();  // every collective so far has finished: reading their timings does not wait
}

double DataParallel::global_loss(double local_loss) {
  double v = weight_ * local_loss;
  dist::all_reduce_sum(&v, 1, "all-reduce of the loss");
  return v;
}

void DataParallel::check_sync(long long step) {
  settle();
  dist::check_parameters_in_sync(model_.parameters(), step);
}

std::string DataParallel::describe() const {
  const dist::World& w = dist::world();
  std::string s = std::to_string(w.size) + " rank(s)";
  if (comm_.device() == Device::CUDA)
    s += gpu::nccl::initialized() ? ", NCCL " + gpu::nccl::version() : ", no NCCL (one process)";
  else s += dist::built_with_mpi() && w.distributed() ? ", " + dist::mpi_version() : ", no MPI (one process)";
  s += ", " + std::to_string(reducer_->buckets().size()) + " gradient bucket(s) of <= " +
       std::to_string(flags_.bucket_mb).substr(0, std::to_string(flags_.bucket_mb).find('.') + 3) + " MiB";
  s += ", reduced in " + flags_.grad_dtype;
  if (sparse_) s += ", token-embedding gradient by rows (all-gather of the batch's rows, fp32)";
  if (sharded())
    s += ", ZeRO-1 (AdamW moments sharded; parameter all-gathers waited for by the " +
         std::string(flags_.forward_waits() ? "next forward, module by module)" : "optimizer's step)");
  return s;
}

}  // namespace hg::cli
