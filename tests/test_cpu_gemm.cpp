// The CPU GEMM's run-time levels (core/cpu_gemm.hpp): every level compiled
// (baseline, x86-64-v3[-hg], x86-64-v4[-hg]) that this CPU runs is checked
// against a float64 triple loop within the worst-case rounding bound, on odd
// sizes, every transpose mode, strided blocks, alpha and accumulation; the
// levels are shown to be really distinct code; bad level names are refused.
// The backend's tiled matmul over packed panels gets the same float64 check,
// and so does handgrad's own kernel in both its shapes, on any CPU.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_gemm.hpp"
#include "core/cpu_matmul.hpp"
#include "core/error.hpp"
#include "core/isa/sgemm_kernel.hpp"
#include "core/random.hpp"
#include "tests/catch.hpp"

namespace {

using hg::cpu::GemmBlock;
using hg::cpu::PackedGemm;

// Restores the level a test changed.
struct LevelScope {
  std::string saved = hg::cpu::gemm_level();
  ~LevelScope() { hg::cpu::set_gemm_level(saved); }
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  hg::Generator g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(g.normal());
  return v;
}

struct Problem {
  int64_t rows, cols, depth;
  bool ta, tb;
  int64_t pad;  // extra elements per row of every stored matrix: lda, ldb, ldc > the width
};

// Operands stored with leading dimensions wider than the matrices.
struct Operands {
  Problem p;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c0;
  explicit Operands(const Problem& q, uint64_t seed) : p(q) {
    lda = (q.ta ? q.rows : q.depth) + q.pad;
    ldb = (q.tb ? q.depth : q.cols) + q.pad;
    ldc = q.cols + q.pad;
    a = random_floats(static_cast<size_t>((q.ta ? q.depth : q.rows) * lda), seed);
    b = random_floats(static_cast<size_t>((q.tb ? q.cols : q.depth) * ldb), seed + 1);
    c0 = random_floats(static_cast<size_t>(q.rows * ldc), seed + 2);
  }
  float A(int64_t i, int64_t l) const { return p.ta ? a[l * lda + i] : a[i * lda + l]; }
  float B(int64_t l, int64_t j) const { return p.tb ? b[j * ldb + l] : b[l * ldb + j]; }

  std::vector<float> run(float alpha, bool accumulate) const {
    std::vector<float> c = c0;
    GemmBlock<float> g;
    g.rows = p.rows, g.cols = p.cols, g.depth = p.depth;
    g.a = a.data(), g.lda = lda, g.transpose_a = p.ta;
    g.b = b.data(), g.ldb = ldb, g.transpose_b = p.tb;
    g.c = c.data(), g.ldc = ldc;
    g.alpha = alpha, g.accumulate = accumulate;
    hg::cpu::gemm(g);
    return c;
  }

  // The backend's tiled matmul (core/cpu_matmul.hpp: shared packed panels, depth blocks); needs pad 0.
  std::vector<float> run_tiled(bool accumulate) const {
    std::vector<float> c = c0;
    hg::MatmulShape s;
    s.m = p.rows, s.n = p.cols, s.k = p.depth;
    hg::cpu::matmul(a.data(), b.data(), c.data(), s, p.ta, p.tb, accumulate);
    return c;
  }
};

// Every element within gamma_(k+3) * (|alpha| sum |a||b| + |c0| + |bias|)
// of the float64 result: the worst-case bound of any summation order, FMA or
// not (k products and k-1 additions, one product with alpha, one addition of
// c0, one of the bias). The padding between rows must be left alone.
void check_against_float64(const Operands& o, float alpha, bool accumulate, const std::vector<float>& c,
                           const float* bias = nullptr) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = (o.p.depth + 3) * u / (1 - (o.p.depth + 3) * u);
  int64_t bad = 0;
  for (int64_t i = 0; i < o.p.rows; ++i)
    for (int64_t j = 0; j < o.ldc; ++j) {
      const float got = c[static_cast<size_t>(i * o.ldc + j)], before = o.c0[static_cast<size_t>(i * o.ldc + j)];
      if (j >= o.p.cols) {
        bad += std::memcmp(&got, &before, sizeof got) != 0;
        continue;
      }
      double exact = 0, size = 0;
      for (int64_t l = 0; l < o.p.depth; ++l) {
        exact += double(o.A(i, l)) * o.B(l, j);
        size += std::abs(double(o.A(i, l)) * o.B(l, j));
      }
      exact *= alpha;
      size *= std::abs(alpha);
      if (accumulate) exact += before, size += std::abs(before);
      if (bias) exact += bias[j], size += std::abs(bias[j]);
      bad += !(std::abs(got - exact) <= gamma * size);
    }
  CHECK(bad == 0);
}

// handgrad's float32 kernel shape `Kernel` (core/isa/sgemm_kernel.hpp),
// compiled here at the test's own level: C cut into 2 x 2 tiles at odd
// offsets, each tile packed and multiplied per depth block, as
// core/cpu_matmul.cpp drives it.
template <class Kernel>
std::vector<float> run_kernel_tiles(const Operands& o, float alpha, bool accumulate, const float* bias) {
  const PackedGemm<float> k = Kernel::table();
  std::vector<float> c = o.c0;
  GemmBlock<float> g;
  g.rows = o.p.rows, g.cols = o.p.cols, g.depth = o.p.depth;
  g.a = o.a.data(), g.lda = o.lda, g.transpose_a = o.p.ta;
  g.b = o.b.data(), g.ldb = o.ldb, g.transpose_b = o.p.tb;
  g.c = c.data(), g.ldc = o.ldc, g.alpha = alpha, g.accumulate = accumulate, g.bias = bias;
  const int64_t kc_max = k.depth_block(g.rows, g.cols, g.depth), r_split = g.rows / 2 + 1, c_split = g.cols / 3 + 1;
  std::vector<float> rows(static_cast<size_t>((g.rows + k.row_multiple) * kc_max)),
      cols(static_cast<size_t>((g.cols + k.col_multiple) * kc_max));
  for (int64_t r0 : {int64_t(0), r_split})
    for (int64_t c0 : {int64_t(0), c_split}) {
      const int64_t nr = std::min(g.rows, r0 == 0 ? r_split : g.rows) - r0;
      const int64_t nc = std::min(g.cols, c0 == 0 ? c_split : g.cols) - c0;
      if (nr <= 0 || nc <= 0) continue;
      for (int64_t k0 = 0; k0 < g.depth; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, g.depth - k0);
        k.pack_rows(g, k0, kc, r0, nr, rows.data());
        k.pack_cols(g, k0, kc, c0, nc, cols.data());
        k.multiply(g, kc, r0, nr, c0, nc, rows.data(), cols.data(), k0 == 0, k0 + kc == g.depth);
      }
    }
  return c;
}

const std::vector<Problem> kProblems = {
    {1, 1, 1, false, false, 0},    {7, 5, 3, false, false, 0},     {33, 17, 65, false, true, 3},
    {65, 129, 31, true, false, 1}, {50, 70, 300, true, true, 5},   {130, 3, 257, false, false, 2},
    {2, 200, 9, true, true, 0},    {64, 128, 704, true, false, 0}, {48, 16, 1, false, true, 7},
};

}  // namespace

TEST_CASE("every CPU GEMM level matches float64 within the rounding bound", "[cpu_gemm]") {
  LevelScope scope;
  const std::vector<std::string> levels = hg::cpu::gemm_levels();
  REQUIRE(!levels.empty());
  CHECK(levels.front() == "baseline");
  INFO("levels on this machine: " << levels.size());
  for (const std::string& level : levels) {
    hg::cpu::set_gemm_level(level);
    CHECK(hg::cpu::gemm_level() == level);
    for (const Problem& p : kProblems)
      for (bool accumulate : {false, true})
        for (float alpha : {1.0f, -0.375f}) {
          INFO(level << ": " << p.rows << "x" << p.cols << "x" << p.depth << " ta " << p.ta << " tb " << p.tb << " pad "
                     << p.pad << " accumulate " << accumulate << " alpha " << alpha);
          const Operands o(p, 17);
          check_against_float64(o, alpha, accumulate, o.run(alpha, accumulate));
        }
  }
}

TEST_CASE("handgrad's float32 kernel, AVX-512 and AVX2 shapes, matches float64 on any CPU", "[cpu_gemm]") {
  // The shapes the x86-64-v4-hg and x86-64-v3-hg levels run (W = 16, MR = 8; W = 8,
  // MR = 6), here in plain vector code: packing, edges and tile offsets are
  // checked on every CPU, also one without AVX-512. Depth 300 and 704 span
  // several depth blocks.
  for (const Problem& p : kProblems)
    for (bool accumulate : {false, true})
      for (float alpha : {1.0f, -0.375f}) {
        INFO(p.rows << "x" << p.cols << "x" << p.depth << " ta " << p.ta << " tb " << p.tb << " pad " << p.pad
                    << " accumulate " << accumulate << " alpha " << alpha);
        const Operands o(p, 29);
        const std::vector<float> bias = random_floats(static_cast<size_t>(p.cols), 31);
        using Avx512 = hg::cpu::isa::Sgemm<16, 8>;
        using Avx2 = hg::cpu::isa::Sgemm<8, 6>;
        check_against_float64(o, alpha, accumulate, run_kernel_tiles<Avx512>(o, alpha, accumulate, nullptr));
        check_against_float64(o, alpha, accumulate, run_kernel_tiles<Avx2>(o, alpha, accumulate, nullptr));
        // With a bias added after the last depth block.
        check_against_float64(o, alpha, accumulate, run_kernel_tiles<Avx512>(o, alpha, accumulate, bias.data()),
                              bias.data());
        check_against_float64(o, alpha, accumulate, run_kernel_tiles<Avx2>(o, alpha, accumulate, bias.data()),
                              bias.data());
      }
}

TEST_CASE("the tiled matmul matches float64 within the rounding bound at every level", "[cpu_gemm]") {
  LevelScope scope;
  // Tiled shapes (over 2^17 flops) with ragged edge tiles, every transpose
  // mode, and depths over every level's depth block.
  const std::vector<Problem> problems = {{300, 257, 70, false, false, 0},
                                         {96, 64, 2048, true, false, 0},
                                         {129, 200, 64, false, true, 0},
                                         {200, 129, 1500, true, true, 0},
                                         {512, 384, 128, false, true, 0}};
  for (const std::string& level : hg::cpu::gemm_levels()) {
    hg::cpu::set_gemm_level(level);
    for (const Problem& p : problems)
      for (bool accumulate : {false, true}) {
        INFO(level << ": " << p.rows << "x" << p.cols << "x" << p.depth << " ta " << p.ta << " tb " << p.tb
                   << " accumulate " << accumulate);
        const Operands o(p, 23);
        check_against_float64(o, 1.0f, accumulate, o.run_tiled(accumulate));
      }
  }
}

TEST_CASE("a GEMM level gives the same bits every call; levels are distinct code", "[cpu_gemm]") {
  LevelScope scope;
  const Operands o({67, 45, 129, false, true, 0}, 3);
  std::vector<std::vector<float>> results;
  for (const std::string& level : hg::cpu::gemm_levels()) {
    hg::cpu::set_gemm_level(level);
    const std::vector<float> first = o.run(1.0f, false);
    CHECK(o.run(1.0f, false) == first);
    results.push_back(first);
  }
  // x86-64-v3 and -v4 use FMA, the baseline does not: over 3015 sums of 129
  // products some must round differently. Equal bits would mean the linker
  // merged the copies and every level runs the same code.
  for (size_t i = 1; i < results.size(); ++i) CHECK(results[i] != results[0]);
  if (results.size() == 1) WARN("only the baseline GEMM level runs here: the levels' distinctness is not checked");
}

TEST_CASE("set_gemm_level refuses unknown levels, naming the allowed ones", "[cpu_gemm]") {
  LevelScope scope;
  const std::string before = hg::cpu::gemm_level();
  try {
    hg::cpu::set_gemm_level("x86-64-v9");
    FAIL("no error");
  } catch (const hg::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("'x86-64-v9'") != std::string::npos);
    CHECK(msg.find("allowed baseline") != std::string::npos);
  }
  CHECK(hg::cpu::gemm_level() == before);
}
