#pragma once
// Data-parallel reduction of an embedding table's gradient by its rows
// (docs/distributed.md, "Sparse token-embedding gradient").
//
// A token embedding's gradient is non-zero only in the rows of the ids of
// the batch, and it is final only at the very end of the backward, where a
// dense all-reduce of the whole (V, D) table cannot hide behind compute.
// Instead each rank keeps the rows its embedding backward would scatter (dy,
// one row per position, and the ids), the ranks all-gather them (the ids on
// the host, the rows on the collectives' device) and every rank
// scatter-adds all ranks' rows, rank 0's first, into the zeroed gradient:
// the same sum on every rank, bitwise, in a fixed order. Rows enter scaled
// by the rank's weight, as the dense reduction premultiplies.
#include <cstdint>
#include <string>
#include <vector>

#include "core/module.hpp"
#include "dist/collectives.hpp"

namespace hg::dist {

// --sparse-embedding-grad: auto (rows where they move fewer bytes), on, off.
enum class SparseRows { Auto, On, Off };
SparseRows parse_sparse_rows(const std::string& text);  // hg::Error naming the choices otherwise

// Whether gathering `rows` rows of `width` F32 values from each of `world`
// ranks moves fewer bytes than all-reducing the (vocab, width) table in
// grad_dtype: rows * world * (width + 1) * 4 < vocab * width * sizeof(grad_dtype)
// (the + 1: the ids). Roughly what each rank receives either way.
bool sparse_rows_pay(int64_t rows, int64_t world, int64_t vocab, int64_t width, DType grad_dtype);

class SparseRowsReducer {
 public:
  // table: the embedding's (V, D) F32 parameter on comm.device(); its
  // gradient must be left out of the dense reducer.
  SparseRowsReducer(Collectives& comm, Parameter* table);

  // Before the step's backward: its rows enter weighted by premul.
  void begin_step(double premul);
  // The backward's rows: dy (..., D) for ids (...), both on the device. In a
  // step they are kept for the exchange (the caller must not scatter them)
  // and take returns true; outside a step it returns false and keeps nothing.
  bool take(const Tensor& ids, const Tensor& dy);
  // Once every row of the step was taken (the table's gradient is final):
  // gathers the ids (blocking, on the host) and starts the rows' all-gather.
  void start();
  // Waits for the collectives (Collectives::wait; starts first when start()
  // was not called), then scatter-adds every rank's rows into the table's
  // gradient, which must be zero (the embedding scattered nothing into it).
  void finish();

 private:
  Collectives& comm_;
  Parameter* table_;
  double premul_ = 1.0;
  bool in_step_ = false, started_ = false;
  std::vector<std::pair<Tensor, Tensor>> taken_;  // (ids, dy) of this step
  std::vector<int32_t> ids_;                      // every rank's ids, each rank's padded to the most
  int64_t slot_rows_ = 0;                         // rows per rank in the gathered buffer
  Tensor rows_;                                   // (world * slot_rows_ * D) F32: every rank's scaled rows
};

}  // namespace hg::dist
