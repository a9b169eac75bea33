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
// handgrad's float32 kernel at each FMA level ("x86-64-v3-hg", "x86-64-v4-hg").
GemmKernels gemm_x86_64_v3_hg();
GemmKernels gemm_x86_64_v4_hg();

}  // namespace hg::cpu::isa
