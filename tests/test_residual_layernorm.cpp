// Residual add + LayerNorm: the float64 CPU path against central finite
// differences (loss = <wy, y> + <wh, h>, so dy = wy and the residual-stream
// gradient dh_in = wh), then every other path (CPU F32 fused and unfused,
// CUDA F32 / BF16 fused, CUDA F32 unfused) against float64 on random and
// hostile rows: offsets of 1e4, constant rows, D = 1, 3, 1000, 1025.
//
// Each path is compared with the float64 math applied to the h that path
// stored (h's own rounding to F32 / BF16 is checked separately, against
// f64(x) + f64(r)): that isolates the LayerNorm part. Bounds:
// - h: one rounding, 2^-24 |h| (F32), 2^-9 |h| (BF16).
// - y: float32 statistics. The saved mean is a float32, up to half an ulp of
//   |mean| off, which shifts xhat by that times rstd: bound
//   2^-23 (|mean| + 1) rstd max|gamma| + 1e-5 (1 + |y|); BF16 adds 2^-8 |y|.
// - dh, dgamma, dbeta: float32 sums; each is a sequential run of at most
//   ~300 terms per thread (a column's partials over blocks, or a thread's
//   elements of a row: D / 256 one block per row, EPT <= 32 resident) then
//   a tree, error <= (run + depth) 2^-24 < 3e-5 relative to the sum of
//   magnitudes, so ||got - want|| / ||want|| <= 1e-4; dh in BF16 adds one
//   rounding: 2^-8.
// The CUDA fused path runs with both kernel families (gpu::ResidualLnKernel:
// the resident LayerNorm rows for 16-byte rows of D <= 16384, the
// one-block-per-row kernels elsewhere; and the one-block-per-row kernels on
// every row), at every width where the resident rows change layout, with h
// aliasing x or r and dh aliasing dh_in (kernels called directly).
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"
#include "ops/residual_layernorm.hpp"
#include "tests/test_util.hpp"
#ifdef HG_WITH_CUDA
#include "cuda/layernorm_kernels.hpp"
#include "cuda/residual_layernorm_kernels.hpp"
#endif

using namespace hg;
using hg::test::f64;
using hg::test::rel_error;
using hg::test::same_bytes;
using hg::test::weighted_sum;

namespace {

constexpr double kEps = 1e-5;

struct Inputs {
  Tensor x, r, gamma, beta, wy, wh;  // float64 CPU
};

enum class Rows { Random, Offset, Constant };

Inputs make_inputs(int64_t rows, int64_t D, Rows kind, uint64_t seed) {
  Generator gen(seed);
  Inputs in;
  in.x = Tensor::randn({rows, D}, gen, DType::F64);
  in.r = Tensor::randn({rows, D}, gen, DType::F64, Device::CPU, 0.0, 0.5);
  if (kind == Rows::Offset) in.x = Tensor::randn({rows, D}, gen, DType::F64, Device::CPU, 1e4, 1.0);
  if (kind == Rows::Constant) {
    in.x = Tensor::full({rows, D}, 5.0, DType::F64);
    in.r = Tensor::full({rows, D}, 3.0, DType::F64);
  }
  in.gamma = Tensor::randn({D}, gen, DType::F64, Device::CPU, 1.0, 0.3);
  in.beta = Tensor::randn({D}, gen, DType::F64);
  in.wy = Tensor::randn({rows, D}, gen, DType::F64);
  in.wh = Tensor::randn({rows, D}, gen, DType::F64);
  return in;
}

}  // namespace

TEST_CASE("residual_layernorm float64 gradients match central differences", "[residual_layernorm]") {
  for (const auto& [rows, D] : {std::pair<int64_t, int64_t>{3, 1}, {4, 3}, {5, 17}, {2, 64}}) {
    INFO("rows " << rows << " D " << D);
    Inputs in = make_inputs(rows, D, Rows::Random, 100 + D);
    auto loss = [&] {
      const ResidualLayerNormOutput o = residual_layernorm_forward(in.x, in.r, in.gamma, in.beta, kEps, nullptr);
      return weighted_sum(o.y, in.wy) + weighted_sum(o.h, in.wh);
    };
    LayerNormSaved saved;
    const ResidualLayerNormOutput o = residual_layernorm_forward(in.x, in.r, in.gamma, in.beta, kEps, &saved);
    const LayerNormGrads g = residual_layernorm_backward(in.wy, in.wh, o.h, in.gamma, saved);
    CHECK(rel_error(g.dx, numerical_grad(loss, in.x)) < 1e-7);
    CHECK(rel_error(g.dx, numerical_grad(loss, in.r)) < 1e-7);  // h = x + r: the same gradient
    CHECK(rel_error(g.dgamma, numerical_grad(loss, in.gamma)) < 1e-7);
    CHECK(rel_error(g.dbeta, numerical_grad(loss, in.beta)) < 1e-7);
    // Without a residual gradient, dh is LayerNorm's dx alone.
    const LayerNormGrads plain = residual_layernorm_backward(in.wy, Tensor(), o.h, in.gamma, saved);
    const LayerNormGrads ln = layernorm_backward(in.wy, o.h, in.gamma, saved);
    CHECK(hg::test::max_abs_diff(plain.dx, ln.dx) == 0.0);
  }
}

namespace {

// t (rows, D) in dtype on dev; offset_view: a view one element into its
// storage, so its rows are not 16-byte aligned.
Tensor stored(const Tensor& t, DType dtype, Device dev, bool offset_view = false) {
  if (!offset_view) return t.to(dtype).to(dev);
  const int64_t n = t.numel();
  Tensor flat = Tensor::zeros({n + 1}, DType::F64);
  flat.slice(1, n + 1).copy_(t.reshape({n}));
  return flat.to(dtype).to(dev).slice(1, n + 1).reshape(t.shape());
}

#ifdef HG_WITH_CUDA
using Kernel = gpu::ResidualLnKernel;
#else
enum class Kernel { ResidentRows, OneBlockPerRow };
#endif

struct PathOptions {
  bool offset_view = false;   // x one element off: unaligned rows
  bool residual_grad = true;  // false: the backward without dh_in
  // CUDA fused: the kernels called directly with this choice; unset: the op.
  std::optional<Kernel> kernel;
#ifdef HG_WITH_CUDA
  // With kernel ResidentRows: the backward's resident rows as this memory
  // system's table entry picks them, whatever the GPU (unset: the GPU's own).
  std::optional<gpu::MemorySystem> memory;
#endif
};

struct PathOutputs {
  Tensor h, y, mean, rstd, dh, dgamma, dbeta;
};

const char* kernel_name(Kernel k) { return k == Kernel::ResidentRows ? "resident rows" : "one block per row"; }

#ifdef HG_WITH_CUDA
// The residual backward a named memory system's table entry picks for
// (dtype, D), e.g. ", HBM3e: dh_in held, bf16 8-byte"; "" for none.
std::string entry_name(std::optional<gpu::MemorySystem> memory, DType dtype, int64_t D) {
  if (!memory) return "";
  const gpu::LnResidualBackward k =
      gpu::ln_residual_backward_entry(*memory, dtype == DType::BF16, gpu::ln_width_class(D));
  return std::string(", ") + gpu::memory_system_name(*memory) + ": " + gpu::ln_residual_backward_name(k);
}

// The fused CUDA kernels with `kernel`, outside the op: forward, then the
// backward on its h and statistics (dh_in undefined: none).
PathOutputs run_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                      const Tensor& dh_in, Kernel kernel, std::optional<gpu::MemorySystem> memory = std::nullopt) {
  const int64_t rows = x.size(0), D = x.size(1);
  const auto rows_f32 = [&] { return Tensor::empty({rows}, DType::F32, Device::CUDA); };
  const auto cols_f32 = [&] { return Tensor::empty({D}, DType::F32, Device::CUDA); };
  PathOutputs o{Tensor::empty({rows, D}, x.dtype(), Device::CUDA),
                Tensor::empty({rows, D}, x.dtype(), Device::CUDA),
                rows_f32(),
                rows_f32(),
                Tensor::empty({rows, D}, x.dtype(), Device::CUDA),
                cols_f32(),
                cols_f32()};
  gpu::residual_layernorm_forward_fused(x, r, gamma, beta, float(kEps), o.h, o.y, o.mean, o.rstd, kernel);
  const Tensor* in = dh_in.defined() ? &dh_in : nullptr;
  // The resident rows under a named memory system's entry where they apply,
  // else (unaligned or long rows: nothing launched) the call as kernel says.
  if (kernel == Kernel::ResidentRows && memory &&
      gpu::residual_layernorm_backward_resident(dy, in, o.h, gamma, o.mean, o.rstd, o.dh, o.dgamma, o.dbeta,
                                                gpu::ParamGradWrite::Overwrite, *memory))
    return o;
  gpu::residual_layernorm_backward_fused(dy, in, o.h, gamma, o.mean, o.rstd, o.dh, o.dgamma, o.dbeta, kernel);
  return o;
}
#endif

// The float64 reference of one set of inputs on a stored h: computed by the
// first path that checks against it, reused by the paths after it on the
// same inputs, which must store the same h bit for bit.
struct Float64Reference {
  Tensor h;  // the stored h it was computed on
  Tensor y;
  LayerNormSaved saved;
  LayerNormGrads g;
};

// Runs one path (device, storage dtype, kernel mode) and checks it against
// float64 on the same stored h (`shared`: a reference kept across the paths
// of the same inputs).
PathOutputs check_path(Device dev, DType dtype, KernelMode mode, int64_t rows, int64_t D, Rows kind,
                       PathOptions opt = {}, Float64Reference* shared = nullptr) {
  std::string memory_entry;
#ifdef HG_WITH_CUDA
  memory_entry = entry_name(opt.memory, dtype, D);
#endif
  INFO(device_name(dev) << " " << dtype_name(dtype) << " " << kernel_mode_name(mode) << " rows " << rows << " D " << D
                        << " kind " << int(kind) << (opt.offset_view ? " offset view" : "")
                        << (opt.residual_grad ? "" : " no dh_in")
                        << (opt.kernel ? std::string(" ") + kernel_name(*opt.kernel) : std::string()) << memory_entry);
  const Inputs in = make_inputs(rows, D, kind, 7 * D + rows + int(kind));
  const DType math = math_dtype(dtype);
  const Tensor x = stored(in.x, dtype, dev, opt.offset_view), r = in.r.to(dtype).to(dev);
  const Tensor gamma = in.gamma.to(math).to(dev), beta = in.beta.to(math).to(dev);
  const Tensor dy = in.wy.to(dtype).to(dev);
  const Tensor dh_in = opt.residual_grad ? in.wh.to(dtype).to(dev) : Tensor();
  KernelModeScope scope(mode);
  LayerNormSaved saved;
  ResidualLayerNormOutput o;
  LayerNormGrads g;
  if (opt.kernel) {
#ifdef HG_WITH_CUDA
    const PathOutputs k = run_fused(x, r, gamma, beta, dy, dh_in, *opt.kernel, opt.memory);
    o.h = k.h, o.y = k.y, saved.mean = k.mean, saved.rstd = k.rstd;
    g.dx = k.dh, g.dgamma = k.dgamma, g.dbeta = k.dbeta;
#endif
  } else {
    o = residual_layernorm_forward(x, r, gamma, beta, kEps, &saved);
    g = residual_layernorm_backward(dy, dh_in, o.h, gamma, saved);
  }

  const bool bf16 = dtype == DType::BF16;
  // Element checks count their failures and assert once (a CHECK per element is slow at 1M elements).
  int64_t bad = 0, first_bad = -1;
  const auto tally = [&](bool ok, int64_t i) {
    if (!ok && bad++ == 0) first_bad = i;
  };
  const Tensor gamma64 = f64(gamma);
  Float64Reference own;
  Float64Reference& ref = shared != nullptr ? *shared : own;
  if (ref.h.defined()) {
    INFO("h differs from that of the first path on these inputs");
    REQUIRE(same_bytes(o.h, ref.h));  // the same rounding of x + r in every kernel
  } else {
    // h: one rounding of the exact sum of the stored inputs.
    const auto h = f64(o.h).to_vector(), xs = f64(x).to_vector(), rs = f64(r).to_vector();
    // One round-to-nearest: half an ulp, at most 2^-p of the value for a p-bit significand (bf16 p = 8, f32 p = 24).
    const double h_rel = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
    for (size_t i = 0; i < h.size(); ++i) tally(std::abs(h[i] - (xs[i] + rs[i])) <= h_rel * std::abs(xs[i] + rs[i]), i);
    INFO("h: first element out of bounds " << first_bad);
    REQUIRE(bad == 0);
    // The float64 reference on that h.
    const Tensor h64 = f64(o.h);
    ref.h = o.h;
    ref.y = layernorm_forward(h64, gamma64, f64(beta), kEps, &ref.saved);
    ref.g = residual_layernorm_backward(f64(dy), opt.residual_grad ? f64(dh_in) : Tensor(), h64, gamma64, ref.saved);
  }
  const LayerNormGrads& g_ref = ref.g;

  const auto y = f64(o.y).to_vector(), yr = ref.y.to_vector();
  const auto mean = ref.saved.mean.to_vector(), rstd = ref.saved.rstd.to_vector();
  bad = 0, first_bad = -1;
  double gmax = 0;
  for (double v : gamma64.to_vector()) gmax = std::max(gmax, std::abs(v));
  const double stat_ulp = dtype == DType::F64 ? 1e-15 : std::ldexp(1.0, -23);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < D; ++j) {
      const size_t k = static_cast<size_t>(i * D + j);
      const double bound = stat_ulp * (std::abs(mean[i]) + 1) * rstd[i] * gmax + 1e-5 * (1 + std::abs(yr[k])) +
                           (bf16 ? std::ldexp(std::abs(yr[k]), -8) : 0.0);
      tally(std::abs(y[k] - yr[k]) <= bound, static_cast<int64_t>(k));
    }
  INFO("y: first element out of bounds " << first_bad);
  CHECK(bad == 0);
  CHECK(rel_error(f64(g.dx), g_ref.dx) <= (bf16 ? std::ldexp(1.0, -8) : 1e-4));
  CHECK(rel_error(f64(g.dgamma), g_ref.dgamma) <= 1e-4);
  CHECK(rel_error(f64(g.dbeta), g_ref.dbeta) <= 1e-4);
  CHECK(hg::test::all_finite(g.dx));
  return {o.h, o.y, saved.mean, saved.rstd, g.dx, g.dgamma, g.dbeta};
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{5, 1}, {7, 3}, {9, 1000}, {40, 1025}, {3, 64}};

}  // namespace

namespace {

// The residual backward after a plain layernorm_forward (a LayerNorm whose
// input was no pending sum, as the first layer's LN1): the two forwards save
// the same statistics (mean and rstd of the input rows, float32 but for
// float64), so dh is LayerNorm's backward plus dh_in, to the dh / dgamma /
// dbeta bounds above. x is any stored row (the "h" of the statistics).
void check_backward_after_plain_forward(Device dev, DType dtype, KernelMode mode, int64_t rows, int64_t D, Rows kind) {
  INFO("plain forward: " << device_name(dev) << " " << dtype_name(dtype) << " " << kernel_mode_name(mode) << " rows "
                         << rows << " D " << D << " kind " << int(kind));
  const Inputs in = make_inputs(rows, D, kind, 11 * D + rows + int(kind));
  const DType math = math_dtype(dtype);
  const Tensor x = in.x.to(dtype).to(dev), dy = in.wy.to(dtype).to(dev), dh_in = in.wh.to(dtype).to(dev);
  const Tensor gamma = in.gamma.to(math).to(dev), beta = in.beta.to(math).to(dev);
  KernelModeScope scope(mode);
  LayerNormSaved saved;
  layernorm_forward(x, gamma, beta, kEps, &saved);
  const LayerNormGrads g = residual_layernorm_backward(dy, dh_in, x, gamma, saved);

  LayerNormSaved ref_saved;
  const Tensor x64 = f64(x), gamma64 = f64(gamma);
  layernorm_forward(x64, gamma64, f64(beta), kEps, &ref_saved);
  LayerNormGrads ref = layernorm_backward(f64(dy), x64, gamma64, ref_saved);
  ref.dx = add(ref.dx, f64(dh_in));
  CHECK(rel_error(f64(g.dx), ref.dx) <= (dtype == DType::BF16 ? std::ldexp(1.0, -8) : 1e-4));
  CHECK(rel_error(f64(g.dgamma), ref.dgamma) <= 1e-4);
  CHECK(rel_error(f64(g.dbeta), ref.dbeta) <= 1e-4);
}

}  // namespace

TEST_CASE("residual_layernorm_backward after a plain layernorm_forward, CPU paths", "[residual_layernorm]") {
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant})
      for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
        check_backward_after_plain_forward(Device::CPU, DType::F32, mode, rows, D, kind);
}

TEST_CASE("residual_layernorm CPU paths match float64 on random and hostile rows", "[residual_layernorm]") {
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant})
      for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
        check_path(Device::CPU, DType::F32, mode, rows, D, kind);
}

TEST_CASE("residual_layernorm validates its inputs", "[residual_layernorm]") {
  Generator gen(1);
  const Tensor x = Tensor::randn({4, 8}, gen), r = Tensor::randn({4, 7}, gen);
  const Tensor gamma = Tensor::ones({8}), beta = Tensor::zeros({8});
  CHECK_THROWS_AS(residual_layernorm_forward(x, r, gamma, beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x.to(DType::F64), gamma, beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x, Tensor::ones({7}), beta, kEps, nullptr), Error);
  CHECK_THROWS_AS(residual_layernorm_forward(x, x, gamma, beta, -1.0, nullptr), Error);
  LayerNormSaved saved;
  const ResidualLayerNormOutput o = residual_layernorm_forward(x, x, gamma, beta, kEps, &saved);
  CHECK_THROWS_AS(residual_layernorm_backward(x, Tensor::zeros({4, 9}), o.h, gamma, saved), Error);
  CHECK_THROWS_AS(residual_layernorm_backward(Tensor::zeros({3, 8}), Tensor(), o.h, gamma, saved), Error);
}

// Activation recomputation: y again from the stored h alone.
TEST_CASE("residual_layernorm_output: the forward's y again from h, bitwise, on the CPU paths",
          "[residual_layernorm]") {
  for (const DType dtype : {DType::F32, DType::F64})
    for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
      for (const auto& [rows, D] : kShapes)
        for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant}) {
          INFO(dtype_name(dtype) << " " << kernel_mode_name(mode) << " rows " << rows << " D " << D << " kind "
                                 << int(kind));
          KernelModeScope scope(mode);
          const Inputs in = make_inputs(rows, D, kind, 3 * D + rows);
          const Tensor gamma = in.gamma.to(dtype), beta = in.beta.to(dtype);
          const ResidualLayerNormOutput o =
              residual_layernorm_forward(in.x.to(dtype), in.r.to(dtype), gamma, beta, kEps, nullptr);
          CHECK(same_bytes(residual_layernorm_output(o.h, gamma, beta, kEps), o.y));
        }
  const Tensor h = Tensor::ones({4, 8});
  CHECK_THROWS_AS(residual_layernorm_output(Tensor(), Tensor::ones({8}), Tensor::zeros({8}), kEps), Error);
  CHECK_THROWS_AS(residual_layernorm_output(h, Tensor::ones({7}), Tensor::zeros({8}), kEps), Error);
  CHECK_THROWS_AS(residual_layernorm_output(h, Tensor::ones({8}), Tensor::zeros({8}), -1.0), Error);
}

namespace {
constexpr Kernel kKernels[] = {Kernel::ResidentRows, Kernel::OneBlockPerRow};
}  // namespace

TEST_CASE("residual_layernorm CUDA fused (F32, BF16) and unfused match float64", "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant}) {
      check_path(Device::CUDA, DType::F32, KernelMode::Fused, rows, D, kind);
      check_path(Device::CUDA, DType::BF16, KernelMode::Fused, rows, D, kind);
      check_path(Device::CUDA, DType::F32, KernelMode::Unfused, rows, D, kind);
      for (const Kernel k : kKernels) {
        check_path(Device::CUDA, DType::F32, KernelMode::Fused, rows, D, kind, {false, true, k});
        check_path(Device::CUDA, DType::BF16, KernelMode::Fused, rows, D, kind, {false, true, k});
      }
    }
#endif
}

// The op picks the resident rows or the one-block-per-row kernel as for a
// residual forward: kShapes and kLayoutWidths reach both, with the plain
// forward's own kernels (one-pass statistics in some bf16 widths) before them.
TEST_CASE("residual_layernorm_backward CUDA after a plain layernorm_forward", "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
  for (const auto& [rows, D] : kShapes)
    for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant}) {
      check_backward_after_plain_forward(Device::CUDA, DType::F32, KernelMode::Fused, rows, D, kind);
      check_backward_after_plain_forward(Device::CUDA, DType::BF16, KernelMode::Fused, rows, D, kind);
      check_backward_after_plain_forward(Device::CUDA, DType::F32, KernelMode::Unfused, rows, D, kind);
    }
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : {8, 256, 768, 1024, 1025, 4096, 16384, 16385})
      check_backward_after_plain_forward(Device::CUDA, dtype, KernelMode::Fused, 301, D, Rows::Random);
}

#ifdef HG_WITH_CUDA
namespace {

// Every width where the resident rows' layout changes (warp rows of 8/16/24/32 per
// lane, 128/256/512-thread rows, the 512 x 32 forward and 1024 x 16
// backward at 8193-16384) and the fallbacks (D 1 and 7 f32 and 257: rows
// not 16-byte aligned; 16385: past the resident rows).
const std::vector<int64_t> kLayoutWidths = {1, 7, 8, 256, 257, 768, 1024, 1025, 4096, 8192, 16384, 16385};

// Odd, and at most ~3M elements (the float64 reference stays quick).
// At D = 16384, 183 rows: more than the backward's 132 one-row blocks on an
// H100, so blocks add several rows into their partial rows.
int64_t rows_for(int64_t D) { return std::max<int64_t>(5, std::min<int64_t>(2001, 3'000'000 / D) | 1); }

}  // namespace
#endif

TEST_CASE("residual_layernorm CUDA resident rows match float64 and the one-block-per-row kernels at every layout",
          "[residual_layernorm][cuda][variant]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : kLayoutWidths)
      for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant})
        for (const bool residual_grad : {true, false}) {
          if (!residual_grad && kind != Rows::Random) continue;
          const int64_t rows = rows_for(D);
          INFO("dtype " << dtype_name(dtype) << " rows " << rows << " D " << D << " kind " << int(kind)
                        << (residual_grad ? "" : " no dh_in"));
          // One float64 reference for the three runs (they must store the same h).
          Float64Reference ref;
          check_path(Device::CUDA, dtype, KernelMode::Fused, rows, D, kind, {false, residual_grad, kKernels[1]}, &ref);
          // The resident backward as each memory system's table entry picks
          // it (bf16 warp rows: dh_in held with 8-byte slots on HBM3e, read
          // at the store with 16-byte slots on HBM3), on this GPU.
          for (const gpu::MemorySystem memory : {gpu::MemorySystem::HBM3, gpu::MemorySystem::HBM3e}) {
            PathOptions resident_rows{false, residual_grad, kKernels[0]};
            resident_rows.memory = memory;
            check_path(Device::CUDA, dtype, KernelMode::Fused, rows, D, kind, resident_rows, &ref);
          }
        }
  // Unaligned rows fall back to the one-block-per-row kernels.
  for (const DType dtype : {DType::F32, DType::BF16})
    check_path(Device::CUDA, dtype, KernelMode::Fused, 301, 768, Rows::Random, {true, true, Kernel::ResidentRows});
#endif
}

TEST_CASE("residual_layernorm CUDA resident forward is LayerNorm's two-pass forward of the stored h",
          "[residual_layernorm][cuda][variant]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  // The residual kernel holds h = round(x + r) and takes the statistics and y
  // with layernorm_forward_kernel's row functions, shift = h[row, 0]: bitwise its
  // outputs on the stored h, wherever that kernel (gpu::ln::kInRegisters) is
  // compiled for LayerNorm (every f32 width class; the bf16 ones whose table
  // entries are staged).
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : {8, 256, 768, 1024, 4096, 8192, 16384})
      for (const Rows kind : {Rows::Random, Rows::Offset}) {
        if (!gpu::ln_kernel_compiled(gpu::ln::kInRegisters, gpu::LnPass::Forward, dtype == DType::BF16,
                                     gpu::ln_width_class(D)))
          continue;
        INFO("dtype " << dtype_name(dtype) << " D " << D << " kind " << int(kind));
        const int64_t rows = rows_for(D);
        const Inputs in = make_inputs(rows, D, kind, 31 * D + int(kind));
        const Tensor x = in.x.to(dtype).to(Device::CUDA), r = in.r.to(dtype).to(Device::CUDA);
        const Tensor gamma = in.gamma.to(DType::F32).to(Device::CUDA), beta = in.beta.to(DType::F32).to(Device::CUDA);
        Tensor h = Tensor::empty({rows, D}, dtype, Device::CUDA), y = Tensor::empty({rows, D}, dtype, Device::CUDA);
        Tensor mean = Tensor::empty({rows}, DType::F32, Device::CUDA),
               rstd = Tensor::empty({rows}, DType::F32, Device::CUDA);
        REQUIRE(gpu::residual_layernorm_forward_resident(x, r, gamma, beta, float(kEps), h, y, mean, rstd));
        Tensor y_ln = Tensor::empty({rows, D}, dtype, Device::CUDA);
        Tensor mean_ln = Tensor::empty({rows}, DType::F32, Device::CUDA),
               rstd_ln = Tensor::empty({rows}, DType::F32, Device::CUDA);
        gpu::layernorm_forward_fused(h, gamma, beta, float(kEps), y_ln, mean_ln, rstd_ln, gpu::ln::kInRegisters);
        CHECK(same_bytes(y, y_ln));
        CHECK(same_bytes(mean, mean_ln));
        CHECK(same_bytes(rstd, rstd_ln));
      }
#endif
}

// The forward's kernels without the add (ADD = false) on the h they stored:
// y, mean and rstd bitwise the forward's, with each kernel family at every
// layout width, and through the op in both modes (the fused op chooses the
// family as the forward does: x, r, h and y are whole, aligned tensors).
TEST_CASE("residual_layernorm_output CUDA: the forward's y again from h, bitwise, every kernel and layout",
          "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : kLayoutWidths)
      for (const Rows kind : {Rows::Random, Rows::Offset, Rows::Constant}) {
        const int64_t rows = std::min<int64_t>(rows_for(D), 301);
        INFO("dtype " << dtype_name(dtype) << " rows " << rows << " D " << D << " kind " << int(kind));
        const Inputs in = make_inputs(rows, D, kind, 13 * D + int(kind));
        const Tensor x = in.x.to(dtype).to(Device::CUDA), r = in.r.to(dtype).to(Device::CUDA);
        const Tensor gamma = in.gamma.to(DType::F32).to(Device::CUDA), beta = in.beta.to(DType::F32).to(Device::CUDA);
        const auto rows_f32 = [&] { return Tensor::empty({rows}, DType::F32, Device::CUDA); };
        for (const Kernel kernel : kKernels) {
          INFO(kernel_name(kernel));
          Tensor h = Tensor::empty({rows, D}, dtype, Device::CUDA), y = Tensor::empty({rows, D}, dtype, Device::CUDA);
          Tensor mean = rows_f32(), rstd = rows_f32();
          gpu::residual_layernorm_forward_fused(x, r, gamma, beta, float(kEps), h, y, mean, rstd, kernel);
          const Tensor h_before = h.clone();
          Tensor y2 = Tensor::empty({rows, D}, dtype, Device::CUDA), mean2 = rows_f32(), rstd2 = rows_f32();
          gpu::residual_layernorm_output_fused(h, gamma, beta, float(kEps), y2, mean2, rstd2, kernel);
          CHECK(same_bytes(y2, y));
          CHECK(same_bytes(mean2, mean));
          CHECK(same_bytes(rstd2, rstd));
          CHECK(same_bytes(h, h_before));  // read, never written
        }
        for (const KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
          if (mode == KernelMode::Unfused && dtype == DType::BF16) continue;  // as above: CUDA unfused runs f32
          INFO("op, " << kernel_mode_name(mode));
          KernelModeScope scope(mode);
          const ResidualLayerNormOutput o = residual_layernorm_forward(x, r, gamma, beta, kEps, nullptr);
          CHECK(same_bytes(residual_layernorm_output(o.h, gamma, beta, kEps), o.y));
        }
      }
#endif
}

TEST_CASE("residual_layernorm CUDA kernels in place: h = x, h = r, dh = dh_in", "[residual_layernorm][cuda][alias]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  for (const Kernel kernel : kKernels)
    for (const DType dtype : {DType::F32, DType::BF16})
      for (const int64_t D : {8, 768, 1024, 4096, 16384, 16385}) {
        INFO(kernel_name(kernel) << " dtype " << dtype_name(dtype) << " D " << D);
        const int64_t rows = rows_for(D);
        const Inputs in = make_inputs(rows, D, Rows::Offset, 57 * D + int(kernel));
        const auto dev = [&](const Tensor& t) { return t.to(dtype).to(Device::CUDA); };
        const Tensor x = dev(in.x), r = dev(in.r), dy = dev(in.wy), dh_in = dev(in.wh);
        const Tensor gamma = in.gamma.to(DType::F32).to(Device::CUDA), beta = in.beta.to(DType::F32).to(Device::CUDA);
        const auto rows_f32 = [&] { return Tensor::empty({rows}, DType::F32, Device::CUDA); };
        const auto cols_f32 = [&] { return Tensor::empty({D}, DType::F32, Device::CUDA); };

        // Out of place: the reference for the in-place runs.
        Tensor h = Tensor::empty({rows, D}, dtype, Device::CUDA), y = Tensor::empty({rows, D}, dtype, Device::CUDA);
        Tensor mean = rows_f32(), rstd = rows_f32();
        gpu::residual_layernorm_forward_fused(x, r, gamma, beta, float(kEps), h, y, mean, rstd, kernel);
        for (const bool into_x : {true, false}) {
          INFO((into_x ? "h = x" : "h = r"));
          Tensor xs = x.clone(), rs = r.clone();
          Tensor& hh = into_x ? xs : rs;
          Tensor y2 = Tensor::empty({rows, D}, dtype, Device::CUDA), mean2 = rows_f32(), rstd2 = rows_f32();
          gpu::residual_layernorm_forward_fused(xs, rs, gamma, beta, float(kEps), hh, y2, mean2, rstd2, kernel);
          CHECK(same_bytes(hh, h));
          CHECK(same_bytes(y2, y));
          CHECK(same_bytes(mean2, mean));
          CHECK(same_bytes(rstd2, rstd));
        }
        Tensor dh = Tensor::empty({rows, D}, dtype, Device::CUDA), dgamma = cols_f32(), dbeta = cols_f32();
        gpu::residual_layernorm_backward_fused(dy, &dh_in, h, gamma, mean, rstd, dh, dgamma, dbeta, kernel);
        Tensor stream = dh_in.clone(), dgamma2 = cols_f32(), dbeta2 = cols_f32();
        gpu::residual_layernorm_backward_fused(dy, &stream, h, gamma, mean, rstd, stream, dgamma2, dbeta2, kernel);
        CHECK(same_bytes(stream, dh));
        CHECK(same_bytes(dgamma2, dgamma));
        CHECK(same_bytes(dbeta2, dbeta));
      }
#endif
}

TEST_CASE("residual_layernorm CUDA backward is deterministic (no float atomics)", "[residual_layernorm][cuda]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  // The resident rows under both memory systems' entries, then the one-block-per-row kernels.
  const std::pair<Kernel, std::optional<gpu::MemorySystem>> runs[] = {{Kernel::ResidentRows, gpu::MemorySystem::HBM3},
                                                                      {Kernel::ResidentRows, gpu::MemorySystem::HBM3e},
                                                                      {Kernel::OneBlockPerRow, std::nullopt}};
  for (const auto& [kernel, memory] : runs)
    for (const DType dtype : {DType::F32, DType::BF16})
      for (const int64_t D : {768, 4096, 16384}) {
        INFO(kernel_name(kernel) << entry_name(memory, dtype, D) << " dtype " << dtype_name(dtype) << " D " << D);
        const int64_t rows = std::max<int64_t>(300, rows_for(D));
        const Inputs in = make_inputs(rows, D, Rows::Random, 5);
        const Tensor x = in.x.to(dtype).to(Device::CUDA), r = in.r.to(dtype).to(Device::CUDA);
        const Tensor gamma = in.gamma.to(DType::F32).to(Device::CUDA), beta = in.beta.to(DType::F32).to(Device::CUDA);
        const Tensor dy = in.wy.to(dtype).to(Device::CUDA), dh_in = in.wh.to(dtype).to(Device::CUDA);
        const PathOutputs a = run_fused(x, r, gamma, beta, dy, dh_in, kernel, memory);
        const PathOutputs b = run_fused(x, r, gamma, beta, dy, dh_in, kernel, memory);
        CHECK(same_bytes(a.dh, b.dh));
        CHECK(same_bytes(a.dgamma, b.dgamma));
        CHECK(same_bytes(a.dbeta, b.dbeta));
      }
#endif
}
