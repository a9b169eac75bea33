#include "core/cpu_gemm.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "core/aligned_scratch.hpp"
#include "core/error.hpp"
#include "core/isa/gemm_level.hpp"

namespace hg::cpu {
namespace {

using isa::GemmKernels;

// Whether the CPU (and the OS, which must save the wide registers) runs code
// built for these levels. GCC checks the whole level; clang 14 knows only
// single features, of which these are the ones the GEMM's code needs.
[[maybe_unused]] bool cpu_runs_v3() {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("x86-64-v3");
#else
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
#endif
}

[[maybe_unused]] bool cpu_runs_v4() {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("x86-64-v4");
#else
  return cpu_runs_v3() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
#endif
}

// HG_GEMM_PER_LEVEL: core/CMakeLists.txt built the x86-64-v3 and -v4 objects.
// Each FMA level comes twice, handgrad's float32 kernel ("-hg") first:
// the last is the default.
std::vector<GemmKernels> available() {
  std::vector<GemmKernels> levels{isa::gemm_baseline()};
#if defined(HG_GEMM_PER_LEVEL)
  __builtin_cpu_init();
  if (cpu_runs_v3()) levels.insert(levels.end(), {isa::gemm_x86_64_v3_hg(), isa::gemm_x86_64_v3()});
  if (cpu_runs_v4()) levels.insert(levels.end(), {isa::gemm_x86_64_v4_hg(), isa::gemm_x86_64_v4()});
#endif
  return levels;
}

const std::vector<GemmKernels>& levels() {
  static const std::vector<GemmKernels> all = available();
  return all;
}

std::string allowed_levels() {
  std::string s;
  for (const GemmKernels& k : levels()) s += (s.empty() ? "" : ", ") + std::string(k.level);
  return s;
}

const GemmKernels* find_level(const std::string& name, const char* who) {
  for (const GemmKernels& k : levels())
    if (name == k.level) return &k;
  fail(who, "'", name, "' is not a GEMM level this build runs on this CPU: allowed ", allowed_levels());
}

const GemmKernels* initial_level() {
  const char* env = std::getenv("HG_GEMM_LEVEL");
  if (env != nullptr && *env != '\0') return find_level(env, "HG_GEMM_LEVEL");
  return &levels().back();
}

std::atomic<const GemmKernels*>& current() {
  static std::atomic<const GemmKernels*> k{initial_level()};
  return k;
}

// One whole product through a level's packed pieces, on the calling thread:
// per depth block, all of op(A) and op(B) packed, then one multiply.
void packed_whole(const PackedGemm<float>& p, const GemmBlock<float>& g) {
  if (g.rows == 0 || g.cols == 0) return;
  if (g.depth == 0) {  // no product: C = [C +] bias
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t j = 0; j < g.cols; ++j)
        g.c[r * g.ldc + j] = (g.accumulate ? g.c[r * g.ldc + j] : 0.f) + (g.bias ? g.bias[j] : 0.f);
    return;
  }
  const int64_t kc_max = std::min(g.depth, p.depth_block(g.rows, g.cols, g.depth));
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  thread_local AlignedScratch row_scratch, col_scratch;
  float* rows = static_cast<float*>(row_scratch.get(sizeof(float) * round_up(g.rows, p.row_multiple) * kc_max));
  float* cols = static_cast<float*>(col_scratch.get(sizeof(float) * round_up(g.cols, p.col_multiple) * kc_max));
  for (int64_t k0 = 0; k0 < g.depth; k0 += kc_max) {
    const int64_t kc = std::min(kc_max, g.depth - k0);
    p.pack_rows(g, k0, kc, 0, g.rows, rows);
    p.pack_cols(g, k0, kc, 0, g.cols, cols);
    p.multiply(g, kc, 0, g.rows, 0, g.cols, rows, cols, k0 == 0, k0 + kc == g.depth);
  }
}

}  // namespace

void gemm(const GemmBlock<float>& g) {
  const GemmKernels* k = current().load(std::memory_order_relaxed);
  if (k->f32 != nullptr) k->f32(g);
  else packed_whole(k->packed_f32, g);
}
void gemm(const GemmBlock<double>& g) { current().load(std::memory_order_relaxed)->f64(g); }

const PackedGemm<float>& packed_gemm_f32() { return current().load(std::memory_order_relaxed)->packed_f32; }
const PackedGemm<double>& packed_gemm_f64() { return current().load(std::memory_order_relaxed)->packed_f64; }

std::vector<std::string> gemm_levels() {
  std::vector<std::string> names;
  for (const GemmKernels& k : levels()) names.push_back(k.level);
  return names;
}

std::string gemm_level() { return current().load()->level; }

void set_gemm_level(const std::string& level) { current().store(find_level(level, "set_gemm_level")); }

}  // namespace hg::cpu
