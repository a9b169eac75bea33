#pragma once
// The CPU backend's (batched) matmul on the threads: tiles fixed by the
// shape, packed operands shared by the tiles, and an optional epilogue run on
// each finished tile while it is still in cache (core/cpu_matmul.cpp).
#include <cstdint>
#include <functional>

#include "core/matmul_shape.hpp"

namespace hg::cpu {

// Called once per finished tile of batch entry 0..: C rows [r0, r0 + rows),
// columns [c0, c0 + cols) (row-major, leading dimension n). Must touch only
// that tile (tiles run on different threads).
template <class T>
using TileEpilogue = std::function<void(T* c, int64_t ldc, int64_t r0, int64_t rows, int64_t c0, int64_t cols)>;

// C [+]= op(A) op(B) for every batch entry; results do not depend on the thread count.
template <class T>
void matmul(const T* a, const T* b, T* c, const MatmulShape& s, bool transpose_a, bool transpose_b,
            bool accumulate, const TileEpilogue<T>& epilogue = nullptr);

}  // namespace hg::cpu
