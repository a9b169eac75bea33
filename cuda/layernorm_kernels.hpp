#pragma once
// Launch API of the fused LayerNorm kernels (cuda/layernorm.cu). Plain C++:
// ops/layernorm.cpp calls these for CUDA tensors in fused mode, after it has
// validated shapes and allocated every output on the GPU.
#include "core/tensor.hpp"
#include "cuda/lab_switch.hpp"

namespace hg::gpu {

// x, y: (rows, D) contiguous, both F32 or both BF16 (math in float32).
// gamma, beta: (D,) F32. mean, rstd: (rows,) F32, written for backward.
void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             Tensor& y, Tensor& mean, Tensor& rstd);

// dy, x, dx: (rows, D), all F32 or all BF16. gamma (D,) F32; mean, rstd (rows,) F32.
// dgamma, dbeta: (D,) F32, overwritten. Deterministic: per-block partial sums
// reduced by a second kernel in a fixed order (no float atomics).
void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dgamma,
                              Tensor& dbeta);

// Lab variants of the resident kernels (16-byte aligned rows, D <= 16384;
// docs/layernorm_kernels_notes.md, "Lab variants"): 0 is the kernel of
// 2026-11-26, 1 .. kLayerNormVariants - 1 the candidates (6 and 7: 5 and 0
// with bf16 rows accessed 8 bytes at a time; 8: 5 taking two rows a step;
// 9: on warp rows, gamma/beta read from a copy in shared memory, the
// forward 1's and the backward 5's; 10: the same with 5's forward).
// HG_LN_VARIANT=V forces V on both passes wherever it applies; unset, each
// case runs the variant of the production table in cuda/layernorm.cu.
constexpr int kLayerNormVariants = 11;
inline LabSwitch& layernorm_lab_switch() {
  static LabSwitch s("HG_LN_VARIANT", kLayerNormVariants);
  return s;
}

// The production table is measured per memory system: 0 on HBM3 (H100,
// 3.35 TB/s), 1 on HBM3e (H200, 4.8 TB/s), where the warp rows need more
// bytes in flight and other variants win. Unset, a device whose peak DRAM
// bandwidth (dram_peak_gbps) reaches kLnHbm3eGbps runs table 1, any other
// table 0; HG_LN_TABLE=0|1 (or a LabSwitchScope) forces one, so one device
// can time both.
constexpr int kLayerNormTables = 2;
constexpr double kLnHbm3eGbps = 4000;
inline LabSwitch& layernorm_table_switch() {
  static LabSwitch s("HG_LN_TABLE", kLayerNormTables);
  return s;
}
// The table this process runs now (the forced one, else the device's).
int layernorm_production_table();

}  // namespace hg::gpu
