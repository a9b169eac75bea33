#include "core/indexing.hpp"

#include <cmath>

#include "core/backend.hpp"

namespace hg {

std::vector<int32_t> read_indices(const Tensor& ids, int64_t limit, const char* op) {
  ids.check_defined(op);
  ids.check_dtype(DType::F32, op);
  HG_CHECK(limit > 0 && limit < (int64_t{1} << 24), op, "index limit ", limit, " out of range (0, 2^24)");
  const std::vector<double> values = ids.to_vector();
  std::vector<int32_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (!is_index(v, limit))
      fail(op, "id ", v, " at flat position ", i, " of ids ", ids.shape(), " is not an integer in [0, ", limit, ")");
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

int64_t count_bad_indices(const Tensor& ids, int64_t limit, double except) {
  return count_bad_indices(std::vector<IndexSet>{{ids, limit, except}}).front();
}

std::vector<int64_t> count_bad_indices(const std::vector<IndexSet>& sets) {
  const char* op = "count_bad_indices";
  if (sets.empty()) return {};
  for (const IndexSet& s : sets) {
    s.ids.check_defined(op);
    s.ids.check_dtype(DType::F32, op);
    HG_CHECK(s.limit > 0 && s.limit < (int64_t{1} << 24), op, "index limit ", s.limit, " out of range (0, 2^24)");
    HG_CHECK(s.ids.device() == sets.front().ids.device(), op, "the sets are on ",
             device_name(sets.front().ids.device()), " and ", device_name(s.ids.device()),
             "; count them on one device");
  }
  return backend_for(sets.front().ids.device()).count_bad_indices(sets);
}

namespace {

void check_table(const Tensor& table, const char* op) {
  table.check_defined(op);
  HG_CHECK(table.ndim() == 2, op, "table must be (V, D), got ", table.shape());
  HG_CHECK(table.dtype() == DType::F32 || table.dtype() == DType::F64, op, "table must be F32 or F64, got ",
           dtype_name(table.dtype()));
}

}  // namespace

Tensor gather_rows(const Tensor& table, const Tensor& ids, IdCheck check) {
  const char* op = "gather_rows";
  check_table(table, op);
  ids.check_defined(op);
  ids.check_dtype(DType::F32, op);
  check_same_device(op, table, ids);
  // The CUDA gather reads the ids on the device; the host list is for the CPU.
  const bool on_device = check == IdCheck::Device && table.is_cuda();
  const std::vector<int32_t> idx = on_device ? std::vector<int32_t>() : read_indices(ids, table.size(0), op);
  Shape out_shape = ids.shape();
  out_shape.push_back(table.size(1));
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  if (out.numel() == 0) return out;
  Tensor out_rows = out.reshape({ids.numel(), table.size(1)});
  backend_for(table.device()).gather_rows(table, ids, idx, out_rows);
  return out;
}

void scatter_add_rows(const Tensor& grad, const Tensor& ids, Tensor& grad_table, IdCheck check) {
  const char* op = "scatter_add_rows";
  check_table(grad_table, op);
  grad.check_defined(op);
  check_same_device(op, grad, grad_table);
  check_same_device(op, ids, grad_table);
  // A BF16 grad may feed an F32 table (a bf16 residual stream's gradient):
  // the CUDA kernel widens it as it reads; the CPU casts it first.
  const bool bf16_grad = grad.dtype() == DType::BF16 && grad_table.dtype() == DType::F32;
  HG_CHECK(grad.dtype() == grad_table.dtype() || bf16_grad, op, "grad is ", dtype_name(grad.dtype()), " but the table ",
           dtype_name(grad_table.dtype()), "; grad must be the table's dtype, or bf16 for an f32 table");
  Shape expected = ids.shape();
  expected.push_back(grad_table.size(1));
  HG_CHECK(grad.shape() == expected, op, "grad ", grad.shape(), " must be ids.shape + (D,) = ", expected, " for ids ",
           ids.shape(), " and table ", grad_table.shape());
  if (bf16_grad && !grad_table.is_cuda()) return scatter_add_rows(grad.to(DType::F32), ids, grad_table, check);
  if (check == IdCheck::Device && grad_table.is_cuda()) {
    ids.check_dtype(DType::F32, op);
    if (grad.numel() > 0)
      backend_for(grad_table.device())
          .scatter_add_rows_device_ids(grad.reshape({ids.numel(), grad_table.size(1)}), ids.reshape({ids.numel()}),
                                       grad_table);
    return;
  }
  const std::vector<int32_t> idx = read_indices(ids, grad_table.size(0), op);
  if (grad.numel() == 0) return;
  backend_for(grad_table.device()).scatter_add_rows(grad.reshape({ids.numel(), grad_table.size(1)}), idx, grad_table);
}

}  // namespace hg
