#include "ops/embedding.hpp"

#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/indexing_kernels.hpp"

namespace hg {
namespace {

constexpr const char* kForward = "embedding_forward";
constexpr const char* kBackward = "embedding_backward";

bool use_fused_kernel(const Tensor& table) {
  return table.is_cuda() && kernel_mode() == KernelMode::Fused && table.dtype() == DType::F32;
}

// The (T, D) positions for ids (B, T), and a table (V, D) of their dtype.
void check_tables(const Tensor& token, const Tensor& positions, const Tensor& ids, const char* op) {
  token.check_defined(op);
  positions.check_defined(op);
  ids.check_defined(op);
  HG_CHECK(token.dtype() == DType::F32 || token.dtype() == DType::F64, op, "token table must be f32 or f64, got ",
           token.describe());
  HG_CHECK(ids.ndim() == 2, op, "ids must be (B, T), got ", ids.shape());
  HG_CHECK(token.ndim() == 2 && positions.ndim() == 2 && positions.size(1) == token.size(1) &&
               positions.size(0) == ids.size(1) && positions.dtype() == token.dtype(),
           op, "token ", token.describe(), " and positions ", positions.describe(),
           " must be (V, D) and (T, D) of one dtype, T = ", ids.size(1), " for ids ", ids.shape());
  check_same_device(op, token, positions);
  check_same_device(op, token, ids);
}

}  // namespace

Tensor embedding_forward(const Tensor& token, const Tensor& positions, const Tensor& ids, DType out_dtype,
                         IdCheck check) {
  check_tables(token, positions, ids, kForward);
  HG_CHECK(out_dtype == token.dtype() || (out_dtype == DType::BF16 && token.dtype() == DType::F32), kForward,
           "out dtype ", dtype_name(out_dtype), " is not allowed for ", dtype_name(token.dtype()),
           " tables: the tables' dtype, or bf16 for f32 tables");
  if (!use_fused_kernel(token)) return add(gather_rows(token, ids, check), positions).to(out_dtype);
  ids.check_dtype(DType::F32, kForward);
  if (check == IdCheck::Host) read_indices(ids, token.size(0), "gather_rows");  // throws on the first bad id
  Tensor out = Tensor::empty({ids.size(0), ids.size(1), token.size(1)}, out_dtype, token.device());
  Tensor out_rows = out.reshape({ids.numel(), token.size(1)});
  gpu::embed_rows_cuda(token, positions, ids.reshape({ids.numel()}), out_rows);
  return out;
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor* token_grad, Tensor& positions_grad,
                        IdCheck check) {
  dy.check_defined(kBackward);
  ids.check_defined(kBackward);
  positions_grad.check_defined(kBackward);
  const DType table = positions_grad.dtype();
  HG_CHECK(ids.ndim() == 2 && positions_grad.ndim() == 2 && positions_grad.size(0) == ids.size(1), kBackward,
           "positions_grad ", positions_grad.describe(), " must be (T, D) for ids ", ids.shape());
  const int64_t b = ids.size(0), t = ids.size(1), d = positions_grad.size(1);
  HG_CHECK(dy.shape() == Shape({b, t, d}), kBackward, "dy ", dy.shape(), " must be (B, T, D) = ", Shape({b, t, d}));
  HG_CHECK(dy.dtype() == table || (dy.dtype() == DType::BF16 && table == DType::F32), kBackward, "dy is ",
           dtype_name(dy.dtype()), " but the gradients ", dtype_name(table),
           "; dy must be the gradients' dtype, or bf16 for f32 gradients");
  HG_CHECK(
      token_grad == nullptr || (token_grad->dtype() == table && token_grad->ndim() == 2 && token_grad->size(1) == d),
      kBackward, "token_grad ", token_grad ? token_grad->describe() : std::string(), " must be (V, ", d, ") ",
      dtype_name(table));
  check_same_device(kBackward, dy, positions_grad);
  check_same_device(kBackward, ids, positions_grad);
  // The fused path reads a bf16 dy as it is; the composition sums in the tables' dtype.
  const bool fused = use_fused_kernel(positions_grad);
  const Tensor g = fused ? dy : dy.to(table);
  if (token_grad) scatter_add_rows(g, ids, *token_grad, check);
  if (!fused) {
    positions_grad.copy_(add(positions_grad, sum(g, 0)));
    return;
  }
  if (dy.numel() == 0) return;
  // dy as (B, T D): the position gradient is its column sums.
  gpu::column_sum(dy, b, t * d, t * d, positions_grad.reshape({t * d}), /*accumulate=*/true);
}

}  // namespace hg
