// The fused softmax CUDA kernels called directly (cuda/softmax_kernels.hpp),
// at every Tk where cuda/softmax.cu switches layout (lane teams of 8/16/32
// lanes with 1-8 chunks, block team, streaming), in f32 and bf16, on aligned
// tensors (16-byte path) and on views one element off (scalar path). Outputs
// are poisoned with NaN first, so an element the kernel fails to write shows.
// The staged forward (sm_90+, non-causal 16-byte rows of Tk 1024..16384)
// has its own cases: padding mask, hostile rows, run to run, against the
// register layout on the same rows, and with more rows than the GPU runs
// groups at once (a mask row kept in registers must follow its group from
// batch to batch).
// The op-level tests (every path against float64, hostile inputs, errors)
// are in tests/test_softmax.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cuda_runtime.hpp"
#include "core/tensor.hpp"
#include "cuda/softmax_kernels.hpp"
#include "ops/softmax.hpp"
#include "tests/bf16_ulps.hpp"
#include "tests/test_util.hpp"

namespace {

using hg::Device;
using hg::DType;
using hg::Shape;
using hg::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// PaddingHostileManyRows: PaddingHostile's batches with so many rows that
// every group of the staged forward handles rows of more than one batch.
enum class Variant { Plain, PaddingCausal, FullMaskHostile, HugeLogits, PaddingHostile, PaddingHostileManyRows };

bool padding_hostile(Variant v) { return v == Variant::PaddingHostile || v == Variant::PaddingHostileManyRows; }

// Queries a head for PaddingHostileManyRows (2 heads): a batch's rows
// outnumber the groups of tk / 32 threads or more (a staged thread holds at
// most 32 keys) that fit the GPU at once, at most 2048 threads a SM. So the
// resident grid's stride between a group's rows is less than a batch: every
// group's first row is in batch 0 (fully masked) and its later rows reach
// batches 1 and 2, whose masks differ; a kept mask row not read again for
// another batch's row gives that row batch 0's zeros.
int64_t many_rows_tq(int64_t tk) {
  const int64_t groups = int64_t{hg::gpu::sm_count()} * 2048 * 32 / tk;
  return groups / 2 + 1;
}

struct Case {
  int64_t b, h, tq, tk;
  const Tensor* mask;  // F64 CPU copy of the F32 mask, or null
  int64_t mask_batch_stride, mask_query_stride;
  bool causal;
  double scale;
  int64_t rows() const { return b * h * tq; }
};

// float64 reference straight from the definition in ops/softmax.hpp, on the
// values the kernel saw (x widened from its storage dtype).
std::vector<double> reference_forward(const std::vector<double>& x, const Case& c) {
  const std::vector<double> mask = c.mask != nullptr ? c.mask->to_vector() : std::vector<double>();
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < c.rows(); ++r) {
    const int64_t bi = r / (c.h * c.tq), q = r % c.tq;
    const int64_t visible = c.causal ? std::clamp<int64_t>(q + c.tk - c.tq + 1, 0, c.tk) : c.tk;
    std::vector<double> z(static_cast<size_t>(c.tk), -kInf);
    bool row_nan = false;
    double zmax = -kInf;
    for (int64_t k = 0; k < visible; ++k) {
      double v = c.scale * x[r * c.tk + k];
      if (c.mask != nullptr) {
        const double m = mask[bi * c.mask_batch_stride + q * c.mask_query_stride + k];
        v += m > hg::kSoftmaxMaskThreshold ? m : m - kInf;
      }
      z[k] = v;
      row_nan = row_nan || std::isnan(v);
      zmax = std::max(zmax, v);
    }
    if (row_nan) {
      for (int64_t k = 0; k < c.tk; ++k) y[r * c.tk + k] = kNaN;
      continue;
    }
    if (zmax == -kInf) continue;  // fully masked: zeros
    double total = 0.0;
    for (double& v : z) total += (v = std::exp(v - zmax));
    for (int64_t k = 0; k < c.tk; ++k) y[r * c.tk + k] = z[k] / total;
  }
  return y;
}

std::vector<double> reference_backward(const std::vector<double>& dy, const std::vector<double>& y, int64_t tk,
                                       double scale) {
  std::vector<double> dx(y.size());
  for (size_t r = 0; r < y.size() / tk; ++r) {
    double dot = 0.0;
    for (int64_t k = 0; k < tk; ++k) dot += dy[r * tk + k] * y[r * tk + k];
    for (int64_t k = 0; k < tk; ++k) dx[r * tk + k] = scale * y[r * tk + k] * (dy[r * tk + k] - dot);
  }
  return dx;
}

// NaN exactly where the reference has NaN; elsewhere finite, with a relative
// (norm) error and an absolute error below the tolerance.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol, double abs_tol) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0, worst = 0;
  size_t nan_mismatch = 0, not_finite = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      nan_mismatch += !std::isnan(got[i]);
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++not_finite;  // includes the NaN poison of an unwritten element
      continue;
    }
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-300);
  CAPTURE(rel, worst);
  CHECK(nan_mismatch == 0);
  CHECK(not_finite == 0);
  CHECK(rel < tol);
  CHECK(worst < abs_tol);
}

// A CUDA tensor of `shape` whose data starts `offset` elements into its
// storage (offset 1 breaks 16-byte alignment), filled from `values` (any
// dtype/device) or with NaN.
Tensor device_view(const Shape& shape, DType dtype, int64_t offset, const Tensor* values) {
  const int64_t n = hg::shape_numel(shape);
  Tensor t = Tensor::full({n + offset}, kNaN, dtype, Device::CUDA).slice(offset, n + offset).reshape(shape);
  if (values != nullptr) t.copy_(*values);
  return t;
}

void check_case(const Case& c, Variant variant, const Tensor& x, const Tensor& dy, Tensor& y, Tensor& dx,
                const hg::SoftmaxRows& l, int64_t tk, DType dtype);
void check_staged(const Tensor& x, const Tensor& y, const hg::SoftmaxRows& l, const Shape& shape, DType dtype,
                  int64_t offset);

// Batch 1 of PaddingHostile (its keys past tk - tk / 3 masked): a NaN score
// at a visible key (row (1, 0, 0)) and at a masked one ((1, 0, 1)): NaN rows;
// logits of +-1e30 ((1, 0, 2)); a constant row ((1, 0, 3)); one key of 1e30
// ((1, 1, 0)).
void set_hostile_rows(Tensor& x, int64_t tk) {
  x.set({1, 0, 0, 5}, kNaN);
  x.set({1, 0, 1, tk - 1}, kNaN);
  for (int64_t k = 0; k < tk; ++k) {
    x.set({1, 0, 2, k}, k % 3 == 0 ? 1e30 : -1e30);
    x.set({1, 0, 3, k}, 2.5);
  }
  x.set({1, 1, 0, 7}, 1e30);
}

void run_case(Variant variant, int64_t tk, DType dtype, int64_t offset, uint64_t seed) {
  hg::Generator gen(seed);
  Case c{};
  Tensor mask64;
  switch (variant) {
    case Variant::Plain:       // softmax_forward's layout: rows of tk, no mask
    case Variant::HugeLogits:  // the same with logits of about 1e30
      c = {1, 1, 1, tk, nullptr, 0, 0, false, 1.0};
      c.b = 5;
      break;
    case Variant::PaddingCausal: {  // (B, 1, 1, Tk) mask, causal, Tq = 3
      std::vector<double> m(static_cast<size_t>(2 * tk));
      for (double& v : m) {
        const double u = gen.uniform();
        v = u < 0.1 ? -kInf : u < 0.2 ? -1e9 : u < 0.5 ? -2.0 * gen.uniform() : 0.0;
      }
      mask64 = Tensor::from_vector(m, {2, 1, 1, tk}, DType::F64);
      c = {2, 2, 3, tk, &mask64, tk, 0, true, 0.7};
      break;
    }
    case Variant::FullMaskHostile: {  // (B, 1, Tq, Tk) mask; row 0 fully masked, row 1 NaN
      std::vector<double> m(static_cast<size_t>(2 * 3 * tk));
      for (double& v : m) v = gen.uniform() < 0.2 ? -kInf : -gen.uniform();
      for (int64_t k = 0; k < tk; ++k) m[k] = (k % 2 == 0) ? -kInf : -1e9;  // b 0, q 0: every key masked
      mask64 = Tensor::from_vector(m, {2, 1, 3, tk}, DType::F64);
      c = {2, 2, 3, tk, &mask64, 3 * tk, tk, false, 0.125};
      break;
    }
    case Variant::PaddingHostile:  // (B, 1, 1, Tk) padding mask, non-causal, Tq = 4: the staged forward's rows
    case Variant::PaddingHostileManyRows: {
      std::vector<double> m(static_cast<size_t>(3 * tk));
      for (int64_t k = 0; k < tk; ++k) {
        m[k] = k % 2 == 0 ? -kInf : -1e9;                                  // batch 0: every key masked
        m[tk + k] = k >= tk - tk / 3 ? -kInf : (k % 5 == 1 ? -1e4 : 0.0);  // batch 1: a padded tail, biases
        m[2 * tk + k] = gen.uniform() < 0.1 ? -kInf : -2.0 * gen.uniform();
      }
      mask64 = Tensor::from_vector(m, {3, 1, 1, tk}, DType::F64);
      const int64_t tq = variant == Variant::PaddingHostile ? 4 : many_rows_tq(tk);
      c = {3, 2, tq, tk, &mask64, tk, 0, false, 0.125};
      break;
    }
  }
  const Shape shape{c.b, c.h, c.tq, c.tk};
  INFO("variant " << static_cast<int>(variant) << " tk " << tk << " dtype " << hg::dtype_name(dtype) << " offset "
                  << offset);

  Tensor x_host = Tensor::randn(shape, gen, DType::F32, Device::CPU, 0.0, variant == Variant::HugeLogits ? 1e30 : 3.0);
  if (variant == Variant::FullMaskHostile) x_host.set({0, 0, 1, tk / 2}, kNaN);  // row 1: NaN at a visible key
  if (padding_hostile(variant)) set_hostile_rows(x_host, tk);
  const Tensor dy_host = Tensor::randn(shape, gen, DType::F32);
  const Tensor x = device_view(shape, dtype, offset, &x_host);
  const Tensor dy = device_view(shape, dtype, offset, &dy_host);
  Tensor y = device_view(shape, dtype, offset, nullptr);   // NaN poison
  Tensor dx = device_view(shape, dtype, offset, nullptr);  // NaN poison
  const Tensor mask = mask64.defined() ? mask64.to(DType::F32).to(Device::CUDA) : Tensor();
  if (mask.defined()) mask64 = mask.to(Device::CPU).to(DType::F64);  // the values the kernel reads

  hg::SoftmaxRows l;
  l.rows = c.rows();
  l.tk = tk;
  l.tq = c.tq;
  l.heads = c.h;
  l.mask = mask.defined() ? &mask : nullptr;
  l.mask_batch_stride = c.mask_batch_stride;
  l.mask_query_stride = c.mask_query_stride;
  l.causal = c.causal;
  l.scale = static_cast<float>(c.scale);
  check_case(c, variant, x, dy, y, dx, l, tk, dtype);
  if (padding_hostile(variant)) check_staged(x, y, l, shape, dtype, offset);
}

// One forward and backward of run_case's inputs, against float64.
void check_case(const Case& c, Variant variant, const Tensor& x, const Tensor& dy, Tensor& y, Tensor& dx,
                const hg::SoftmaxRows& l, int64_t tk, DType dtype) {
  hg::gpu::softmax_forward_fused(x, l, y);
  hg::gpu::softmax_backward_fused(dy, y, c.rows(), tk, static_cast<float>(c.scale), dx);

  // F32: z rounding (~1e-7 relative, exp argument off by ~1e-6) and sums of
  // up to 40000 terms. BF16: float32 results rounded once, so within 1 ulp of
  // the reference rounded to bf16 and equal to it on >= 99% of the elements
  // (tests/bf16_ulps.hpp); a NaN where the reference has none (the poison of
  // an unwritten element) fails both.
  const std::vector<double> x_seen = x.to_vector(), y_got = y.to_vector(), dy_seen = dy.to_vector();
  const std::vector<double> y_ref = reference_forward(x_seen, c);
  const std::vector<double> dx_got = dx.to_vector();
  const std::vector<double> dx_ref = reference_backward(dy_seen, y_got, tk, c.scale);
  if (dtype == DType::F32) {
    check_close(y_got, y_ref, 1e-5, 2e-5);
    check_close(dx_got, dx_ref, 1e-5, 1e-4);
  } else {
    HG_CHECK_BF16(y_got, y_ref, hg::test::softmax_y_slack(y_ref));
    HG_CHECK_BF16(dx_got, dx_ref, hg::test::softmax_dx_slack(dy_seen, y_got, tk, c.scale));
  }
  if (variant == Variant::HugeLogits) {
    // Finite logits give finite outputs: y one-hot (or split between tied
    // maxima) and dx against the float64 y, not the kernel's.
    size_t not_finite = 0;
    for (size_t i = 0; i < y_got.size(); ++i) not_finite += !std::isfinite(y_got[i]) || !std::isfinite(dx_got[i]);
    CHECK(not_finite == 0);
    const std::vector<double> dx_ref64 = reference_backward(dy_seen, y_ref, tk, c.scale);
    if (dtype == DType::F32) {
      check_close(dx_got, dx_ref64, 1e-5, 1e-4);
    } else {
      HG_CHECK_BF16(dx_got, dx_ref64, hg::test::softmax_dx_slack(dy_seen, y_ref, tk, c.scale));
    }
  }
  if (variant == Variant::FullMaskHostile) {
    size_t not_zero = 0, not_nan = 0;
    for (int64_t k = 0; k < tk; ++k) {
      not_zero += y_got[k] != 0.0 || dx_got[k] != 0.0;  // row 0, fully masked: exact zeros
      not_nan += !std::isnan(y_got[tk + k]);            // row 1, a NaN key: NaN everywhere
    }
    CHECK(not_zero == 0);
    CHECK(not_nan == 0);
  }
  if (padding_hostile(variant)) {
    const int64_t batch = c.h * c.tq * tk;
    size_t not_zero = 0, not_nan = 0;
    for (int64_t i = 0; i < batch; ++i) not_zero += y_got[i] != 0.0 || dx_got[i] != 0.0;  // batch 0: zeros
    for (int64_t i = batch; i < batch + 2 * tk; ++i) not_nan += !std::isnan(y_got[i]);    // rows (1, 0, 0..1)
    CHECK(not_zero == 0);
    CHECK(not_nan == 0);
  }
}

// Equal bit for bit: the same value, sign of zero and NaN-ness.
size_t bitwise_mismatches(const std::vector<double>& a, const std::vector<double>& b) {
  size_t n = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    n += std::isnan(a[i]) ? !std::isnan(b[i]) : !(a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]));
  return n;
}

// Where the staged forward applies (sm_90+, 16-byte rows, non-causal,
// Tk 1024..16384; bf16 rows without a mask only past Tk 4096) it must be
// the one chosen (also for the same rows without their mask), give the
// same bits on a second run, and agree with the register layout on the
// same rows: the layout with Tq = 1 and causal (every key visible, the
// same numbers) is never staged. Not bitwise there: the max and each exp are the same FFMA and
// ex2, but the staged groups sum a row's exps in another order (bf16 Tk
// 1024: a warp of 32 keys a lane against 64 threads of 16), so 1 / sum may
// differ in its last bit; f32 within the float64 bound, bf16 within 1 ulp
// on all and equal on >= 99%. From Tk 2048 a mask of query stride 0 must
// take the staged kernel that keeps the mask row in registers.
void check_staged(const Tensor& x, const Tensor& y, const hg::SoftmaxRows& l, const Shape& shape, DType dtype,
                  int64_t offset) {
  const bool staged = hg::gpu::compute_capability() >= 90 && offset == 0 && !l.causal && l.tk >= 1024 && l.tk <= 16384;
  const bool kept = staged && l.mask != nullptr && l.mask_query_stride == 0 && l.tk >= 2048;
  CHECK(hg::gpu::softmax_forward_is_staged(x, l, y) == staged);
  CHECK(hg::gpu::softmax_forward_keeps_mask_row(x, l, y) == kept);
  hg::SoftmaxRows unmasked = l;
  unmasked.mask = nullptr;
  unmasked.mask_batch_stride = unmasked.mask_query_stride = 0;
  CHECK(hg::gpu::softmax_forward_is_staged(x, unmasked, y) == (staged && (dtype == DType::F32 || l.tk > 4096)));
  Tensor again = device_view(shape, dtype, offset, nullptr);
  hg::gpu::softmax_forward_fused(x, l, again);
  CHECK(bitwise_mismatches(again.to_vector(), y.to_vector()) == 0);

  hg::SoftmaxRows registers = l;
  registers.heads = l.heads * l.tq;
  registers.tq = 1;
  registers.causal = true;
  CHECK_FALSE(hg::gpu::softmax_forward_is_staged(x, registers, y));
  Tensor y_registers = device_view(shape, dtype, offset, nullptr);
  hg::gpu::softmax_forward_fused(x, registers, y_registers);
  const std::vector<double> got = y.to_vector(), want = y_registers.to_vector();
  if (dtype == DType::F32) check_close(got, want, 1e-5, 2e-5);
  else HG_CHECK_BF16(got, want, hg::test::softmax_y_slack(want));
}

}  // namespace

TEST_CASE("fused softmax kernels agree with float64 at every layout boundary", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  // Around each switch: f32 16-byte lanes 8/16/32 x 1/2/4/8 up to 1024, bf16
  // up to 1024 (N <= 4), scalar lanes up to 256, block team up to 16384
  // (scalar backward 8192), then streaming. Odd values force the scalar path.
  const std::vector<int64_t> tks = {1,   3,   8,    31,   32,   33,   64,   96,   128,   129,   200,   256,  264,
                                    512, 520, 1000, 1024, 1032, 4096, 4097, 8200, 16384, 16385, 16392, 40000};
  uint64_t seed = 7000;
  for (const int64_t tk : tks)
    for (const DType dtype : {DType::F32, DType::BF16})
      for (const int64_t offset : {0, 1})
        for (const Variant v : {Variant::Plain, Variant::PaddingCausal, Variant::FullMaskHostile})
          run_case(v, tk, dtype, offset, seed++);
}

// Logits of about 1e30: every layout (lane teams, block team, streaming;
// 16-byte and scalar rows) must keep the max key's exponent exactly 0, so
// that y and dx stay finite and match float64 (the unfused path does).
TEST_CASE("fused softmax kernels stay finite at logits of 1e30", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 9000;
  for (const int64_t tk : {8, 64, 256, 512, 1000, 1024, 4096, 16392})
    for (const DType dtype : {DType::F32, DType::BF16})
      for (const int64_t offset : {0, 1}) run_case(Variant::HugeLogits, tk, dtype, offset, seed++);
}

// The staged forward's rows (the attention padding mask (B, 1, 1, Tk),
// non-causal) at the sizes it was measured on and at Tk 3000 (a row that
// fills its group's chunks only in part), with hostile rows; offset 1 (a
// misaligned view) and Tk 512 must not take it and stay correct, and the
// causal boundary case above covers causal rows at these Tk.
TEST_CASE("staged softmax forward: padding mask, hostile rows, run to run, register layout", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 9500;
  for (const int64_t tk : {512, 1024, 2048, 3000, 4096, 8192})
    for (const DType dtype : {DType::F32, DType::BF16})
      for (const int64_t offset : {0, 1}) run_case(Variant::PaddingHostile, tk, dtype, offset, seed++);
}

// The kept mask row (Tk >= 2048) on rows that make every group of the
// staged forward move from batch to batch (many_rows_tq): about 26M scores
// a call, every one against float64.
TEST_CASE("staged softmax forward: a kept mask row follows its group across batches", "[softmax][cuda]") {
  HG_REQUIRE_GPU();
  uint64_t seed = 9600;
  for (const int64_t tk : {2048, 3000})
    for (const DType dtype : {DType::F32, DType::BF16}) run_case(Variant::PaddingHostileManyRows, tk, dtype, 0, seed++);
}
