#pragma once
// The CPU backend's (batched) matmul on the threads: tiles fixed by the
// shape, packed operands shared by the tiles (core/cpu_matmul.cpp).
#include <cstdint>
#include <functional>

#include "core/matmul_shape.hpp"

namespace hg::cpu {

// What a 2-D matmul does to C while each tile of it is still in cache, so
// the GEMM epilogues need no pass of their own over C: `bias` (n values) is
// added to every row, then finish(r0, rows, c0, cols) runs on the finished
// tile. Tiles are fixed by the shape, so the results still do not depend on
// the thread count.
template <class T>
struct MatmulEpilogue {
  const T* bias = nullptr;
  std::function<void(int64_t r0, int64_t rows, int64_t c0, int64_t cols)> finish;
};

// C [+]= op(A) op(B) for every batch entry; results do not depend on the
// thread count. An epilogue needs s.batch == 1.
template <class T>
void matmul(const T* a, const T* b, T* c, const MatmulShape& s, bool transpose_a, bool transpose_b, bool accumulate,
            const MatmulEpilogue<T>* epilogue = nullptr);

}  // namespace hg::cpu
