#pragma once
// The GELU backward GEMM on Hopper's own instructions
// (cuda/gelu_backward_gemm.cu, sm_90a wgmma + TMA): what cuda/gemm_lt.cu
// runs for a bf16 GeluBackward where it applies, in place of cuBLASLt's
// DGELU epilogue and the column-sum pass after it (docs/gemm.md, "The GELU
// backward on wgmma"). Plain C++; cuda/no_cuda.cpp has the throwing twins.
#include <cstdint>

namespace hg::gpu {

// Whether GeluBackward GEMMs may take the wgmma kernel where it applies (on
// by default). Off sends every call to cuBLASLt: the tests and bench_gemm
// compare the two.
void allow_wgmma_gelu_backward(bool allowed);

// How many GEMMs the wgmma kernel has run in this process (tests check
// that a call took it).
int64_t wgmma_gelu_backward_runs();

// Whether out = (dy W) * gelu'(pre) with dy [m][k], W [k][n], pre and out
// [m][n] (bf16, rows contiguous) can run on the wgmma kernel: allowed, the
// library holds its sm_90a code, the device is compute capability 9.0, the
// driver has cuTensorMapEncodeTiled, n and k multiples of 8, every base
// 16-byte aligned, m within the grid's 65535 block rows.
bool gelu_backward_wgmma_applies(const void* dy, const void* w, const void* pre, const void* out, int64_t m, int64_t n,
                                 int64_t k);

// Runs it on stream(): out as above, and for each block row of 128 rows
// of out its column sums of the rounded out values (col_sums, f32
// [ceil(m / 128)][n]; null: none), in a fixed order.
void gelu_backward_wgmma(const void* dy, const void* w, const void* pre, void* out, float* col_sums, int64_t m,
                         int64_t n, int64_t k);

// Rows of column sums gelu_backward_wgmma writes for m rows.
int64_t gelu_backward_wgmma_sum_rows(int64_t m);

}  // namespace hg::gpu
