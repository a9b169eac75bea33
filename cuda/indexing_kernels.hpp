#pragma once
// Launch API of the row gather / scatter-add kernels (cuda/indexing.cu),
// behind the CUDA backend's gather_rows / scatter_add_rows (core/backend.hpp);
// core/indexing.cpp validates shapes and ids before those are called.
#include <cstdint>
#include <vector>

#include "core/indexing.hpp"
#include "core/tensor.hpp"

namespace hg::gpu {

// out (N, D) = table (V, D) rows picked by ids (N) F32; table/out F32 or F64.
void gather_rows_cuda(const Tensor& table, const Tensor& ids, int64_t n, Tensor& out);

// out (N, D) = table (V, D) rows picked by ids (N) F32, plus positions
// (T, D) row r % T for out row r (N = B T, ids in (B, T) order), rounded to
// out's dtype (F32 or BF16) once: the embedding forward in one pass. table
// and positions F32. An id that names no row gives a NaN row.
void embed_rows_cuda(const Tensor& table, const Tensor& positions, const Tensor& ids, Tensor& out);

// grad_table (V, D) [v, :] += sum of grad (N, D) [p, :] over the positions p
// with rows[p] == v (rows: N ids in [0, V), on the host), in ascending p. One
// thread owns one (v, d): deterministic. grad and grad_table F32 or F64 alike,
// or a BF16 grad into an F32 table (widened as read: the sums of its cast).
void scatter_add_rows_cuda(const Tensor& grad, const std::vector<int32_t>& rows, Tensor& grad_table);

// The same sums with the CSR built on the device from ids (N) F32 (a count,
// a scan and a stable radix sort of the positions by row: the same ascending
// order, so bitwise the result of scatter_add_rows_cuda); nothing crosses to the host, so a CUDA
// graph can capture it. Ids that name no row are left out.
void scatter_add_rows_cuda_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table);

// For each set, how many of its ids (F32) are not integers in [0, limit),
// values equal to `except` apart: one kernel a set, then the counts read
// back in one copy (synchronizes).
std::vector<int64_t> count_bad_indices_cuda(const std::vector<IndexSet>& sets);

}  // namespace hg::gpu
