#include "core/indexing.hpp"

#include <cmath>

#if HG_WITH_CUDA
#include "cuda/indexing_kernels.hpp"
#endif

namespace hg {

std::vector<int32_t> read_indices(const Tensor& ids, int64_t limit, const char* op) {
  ids.check_defined(op);
  ids.check_dtype(DType::F32, op);
  HG_CHECK(limit > 0 && limit < (int64_t{1} << 24), op, "index limit ", limit, " out of range (0, 2^24)");
  const std::vector<double> values = ids.to_vector();
  std::vector<int32_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (!(v >= 0 && v < static_cast<double>(limit)) || v != std::floor(v))
      fail(op, "id ", v, " at flat position ", i, " of ids ", ids.shape(), " is not an integer in [0, ",
           limit, ")");
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

namespace {

void check_table(const Tensor& table, const char* op) {
  table.check_defined(op);
  HG_CHECK(table.ndim() == 2, op, "table must be (V, D), got ", table.shape());
  HG_CHECK(table.dtype() == DType::F32 || table.dtype() == DType::F64, op,
           "table must be F32 or F64, got ", dtype_name(table.dtype()));
}

template <class T>
void gather_cpu(const Tensor& table, const std::vector<int32_t>& idx, Tensor& out) {
  const int64_t d = table.size(1);
  const T* src = table.data<T>();
  T* dst = out.data<T>();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j) dst[static_cast<int64_t>(i) * d + j] = src[idx[i] * d + j];
}

template <class T>
void scatter_add_cpu(const Tensor& grad, const std::vector<int32_t>& idx, Tensor& table) {
  const int64_t d = table.size(1);
  const T* src = grad.data<T>();
  T* dst = table.data<T>();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j) dst[idx[i] * d + j] += src[static_cast<int64_t>(i) * d + j];
}

}  // namespace

Tensor gather_rows(const Tensor& table, const Tensor& ids) {
  const char* op = "gather_rows";
  check_table(table, op);
  ids.check_defined(op);
  check_same_device(op, table, ids);
  const std::vector<int32_t> idx = read_indices(ids, table.size(0), op);
  Shape out_shape = ids.shape();
  out_shape.push_back(table.size(1));
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  if (out.numel() == 0) return out;
  if (table.is_cuda()) {
#if HG_WITH_CUDA
    gpu::gather_rows_cuda(table, ids, ids.numel(), out);
#else
    fail(op, "handgrad was built without CUDA");
#endif
  } else if (table.dtype() == DType::F32) {
    gather_cpu<float>(table, idx, out);
  } else {
    gather_cpu<double>(table, idx, out);
  }
  return out;
}

void scatter_add_rows(const Tensor& grad, const Tensor& ids, Tensor& grad_table) {
  const char* op = "scatter_add_rows";
  check_table(grad_table, op);
  grad.check_defined(op);
  check_same_device(op, grad, grad_table);
  check_same_device(op, ids, grad_table);
  check_same_dtype(op, grad, grad_table);
  Shape expected = ids.shape();
  expected.push_back(grad_table.size(1));
  HG_CHECK(grad.shape() == expected, op, "grad ", grad.shape(), " must be ids.shape + (D,) = ", expected,
           " for ids ", ids.shape(), " and table ", grad_table.shape());
  const std::vector<int32_t> idx = read_indices(ids, grad_table.size(0), op);
  if (grad.numel() == 0) return;
  if (grad_table.is_cuda()) {
#if HG_WITH_CUDA
    // Counting sort of positions by row (a CSR), so each GPU thread owns one
    // (row, column) and sums its positions in ascending order.
    const int64_t v = grad_table.size(0);
    std::vector<int32_t> offsets(static_cast<size_t>(v) + 1, 0);
    for (int32_t r : idx) ++offsets[r + 1];
    for (int64_t r = 0; r < v; ++r) offsets[r + 1] += offsets[r];
    std::vector<int32_t> positions(idx.size());
    std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
    for (size_t p = 0; p < idx.size(); ++p) positions[fill[idx[p]]++] = static_cast<int32_t>(p);
    gpu::scatter_add_rows_cuda(grad, offsets, positions, grad_table);
#else
    fail(op, "handgrad was built without CUDA");
#endif
  } else if (grad.dtype() == DType::F32) {
    scatter_add_cpu<float>(grad, idx, grad_table);
  } else {
    scatter_add_cpu<double>(grad, idx, grad_table);
  }
}

}  // namespace hg
