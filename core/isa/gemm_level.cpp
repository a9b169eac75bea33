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
#include "core/isa/sgemm_kernel.hpp"

#ifndef HG_GEMM_LEVEL_FN
#error "compile with -DHG_GEMM_LEVEL_FN=gemm_<level> -DHG_GEMM_LEVEL_NAME=\"<level>\" (core/CMakeLists.txt)"
#endif

namespace hg::cpu::isa {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;

// The C tile [r0, r0 + rows) x [c0, c0 + cols) as an Eigen map (vectorised).
template <class T>
Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>> tile(const GemmBlock<T>& g, int64_t r0, int64_t rows, int64_t c0,
                                                 int64_t cols) {
  return {g.c + r0 * g.ldc + c0, rows, cols, Eigen::OuterStride<>(g.ldc)};
}

// C tile rows += g.bias (after the product, as a separate addition).
template <class T>
void add_bias(const GemmBlock<T>& g, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  tile(g, r0, rows, c0, cols).rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(g.bias + c0, cols);
}

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
  if (g.bias != nullptr) add_bias(g, 0, g.rows, 0, g.cols);
}

void run_f32(const GemmBlock<float>& g) { run(g); }
void run_f64(const GemmBlock<double>& g) { run(g); }

// The packed path (cpu_gemm.hpp PackedGemm) drives Eigen's own pieces, as its
// sequential product does: a row-major C is the column-major C^T = op(B)^T
// op(A)^T, so op(B)'s columns are Eigen's packed "lhs" (mr-row panels) and
// op(A)'s rows its packed "rhs" (nr-column panels).
namespace ei = Eigen::internal;
using Index = Eigen::Index;
template <class T>
using Traits = ei::gebp_traits<T, T>;
template <class T, int Order>
using Mapper = ei::const_blas_data_mapper<T, Index, Order>;
template <class T>
using ResMapper = ei::blas_data_mapper<T, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;

// Eigen's own k blocking for the whole product (fits the L1 panels).
template <class T>
int64_t depth_block(int64_t rows, int64_t cols, int64_t depth) {
  Index k = depth, m = cols, n = rows;
  ei::computeProductBlockingSizes<T, T, 1>(k, m, n, Index(1));
  return k;
}

template <class T, int Order>
void pack_rows_as(const T* a, int64_t lda, int64_t k0, int64_t kc, int64_t r0, int64_t rows, T* packed) {
  ei::gemm_pack_rhs<T, Index, Mapper<T, Order>, Traits<T>::nr, Order> pack;
  pack(packed, Mapper<T, Order>(a, lda).getSubMapper(k0, r0), kc, rows);
}

// op(A)^T (depth x rows): A is rows x depth row-major (column-major op(A)^T), or depth x rows when transposed.
template <class T>
void pack_rows(const GemmBlock<T>& g, int64_t k0, int64_t kc, int64_t r0, int64_t rows, T* packed) {
  if (g.transpose_a) pack_rows_as<T, Eigen::RowMajor>(g.a, g.lda, k0, kc, r0, rows, packed);
  else pack_rows_as<T, Eigen::ColMajor>(g.a, g.lda, k0, kc, r0, rows, packed);
}

template <class T, int Order>
void pack_cols_as(const T* b, int64_t ldb, int64_t k0, int64_t kc, int64_t c0, int64_t cols, T* packed) {
  using Tr = Traits<T>;
  ei::gemm_pack_lhs<T, Index, Mapper<T, Order>, Tr::mr, Tr::LhsProgress, typename Tr::LhsPacket4Packing, Order> pack;
  pack(packed, Mapper<T, Order>(b, ldb).getSubMapper(c0, k0), kc, cols);
}

// op(B)^T (cols x depth): B is depth x cols row-major (column-major op(B)^T), or cols x depth when transposed.
template <class T>
void pack_cols(const GemmBlock<T>& g, int64_t k0, int64_t kc, int64_t c0, int64_t cols, T* packed) {
  if (g.transpose_b) pack_cols_as<T, Eigen::RowMajor>(g.b, g.ldb, k0, kc, c0, cols, packed);
  else pack_cols_as<T, Eigen::ColMajor>(g.b, g.ldb, k0, kc, c0, cols, packed);
}

template <class T>
void multiply(const GemmBlock<T>& g, int64_t kc, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
              const T* packed_rows, const T* packed_cols, bool first, bool last) {
  if (first && !g.accumulate) tile(g, r0, rows, c0, cols).setZero();
  ei::gebp_kernel<T, T, Index, ResMapper<T>, Traits<T>::mr, Traits<T>::nr, false, false> gebp;
  gebp(ResMapper<T>(g.c, g.ldc).getSubMapper(c0, r0), packed_cols, packed_rows, cols, kc, rows, g.alpha);
  if (last && g.bias != nullptr) add_bias(g, r0, rows, c0, cols);
}

template <class T>
PackedGemm<T> packed() {
  return {depth_block<T>, pack_rows<T>, pack_cols<T>, multiply<T>};
}

}  // namespace

// float32 at the FMA levels comes in two kernels, Eigen's and handgrad's own
// (core/isa/sgemm_kernel.hpp, whose whole products go through its packed
// pieces: f32 = nullptr, core/cpu_gemm.cpp). Each FMA level runs Eigen's,
// and "<level>-hg" handgrad's: on the Xeon of an H200 machine (AVX-512) and
// on an AVX2 VM handgrad's was not faster (docs/cpu.md). float64, and
// float32 without FMA: Eigen's.
#define HG_GEMM_CAT2(a, b) a##b
#define HG_GEMM_CAT(a, b) HG_GEMM_CAT2(a, b)
#if defined(__AVX512F__)
GemmKernels HG_GEMM_LEVEL_FN() { return {HG_GEMM_LEVEL_NAME, run_f32, run_f64, packed<float>(), packed<double>()}; }
GemmKernels HG_GEMM_CAT(HG_GEMM_LEVEL_FN, _hg)() {
  return {HG_GEMM_LEVEL_NAME "-hg", nullptr, run_f64, Sgemm<16, 8>::table(), packed<double>()};
}
#elif defined(__AVX2__) && defined(__FMA__)
GemmKernels HG_GEMM_LEVEL_FN() { return {HG_GEMM_LEVEL_NAME, run_f32, run_f64, packed<float>(), packed<double>()}; }
GemmKernels HG_GEMM_CAT(HG_GEMM_LEVEL_FN, _hg)() {
  return {HG_GEMM_LEVEL_NAME "-hg", nullptr, run_f64, Sgemm<8, 6>::table(), packed<double>()};
}
#else
GemmKernels HG_GEMM_LEVEL_FN() { return {HG_GEMM_LEVEL_NAME, run_f32, run_f64, packed<float>(), packed<double>()}; }
#endif

}  // namespace hg::cpu::isa
