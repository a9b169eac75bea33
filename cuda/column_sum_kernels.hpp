#pragma once
// Column sums on the GPU (cuda/column_sum.cu): the bias gradients of
// cuda/gemm_lt.cu, and the GELU backward's pass over the dgrad GEMM's output.
// Plain C++; cuda/no_cuda.cpp has the throwing twins.
#include <cstdint>

#include "core/tensor.hpp"

namespace hg::gpu {

// Which kernels sum: one launch of thread-block clusters (sm_90+), or a
// partial-sum kernel and a finishing kernel (any GPU); Auto picks the first
// where it runs.
enum class ColumnSumKernels { Auto, Clusters, TwoPass };

// Whether the cluster kernels run here (an sm_90+ GPU and sm_90 code).
bool column_sum_clusters_run();

// out[j] = sum_{i < rows} x[i * ld + j] for j < cols, or out[j] += that sum
// (accumulate; one addition in float32, then the rounding to out's dtype).
// The sum is float32 in an order fixed by (rows, cols, alignment, kernels):
// the same bits on every run. x: F32 or BF16 CUDA storage from x.raw_data()
// (a view's offset included), ld >= cols; 16-byte loads where x and ld allow,
// element loads otherwise. out: F32 or BF16, (cols,) contiguous, CUDA.
void column_sum(const Tensor& x, int64_t rows, int64_t cols, int64_t ld, const Tensor& out, bool accumulate,
                ColumnSumKernels kernels = ColumnSumKernels::Auto);

// The GELU backward after the plain dgrad GEMM, in one launch: dx = rn(dx *
// gelu'(pre)) in place (rn: to dx's dtype) and, with bias_grad, the column
// sums of that rounded dx written or added (accumulate) as column_sum does.
// dx, pre: (rows, cols) contiguous, one dtype (F32 or BF16); bias_grad:
// F32, or dx's dtype. Needs column_sum_clusters_run().
void gelu_backward_pass(const Tensor& dx, const Tensor& pre, const Tensor* bias_grad, bool accumulate);

}  // namespace hg::gpu
