#pragma once
#include <cstdint>
#include <functional>
#include <utility>

#include "core/indexing.hpp"
#include "core/module.hpp"
#include "core/random.hpp"

namespace hg {

// Token embedding plus a learned position embedding:
//   out[b, t, :] = token.weight[ids[b, t], :] + position.weight[t, :]
// ids is (B, T) of integer token ids stored as F32, on the module's device.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab_size, int64_t max_positions, int64_t dim, Generator& gen, DType dtype = DType::F32,
            double init_std = 0.02);

  // (B, T) -> (B, T, dim) in the tables' dtype, or in out_dtype: BF16 for
  // F32 tables gives a bf16 residual stream its input in the same pass
  // (ops/embedding.hpp).
  Tensor forward(const Tensor& ids);
  Tensor forward(const Tensor& ids, DType out_dtype);
  // For inference: positions start..start+T-1 (a key/value cache's next
  // positions), nothing kept for a backward. forward() is apply(ids, 0).
  Tensor apply(const Tensor& ids, int64_t start);
  Tensor apply(const Tensor& ids, int64_t start, DType out_dtype);
  // Accumulates into both tables; ids are not differentiable, so nothing is
  // returned. dy in the tables' dtype, or BF16 for F32 tables.
  void backward(const Tensor& dy);

  Parameter token;     // (vocab, dim)
  Parameter position;  // (max_positions, dim)

  // Where ids are checked (core/indexing.hpp): on the host (default), or on
  // the device while TrainStep captures a CUDA graph (it checks each batch
  // on the host before copying it in).
  void set_id_check(IdCheck check) { id_check_ = check; }

  // Data parallelism may reduce the token table's gradient by its rows
  // (dist/sparse_rows.hpp): backward() first offers (ids, dy) to the sink;
  // when it returns true it has taken them and the rows are not scattered
  // into token.grad here. Null (the default): always scattered here.
  using TokenRowsSink = std::function<bool(const Tensor& ids, const Tensor& dy)>;
  void set_token_rows_sink(TokenRowsSink sink) { token_rows_sink_ = std::move(sink); }

 private:
  Tensor ids_;  // saved by forward
  IdCheck id_check_ = IdCheck::Host;
  TokenRowsSink token_rows_sink_;
};

}  // namespace hg
