#pragma once
// Column sums of a float32 matrix in double, the reduction over a leading
// dim (a Linear's bias gradient: the sums of dy's rows). Vectorised and
// dispatched per ISA like core/cpu_math.hpp, with the same bits as the
// scalar definition on every ISA: each column is added row after row in
// double, then scaled and rounded to float once.
#include <cstdint>

namespace hg::cpu {

// y[j] = float(scale * (x[0][j] + x[1][j] + ... + x[rows-1][j])) for
// j < cols, the sum in double in row order; row i starts at x + i * ld.
// rows >= 1. Rows are read whole, in memory order.
void column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, double scale, float* y);

}  // namespace hg::cpu
