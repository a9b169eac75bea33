#pragma once
#include <cstdint>

#include "core/shape.hpp"

namespace hg {

// How every backend swaps two dims of a contiguous tensor. The shape is read
// as (A, n0, M, n1, B): A the dims before the first swapped one, M those
// between, B those after. Element (a, i, m, j, b) of x goes to (a, j, m, i, b)
// of out. When at most one of n0, M, n1 exceeds 1 (a swapped dim of size 1
// next to the other, both of size 1, or a dim with itself), memory order does
// not change and the transpose is a plain copy.
struct TransposePlan {
  int64_t A = 1, n0 = 1, M = 1, n1 = 1, B = 1;
  bool plain_copy = false;
};

// Throws hg::Error naming `op`, the shapes and the dims when a dim is out of
// range or `out` does not have x's shape with the two dims swapped.
TransposePlan transpose_plan(const Shape& x, const Shape& out, int dim0, int dim1, const char* op);

}  // namespace hg
