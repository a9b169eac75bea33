#pragma once
// Column sums on the GPU (cuda/column_sum.cu): the bias gradients of
// cuda/gemm_lt.cu.
// Plain C++; cuda/no_cuda.cpp has the throwing twins.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::gpu {

// out[j] = sum_{i < rows} x[i * ld + j] for j < cols, or out[j] += that sum
// (accumulate; one addition in float32, then the rounding to out's dtype).
// The sum is float32 in an order fixed by (rows, cols):
// the same bits on every run. x: F32 or BF16 CUDA storage from x.raw_data()
// (a view's offset included), ld >= cols. out: F32 or BF16, (cols,) contiguous, CUDA.
void column_sum(const Tensor& x, int64_t rows, int64_t cols, int64_t ld, const Tensor& out, bool accumulate);

}  // namespace hg::gpu
