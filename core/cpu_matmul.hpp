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

// Whether matmul runs each of `batch` products of m x n x k as one GEMM
// (core/cpu_gemm.hpp) on one thread, the batch entries on the threads, at
// every thread count; otherwise it cuts each product into tiles (on one
// thread, a product without an epilogue still runs whole, with the same
// bits as its tiles).
bool matmul_runs_whole_products(int64_t batch, int64_t m, int64_t n, int64_t k);

// C [+]= op(A) op(B) for every batch entry; results do not depend on the
// thread count. An epilogue needs s.batch == 1.
template <class T>
void matmul(const T* a, const T* b, T* c, const MatmulShape& s, bool transpose_a, bool transpose_b, bool accumulate,
            const MatmulEpilogue<T>* epilogue = nullptr);

}  // namespace hg::cpu
