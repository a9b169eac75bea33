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

// body(begin, end) for the pieces of [0, n) of `chunk` elements, on the
// library's threads (core/parallel.hpp). The pieces depend on n alone, so
// per-piece results combined in piece order are the same at any thread
// count. For the per-element passes of the kernel tests (millions of
// elements, once per configuration); body must not use Catch2 assertions.
template <class Body>
void for_pieces(int64_t n, int64_t chunk, const Body& body) {
  parallel_for(pieces(n, chunk), n, [&](int64_t p) { body(p * chunk, std::min(n, (p + 1) * chunk)); });
}
constexpr int64_t kPiece = int64_t(1) << 16;

// Every element of t as float64, row-major: one copy to the host, then one
// typed pass. Tensor::to_vector goes through the generic accessor element by
// element, several times slower on the millions of elements the kernel
// tests compare.
inline std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.to(Device::CPU);
  const int64_t n = h.numel();
  std::vector<double> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const auto widen = [&](const auto* p, auto convert) {
    for_pieces(n, kPiece, [&](int64_t b, int64_t e) { std::transform(p + b, p + e, out.begin() + b, convert); });
  };
  const auto same = [](auto v) { return static_cast<double>(v); };
  switch (h.dtype()) {
    case DType::F32: widen(h.data<float>(), same); break;
    case DType::F64: widen(h.data<double>(), same); break;
    case DType::BF16: widen(h.data<bf16_t>(), bf16_to_float); break;
    case DType::F16: widen(h.data<f16_t>(), half_to_float); break;
  }
  return out;
}

// A CPU tensor of `dtype` holding `values`, each stored as
// Tensor::from_vector stores it (16-bit types through float), in one typed
// pass: host_values(host_tensor(v, ...)) are the stored numbers.
inline Tensor host_tensor(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::CPU);
  REQUIRE(static_cast<size_t>(t.numel()) == values.size());
  if (values.empty()) return t;
  const auto narrow = [&](auto* p, auto convert) {
    for_pieces(t.numel(), kPiece,
               [&](int64_t b, int64_t e) { std::transform(values.begin() + b, values.begin() + e, p + b, convert); });
  };
  const auto through_float = [](auto to) { return [to](double v) { return to(static_cast<float>(v)); }; };
  switch (dtype) {
    case DType::F32: narrow(t.data<float>(), [](double v) { return static_cast<float>(v); }); break;
    case DType::F64: narrow(t.data<double>(), [](double v) { return v; }); break;
    case DType::BF16: narrow(t.data<bf16_t>(), through_float(float_to_bf16)); break;
    case DType::F16: narrow(t.data<f16_t>(), through_float(float_to_half)); break;
  }
  return t;
}

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
  return mean_error_in_stddevs(host_values(mean), host_values(want_mean), host_values(want_rstd));
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = host_values(a), vb = host_values(b);
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
inline bool all_finite(const Tensor& t) { return all_finite(host_values(t)); }

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
  return host_tensor(host_values(t), t.shape(), DType::F64);
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
