#pragma once
// Which fused LayerNorm kernel runs where: the named kernel configurations
// (LnKernel) and the production table that picks one per memory system,
// pass, dtype and width class; the same for the residual backward's rows
// (LnResidualBackward). Plain C++ (constexpr), so that tests and
// benchmarks can name a configuration and cuda/layernorm.cu compiles exactly
// the kernels this table (and each entry's fallback) can reach.
//
// A configuration applies to 16-byte aligned rows of D <= 16384 (the rows a
// group holds whole); other rows always take the chunked, cluster or scalar
// kernels. Design of each kernel: docs/layernorm.md; measurements and how a
// configuration earns its place here: bench/lab/layernorm.md.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace hg::gpu {

// How a group of threads holds the rows it works on.
enum class LnRows : uint8_t {
  InRegisters,     // loaded straight into registers, one row at a time
  Staged,          // bulk-copied into a ring of shared-memory stages, several rows in flight (sm_90+)
  StagedTwoAStep,  // staged, and two rows taken per step: one group reduction per statistic for both
};

// One kernel configuration. Fields that do not apply to a pass, dtype or
// row holding are ignored there (documented per field).
struct LnKernel {
  LnRows rows = LnRows::InRegisters;
  // Forward, rows in registers: statistics in one pass (sum and sum of
  // squares, with a second pass only where the shift is far from the mean)
  // and y by two FFMAs; bf16 widened by masks, read-only loads.
  bool one_pass_stats = false;
  // Forward, one-pass: bf16 rows held as packed 16-byte words (half the
  // registers), so a group of several warps takes half the threads per row
  // and a block twice the rows.
  bool bf16_packed = false;
  // bf16 rows read 4 elements (8 bytes) at a time instead of 8, so each
  // thread's 16-byte gamma/beta loads are lane-contiguous.
  bool bf16_8_byte_access = false;
  // Warp rows (a group of one warp) read gamma (and, forward, beta) from a
  // copy the block makes in shared memory.
  bool params_in_shared_memory = false;
  // Staged forward: the bytes in flight per SM the ring depth aims at, in KB;
  // 0 for the fewest stages (2). The staged backward sizes its own rings.
  int stage_kb = 64;

  constexpr bool operator==(const LnKernel& o) const {
    return rows == o.rows && one_pass_stats == o.one_pass_stats && bf16_packed == o.bf16_packed &&
           bf16_8_byte_access == o.bf16_8_byte_access && params_in_shared_memory == o.params_in_shared_memory &&
           stage_kb == o.stage_kb;
  }
  constexpr bool operator!=(const LnKernel& o) const { return !(*this == o); }
};

// The configurations production ships (both passes unless named for one).
namespace ln {
constexpr LnKernel rows_of(LnRows rows) {
  LnKernel k;
  k.rows = rows;
  return k;
}
constexpr LnKernel with_8_byte_bf16(LnKernel k) { return k.bf16_8_byte_access = true, k; }
constexpr LnKernel with_params_in_shared_memory(LnKernel k) { return k.params_in_shared_memory = true, k; }

// Rows in registers; the forward takes two-pass statistics.
constexpr LnKernel kInRegisters = rows_of(LnRows::InRegisters);
constexpr LnKernel kInRegisters8ByteBf16 = with_8_byte_bf16(kInRegisters);
// Forward only: one-pass statistics and FFMA normalisation, rows in registers.
constexpr LnKernel kOnePass = [] {
  LnKernel k;
  k.one_pass_stats = true;
  return k;
}();
constexpr LnKernel kOnePassPackedBf16 = [] {
  LnKernel k = kOnePass;
  k.bf16_packed = true;
  return k;
}();
constexpr LnKernel kOnePassPackedBf16SharedParams = with_params_in_shared_memory(kOnePassPackedBf16);
// Rows staged in shared memory by bulk copies (sm_90+).
constexpr LnKernel kStaged = rows_of(LnRows::Staged);
constexpr LnKernel kStaged8ByteBf16 = with_8_byte_bf16(kStaged);
// Staged with the parameters from shared memory on warp rows; the forward
// keeps the fewest stages (a third stage cost bf16 rows of 384-512 elements
// 4-9% on an H100).
constexpr LnKernel kStagedSharedParams = [] {
  LnKernel k = with_params_in_shared_memory(kStaged);
  k.stage_kb = 0;
  return k;
}();
// Forward only: staged, two rows a step.
constexpr LnKernel kStagedTwoAStep = rows_of(LnRows::StagedTwoAStep);
}  // namespace ln

// The memory systems the table is measured on: HBM3 (H100, about 3.35
// TB/s) and HBM3e (H200, 4.8 TB/s, where warp rows need more bytes in
// flight). A device whose peak DRAM bandwidth (gpu::dram_peak_gbps) reaches
// kHbm3eGbps runs the HBM3e table, any other the HBM3 one.
enum class MemorySystem : uint8_t { HBM3, HBM3e };
constexpr int kMemorySystems = 2;
constexpr double kHbm3eGbps = 4000;

enum class LnPass : uint8_t { Forward, Backward };

// Width classes of the table: D <= 256, 512, 1024, 2048, 3072, 4096, 8192,
// then everything longer (configurations apply up to 16384).
constexpr int kLnWidthClasses = 8;
constexpr int kLnResidentMaxD = 16384;
constexpr int ln_width_class(int64_t D) {
  constexpr int64_t kUpTo[kLnWidthClasses - 1] = {256, 512, 1024, 2048, 3072, 4096, 8192};
  int c = 0;
  while (c < kLnWidthClasses - 1 && D > kUpTo[c]) ++c;
  return c;
}

// One memory system's configurations: [f32, bf16][width class] per pass.
struct LnTable {
  LnKernel forward[2][kLnWidthClasses];
  LnKernel backward[2][kLnWidthClasses];
};

namespace ln_table_detail {
using namespace ln;
// Every entry is the configuration measured fastest at those widths on that
// memory (bench/lab/layernorm.md); promoting another is one edit here.
constexpr LnTable kProduction[kMemorySystems] = {
    // HBM3 (H100)
    {// forward      <=256          <=512                <=1024               <=2048
     //              <=3072         <=4096               <=8192               <=16384
     {{kInRegisters, kStagedSharedParams, kStagedSharedParams, kStaged,  // f32
       kStagedTwoAStep, kStagedTwoAStep, kStaged, kStaged},
      {kOnePassPackedBf16SharedParams, kStagedSharedParams, kOnePassPackedBf16SharedParams,
       kOnePassPackedBf16,  // bf16
       kOnePassPackedBf16, kStagedTwoAStep, kStaged, kStaged}},
     // backward
     {{kInRegisters, kInRegisters, kStagedSharedParams, kInRegisters,  // f32
       kInRegisters, kInRegisters, kInRegisters, kInRegisters},
      {kInRegisters, kInRegisters, kStagedSharedParams, kInRegisters8ByteBf16,  // bf16
       kInRegisters8ByteBf16, kInRegisters8ByteBf16, kStaged8ByteBf16, kStaged8ByteBf16}}},
    // HBM3e (H200)
    {                                                                            // forward
     {{kStagedSharedParams, kStagedSharedParams, kStagedSharedParams, kOnePass,  // f32
       kOnePass, kOnePass, kOnePass, kOnePass},
      {kOnePassPackedBf16SharedParams, kOnePassPackedBf16SharedParams, kOnePassPackedBf16SharedParams,
       kOnePassPackedBf16,  // bf16
       kOnePassPackedBf16, kStagedTwoAStep, kOnePassPackedBf16, kOnePassPackedBf16}},
     // backward
     {{kInRegisters, kInRegisters, kStagedSharedParams, kInRegisters,  // f32
       kInRegisters, kInRegisters, kInRegisters, kInRegisters},
      {kInRegisters8ByteBf16, kInRegisters8ByteBf16, kInRegisters8ByteBf16, kInRegisters8ByteBf16,  // bf16
       kInRegisters8ByteBf16, kInRegisters8ByteBf16, kInRegisters8ByteBf16, kStaged8ByteBf16}}},
};
}  // namespace ln_table_detail

constexpr const LnTable& ln_production_table(MemorySystem m) {
  return ln_table_detail::kProduction[static_cast<int>(m)];
}

// The table entry for (memory system, pass, dtype: F32 or BF16, width class).
constexpr LnKernel ln_table_entry(MemorySystem m, LnPass pass, bool bf16, int width_class) {
  const LnTable& t = ln_production_table(m);
  return pass == LnPass::Forward ? t.forward[bf16][width_class] : t.backward[bf16][width_class];
}

// The configuration production runs for rows of D elements in `dtype`.
constexpr LnKernel ln_production_kernel(MemorySystem m, LnPass pass, DType dtype, int64_t D) {
  return ln_table_entry(m, pass, dtype == DType::BF16, ln_width_class(D));
}

// The residual backward (dh = dh_in + LayerNorm's dx,
// cuda/layernorm_residual.cuh) on resident rows, which always holds h and dy
// in registers: whether a thread also holds its slots of dh_in there, so the
// three rows are in flight at once, or reads each slot as it stores dh,
// holding no registers across the row's reductions; and whether bf16 rows
// read 8 bytes a slot instead of 16.
struct LnResidualBackward {
  bool holds_dh_in = false;
  bool bf16_8_byte_access = false;

  constexpr bool operator==(const LnResidualBackward& o) const {
    return holds_dh_in == o.holds_dh_in && bf16_8_byte_access == o.bf16_8_byte_access;
  }
  constexpr bool operator!=(const LnResidualBackward& o) const { return !(*this == o); }
};

namespace ln {
constexpr LnResidualBackward kStreamedDhIn{false, false};
constexpr LnResidualBackward kHeldDhIn{true, false};
constexpr LnResidualBackward kHeldDhIn8ByteBf16{true, true};
}  // namespace ln

namespace ln_table_detail {
// [memory system][f32, bf16][width class]. Warp rows (D <= 1024) hold
// dh_in; bf16 warp rows only on HBM3e, where they need more bytes in
// flight, and there 8 bytes a slot as the backward table above reads them
// (measurements: docs/residual_layernorm.md).
constexpr LnResidualBackward kResidualBackwardProduction[kMemorySystems][2][kLnWidthClasses] = {
    // HBM3 (H100)  <=256      <=512      <=1024      <=2048 ... <=16384
    {{kHeldDhIn, kHeldDhIn, kHeldDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn,
      kStreamedDhIn},  // f32
     {kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn,
      kStreamedDhIn}},  // bf16
    // HBM3e (H200)
    {{kHeldDhIn, kHeldDhIn, kHeldDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn,
      kStreamedDhIn},  // f32
     {kHeldDhIn8ByteBf16, kHeldDhIn8ByteBf16, kHeldDhIn8ByteBf16, kStreamedDhIn, kStreamedDhIn, kStreamedDhIn,
      kStreamedDhIn, kStreamedDhIn}},  // bf16
};
}  // namespace ln_table_detail

// The residual backward production runs on (memory system, dtype: F32 or
// BF16, width class).
constexpr LnResidualBackward ln_residual_backward_entry(MemorySystem m, bool bf16, int width_class) {
  return ln_table_detail::kResidualBackwardProduction[static_cast<int>(m)][bf16][width_class];
}

// A residual backward as text, e.g. "dh_in held, bf16 8-byte".
inline std::string ln_residual_backward_name(const LnResidualBackward& k) {
  return std::string(k.holds_dh_in ? "dh_in held" : "dh_in read at the store") +
         (k.bf16_8_byte_access ? ", bf16 8-byte" : "");
}

// What a configuration runs where it cannot (a device or build below sm_90,
// or a staged backward whose two stages do not fit a block): rows in
// registers with the same bf16 access width. A configuration in registers
// is its own fallback.
constexpr LnKernel ln_fallback(const LnKernel& k) {
  if (k.rows == LnRows::InRegisters) return k;
  return k.bf16_8_byte_access ? ln::kInRegisters8ByteBf16 : ln::kInRegisters;
}

// Whether the kernels of k are compiled for (pass, dtype, width class): an
// entry of some memory system's table there, or such an entry's fallback.
constexpr bool ln_kernel_compiled(const LnKernel& k, LnPass pass, bool bf16, int width_class) {
  for (int m = 0; m < kMemorySystems; ++m) {
    const LnKernel entry = ln_table_entry(static_cast<MemorySystem>(m), pass, bf16, width_class);
    if (k == entry || k == ln_fallback(entry)) return true;
  }
  return false;
}

// Every distinct configuration compiled for (pass, dtype, D), table entries
// first: what a test runs to cover each of them.
inline std::vector<LnKernel> ln_compiled_kernels(LnPass pass, DType dtype, int64_t D) {
  std::vector<LnKernel> out;
  const bool bf16 = dtype == DType::BF16;
  const int c = ln_width_class(D);
  const auto add = [&](const LnKernel& k) {
    for (const LnKernel& seen : out)
      if (seen == k) return;
    out.push_back(k);
  };
  for (int m = 0; m < kMemorySystems; ++m) add(ln_table_entry(static_cast<MemorySystem>(m), pass, bf16, c));
  for (int m = 0; m < kMemorySystems; ++m)
    add(ln_fallback(ln_table_entry(static_cast<MemorySystem>(m), pass, bf16, c)));
  return out;
}

// A configuration as text, e.g. "staged, params in shared memory, 0 KB in flight".
inline std::string ln_kernel_name(const LnKernel& k) {
  std::string s = k.rows == LnRows::InRegisters ? "in registers"
                  : k.rows == LnRows::Staged    ? "staged"
                                                : "staged two a step";
  if (k.one_pass_stats) s += ", one-pass";
  if (k.bf16_packed) s += ", bf16 packed";
  if (k.bf16_8_byte_access) s += ", bf16 8-byte";
  if (k.params_in_shared_memory) s += ", params in shared memory";
  if (k.rows != LnRows::InRegisters) s += ", " + std::to_string(k.stage_kb) + " KB in flight";
  return s;
}

inline const char* memory_system_name(MemorySystem m) { return m == MemorySystem::HBM3 ? "HBM3" : "HBM3e"; }

}  // namespace hg::gpu
