#pragma once
// A growable 64-byte aligned buffer, one per thread where it is used as a
// thread_local: the GEMM's packed panels (core/cpu_matmul.cpp,
// core/cpu_gemm.cpp), which the kernels read with full-vector loads that
// must not straddle cache lines.
#include <cstdlib>
#include <memory>
#include <new>

namespace hg::cpu {

struct AlignedScratch {
  std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
  size_t bytes = 0;
  // At least n bytes; the old contents are not kept when it grows.
  void* get(size_t n) {
    if (n > bytes) {
      p.reset();
      bytes = (n + 4095) / 4096 * 4096;
      p.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
      if (!p) {
        bytes = 0;
        throw std::bad_alloc();
      }
    }
    return p.get();
  }
};

}  // namespace hg::cpu
