// Eigen's GEMM for one CPU level. core/CMakeLists.txt compiles this file once
// per level with -march=<level>, -DHG_GEMM_LEVEL_FN=gemm_<level> and
// -DEigen=hg_eigen_<level>: the macro renames Eigen's namespace, so each
// object's template instances (packing, gebp kernel, cache-size queries) have
// their own names and the linker cannot swap an AVX-512 copy into the
// baseline path. Nothing else with inline linkage may be emitted here; the
// CTest gemm_level_symbols checks the objects for weak symbols outside the
// renamed namespace.
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>

#include "core/isa/gemm_level.hpp"

#ifndef HG_GEMM_LEVEL_FN
#error "compile with -DHG_GEMM_LEVEL_FN=gemm_<level> -DHG_GEMM_LEVEL_NAME=\"<level>\" (core/CMakeLists.txt)"
#endif

namespace hg::cpu::isa {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;

template <class T>
void run(const GemmBlock<T>& g) {
  const ConstMap<T> A(g.a, g.transpose_a ? g.depth : g.rows, g.transpose_a ? g.rows : g.depth,
                      Eigen::OuterStride<>(g.lda));
  const ConstMap<T> B(g.b, g.transpose_b ? g.cols : g.depth, g.transpose_b ? g.depth : g.cols,
                      Eigen::OuterStride<>(g.ldb));
  Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>> C(g.c, g.rows, g.cols, Eigen::OuterStride<>(g.ldc));
  // Always "+=": both modes share one product kernel per transpose combination.
  if (!g.accumulate) C.setZero();
  if (!g.transpose_a && !g.transpose_b) C.noalias() += g.alpha * A * B;
  else if (!g.transpose_a) C.noalias() += g.alpha * A * B.transpose();
  else if (!g.transpose_b) C.noalias() += g.alpha * A.transpose() * B;
  else C.noalias() += g.alpha * A.transpose() * B.transpose();
}

void run_f32(const GemmBlock<float>& g) { run(g); }
void run_f64(const GemmBlock<double>& g) { run(g); }

}  // namespace

GemmKernels HG_GEMM_LEVEL_FN() { return {HG_GEMM_LEVEL_NAME, run_f32, run_f64}; }

}  // namespace hg::cpu::isa
