#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

// Row gather and its backward, the primitives under Embedding. Token ids are
// a Tensor of integer values stored as F32 (exact below 2^24), on the same
// device as the table, so a batch of ids moves to the GPU once per step.
namespace hg {

// Whether v is an integer in [0, limit): a row id, or a class index.
inline bool is_index(double v, int64_t limit) { return v >= 0 && v < static_cast<double>(limit) && v == std::floor(v); }

// Copies ids to the host and checks that every value is an integer in
// [0, limit); throws hg::Error naming `op` and the first bad value otherwise.
std::vector<int32_t> read_indices(const Tensor& ids, int64_t limit, const char* op);

// How many values of ids (F32) are not integers in [0, limit), values equal
// to `except` apart (a loss's ignore_index; NaN: none). Counted where ids
// live: for ids on the GPU one kernel, and only the count comes back.
int64_t count_bad_indices(const Tensor& ids, int64_t limit, double except = std::nan(""));

// One set of values count_bad_indices checks.
struct IndexSet {
  Tensor ids;
  int64_t limit = 0;
  double except = std::nan("");
};
// The count of each set (all on one device), read back together: on the GPU
// one kernel a set and one copy to the host for all of them.
std::vector<int64_t> count_bad_indices(const std::vector<IndexSet>& sets);

// Where the ids are checked. Host: copied back and validated, a bad id
// throws. Device (CUDA): nothing leaves the GPU, so a CUDA graph can capture
// the op; the caller has checked the ids before (TrainStep does when it
// stages a batch), and an id that names no row still cannot read out of
// bounds: gathered it gives a NaN row, scattered it is left out. On the CPU
// both are Host.
enum class IdCheck { Host, Device };

// out[i, :] = table[ids[i], :]. table (V, D) F32/F64; ids F32 of any shape;
// out has shape ids.shape + (D,), table's dtype and device.
Tensor gather_rows(const Tensor& table, const Tensor& ids, IdCheck check = IdCheck::Host);

// grad_table[ids[i], :] += grad[i, :] for every i, in increasing i for each
// row (deterministic on every device: no float atomics). grad has shape
// ids.shape + (D,) and the table's dtype, or BF16 for an F32 table (the sums
// of its exact F32 cast); grad_table (V, D) is accumulated into in place.
void scatter_add_rows(const Tensor& grad, const Tensor& ids, Tensor& grad_table, IdCheck check = IdCheck::Host);

}  // namespace hg
