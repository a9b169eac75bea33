#pragma once
// handgrad's own float32 GEMM for the FMA levels (core/isa/gemm_level.cpp
// builds it for x86-64-v3 with W = 8, for x86-64-v4 with W = 16): the
// PackedGemm pieces of core/cpu_gemm.hpp, a register-blocked micro-kernel
// over packed panels, as BLIS and oneDNN do. Eigen 3.4's kernel keeps 12 of
// AVX-512's 32 vector registers as accumulators (48 x 4 blocks); this one
// holds an MR x 2W block of C, MR = 8 on AVX-512 (16 accumulators) and 6 on
// AVX2 (12 of its 16 registers).
//
// Everything here has internal linkage: each level's object keeps its own
// copy (the CTest gemm_level_symbols checks). W and MR are template
// parameters, so tests/test_cpu_gemm.cpp also builds the AVX-512 shape at
// the test's own level and checks it against float64 on any CPU.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu_gemm.hpp"

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace hg::cpu::isa {
namespace {

// Panels: op(A)'s rows in micro-panels of MR rows, k-major (the MR values of
// one k side by side), zero-padded to MR rows; op(B)'s columns in
// micro-panels of NR = 2W columns, k-major, zero-padded to NR columns. A
// packed block of `rows` x kc takes round_up(rows, MR) * kc floats.
template <int W, int MR>
struct Sgemm {
  typedef float Vec __attribute__((vector_size(W * sizeof(float))));
  static constexpr int NR = 2 * W;
  // The depth block: a B micro-panel (kc x NR) stays in L1 while the A
  // micro-panels stream past it (16 KiB at W = 16, 8 KiB at W = 8).
  static constexpr int64_t kDepthBlock = W == 16 ? 128 : 256;

  static Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
  static Vec splat(float x) {  // one broadcast (Vec{} + x would add 0 first)
    float lanes[W];
    for (float& l : lanes) l = x;
    return load(lanes);
  }
  // acc + a * b, one rounding where the level has FMA.
  static Vec fma(Vec a, Vec b, Vec acc) {
#if defined(__AVX512F__)
    if constexpr (W == 16) return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#endif
#if defined(__FMA__)
    if constexpr (W == 8) return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#endif
    return acc + a * b;
  }

  static int64_t depth_block(int64_t, int64_t, int64_t) { return kDepthBlock; }

  // Rows [0, 8) of 8 floats at src + i * ld (rows >= n read as zeros) written
  // as 8 columns: dst + j * stride receives column j. Three rounds of
  // shuffles, as the classic 8 x 8 AVX transpose (the packers' transposes).
  typedef float V8 __attribute__((vector_size(8 * sizeof(float))));
  static void transpose8(const float* src, int64_t ld, int n, float* dst, int64_t stride) {
    V8 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) {
      r[i] = V8{};
      if (i < n) std::memcpy(&r[i], src + i * ld, sizeof(V8));
    }
    for (int i = 0; i < 8; i += 2) {
      t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
      t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
      for (int h = 0; h < 2; ++h) {
        u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
      }
    for (int j = 0; j < 4; ++j) {
      const V8 lo = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
      const V8 hi = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
      std::memcpy(dst + j * stride, &lo, sizeof(V8));
      std::memcpy(dst + (j + 4) * stride, &hi, sizeof(V8));
    }
  }

  // packed[k * width + i] = src[i * ld + k] for i < width (0 for i >= n), k < kc:
  // `width` rows of a row-major block turned k-major.
  template <int width>
  static void transpose_block(const float* src, int64_t ld, int n, int64_t kc, float* packed) {
    int64_t k = 0;
    if constexpr (width % 8 == 0)
      for (; k + 8 <= kc; k += 8)
        for (int i0 = 0; i0 < width; i0 += 8) transpose8(src + i0 * ld + k, ld, n - i0, packed + k * width + i0, width);
    for (; k < kc; ++k)
      for (int i = 0; i < width; ++i) packed[k * width + i] = i < n ? src[i * ld + k] : 0.f;
  }

  // op(A) rows [r0, r0 + rows) x depth [k0, k0 + kc).
  static void pack_rows(const GemmBlock<float>& g, int64_t k0, int64_t kc, int64_t r0, int64_t rows, float* packed) {
    for (int64_t p = 0; p < rows; p += MR, packed += MR * kc) {
      const int n = static_cast<int>(std::min<int64_t>(MR, rows - p));
      if (g.transpose_a) {  // A is depth x rows: MR neighbours per k
        for (int64_t k = 0; k < kc; ++k) {
          const float* src = g.a + (k0 + k) * g.lda + r0 + p;
          float* dst = packed + k * MR;
          for (int i = 0; i < MR; ++i) dst[i] = i < n ? src[i] : 0.f;
        }
      } else {  // A is rows x depth: transposed
        transpose_block<MR>(g.a + (r0 + p) * g.lda + k0, g.lda, n, kc, packed);
      }
    }
  }

  // op(B) depth [k0, k0 + kc) x columns [c0, c0 + cols).
  static void pack_cols(const GemmBlock<float>& g, int64_t k0, int64_t kc, int64_t c0, int64_t cols, float* packed) {
    for (int64_t p = 0; p < cols; p += NR, packed += NR * kc) {
      const int n = static_cast<int>(std::min<int64_t>(NR, cols - p));
      if (!g.transpose_b) {  // B is depth x cols: NR neighbours per k
        for (int64_t k = 0; k < kc; ++k) {
          const float* src = g.b + (k0 + k) * g.ldb + c0 + p;
          float* dst = packed + k * NR;
          if (n == NR) std::memcpy(dst, src, sizeof(float) * NR);
          else
            for (int j = 0; j < NR; ++j) dst[j] = j < n ? src[j] : 0.f;
        }
      } else {  // B is cols x depth: transposed
        transpose_block<NR>(g.b + (c0 + p) * g.ldb + k0, g.ldb, n, kc, packed);
      }
    }
  }

  // C[0..rows) x [0..cols) = alpha * (A micro-panel) (B micro-panel)
  // [+ C unless `overwrite`] [+ bias[0..cols) when bias is set].
  static void kernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int rows, int cols, float alpha,
                     bool overwrite, const float* bias) {
    for (int i = 0; i < rows; ++i) __builtin_prefetch(c + i * ldc, 1, 3);  // C is written after the loop
    Vec acc[MR][2] = {};
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
      const Vec b0 = load(b), b1 = load(b + W);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const Vec ai = splat(a[i]);
        acc[i][0] = fma(ai, b0, acc[i][0]);
        acc[i][1] = fma(ai, b1, acc[i][1]);
      }
    }
    if (rows == MR && cols == NR) {
      finish(acc, alpha, overwrite, bias, c, ldc);
      return;
    }
    edge(acc, alpha, overwrite, bias, c, ldc, rows, cols);
  }

  // An edge block: the same arithmetic on a copy of the valid part.
  __attribute__((noinline)) static void edge(const Vec (&acc)[MR][2], float alpha, bool overwrite, const float* bias,
                                             float* c, int64_t ldc, int rows, int cols) {
    float t[MR][NR] = {}, bias_copy[NR] = {};
    for (int i = 0; i < rows; ++i) std::memcpy(t[i], c + i * ldc, sizeof(float) * cols);
    if (bias) std::memcpy(bias_copy, bias, sizeof(float) * cols);
    finish(acc, alpha, overwrite, bias ? bias_copy : nullptr, t[0], NR);
    for (int i = 0; i < rows; ++i) std::memcpy(c + i * ldc, t[i], sizeof(float) * cols);
  }

  // The MR x NR block at c: alpha acc [+ c] [+ bias], one FMA then one addition.
  static void finish(const Vec (&acc)[MR][2], float alpha, bool overwrite, const float* bias, float* c, int64_t ldc) {
    const Vec va = splat(alpha), zero = {};
    const Vec bias0 = bias ? load(bias) : zero, bias1 = bias ? load(bias + W) : zero;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      Vec c0 = fma(va, acc[i][0], overwrite ? zero : load(c + i * ldc));
      Vec c1 = fma(va, acc[i][1], overwrite ? zero : load(c + i * ldc + W));
      if (bias) c0 += bias0, c1 += bias1;
      store(c + i * ldc, c0);
      store(c + i * ldc + W, c1);
    }
  }

  // C tile [r0, r0 + rows) x [c0, c0 + cols) (+)= alpha * panels: each B
  // micro-panel meets every A micro-panel while it is in L1.
  static void multiply(const GemmBlock<float>& g, int64_t kc, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                       const float* packed_rows, const float* packed_cols, bool first, bool last) {
    const bool overwrite = first && !g.accumulate;
    for (int64_t q = 0; q < cols; q += NR) {
      const float* b = packed_cols + q * kc;
      const float* bias = last && g.bias ? g.bias + c0 + q : nullptr;
      const int nc = static_cast<int>(std::min<int64_t>(NR, cols - q));
      for (int64_t p = 0; p < rows; p += MR)
        kernel(kc, packed_rows + p * kc, b, g.c + (r0 + p) * g.ldc + c0 + q, g.ldc,
               static_cast<int>(std::min<int64_t>(MR, rows - p)), nc, g.alpha, overwrite, bias);
    }
  }

  static PackedGemm<float> table() { return {depth_block, pack_rows, pack_cols, multiply, MR, NR}; }
};

}  // namespace
}  // namespace hg::cpu::isa
