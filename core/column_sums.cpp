#include "core/column_sums.hpp"

#include <cstring>
#include <vector>

#include "core/simd.hpp"

namespace hg::cpu {
namespace {

// 4 floats widened to 4 doubles: one ymm on AVX2 and AVX-512, two xmm on
// SSE2. (8 doubles in one 64-byte vector would be one zmm on AVX-512, but
// GCC moves such vectors through the stack in the AVX2 clone, which made it
// slower than SSE2; the sums are bound by reading x anyway.)
typedef float Floats4 __attribute__((vector_size(16)));
typedef double Doubles4 __attribute__((vector_size(32)));
constexpr int64_t kWidth = 4;

HG_SIMD_INLINE Doubles4 widen(const float* p) {
  Floats4 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, Doubles4);
}

HG_SIMD_INLINE Doubles4 load(const double* p) {
  Doubles4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

// A row at a time into the double sums (rows are read whole, in memory
// order, so the hardware prefetchers follow); the full vectors of kWidth
// columns, then the rest. The same additions in the same order in every
// lane, so every clone gives the same bits.
HG_SIMD_CLONES void column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, double scale, float* y) {
  std::vector<double> sums(static_cast<size_t>(cols));
  double* acc = sums.data();
  const int64_t full = cols / kWidth * kWidth;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * ld;
    if (i == 0) {
      for (int64_t j = 0; j < full; j += kWidth) {
        const Doubles4 v = widen(row + j);
        std::memcpy(acc + j, &v, sizeof v);
      }
      for (int64_t j = full; j < cols; ++j) acc[j] = static_cast<double>(row[j]);
      continue;
    }
    for (int64_t j = 0; j < full; j += kWidth) {
      const Doubles4 v = load(acc + j) + widen(row + j);
      std::memcpy(acc + j, &v, sizeof v);
    }
    for (int64_t j = full; j < cols; ++j) acc[j] += static_cast<double>(row[j]);
  }
  for (int64_t j = 0; j < full; j += kWidth) {
    const Floats4 out = __builtin_convertvector(load(acc + j) * scale, Floats4);
    std::memcpy(y + j, &out, sizeof out);
  }
  for (int64_t j = full; j < cols; ++j) y[j] = static_cast<float>(acc[j] * scale);
}

}  // namespace hg::cpu
