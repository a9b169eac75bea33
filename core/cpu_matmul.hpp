#pragma once
// The CPU backend's (batched) matmul on the threads: tiles fixed by the
// shape, packed operands shared by the tiles (core/cpu_matmul.cpp).
#include <cstdint>

#include "core/matmul_shape.hpp"

namespace hg::cpu {

// C [+]= op(A) op(B) for every batch entry; results do not depend on the thread count.
template <class T>
void matmul(const T* a, const T* b, T* c, const MatmulShape& s, bool transpose_a, bool transpose_b, bool accumulate);

}  // namespace hg::cpu
