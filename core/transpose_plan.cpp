#include "core/transpose_plan.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"

namespace hg {

TransposePlan transpose_plan(const Shape& x, const Shape& out, int dim0, int dim1, const char* op) {
  const int ndim = static_cast<int>(x.size());
  const int a = normalize_dim(dim0, ndim, op), b = normalize_dim(dim1, ndim, op);
  const int d0 = std::min(a, b), d1 = std::max(a, b);
  Shape expected = x;
  std::swap(expected[d0], expected[d1]);
  HG_CHECK(out == expected, op, "out shape ", out, " should be ", expected, " for x ", x, " with dims ", d0, " and ",
           d1, " swapped");
  TransposePlan p;
  for (int i = 0; i < d0; ++i) p.A *= x[i];
  for (int i = d0 + 1; i < d1; ++i) p.M *= x[i];
  for (int i = d1 + 1; i < ndim; ++i) p.B *= x[i];
  p.n0 = x[d0];
  p.n1 = x[d1];
  // The memory order stays when at most one of n0, M, n1 exceeds 1: (1, M, n1) -> (n1, M, 1) moves
  // every element unless M or n1 is 1.
  p.plain_copy = d0 == d1 || (p.n0 == 1 && p.n1 == 1) || ((p.n0 == 1 || p.n1 == 1) && p.M == 1);
  return p;
}

}  // namespace hg
