#include "core/matmul_shape.hpp"

#include "core/error.hpp"

namespace hg {

MatmulShape matmul_shape(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b, const char* op) {
  HG_CHECK(a.size() >= 2 && b.size() >= 2, op, "needs operands with at least 2 dims, got a ", a, " and b ", b);
  const size_t ra = a.size(), rb = b.size();
  MatmulShape s;
  s.m = transpose_a ? a[ra - 1] : a[ra - 2];
  const int64_t ka = transpose_a ? a[ra - 2] : a[ra - 1];
  const int64_t kb = transpose_b ? b[rb - 1] : b[rb - 2];
  s.n = transpose_b ? b[rb - 2] : b[rb - 1];
  HG_CHECK(ka == kb, op, "inner dims differ: a ", a, (transpose_a ? " (transposed)" : ""), " has k=", ka, ", b ", b,
           (transpose_b ? " (transposed)" : ""), " has k=", kb);
  s.k = ka;

  if (rb == 2) {
    s.b_shared = ra > 2;
  } else {
    HG_CHECK(rb == ra, op, "batch dims differ: a ", a, " b ", b, " (b must be 2-D or have a's batch dims)");
    for (size_t i = 0; i + 2 < ra; ++i) HG_CHECK(a[i] == b[i], op, "batch dims differ: a ", a, " b ", b);
  }
  s.out.assign(a.begin(), a.end() - 2);
  for (int64_t d : s.out) s.batch *= d;
  s.out.push_back(s.m);
  s.out.push_back(s.n);
  return s;
}

}  // namespace hg
