#pragma once
// The table one compilation of core/isa/gemm_level.cpp exports. Declarations
// only: this header is read by objects built for different CPU levels, so it
// must not define any function the linker could share between them.
#include "core/cpu_gemm.hpp"

namespace hg::cpu::isa {

struct GemmKernels {
  const char* level;
  void (*f32)(const GemmBlock<float>&);  // nullptr: whole products go through packed_f32
  void (*f64)(const GemmBlock<double>&);
  PackedGemm<float> packed_f32;
  PackedGemm<double> packed_f64;
};

GemmKernels gemm_baseline();
GemmKernels gemm_x86_64_v3();
GemmKernels gemm_x86_64_v4();
// The other float32 kernel of each FMA level: handgrad's at x86-64-v3
// ("x86-64-v3-hg"), Eigen's at x86-64-v4 ("x86-64-v4-eigen").
GemmKernels gemm_x86_64_v3_hg();
GemmKernels gemm_x86_64_v4_eigen();

}  // namespace hg::cpu::isa
