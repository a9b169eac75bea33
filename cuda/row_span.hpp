#pragma once
// How the staged row pass (cuda/cross_entropy_lse.cu) splits a row at
// 16-byte boundaries: [0, head) and [body_end, n) an element at a time,
// [head, body_end) in whole 16-byte words. Plain C++ shared by the kernel and
// the host, so tests/test_cross_entropy_lse.cpp checks the split on the CPU.
#include <cstdint>

#if defined(__CUDACC__)
#define HG_ROW_SPAN_FN __host__ __device__ inline
#else
#define HG_ROW_SPAN_FN inline
#endif

namespace hg::gpu {

struct RowSpan {
  int64_t head, body_end;
};

// A row of n elements of elem_bytes (a power of two up to 16) starting at
// byte address `address` (a multiple of elem_bytes).
HG_ROW_SPAN_FN RowSpan row_span(uint64_t address, int64_t n, int64_t elem_bytes) {
  const int64_t per_word = 16 / elem_bytes;
  const int64_t misaligned = static_cast<int64_t>(address % 16) / elem_bytes;
  const int64_t to_boundary = misaligned == 0 ? 0 : per_word - misaligned;
  const int64_t head = to_boundary < n ? to_boundary : n;
  return {head, head + (n - head) / per_word * per_word};
}

// Shared memory for one staged row of n elements: the copy sits at the row's
// own address mod 16 (so its words are aligned where the row's are), and
// ends within its last 16-byte word.
HG_ROW_SPAN_FN uint64_t staged_row_bytes(int64_t n, int64_t elem_bytes) {
  return static_cast<uint64_t>((n * elem_bytes + 15) / 16 * 16 + 16);
}

}  // namespace hg::gpu

#undef HG_ROW_SPAN_FN
