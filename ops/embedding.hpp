#pragma once
#include "core/indexing.hpp"
#include "core/tensor.hpp"

namespace hg {

// Token plus position embedding, a language model's first op:
//   out[b, t, :] = token[ids[b, t], :] + positions[t, :]
// token (V, D) and positions (T, D) F32 or F64 alike; ids (B, T), integer
// ids stored as F32, on the same device; out (B, T, D) in out_dtype: the
// tables' dtype, or BF16 for F32 tables (the F32 sum rounded once). `check`:
// where the ids are checked (core/indexing.hpp). CUDA fused mode runs one
// kernel for F32 tables (embed_rows_kernel, cuda/indexing.cu), which moves
// the rows once; the CPU and the unfused mode compose gather_rows, add and a
// cast, the same bits.
Tensor embedding_forward(const Tensor& token, const Tensor& positions, const Tensor& ids, DType out_dtype,
                         IdCheck check);

// embedding_forward's backward, added into the gradients:
//   token_grad[ids[b, t], :] += dy[b, t, :]   (in ascending (b, t) for each row)
//   positions_grad[t, :]     += sum over b of dy[b, t, :]
// dy (B, T, D) in the tables' dtype, or BF16 for F32 tables; token_grad null
// leaves the token rows to the caller (data parallelism's sparse rows).
// CUDA fused mode reads a BF16 dy as it is: the scatter widens it as it
// reads, and the position sums are column sums over the batch
// (gpu::column_sum, F32, one add into positions_grad); the token rows are
// then bitwise those of the unfused mode. The CPU and the unfused mode cast
// dy to the tables' dtype first and compose scatter_add_rows, sum and add.
void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor* token_grad, Tensor& positions_grad, IdCheck check);

}  // namespace hg
