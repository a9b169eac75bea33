#pragma once
// Shared by the Catch2 tests: finite differences, error norms, GPU skip.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/gradcheck.hpp"
#include "core/half.hpp"
#include "core/parallel.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "tests/catch.hpp"

namespace hg::test {

// The finite-difference tools live in the library (core/gradcheck.hpp).
using hg::central_difference;
using hg::numerical_grad;
using hg::rel_error;
using hg::weighted_sum;

// hg::gpu::set_memory_limit for a scope: the limit lifted again at its end.
struct GpuMemoryLimit {
  explicit GpuMemoryLimit(size_t bytes) { hg::gpu::set_memory_limit(bytes); }
  ~GpuMemoryLimit() { hg::gpu::set_memory_limit(0); }
  GpuMemoryLimit(const GpuMemoryLimit&) = delete;
  GpuMemoryLimit& operator=(const GpuMemoryLimit&) = delete;
};

// The per-element passes of the kernel tests (millions of elements, once per
// configuration) run in pieces of kPiece on hg::for_pieces' threads; their
// bodies must not use Catch2 assertions.
constexpr int64_t kPiece = int64_t(1) << 16;

// rel_error (core/gradcheck.hpp) of host values: ||a - b|| / max(||a||, ||b||),
// the sums taken per piece (for_pieces) and added in piece order.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  const int64_t n = static_cast<int64_t>(a.size());
  struct Sums {
    double diff = 0, na = 0, nb = 0;
  };
  std::vector<Sums> part(static_cast<size_t>(pieces(n, kPiece)));
  for_pieces(n, kPiece, [&](int64_t begin, int64_t end) {
    Sums& s = part[static_cast<size_t>(begin / kPiece)];
    for (int64_t i = begin; i < end; ++i) {
      s.diff += (a[i] - b[i]) * (a[i] - b[i]);
      s.na += a[i] * a[i];
      s.nb += b[i] * b[i];
    }
  });
  Sums all;
  for (const Sums& s : part) all.diff += s.diff, all.na += s.na, all.nb += s.nb;
  return std::sqrt(all.diff) / std::max({std::sqrt(all.na), std::sqrt(all.nb), 1e-300});
}

// Central differences of `loss` with respect to up to `max_coords`
// coordinates of x (a float64 CPU tensor, perturbed in place and restored):
// all of them when x has no more, else `max_coords` drawn from `gen`.
// Returns ||numeric - analytic|| / max(||analytic||, ||numeric||, floor)
// over those coordinates.
inline double sampled_fd_rel_error(const std::function<double()>& loss, Tensor& x, const Tensor& analytic,
                                   int64_t max_coords, Generator& gen, double h, double floor) {
  REQUIRE(x.dtype() == DType::F64);
  REQUIRE(analytic.shape() == x.shape());
  std::vector<int64_t> coords;
  if (x.numel() <= max_coords) {
    for (int64_t i = 0; i < x.numel(); ++i) coords.push_back(i);
  } else {
    for (int64_t k = 0; k < max_coords; ++k) coords.push_back(static_cast<int64_t>(gen.next_u64() % x.numel()));
  }
  const std::vector<double> a = analytic.to_vector();
  double* xs = x.data<double>();
  double diff = 0, na = 0, nn = 0;
  for (int64_t i : coords) {
    const double num = central_difference(loss, xs, i, h);
    diff += (num - a[i]) * (num - a[i]);
    na += a[i] * a[i];
    nn += num * num;
  }
  return std::sqrt(diff) / std::max({std::sqrt(na), std::sqrt(nn), floor});
}

// LayerNorm's per-row mean is compared in units of the row's standard
// deviation: max_r |mean_r - want_mean_r| * want_rstd_r. A relative error
// would be ill-posed (a zero-centred row has mean ~ 1/sqrt(D), so float32
// summation noise of ~log2(D) * 2^-24 * mean|x| looks large next to it);
// this measure is the error the mean puts into x_hat, which is what matters.
inline double mean_error_in_stddevs(const std::vector<double>& m, const std::vector<double>& w,
                                    const std::vector<double>& r) {
  REQUIRE(m.size() == w.size());
  REQUIRE(r.size() == w.size());
  double worst = 0;
  for (size_t i = 0; i < m.size(); ++i) worst = std::max(worst, std::abs(m[i] - w[i]) * r[i]);
  return worst;
}
inline double mean_error_in_stddevs(const Tensor& mean, const Tensor& want_mean, const Tensor& want_rstd) {
  REQUIRE(mean.shape() == want_mean.shape());
  return mean_error_in_stddevs(mean.to_vector(), want_mean.to_vector(), want_rstd.to_vector());
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

inline bool all_finite(const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<char> finite(static_cast<size_t>(pieces(n, kPiece)), 1);
  for_pieces(n, kPiece, [&](int64_t begin, int64_t end) {
    finite[static_cast<size_t>(begin / kPiece)] =
        std::all_of(values.begin() + begin, values.begin() + end, [](double v) { return std::isfinite(v); });
  });
  return std::all_of(finite.begin(), finite.end(), [](char f) { return f != 0; });
}
inline bool all_finite(const Tensor& t) { return all_finite(t.to_vector()); }

// Byte for byte (host copies of tensors of one shape and dtype): -0 and +0
// differ, a NaN equals the same NaN. The check of "the same bits".
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// A float64 CPU copy, the form every comparison with a float64 reference
// takes (exact: every storage type widens to float64 exactly).
inline Tensor f64(const Tensor& t) {
  if (t.dtype() == DType::F64) return t.to(Device::CPU);
  return Tensor::from_vector(t.to_vector(), t.shape(), DType::F64);
}

// The message of the exception `f` throws, or "" when it returns normally
// (one spelling for Catch2 v2 and v3, which differ in their matchers).
template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace hg::test

namespace hg::test {

// HG_REQUIRE_CUDA=1 (scripts/gpu_check.sh sets it) says this machine must run
// the GPU tests: every case that would skip for want of a GPU fails instead.
// Unset or 0: skip, visibly. Any other value is refused, not guessed at.
inline bool cuda_required() {
  const char* text = std::getenv("HG_REQUIRE_CUDA");
  const std::string v = text == nullptr ? "" : text;
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw std::runtime_error("HG_REQUIRE_CUDA must be 0 or 1 (or unset), got '" + v + "'");
}

// For a CPU test case that also runs CUDA variants when it can: true where a
// GPU is present; otherwise a visible SKIPPED warning naming what did not
// run (test.sh and gpu_check.sh count those lines), or, under
// HG_REQUIRE_CUDA=1, a failure. No path is dropped without a word.
inline bool cuda_paths_run(const std::string& what) {
  const bool required = cuda_required();  // a bad value is refused even where a GPU is present
  if (::hg::cuda_available()) return true;
  if (required) {
    FAIL_CHECK("HG_REQUIRE_CUDA=1 but no CUDA GPU present: the CUDA paths of " << what << " cannot run");
  } else {
    WARN("SKIPPED: no CUDA GPU present; the CUDA paths of " << what << " did not run");
  }
  return false;
}

}  // namespace hg::test

// Leaves a GPU test case that cannot run here: a visible "SKIPPED" message,
// or a failure under HG_REQUIRE_CUDA=1 (Catch2 v2 and v3 alike).
#define HG_GPU_UNAVAILABLE(why)                                          \
  do {                                                                   \
    if (::hg::test::cuda_required()) FAIL("HG_REQUIRE_CUDA=1 but " why); \
    HG_SKIP("SKIPPED: " why);                                            \
  } while (0)

// First line of every GPU test case. HG_REQUIRE_CUDA's value is checked on
// every machine, so a bad value is refused where a GPU is present too.
#define HG_REQUIRE_GPU()                                                                                              \
  do {                                                                                                                \
    (void)::hg::test::cuda_required();                                                                                \
    if (!::hg::cuda_available()) HG_GPU_UNAVAILABLE("no CUDA GPU present; this GPU test runs on the device machine"); \
  } while (0)
