#pragma once
#include <cstdint>

#include "core/shape.hpp"

namespace hg {

// The shape bookkeeping of a (batched) matmul, shared by tensor_functions and
// every backend so they agree on what is legal:
// op(a) is (..., m, k), op(b) is (..., k, n) or 2-D (k, n) shared by all batches.
struct MatmulShape {
  int64_t batch = 1;  // product of a's leading (batch) dims
  int64_t m = 0, k = 0, n = 0;
  bool b_shared = false;  // b is 2-D while a has batch dims
  Shape out;              // a's leading dims + (m, n)
};

// Throws hg::Error naming `op` and both shapes when the operands do not fit.
MatmulShape matmul_shape(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b, const char* op);

}  // namespace hg
