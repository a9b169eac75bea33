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
};

void gemm(const GemmBlock<float>& g);
void gemm(const GemmBlock<double>& g);

// Levels this build and this CPU can run, slowest first: "baseline" (the
// build's own flags), then "x86-64-v3" and "x86-64-v4" where supported.
std::vector<std::string> gemm_levels();
// The level in use: HG_GEMM_LEVEL when set (one of gemm_levels()), else the
// last of gemm_levels().
std::string gemm_level();
// For tests and benchmarks; hg::Error names the allowed levels.
void set_gemm_level(const std::string& level);

}  // namespace hg::cpu
