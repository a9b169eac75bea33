#include "models/embedding.hpp"

#include <string>

#include "core/indexing.hpp"
#include "core/profiler.hpp"
#include "ops/embedding.hpp"

namespace hg {

Embedding::Embedding(int64_t vocab_size, int64_t max_positions, int64_t dim, Generator& gen, DType dtype,
                     double init_std) {
  HG_CHECK(vocab_size > 0 && max_positions > 0 && dim > 0, "Embedding", "sizes must be positive, got vocab ",
           vocab_size, " positions ", max_positions, " dim ", dim);
  register_parameter("token", token, Tensor::randn({vocab_size, dim}, gen, dtype, Device::CPU, 0.0, init_std));
  register_parameter("position", position, Tensor::randn({max_positions, dim}, gen, dtype, Device::CPU, 0.0, init_std));
}

Tensor Embedding::forward(const Tensor& ids) { return forward(ids, token.value.dtype()); }

Tensor Embedding::forward(const Tensor& ids, DType out_dtype) {
  Tensor out = apply(ids, 0, out_dtype);
  ids_ = ids;
  return out;
}

Tensor Embedding::apply(const Tensor& ids, int64_t start) { return apply(ids, start, token.value.dtype()); }

Tensor Embedding::apply(const Tensor& ids, int64_t start, DType out_dtype) {
  const char* op = "Embedding::forward";
  ids.check_defined(op);
  HG_CHECK(ids.ndim() == 2, op, "ids must be (B, T), got ", ids.shape());
  const int64_t t = ids.size(1);
  HG_CHECK(start >= 0, op, "start position must be >= 0, got ", start);
  HG_CHECK(start + t <= position.value.size(0), op, "sequence length ", t, start > 0 ? " after position " : "",
           start > 0 ? std::to_string(start) : "", " exceeds max_positions ", position.value.size(0), " (ids ",
           ids.shape(), ")");
  HG_PROFILE("embedding", ids.device());
  return embedding_forward(token.value, position.value.slice(start, start + t), ids, out_dtype, id_check_);
}

void Embedding::backward(const Tensor& dy) {
  const char* op = "Embedding::backward";
  HG_CHECK(ids_.defined(), op, "backward called before forward");
  const int64_t b = ids_.size(0), t = ids_.size(1), d = token.value.size(1);
  HG_CHECK(dy.shape() == Shape({b, t, d}), op, "dy ", dy.shape(), " must be (B, T, D) = ", Shape({b, t, d}));
  HG_PROFILE("embedding", dy.device());
  // A sink takes the token rows as the tables' dtype.
  const bool sunk = token_rows_sink_ && token_rows_sink_(ids_, dy.to(token.grad.dtype()));
  Tensor position_rows = position.grad.slice(0, t);  // position t's gradient: rows [0, T) of the table
  embedding_backward(dy, ids_, sunk ? nullptr : &token.grad, position_rows, id_check_);
}

}  // namespace hg
