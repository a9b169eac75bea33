#pragma once
// Launch API of the row gather / scatter-add kernels (cuda/indexing.cu),
// behind the CUDA backend's gather_rows / scatter_add_rows (core/backend.hpp);
// core/indexing.cpp validates shapes and ids before those are called.
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg::gpu {

// out (N, D) = table (V, D) rows picked by ids (N) F32; table/out F32 or F64.
void gather_rows_cuda(const Tensor& table, const Tensor& ids, int64_t n, Tensor& out);

// grad_table (V, D) [v, :] += sum of grad (N, D) [p, :] over the positions p
// with rows[p] == v (rows: N ids in [0, V), on the host), in ascending p. One
// thread owns one (v, d): deterministic.
void scatter_add_rows_cuda(const Tensor& grad, const std::vector<int32_t>& rows, Tensor& grad_table);

}  // namespace hg::gpu
