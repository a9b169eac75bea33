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
  const auto dtypes = CLI::IsMember({"fp32", "bf16"});
  if (sweep) {
    app.add_option("--bucket-mb", sweep->bucket_mb, std::string(bucket_help) + "; a list (10,25,50) measures each")
        ->check(CLI::Range(0.001, 4096.0))
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--grad-dtype", sweep->grad_dtype, std::string(dtype_help) + "; a list (fp32,bf16) measures each")
        ->check(dtypes)
        ->delimiter(',')
        ->capture_default_str();
  } else {
    app.add_option("--bucket-mb", f.bucket_mb, bucket_help)->check(CLI::Range(0.001, 4096.0))->capture_default_str();
    app.add_option("--grad-dtype", f.grad_dtype, dtype_help)->check(dtypes)->capture_default_str();
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
  app.add_option("--zero", f.zero, "data parallel: 1 shards the AdamW moments across ranks (ZeRO-1), 0 does not")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--comm-timeout", f.comm_timeout,
                 "data parallel: seconds a collective may wait before every rank is stopped (0: no limit)")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  app.add_flag("--check-sync", f.check_sync,
               "data parallel: compare a hash of the parameters across ranks after every step (else at evaluations)");
}

std::vector<DataParallelFlags> DataParallelSweep::combinations(const DataParallelFlags& base) const {
  std::vector<DataParallelFlags> all;
  for (const std::string& sparse : sparse_embedding_grad)
    for (const std::string& dtype : grad_dtype)
      for (double mb : bucket_mb) {
        DataParallelFlags f = base;
        f.bucket_mb = mb;
        f.grad_dtype = dtype;
        f.sparse_embedding_grad = sparse;
        all.push_back(f);
      }
  return all;
}

const dist::World& start_world(Device device, const DataParallelFlags& f) {
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
}

DataParallel::~DataParallel() {
  model_.set_grads_ready_hook(nullptr);
  model_.embed.set_token_rows_sink(nullptr);
}

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
  if (comm_.device() != Device::CUDA) return;
  const dist::Watch watch("the step's gradient collectives");
  gpu::synchronize();
}

double DataParallel::global_loss(double local_loss) {
  double v = weight_ * local_loss;
  dist::all_reduce_sum(&v, 1, "all-reduce of the loss");
  return v;
}

void DataParallel::check_sync(long long step) { dist::check_parameters_in_sync(model_.parameters(), step); }

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
  if (sharded()) s += ", ZeRO-1 (AdamW moments sharded)";
  return s;
}

}  // namespace hg::cli
