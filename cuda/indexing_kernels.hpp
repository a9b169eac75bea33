#pragma once
// Launch API of the row gather / scatter-add kernels (cuda/indexing.cu).
// core/indexing.cpp validates shapes and ids before calling these.
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hg::gpu {

// out (N, D) = table (V, D) rows picked by ids (N) F32; table/out F32 or F64.
void gather_rows_cuda(const Tensor& table, const Tensor& ids, int64_t n, Tensor& out);

// grad_table[v, :] += sum over positions p of row v of grad[p, :], where the
// positions of row v are positions[offsets[v] .. offsets[v+1]) (a CSR built
// on the host, ascending p). One thread owns one (v, d): deterministic.
void scatter_add_rows_cuda(const Tensor& grad, const std::vector<int32_t>& offsets,
                           const std::vector<int32_t>& positions, Tensor& grad_table);

}  // namespace hg::gpu
