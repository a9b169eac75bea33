#include "dist/sparse_rows.hpp"

#include <algorithm>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/indexing.hpp"
#include "dist/world.hpp"

namespace hg::dist {

SparseRows parse_sparse_rows(const std::string& text) {
  if (text == "auto") return SparseRows::Auto;
  if (text == "on") return SparseRows::On;
  if (text == "off") return SparseRows::Off;
  fail("--sparse-embedding-grad", "'", text, "' is not one of auto, on, off");
}

bool sparse_rows_pay(int64_t rows, int64_t world, int64_t vocab, int64_t width, DType grad_dtype) {
  const double gathered = static_cast<double>(rows) * static_cast<double>(world) * static_cast<double>(width + 1) * 4;
  const double dense =
      static_cast<double>(vocab) * static_cast<double>(width) * static_cast<double>(dtype_size(grad_dtype));
  return rows > 0 && gathered < dense;
}

SparseRowsReducer::SparseRowsReducer(Collectives& comm, Parameter* table) : comm_(comm), table_(table) {
  const char* op = "SparseRowsReducer";
  HG_CHECK(table && table->value.defined() && table->grad.defined(), op, "the table parameter is undefined");
  HG_CHECK(table->grad.ndim() == 2 && table->grad.dtype() == DType::F32, op,
           "the table's gradient must be (V, D) F32, got ", table->grad.describe());
  table->grad.check_device(comm.device(), op);
}

void SparseRowsReducer::begin_step(double premul) {
  HG_CHECK(!in_step_, "SparseRowsReducer::begin_step", "the previous step was not finished (finish())");
  premul_ = premul;
  in_step_ = true;
  started_ = false;
  taken_.clear();
}

bool SparseRowsReducer::take(const Tensor& ids, const Tensor& dy) {
  if (!in_step_) return false;
  const char* op = "SparseRowsReducer::take";
  HG_CHECK(!started_, op, "rows arrived after the table's gradient was reported final");
  const int64_t d = table_->grad.size(1);
  HG_CHECK(dy.dtype() == DType::F32 && dy.numel() == ids.numel() * d, op, "dy ", dy.describe(), " is not ids ",
           ids.shape(), " x ", d, " F32 values");
  taken_.emplace_back(ids, dy);
  return true;
}

void SparseRowsReducer::start() {
  const char* op = "SparseRowsReducer::start";
  HG_CHECK(in_step_ && !started_, op, "not inside a step, or started twice");
  started_ = true;
  const Tensor& grad = table_->grad;
  const int64_t d = grad.size(1);
  // This rank's ids on the host: the copy waits for the backward queued so
  // far, as the embedding's own scatter would have.
  std::vector<int32_t> mine;
  for (const auto& [ids, dy] : taken_) {
    const std::vector<int32_t> v = read_indices(ids, grad.size(0), op);
    mine.insert(mine.end(), v.begin(), v.end());
  }
  std::vector<size_t> counts;
  const std::vector<int32_t> all = all_gather_v(mine, counts, "all-gather of the embedding ids");
  const int64_t world_size = static_cast<int64_t>(counts.size()), rank = world().rank;
  slot_rows_ = static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
  // Each rank's ids padded to slot_rows_ with id 0, whose rows are zero: adding them changes nothing.
  ids_.assign(static_cast<size_t>(world_size * slot_rows_), 0);
  for (int64_t r = 0, from = 0; r < world_size; from += static_cast<int64_t>(counts[r++]))
    std::copy(all.begin() + from, all.begin() + from + static_cast<int64_t>(counts[r]), ids_.begin() + r * slot_rows_);
  if (slot_rows_ == 0) return;
  const int64_t total = world_size * slot_rows_ * d;
  if (!rows_.defined() || rows_.numel() != total) rows_ = Tensor::zeros({total}, DType::F32, comm_.device());
  // premul * dy into this rank's slot (the float product of the dense path's premultiply).
  Backend& be = backend_for(comm_.device());
  const Tensor scale = Tensor::full({1}, premul_, DType::F32, comm_.device());
  int64_t at = rank * slot_rows_;
  for (const auto& [ids, dy] : taken_) {
    const int64_t n = ids.numel();
    Tensor slot = rows_.slice(at * d, (at + n) * d).reshape({n, d});
    be.zip(BinaryOp::Mul, dy.reshape({n, d}), scale, slot);
    at += n;
  }
  if (at < (rank + 1) * slot_rows_) rows_.slice(at * d, (rank + 1) * slot_rows_ * d).fill_(0.0);
  comm_.all_gather(rows_);
}

void SparseRowsReducer::finish() {
  HG_CHECK(in_step_, "SparseRowsReducer::finish", "no step begun (begin_step())");
  if (!started_) start();
  comm_.wait("all-gather of the embedding rows");
  if (slot_rows_ > 0) {
    const Tensor rows = rows_.reshape({static_cast<int64_t>(ids_.size()), table_->grad.size(1)});
    // Ascending position per table row: rank 0's rows, then rank 1's, ... on every rank.
    backend_for(comm_.device()).scatter_add_rows(rows, ids_, table_->grad);
  }
  taken_.clear();
  in_step_ = false;
}

}  // namespace hg::dist
