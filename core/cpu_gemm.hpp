#pragma once
// The CPU backend's single-threaded GEMM: Eigen's product compiled once per
// x86-64 level (core/isa/gemm_level.cpp: baseline, x86-64-v3 = AVX2+FMA,
// x86-64-v4 = AVX-512) and picked at run time from what the CPU supports, so
// a portable binary still gets FMA and wide vectors (docs/cpu.md).
// The levels round differently (FMA, vector width); one level gives the same
// bits for the same shapes every time, which is what the thread-count
// guarantee rests on.
#include <cstdint>
#include <string>
#include <vector>

namespace hg::cpu {

// C = [C +] alpha op(A) op(B): op(A) is rows x depth, op(B) depth x cols,
// every matrix row-major with the given leading dimension (elements).
template <class T>
struct GemmBlock {
  int64_t rows = 0, cols = 0, depth = 0;
  const T* a = nullptr;
  int64_t lda = 0;
  bool transpose_a = false;
  const T* b = nullptr;
  int64_t ldb = 0;
  bool transpose_b = false;
  T* c = nullptr;
  int64_t ldc = 0;
  T alpha = 1;
  bool accumulate = false;
  const T* bias = nullptr;  // cols values added to every row of C after the product
};

void gemm(const GemmBlock<float>& g);
void gemm(const GemmBlock<double>& g);

// One product cut into tiles that share packed operands: op(A)'s rows and
// op(B)'s columns are packed once per depth block (of depth_block() rows of
// the k dim) instead of once per tile, and each tile multiplies its panels.
// The k-order of an element depends on the product's shape and the tile
// holding it, never on which thread packs or multiplies (core/cpu_matmul.cpp
// runs the phases). g.rows/cols/depth are the whole product's; a packed block
// of `rows` (`cols`) takes round_up(rows, row_multiple) * kc
// (round_up(cols, col_multiple) * kc) elements, 64-byte aligned.
template <class T>
struct PackedGemm {
  int64_t (*depth_block)(int64_t rows, int64_t cols, int64_t depth);
  // op(A) rows [r0, r0 + rows) x depth [k0, k0 + kc) into `packed`.
  void (*pack_rows)(const GemmBlock<T>& g, int64_t k0, int64_t kc, int64_t r0, int64_t rows, T* packed);
  // op(B) depth [k0, k0 + kc) x columns [c0, c0 + cols) into `packed`.
  void (*pack_cols)(const GemmBlock<T>& g, int64_t k0, int64_t kc, int64_t c0, int64_t cols, T* packed);
  // C tile += alpha * (packed rows) * (packed cols). `first`: the tile's
  // first depth block, where C is overwritten unless g.accumulate; `last`:
  // its last, after which g.bias (when set) is added to the tile's rows.
  void (*multiply)(const GemmBlock<T>& g, int64_t kc, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                   const T* packed_rows, const T* packed_cols, bool first, bool last);
  int64_t row_multiple = 1, col_multiple = 1;  // the packers pad rows (columns) to a multiple of these
};

// The current level's (HG_GEMM_LEVEL, set_gemm_level).
const PackedGemm<float>& packed_gemm_f32();
const PackedGemm<double>& packed_gemm_f64();

// Levels this build and this CPU can run, slowest first: "baseline" (the
// build's own flags), then "x86-64-v3-hg", "x86-64-v3", "x86-64-v4-hg"
// and "x86-64-v4" where supported. float32 runs Eigen's kernel at
// "x86-64-v3" and "x86-64-v4", handgrad's (core/isa/sgemm_kernel.hpp) at
// "x86-64-v3-hg" and "x86-64-v4-hg".
std::vector<std::string> gemm_levels();
// The level in use: HG_GEMM_LEVEL when set (one of gemm_levels()), else the
// last of gemm_levels().
std::string gemm_level();
// For tests and benchmarks; hg::Error names the allowed levels.
void set_gemm_level(const std::string& level);

}  // namespace hg::cpu
