// The fused LayerNorm CUDA kernels called directly (cuda/layernorm_kernels.hpp)
// at every D where cuda/layernorm.cu changes layout (warp per row with 8/16/24/32
// elements per lane, 128/256/512-thread rows, the 512 x 32 forward and the
// 1024-thread backward, backward clusters of 2..8 blocks per row, the chunked
// kernels), in f32 and bf16, on aligned
// tensors (16-byte path) and on views one element off (scalar path), with
// enough rows that every persistent block walks several. Outputs are poisoned
// with NaN first, so an element the kernels fail to write shows. The
// reference: plain float64 loops for the forward, the float64 CPU path for
// the backward (checked by finite differences in tests/test_layernorm.cpp,
// which also holds the op-level CUDA tests).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "cuda/layernorm_table.hpp"
#include "ops/layernorm.hpp"
#include "tests/layernorm_outputs.hpp"
#include "tests/test_util.hpp"
#ifdef HG_WITH_CUDA
#include "cuda/layernorm_kernels.hpp"
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

// ---- the production table (plain C++: runs without a GPU) ----

TEST_CASE("layernorm table: width classes, memory systems, and what each entry may name", "[layernorm][table]") {
  using namespace hg::gpu;
  // Width classes end at 256, 512, 1024, 2048, 3072, 4096, 8192; the last
  // takes everything longer.
  CHECK(ln_width_class(1) == 0);
  CHECK(ln_width_class(256) == 0);
  CHECK(ln_width_class(257) == 1);
  CHECK(ln_width_class(1024) == 2);
  CHECK(ln_width_class(3072) == 4);
  CHECK(ln_width_class(3073) == 5);
  CHECK(ln_width_class(8192) == 6);
  CHECK(ln_width_class(8193) == 7);
  CHECK(ln_width_class(1 << 20) == 7);
  for (const MemorySystem m : {MemorySystem::HBM3, MemorySystem::HBM3e})
    for (const LnPass pass : {LnPass::Forward, LnPass::Backward})
      for (const bool bf16 : {false, true})
        for (int c = 0; c < kLnWidthClasses; ++c) {
          const LnKernel k = ln_table_entry(m, pass, bf16, c);
          INFO(memory_system_name(m) << (pass == LnPass::Forward ? " forward " : " backward ")
                                     << (bf16 ? "bf16" : "f32") << " class " << c << ": " << ln_kernel_name(k));
          CHECK(ln_kernel_compiled(k, pass, bf16, c));
          CHECK(ln_kernel_compiled(ln_fallback(k), pass, bf16, c));
          CHECK(ln_fallback(k).rows == LnRows::InRegisters);
          CHECK(ln_fallback(k).bf16_8_byte_access == k.bf16_8_byte_access);
          if (!bf16) CHECK_FALSE(k.bf16_8_byte_access);  // an f32 row has no 8-byte bf16 slots
          if (pass == LnPass::Backward) {                // the backward has no one-pass or two-a-step kernels
            CHECK(k.rows != LnRows::StagedTwoAStep);
            CHECK_FALSE(k.one_pass_stats);
            CHECK_FALSE(k.bf16_packed);
          }
          if (k.one_pass_stats || k.bf16_packed) CHECK(k.rows == LnRows::InRegisters);
          // What the device would run is what the table says.
          constexpr int64_t kLast[kLnWidthClasses] = {256, 512, 1024, 2048, 3072, 4096, 8192, kLnResidentMaxD};
          const int64_t D = kLast[c];
          CHECK(ln_production_kernel(m, pass, bf16 ? hg::DType::BF16 : hg::DType::F32, D) == k);
          // The list a test runs holds the entry and its fallback, each once.
          const std::vector<LnKernel> all = ln_compiled_kernels(pass, bf16 ? hg::DType::BF16 : hg::DType::F32, D);
          CHECK(std::count(all.begin(), all.end(), k) == 1);
          CHECK(std::count(all.begin(), all.end(), ln_fallback(k)) == 1);
        }
  // Rows in registers are not compiled everywhere: the bf16 forward of
  // 1025-2048 runs one-pass packed rows on both memories.
  CHECK_FALSE(ln_kernel_compiled(ln::kInRegisters, LnPass::Forward, true, 3));
}

#ifdef HG_WITH_CUDA
namespace {

using namespace hg;
using hg::test::all_finite;
using hg::test::rel_error;
using hg::test::same_bytes;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kEps = 1e-5f;

#if defined(__GLIBC__)
// The cases allocate and free host buffers of 10 to 200 MB thousands of
// times. By default glibc maps each one anew and returns it on free, so every
// page faults in again: a third of the host time. Take buffers up to 32 MB
// (glibc's largest threshold) from the heap and keep freed memory for reuse.
[[maybe_unused]] const bool kHostBuffersReused =
    mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#endif

using Outputs = hg::test::LayerNormOutputs;
using Values = hg::test::LayerNormValues;

// A case's inputs as float64 host values: x and dy (rows, D), gamma and beta
// (D, float32 numbers). Drawn in float64 (draw), then stored in a dtype
// (stored_as): from there on the values are the stored numbers, what the
// reference sees. The host work (drawing, the float64 reference, the
// comparisons) outweighs the kernels by far, so the cases draw once and run
// both dtypes, both layouts and every configuration on one draw where they can.
struct Case {
  int64_t rows = 0, D = 0;
  DType dtype = DType::F64;
  std::vector<double> x, dy, gamma, beta;
};

// How x is drawn: N(offset, stddev^2); first_column: if set, x[r, 0] =
// first_column(r); row_scale: if set, row r is multiplied by row_scale(r).
// with_dy: false for the forward-only cases.
struct Draw {
  double offset = 0.0, stddev = 1.0;
  std::function<double(int64_t)> first_column = nullptr, row_scale = nullptr;
  bool with_dy = true;
};

// The numbers `values` become when stored in dtype.
std::vector<double> rounded(const std::vector<double>& values, DType dtype) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, dtype).to_vector();
}

// n values of N(mean, stddev^2), stream `stream` of `seed`: Marsaglia's
// polar method on the generator's uniforms, both values of each accepted
// pair used, several times faster than Generator::normal (Box-Muller, one
// value per pair, two transcendental calls each); the cases draw tens of
// millions. In pieces of 2^16 values on the library's threads, piece p
// from the generator's counter (stream << 48) + (p << 24) on (it takes
// ~2^17 of them): the same values at any thread count.
std::vector<double> normals(uint64_t seed, uint64_t stream, int64_t n, double mean, double stddev) {
  std::vector<double> v(static_cast<size_t>(n));
  hg::for_pieces(n, hg::test::kPiece, [&](int64_t begin, int64_t end) {
    Generator gen(seed);
    gen.set_state(seed, (stream << 48) + (static_cast<uint64_t>(begin / hg::test::kPiece) << 24));
    for (int64_t i = begin; i < end;) {
      const double a = 2.0 * gen.uniform() - 1.0, b = 2.0 * gen.uniform() - 1.0, s = a * a + b * b;
      if (s >= 1.0 || s == 0.0) continue;
      const double f = std::sqrt(-2.0 * std::log(s) / s);
      v[i++] = mean + stddev * a * f;
      if (i < end) v[i++] = mean + stddev * b * f;
    }
  });
  return v;
}

// x as `how` says, dy of N(0, 1), gamma of N(1, 0.5^2) and beta of N(0, 1)
// in float32, each from its own stream of seed.
Case draw(int64_t rows, int64_t D, uint64_t seed, const Draw& how = {}) {
  Case c{rows, D, DType::F64, normals(seed, 0, rows * D, how.offset, how.stddev), {}, {}, {}};
  for (int64_t r = 0; r < rows; ++r) {
    if (how.first_column) c.x[r * D] = how.first_column(r);
    if (how.row_scale) std::for_each(&c.x[r * D], &c.x[r * D] + D, [k = how.row_scale(r)](double& v) { v *= k; });
  }
  if (how.with_dy) c.dy = normals(seed, 1, rows * D, 0.0, 1.0);
  c.gamma = rounded(normals(seed, 2, D, 1.0, 0.5), DType::F32);
  c.beta = rounded(normals(seed, 3, D, 0.0, 1.0), DType::F32);
  return c;
}

// x and dy rounded to dtype: what the GPU tensors will hold.
Case stored_as(const Case& drawn, DType dtype) {
  Case c = drawn;
  c.dtype = dtype;
  c.x = rounded(drawn.x, dtype);
  c.dy = rounded(drawn.dy, dtype);
  return c;
}

Case make_case(int64_t rows, int64_t D, DType dtype, uint64_t seed, const Draw& how = {}) {
  return stored_as(draw(rows, D, seed, how), dtype);
}

// (rows, D) on the GPU in `dtype`; offset_view: a view starting one element
// into its storage, so the row starts are not 16-byte aligned.
Tensor gpu_matrix(const std::vector<double>& values, int64_t rows, int64_t D, DType dtype, bool offset_view) {
  if (!offset_view) return Tensor::from_vector(values, {rows, D}, dtype).to(Device::CUDA);
  std::vector<double> flat(values.size() + 1, 0.0);
  std::copy(values.begin(), values.end(), flat.begin() + 1);
  return Tensor::from_vector(flat, {rows * D + 1}, dtype).to(Device::CUDA).slice(1, rows * D + 1).reshape({rows, D});
}

struct Inputs {
  Tensor x, gamma, beta, dy;  // on the GPU (x possibly a misaligned view)
};

Inputs upload(const Case& c, bool offset_view) {
  return {gpu_matrix(c.x, c.rows, c.D, c.dtype, offset_view),
          Tensor::from_vector(c.gamma, {c.D}, DType::F32).to(Device::CUDA),
          Tensor::from_vector(c.beta, {c.D}, DType::F32).to(Device::CUDA),
          gpu_matrix(c.dy, c.rows, c.D, c.dtype, false)};
}

// The float64 reference on a case's stored values: forward from plain
// float64 loops, backward from the float64 CPU path
// (tests/layernorm_outputs.hpp); for bf16 also each y and dx element's
// float32 slack (the bound of check_outputs).
struct Reference {
  Values want;
  hg::test::LayerNormSlack slack;
};

Reference reference(const Case& c) {
  const Tensor x = Tensor::from_vector(c.x, {c.rows, c.D}, DType::F64),
               dy = Tensor::from_vector(c.dy, {c.rows, c.D}, DType::F64);
  const Tensor gamma = Tensor::from_vector(c.gamma, {c.D}, DType::F64),
               beta = Tensor::from_vector(c.beta, {c.D}, DType::F64);
  Reference r{values_of(hg::test::layernorm_reference(x, gamma, beta, dy, kEps)), {}};
  if (c.dtype == DType::BF16) r.slack = hg::test::layernorm_bf16_slack(r.want, c.x, c.gamma, c.beta, c.dy);
  return r;
}

Tensor poisoned(const Shape& shape, DType dtype) { return Tensor::full(shape, kNaN, dtype, Device::CUDA); }

// The kernel configurations of one run (cuda/layernorm_table.hpp); unset:
// the production table of this device.
struct Configs {
  std::optional<gpu::LnKernel> forward, backward;
};

std::string describe(const Configs& c) {
  const auto name = [](const std::optional<gpu::LnKernel>& k) {
    return k ? gpu::ln_kernel_name(*k) : std::string("production");
  };
  return "forward '" + name(c.forward) + "', backward '" + name(c.backward) + "'";
}

void forward_with(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean, Tensor& rstd,
                  const std::optional<gpu::LnKernel>& k) {
  if (k) gpu::layernorm_forward_fused(x, gamma, beta, kEps, y, mean, rstd, *k);
  else gpu::layernorm_forward_fused(x, gamma, beta, kEps, y, mean, rstd);
}

void backward_with(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, const std::optional<gpu::LnKernel>& k) {
  if (k) gpu::layernorm_backward_fused(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, *k);
  else gpu::layernorm_backward_fused(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
}

// Forward, then backward on the forward's own mean/rstd, every output NaN first.
Outputs run_kernels(const Inputs& in, const Configs& configs = {}) {
  const int64_t rows = in.x.size(0), D = in.x.size(1);
  const DType dtype = in.x.dtype();
  Outputs out{poisoned({rows, D}, dtype), poisoned({rows}, DType::F32), poisoned({rows}, DType::F32),
              poisoned({rows, D}, dtype), poisoned({D}, DType::F32),    poisoned({D}, DType::F32)};
  forward_with(in.x, in.gamma, in.beta, out.y, out.mean, out.rstd, configs.forward);
  backward_with(in.dy, in.x, in.gamma, out.mean, out.rstd, out.dx, out.dgamma, out.dbeta, configs.backward);
  return out;
}

// The configurations a case reaches: on 16-byte rows of D <= 16384 every
// configuration compiled for each pass (gpu::ln_compiled_kernels: the
// entries of every memory system's table and their fallbacks), paired up
// so that max(forward, backward) runs cover them all; other rows run the
// same kernels whatever the configuration, so once, in production.
std::vector<Configs> configs_for(int64_t D, DType dtype, bool offset_view) {
  if (offset_view || D > gpu::kLnResidentMaxD) return {Configs{}};
  const std::vector<gpu::LnKernel> fwd = gpu::ln_compiled_kernels(gpu::LnPass::Forward, dtype, D);
  const std::vector<gpu::LnKernel> bwd = gpu::ln_compiled_kernels(gpu::LnPass::Backward, dtype, D);
  std::vector<Configs> out;
  for (size_t i = 0; i < std::max(fwd.size(), bwd.size()); ++i)
    out.push_back({fwd[std::min(i, fwd.size() - 1)], bwd[std::min(i, bwd.size() - 1)]});
  return out;
}

// The kernels' outputs against the float64 reference. Every output must be
// written (the NaN poison gone), then:
// - statistics, dgamma and dbeta: float32 math on exactly stored inputs.
//   Reductions are trees/short sequential runs: errors ~ log(n) 2^-24 relative
//   to the summed magnitudes (~1e-6); 1e-5 (f32) leaves headroom without
//   hiding a wrong term (a missing row or column shows as >= 1/rows or 1/D).
//   The mean is measured in row standard deviations;
// - y and dx: f32 as above; bf16 within 1 ulp of the float64 reference
//   rounded to bf16, and equal to it on >= 99% of the elements
//   (tests/bf16_ulps.hpp derives the bound).
void check_outputs(const Case& c, const Outputs& out, const Reference& ref) {
  const Values got = values_of(out);
  REQUIRE(all_finite(got.y));
  REQUIRE(all_finite(got.mean));
  REQUIRE(all_finite(got.rstd));
  REQUIRE(all_finite(got.dx));
  REQUIRE(all_finite(got.dgamma));
  REQUIRE(all_finite(got.dbeta));
  if (c.dtype == DType::F32) {
    hg::test::check_layernorm_outputs(got, ref.want, 1e-5, 1e-5, 1e-5);
  } else {  // bf16 y and dx in ulps of the rounded reference; dgamma/dbeta: dy*xhat of rounded values
    hg::test::check_layernorm_bf16(got, ref.want, ref.slack, 1e-5, 1e-4);
  }
}

// check_outputs for every configuration the case reaches, on one reference.
void check_against_reference(const Case& c, const Reference& ref, bool offset_view) {
  const Inputs in = upload(c, offset_view);
  for (const Configs& k : configs_for(c.D, c.dtype, offset_view)) {
    INFO(describe(k));
    check_outputs(c, run_kernels(in, k), ref);
  }
}
void check_against_reference(const Case& c, bool offset_view) { check_against_reference(c, reference(c), offset_view); }

// Every D at which the kernels switch layout, and one past it (769 on the
// scalar path, 776 the first width past 768 with 16-byte rows in both
// dtypes). Past 16384 the forward is chunked; the backward (sm_90+) takes
// clusters of C blocks, each on a slice of at most 16384 columns,
// C at least 2 for 16385 (odd: scalar path) and 16392, 3 for 40000, 4 for
// 65536, 7 for 100003 (odd), and exactly 8 for 131072 (the dispatcher may
// take a larger C where more blocks stay resident); 140000 takes the
// chunked backward (as every D past 16384 does below sm_90).
const std::vector<int64_t> kWidths = {1,    3,     8,     100,   256,   257,   512,   513,    768,    769,
                                      776,  1024,  1025,  1536,  2048,  2056,  3072,  4096,   4104,   8192,
                                      8200, 12288, 16384, 16385, 16392, 40000, 65536, 100003, 131072, 140000};

// Rows: odd, and (below the chunked sizes) more than the persistent grid
// holds at once on an H100, so blocks walk several rows (e.g. D = 16384:
// 183 rows for 132 backward blocks; D = 256: 4501 rows for <= 4224 warps);
// capped at ~3M elements so the float64 reference stays quick.
// HG_KERNEL_ROWS_CAP=N caps every row count below at N: racecheck follows each
// shared-memory access of the cluster kernels slowly enough that their full
// row counts outlast its time cap. 19 rows is more than the persistent grid
// has clusters of 7 or 8 blocks (at most 132 / 7 = 18), so at D = 100003 and
// 131072 some clusters still walk a second row.
int64_t capped(int64_t rows) {
  static const int64_t cap = [] {
    const char* text = std::getenv("HG_KERNEL_ROWS_CAP");
    if (text == nullptr) return std::numeric_limits<int64_t>::max();
    const long long n = std::atoll(text);
    if (n < 1) throw std::runtime_error("HG_KERNEL_ROWS_CAP must be a positive count, got '" + std::string(text) + "'");
    std::fprintf(stderr, "test_layernorm_kernels: at most %lld rows (HG_KERNEL_ROWS_CAP)\n", n);
    return static_cast<int64_t>(n);
  }();
  return std::min(rows, cap);
}

int64_t rows_for(int64_t D) { return capped(std::max<int64_t>(37, std::min<int64_t>(4501, 3'000'000 / D) | 1)); }

// HG_KERNEL_WIDTHS=LO-HI runs only the widths D in [LO, HI] (every test case
// below): scripts/gpu_check.sh splits this program into shards of D so that
// each compute-sanitizer run stays within its time cap. Unset: every width.
bool width_selected(int64_t D) {
  static const std::pair<long long, long long> range = [] {
    const char* text = std::getenv("HG_KERNEL_WIDTHS");
    if (text == nullptr) return std::pair<long long, long long>{1, std::numeric_limits<long long>::max()};
    long long lo = 0, hi = 0;
    char tail = 0;
    if (std::sscanf(text, "%lld-%lld%c", &lo, &hi, &tail) != 2 || lo > hi)
      throw std::runtime_error("HG_KERNEL_WIDTHS must be LO-HI, got '" + std::string(text) + "'");
    std::fprintf(stderr, "test_layernorm_kernels: only D in [%lld, %lld] (HG_KERNEL_WIDTHS)\n", lo, hi);
    return std::pair<long long, long long>{lo, hi};
  }();
  return D >= range.first && D <= range.second;
}

// ---- staged configurations against their fallback (rows in registers) ----
// A staged configuration takes the same statistics in the same order as its
// fallback, the rows in registers with the same slot width (only where a
// row comes from differs), so y, mean and rstd, and dx on the same
// statistics, must be bitwise the fallback's. Two a step: a group with an
// odd share of rows ends on a step with one row (and a second, empty one).

// The staged configurations compiled for (pass, dtype, D).
std::vector<gpu::LnKernel> staged_configs(gpu::LnPass pass, DType dtype, int64_t D) {
  std::vector<gpu::LnKernel> out;
  for (const gpu::LnKernel& k : gpu::ln_compiled_kernels(pass, dtype, D))
    if (k.rows != gpu::LnRows::InRegisters) out.push_back(k);
  return out;
}

struct ForwardOutputs {
  Tensor y, mean, rstd;
};

// The forward alone with configuration k, every output NaN first.
ForwardOutputs run_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const gpu::LnKernel& k) {
  const int64_t rows = x.size(0), D = x.size(1);
  ForwardOutputs out{poisoned({rows, D}, x.dtype()), poisoned({rows}, DType::F32), poisoned({rows}, DType::F32)};
  gpu::layernorm_forward_fused(x, gamma, beta, kEps, out.y, out.mean, out.rstd, k);
  return out;
}

// A forward-only case (drawn without dy) on the GPU in dtype: 16-byte
// aligned rows wherever D * sizeof(dtype) is a multiple of 16.
struct ForwardInputs {
  Tensor x, gamma, beta;
};
ForwardInputs forward_inputs(const Case& drawn, DType dtype) {
  return {Tensor::from_vector(drawn.x, {drawn.rows, drawn.D}, dtype).to(Device::CUDA),
          Tensor::from_vector(drawn.gamma, {drawn.D}, DType::F32).to(Device::CUDA),
          Tensor::from_vector(drawn.beta, {drawn.D}, DType::F32).to(Device::CUDA)};
}
Draw forward_only(Draw how = {}) {
  how.with_dy = false;
  return how;
}

// The staged forward k against its fallback, on any rows.
void check_staged_matches(const ForwardInputs& in, const gpu::LnKernel& k) {
  const ForwardOutputs resident = run_forward(in.x, in.gamma, in.beta, gpu::ln_fallback(k));
  const ForwardOutputs staged = run_forward(in.x, in.gamma, in.beta, k);
  REQUIRE(all_finite(resident.y));
  REQUIRE(all_finite(resident.mean));
  REQUIRE(all_finite(resident.rstd));
  CHECK(same_bytes(staged.y, resident.y));
  CHECK(same_bytes(staged.mean, resident.mean));
  CHECK(same_bytes(staged.rstd, resident.rstd));
}

}  // namespace

TEST_CASE("layernorm kernels: every layout, f32 and bf16, aligned and offset, all outputs written",
          "[layernorm][cuda][kernels][layouts]") {
  HG_REQUIRE_GPU();
  // One draw per width, in both dtypes; the aligned tensor and the offset
  // view hold the same values, so one reference serves both.
  uint64_t seed = 900;
  for (const int64_t D : kWidths) {
    if (!width_selected(D)) continue;
    const int64_t rows = rows_for(D);
    const Case drawn = draw(rows, D, seed++);
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const Case c = stored_as(drawn, dtype);
      const Reference ref = reference(c);
      for (const bool offset_view : {false, true}) {
        INFO("dtype " << dtype_name(dtype) << " rows " << rows << " D " << D << (offset_view ? " offset view" : ""));
        check_against_reference(c, ref, offset_view);
      }
    }
  }
}

// Every width class of the production tables (cuda/layernorm_table.hpp),
// its first and last 16-byte width, with each memory system's table
// whatever the device's is: the configurations each entry names pass the
// reference, and the backward is bitwise reproducible. (The cases above
// cover every compiled configuration; this one covers the lookup.)
TEST_CASE("layernorm kernels: each production table at the edges of its width classes",
          "[layernorm][cuda][kernels][tables]") {
  HG_REQUIRE_GPU();
  // One draw and one reference per width and dtype serve both tables.
  uint64_t seed = 4100;
  for (const int64_t D : {256, 264, 512, 520, 1024, 1032, 2048, 2056, 3072, 3080, 4096, 4104, 8192, 8200, 16384}) {
    if (!width_selected(D)) continue;
    const Case drawn = draw(rows_for(D), D, seed++);
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const Case c = stored_as(drawn, dtype);
      const Reference ref = reference(c);
      const Inputs in = upload(c, false);
      for (const gpu::MemorySystem memory : {gpu::MemorySystem::HBM3, gpu::MemorySystem::HBM3e}) {
        const Configs table{gpu::ln_production_kernel(memory, gpu::LnPass::Forward, dtype, D),
                            gpu::ln_production_kernel(memory, gpu::LnPass::Backward, dtype, D)};
        INFO(gpu::memory_system_name(memory)
             << " table, dtype " << dtype_name(dtype) << " D " << D << ": " << describe(table));
        const Outputs got = run_kernels(in, table);
        check_outputs(c, got, ref);
        const Outputs again = run_kernels(in, table);
        CHECK(same_bytes(again.dx, got.dx));
        CHECK(same_bytes(again.dgamma, got.dgamma));
      }
    }
  }
}

TEST_CASE("layernorm kernels: a configuration not compiled for the case is an error naming those that are",
          "[layernorm][cuda][kernels][tables]") {
  HG_REQUIRE_GPU();
  // The bf16 forward of 1025-2048 runs one-pass packed rows on both memories:
  // rows in registers are not compiled there.
  const Case c = make_case(5, 1032, DType::BF16, 7);
  const Inputs in = upload(c, false);
  Tensor y = poisoned({5, 1032}, DType::BF16), mean = poisoned({5}, DType::F32), rstd = poisoned({5}, DType::F32);
  try {
    gpu::layernorm_forward_fused(in.x, in.gamma, in.beta, kEps, y, mean, rstd, gpu::ln::kInRegisters);
    FAIL("accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("in registers") != std::string::npos);
    CHECK(what.find(gpu::ln_kernel_name(gpu::ln::kOnePassPackedBf16)) != std::string::npos);
  }
  // Rows the configurations do not apply to (offset views) run whatever is asked.
  const Inputs off = upload(c, true);
  gpu::layernorm_forward_fused(off.x, off.gamma, off.beta, kEps, y, mean, rstd, gpu::ln::kInRegisters);
  CHECK(all_finite(y));
}

TEST_CASE("layernorm kernels: backward is bitwise reproducible in every layout",
          "[layernorm][cuda][kernels][reproducible]") {
  HG_REQUIRE_GPU();
  for (const int64_t D : {256, 1024, 2048, 4096, 8192, 16384, 40000, 100003, 131072, 140000}) {
    if (!width_selected(D)) continue;
    const Case drawn = draw(rows_for(D), D, 77);
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const Inputs in = upload(stored_as(drawn, dtype), false);
      for (const Configs& c : configs_for(D, dtype, false)) {
        const Outputs a = run_kernels(in, c);
        const Outputs b = run_kernels(in, c);
        INFO("dtype " << dtype_name(dtype) << " D " << D << " " << describe(c));
        CHECK(all_finite(a.dx));  // written, and not NaN (which no bitwise match would excuse)
        CHECK(all_finite(a.dgamma));
        CHECK(all_finite(a.dbeta));
        CHECK(same_bytes(a.dx, b.dx));
        CHECK(same_bytes(a.dgamma, b.dgamma));
        CHECK(same_bytes(a.dbeta, b.dbeta));
      }
    }
  }
}

TEST_CASE("layernorm kernels: large offsets and constant rows in the block layouts",
          "[layernorm][cuda][kernels][hostile]") {
  HG_REQUIRE_GPU();
  struct Shift {
    double offset, stddev;
  };
  // 1e6 + N(0, 1e-2) in float32 is quantised to steps of 1/16; the reference
  // sees the same stored values. The saved float32 mean is off by up to 1/32,
  // which the backward must correct for (docs/layernorm.md, section 2).
  for (const Shift s : {Shift{1e4, 1.0}, Shift{1e6, 1e-2}, Shift{-3.0, 0.0}})
    for (const int64_t D : {1000, 4096, 16384, 40000, 65536}) {
      if (!width_selected(D)) continue;
      const Case c = make_case(capped(67), D, DType::F32, 31, {s.offset, s.stddev});
      const Values want = reference(c).want;
      const Inputs in = upload(c, false);
      for (const Configs& k : configs_for(D, DType::F32, false)) {
        INFO("offset " << s.offset << " stddev " << s.stddev << " D " << D << " " << describe(k));
        const Values got = values_of(run_kernels(in, k));
        REQUIRE(all_finite(got.y));
        REQUIRE(all_finite(got.dx));
        REQUIRE(all_finite(got.dgamma));
        CHECK(rel_error(got.y, want.y) < 1e-5);
        CHECK(rel_error(got.dx, want.dx) < 1e-5);
        CHECK(rel_error(got.dgamma, want.dgamma) < 1e-5);
        // A constant row: x - shift is exactly 0, so y is beta exactly.
        if (s.stddev == 0.0) CHECK(got.y == want.y);
      }
    }
}

TEST_CASE("layernorm kernels: rows whose squares overflow float32, and tiny rows, in every configuration",
          "[layernorm][cuda][kernels][hostile][range]") {
  HG_REQUIRE_GPU();
  // (x - mean)^2 summed over a row passes the largest float (3.4e38, bf16's
  // too) once |x - mean| passes ~1e19: every kernel must take such rows'
  // statistics again on scaled values (cuda/layernorm_moments.cuh), not
  // return rstd = 0 and y = beta. 1e37 rows: their float32 row sums overflow
  // as well. Tiny rows (eps dominates; 1e-39 is subnormal) must still match.
  // Every configuration compiled for D (configs_for), 16-byte rows and
  // offset views (the scalar kernels), the chunked and cluster widths; the
  // float64 reference is in range. y, dx and rstd row by row: a 1e30 row's
  // dx and rstd are 1e-30 times its neighbours'.
  struct Range {
    const char* name;
    double offset, stddev, huge_scale;  // rows r % 3 == 1 scaled by huge_scale
  };
  const Range ranges[] = {{"N(0,1) 1e30", 0.0, 1e30, 1.0},
                          {"1e30 + N(0,1) 1e28", 1e30, 1e28, 1.0},
                          {"a N(0,1) 1e30 row every third", 0.0, 1.0, 1e30},
                          {"N(0,1) 1e37", 0.0, 1e37, 1.0},
                          {"N(0,1) 1e-30", 0.0, 1e-30, 1.0},
                          {"N(0,1) 1e-39 (subnormal)", 0.0, 1e-39, 1.0}};
  // One draw per width and range, in both dtypes and both layouts.
  uint64_t seed = 5100;
  for (const int64_t D : {8, 256, 768, 1000, 1024, 2048, 3072, 4096, 8192, 16384, 40000, 65536, 140000}) {
    if (!width_selected(D)) continue;
    for (const Range& range : ranges) {
      const auto scale = range.huge_scale == 1.0 ? std::function<double(int64_t)>()
                                                 : [&](int64_t r) { return r % 3 == 1 ? range.huge_scale : 1.0; };
      const Case drawn = draw(capped(37), D, seed++, {range.offset, range.stddev, nullptr, scale});
      for (const DType dtype : {DType::F32, DType::BF16}) {
        const Case c = stored_as(drawn, dtype);
        const Reference ref = reference(c);
        for (const bool offset_view : {false, true}) {
          const Inputs in = upload(c, offset_view);
          for (const Configs& k : configs_for(D, dtype, offset_view)) {
            INFO(range.name << " dtype " << dtype_name(dtype) << " D " << D << (offset_view ? " offset view " : " ")
                            << describe(k));
            const Values got = values_of(run_kernels(in, k));
            REQUIRE(all_finite(got.y));
            REQUIRE(all_finite(got.rstd));
            REQUIRE(all_finite(got.dx));
            CHECK(hg::test::worst_row_rel_error(got.rstd, ref.want.rstd, 1) < 1e-5);
            if (dtype == DType::F32)  // float32 statistics: the mean's storage rounding is 2^-24 |mean|
              hg::test::check_layernorm_rows(got, ref.want, std::ldexp(1.0, -24), 1e-5, 1e-5, 1e-5);
            else hg::test::check_layernorm_bf16(got, ref.want, ref.slack, 1e-5, 1e-4);
          }
        }
      }
    }
  }
}

TEST_CASE("layernorm kernels: rows holding NaN give NaN rows", "[layernorm][cuda][kernels][hostile][range]") {
  HG_REQUIRE_GPU();
  // Row 1 holds one NaN: its y and rstd are NaN in every configuration (the
  // overflow guard takes such a row's statistics again, still NaN), the
  // other rows are finite.
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : {256, 1024, 4096, 16384, 40000, 140000}) {
      if (!width_selected(D)) continue;
      const Inputs in = upload(
          make_case(3, D, dtype, 5200, {0.0, 1.0, [](int64_t r) { return r == 1 ? std::nan("") : 0.5; }}), false);
      for (const Configs& k : configs_for(D, dtype, false)) {
        INFO("dtype " << dtype_name(dtype) << " D " << D << " " << describe(k));
        Outputs out{poisoned({3, D}, dtype),
                    Tensor::zeros({3}, DType::F32, Device::CUDA),
                    Tensor::zeros({3}, DType::F32, Device::CUDA),
                    {},
                    {},
                    {}};
        forward_with(in.x, in.gamma, in.beta, out.y, out.mean, out.rstd, k.forward);
        const std::vector<double> y = out.y.to_vector(), rstd = out.rstd.to_vector();
        CHECK(std::isnan(rstd[1]));
        CHECK(std::isfinite(rstd[0]));
        CHECK(std::isfinite(rstd[2]));
        int64_t finite_in_row_1 = 0, finite_elsewhere = 0;
        for (int64_t j = 0; j < D; ++j) {
          finite_in_row_1 += std::isfinite(y[D + j]);
          finite_elsewhere += std::isfinite(y[j]) + std::isfinite(y[2 * D + j]);
        }
        CHECK(finite_in_row_1 == 0);
        CHECK(finite_elsewhere == 2 * D);
      }
    }
}

TEST_CASE("layernorm kernels: one-pass statistics where x[row, 0] is far from the row mean",
          "[layernorm][cuda][kernels][hostile]") {
  HG_REQUIRE_GPU();
  // The one-pass configurations take the variance as E[d^2] - E[d]^2 of
  // d = x - x[row, 0] and fall back to the second pass when x[row, 0] is over
  // sqrt(3) row standard deviations from the mean. Rows here put x[row, 0] at
  // 0 to 1e4 standard deviations (row r: k = kOff[r % 6]), so both paths run
  // in one launch, next to each other, and every configuration must still match the
  // float64 statistics. No common offset: a float32 mean near 1e3 alone is
  // rounded by 3e-5 row standard deviations, over tol_stats whatever the
  // kernel does (the offset cases above check y, dx and dgamma instead).
  // (Not D = 16384: there the 1e4 rows' mean is off by 1.1e-5 to 1.8e-5 row
  // standard deviations in every configuration, the two-pass one included:
  // the shift by x[row, 0] costs bits when x[row, 0] itself is the outlier.
  // bench/lab/layernorm.md, "Known limits".)
  constexpr double kOff[] = {0.0, 1.0, 1.7, 2.0, 50.0, 1e4};
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t D : {256, 768, 4096}) {
      if (!width_selected(D)) continue;
      const Case c = make_case(capped(97), D, dtype, 41, {0.0, 1.0, [&](int64_t r) { return kOff[r % 6]; }});
      INFO("dtype " << dtype_name(dtype) << " D " << D);
      check_against_reference(c, false);
    }
}

TEST_CASE("layernorm kernels: cluster rows with one to three rows", "[layernorm][cuda][kernels][few-rows]") {
  HG_REQUIRE_GPU();
  // 1 and 3 rows: the persistent grid shrinks to one cluster per row (one
  // partial row each), and no cluster walks a second row, so this checks
  // the first-row exchange and the partial-row count on their own.
  uint64_t seed = 500;
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int64_t rows : {1, 3})
      for (const int64_t D : {16385, 40000, 131072}) {
        if (!width_selected(D)) continue;
        INFO("dtype " << dtype_name(dtype) << " rows " << rows << " D " << D);
        check_against_reference(make_case(rows, D, dtype, seed++), false);
      }
}

TEST_CASE("layernorm kernels: staged forward configurations are bitwise their fallback (rows in registers)",
          "[layernorm][cuda][kernels][staged]") {
  HG_REQUIRE_GPU();
  // Every width class with 16-byte rows in both dtypes (8: one word per f32
  // row; 768..1024 warp rows; 1032 and 4096 multi-warp groups; 8200 and 16384
  // the 512-thread rows), each staged configuration compiled there. 1 and 3
  // rows leave most groups of the one block without a row (they still make
  // the trip, waiting for nothing); 1000 and 5000 rows wrap every group's
  // ring several times (a persistent grid holds at most a few hundred to a
  // few thousand groups). Cases past 24M elements are left out to keep the
  // host draw short. Two a step also runs 2 rows and 2999 and 4001, so that
  // at every width some row count leaves groups odd and even shares side by
  // side (grids hold ~130 to ~4000 groups; of 528, 2999 = 5 x 528 + 359 rows
  // gives shares of 6 and 5). One draw per (D, rows) serves both dtypes and
  // every configuration.
  uint64_t seed = 1700;
  for (const int64_t D : {8, 768, 1000, 1024, 1032, 4096, 8200, 16384}) {
    if (!width_selected(D)) continue;
    for (const int64_t rows : {1, 2, 3, 1000, 2999, 4001, 5000}) {
      if (rows * D > 24'000'000) continue;
      const bool odd_shares = rows == 2 || rows == 2999 || rows == 4001;
      const auto runs_here = [&](DType dtype) {
        std::vector<gpu::LnKernel> out;
        for (const gpu::LnKernel& k : staged_configs(gpu::LnPass::Forward, dtype, D))
          if (!odd_shares || k.rows == gpu::LnRows::StagedTwoAStep) out.push_back(k);
        return out;
      };
      if (runs_here(DType::F32).empty() && runs_here(DType::BF16).empty()) continue;
      const Case drawn = draw(capped(rows), D, seed++, forward_only());
      for (const DType dtype : {DType::F32, DType::BF16}) {
        const ForwardInputs in = forward_inputs(drawn, dtype);
        for (const gpu::LnKernel& k : runs_here(dtype)) {
          INFO("'" << gpu::ln_kernel_name(k) << "' dtype " << dtype_name(dtype) << " rows " << capped(rows) << " D "
                   << D);
          check_staged_matches(in, k);
        }
      }
    }
  }
}

TEST_CASE("layernorm kernels: staged forward configurations are bitwise their fallback on hostile rows",
          "[layernorm][cuda][kernels][staged][hostile]") {
  HG_REQUIRE_GPU();
  struct Hostile {
    double offset, stddev;
    bool outlier_first;  // x[r, 0] at 0 .. 1e4 row standard deviations (row r: kOff[r % 6])
  };
  constexpr double kOff[] = {0.0, 1.0, 1.7, 2.0, 50.0, 1e4};
  for (const int64_t D : {768, 4096, 16384}) {
    if (!width_selected(D)) continue;
    for (const Hostile h : {Hostile{1e4, 1.0, false}, Hostile{-3.0, 0.0, false}, Hostile{0.0, 1.0, true}}) {
      const auto first = h.outlier_first ? std::function<double(int64_t)>([&](int64_t r) { return kOff[r % 6]; })
                                         : std::function<double(int64_t)>();
      const Case drawn = draw(capped(1001), D, 61, forward_only({h.offset, h.stddev, first}));
      for (const DType dtype : {DType::F32, DType::BF16}) {
        const ForwardInputs in = forward_inputs(drawn, dtype);
        for (const gpu::LnKernel& k : staged_configs(gpu::LnPass::Forward, dtype, D)) {
          INFO("'" << gpu::ln_kernel_name(k) << "' dtype " << dtype_name(dtype) << " D " << D << " offset " << h.offset
                   << " stddev " << h.stddev << (h.outlier_first ? " outlier in column 0" : ""));
          check_staged_matches(in, k);
          if (h.stddev == 0.0) {  // a constant row: x - shift is exactly 0, so y is beta exactly
            const ForwardOutputs staged = run_forward(in.x, in.gamma, in.beta, k);
            const std::vector<double> y = staged.y.to_vector(), beta = in.beta.to(dtype).to_vector();
            for (int64_t r = 0; r < in.x.size(0); r += 97)
              CHECK(std::equal(beta.begin(), beta.end(), y.begin() + r * D));
          }
        }
      }
    }
  }
}

namespace {

// ---- the staged backward against its fallback ----

struct Grads {
  Tensor dx, dgamma, dbeta;
};

// The backward alone with configuration k, on a given mean/rstd; outputs NaN first.
Grads backward_as(const gpu::LnKernel& k, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                  const Tensor& rstd) {
  const int64_t D = x.size(1);
  Grads g{poisoned(x.shape(), x.dtype()), poisoned({D}, DType::F32), poisoned({D}, DType::F32)};
  gpu::layernorm_backward_fused(dy, x, gamma, mean, rstd, g.dx, g.dgamma, g.dbeta, k);
  return g;
}

// Per column, sum over rows of |dy xhat| and of |dy| in float64: the scale
// of dgamma's and dbeta's terms. xhat as the kernels form it from the saved
// float32 mean and rstd: (x - mean) rstd less its row mean (the mean's
// rounding times rstd; docs/layernorm.md, section 2).
std::pair<std::vector<double>, std::vector<double>> column_term_scales(const Tensor& dy, const Tensor& x,
                                                                       const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = x.size(0), D = x.size(1);
  const std::vector<double> xs = x.to_vector(), ds = dy.to_vector(), m = mean.to_vector(), r = rstd.to_vector();
  std::vector<double> c(rows, 0.0), sg(D, 0.0), sb(D, 0.0);
  hg::test::for_rows(rows, D, [&](int64_t i) {
    for (int64_t col = 0; col < D; ++col) c[i] += (xs[i * D + col] - m[i]) * r[i];
    c[i] /= static_cast<double>(D);
  });
  // Columns in pieces, each summed over the rows in order.
  hg::for_pieces(D, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t col = begin; col < end; ++col) {
        const double d = ds[i * D + col];
        sg[col] += std::abs(d * ((xs[i * D + col] - m[i]) * r[i] - c[i]));
        sb[col] += std::abs(d);
      }
  });
  return {sg, sb};
}

}  // namespace

TEST_CASE("layernorm kernels: staged backward configurations against their fallback (rows in registers)",
          "[layernorm][cuda][kernels][staged]") {
  HG_REQUIRE_GPU();
  // Both configurations run on one mean/rstd (the production forward's).
  // dx must be bitwise the fallback's: the staged kernel forms each row's
  // three sums with the resident kernel's per-thread order (the same slots:
  // 16 bytes, or 8 bytes of bf16 for both) and group reduction. dgamma/dbeta are sums
  // over the same rows grouped differently (other blocks, register instead
  // of shared-memory accumulators): two float32 sums of the same n = rows
  // terms (bitwise the same xhat in both), each within about (n - 1) 2^-24
  // sum|term| of the exact sum (the worst-case bound of any summation
  // order), plus one rounding per term, differ by at most 2 (n + 2) 2^-24
  // sum|term| (one spare 2^-24 for the float64 scale's own distance from the
  // float32 terms). That catches a wrong or missing column, and a missing row
  // up to ~1000 rows; the layouts test checks every configuration against
  // float64 too. The staged configuration must also be bitwise reproducible. Hostile rows: a
  // common offset of 1e4, and constant rows (x - mean is the mean's rounding
  // alone).
  // One draw per (D, rows, kind) serves both dtypes and every configuration.
  struct Kind {
    double offset, stddev;
  };
  uint64_t seed = 1700;
  for (const int64_t D : {768, 1024, 1032, 4096, 8200, 16384}) {
    if (!width_selected(D)) continue;
    for (const int64_t wanted_rows : {0, 1, 3, 1000, 5000})
      for (const Kind kind : {Kind{0.0, 1.0}, Kind{1e4, 1.0}, Kind{-3.0, 0.0}}) {
        if (kind.stddev != 1.0 || kind.offset != 0.0)
          if (wanted_rows != 1000) continue;         // hostile rows at one row count
        if (wanted_rows * D > 24'000'000) continue;  // the float64 column scales stay a short host pass
        if (staged_configs(gpu::LnPass::Backward, DType::F32, D).empty() &&
            staged_configs(gpu::LnPass::Backward, DType::BF16, D).empty())
          continue;
        const int64_t rows = capped(wanted_rows);
        const Case drawn = draw(rows, D, seed++, {kind.offset, kind.stddev});
        for (const DType dtype : {DType::F32, DType::BF16}) {
          const std::vector<gpu::LnKernel> staged = staged_configs(gpu::LnPass::Backward, dtype, D);
          if (staged.empty()) continue;
          const Inputs in = upload(stored_as(drawn, dtype), false);
          Tensor y = poisoned({rows, D}, dtype), mean = poisoned({rows}, DType::F32),
                 rstd = poisoned({rows}, DType::F32);
          gpu::layernorm_forward_fused(in.x, in.gamma, in.beta, kEps, y, mean, rstd);
          const auto [scale_g, scale_b] = rows == 0 ? std::pair<std::vector<double>, std::vector<double>>()
                                                    : column_term_scales(in.dy, in.x, mean, rstd);
          for (const gpu::LnKernel& k : staged) {
            INFO("'" << gpu::ln_kernel_name(k) << "' dtype " << dtype_name(dtype) << " rows " << rows << " D " << D
                     << " offset " << kind.offset << " stddev " << kind.stddev);
            const Grads want = backward_as(gpu::ln_fallback(k), in.dy, in.x, in.gamma, mean, rstd);
            const Grads got = backward_as(k, in.dy, in.x, in.gamma, mean, rstd);
            const Grads again = backward_as(k, in.dy, in.x, in.gamma, mean, rstd);
            REQUIRE(all_finite(got.dx));
            REQUIRE(all_finite(got.dgamma));
            REQUIRE(all_finite(got.dbeta));
            CHECK(same_bytes(got.dx, want.dx));
            CHECK(same_bytes(got.dx, again.dx));
            CHECK(same_bytes(got.dgamma, again.dgamma));
            CHECK(same_bytes(got.dbeta, again.dbeta));
            const std::vector<double> g_staged = got.dgamma.to_vector(), g_resident = want.dgamma.to_vector();
            const std::vector<double> b_staged = got.dbeta.to_vector(), b_resident = want.dbeta.to_vector();
            if (rows == 0) {  // kernel 2 alone writes the zeros
              CHECK(g_staged == std::vector<double>(D, 0.0));
              CHECK(b_staged == std::vector<double>(D, 0.0));
              continue;
            }
            const double per_term = 2.0 * static_cast<double>(rows + 2) * std::ldexp(1.0, -24);
            int64_t bad_g = 0, bad_b = 0;
            for (int64_t c = 0; c < D; ++c) {
              bad_g += std::abs(g_staged[c] - g_resident[c]) > per_term * scale_g[c];
              bad_b += std::abs(b_staged[c] - b_resident[c]) > per_term * scale_b[c];
            }
            CHECK(bad_g == 0);
            CHECK(bad_b == 0);
          }
        }
      }
  }
}

TEST_CASE("layernorm kernels: bf16 8-byte backward configurations against float64 on few and many rows",
          "[layernorm][cuda][kernels][narrow]") {
  HG_REQUIRE_GPU();
  // The layouts test runs the 8-byte bf16 configurations against float64 on
  // rows enough that every block walks several; this adds the staged test's
  // row counts of 1 and 3 (most groups of the one block without a row) at
  // every resident width class of 16-byte bf16 rows where one is compiled,
  // with the same bounds (check_outputs), and, where two are, dx of each
  // against the other bitwise (the same 8-byte slots, summed in the same
  // order; dgamma/dbeta: other groupings of one sum, held to the float64
  // bounds instead).
  uint64_t seed = 2900;
  for (const int64_t D : {8, 768, 1000, 1024, 1032, 4096, 8200, 16384}) {
    if (!width_selected(D)) continue;
    std::vector<gpu::LnKernel> narrow;
    for (const gpu::LnKernel& k : gpu::ln_compiled_kernels(gpu::LnPass::Backward, DType::BF16, D))
      if (k.bf16_8_byte_access) narrow.push_back(k);
    if (narrow.empty()) continue;
    for (const int64_t rows : {int64_t{1}, int64_t{3}, rows_for(D)}) {
      const Case c = make_case(capped(rows), D, DType::BF16, seed++);
      const Reference ref = reference(c);
      const Inputs in = upload(c, false);
      std::vector<Outputs> got;
      for (const gpu::LnKernel& k : narrow) {
        const Configs configs{std::nullopt, k};
        INFO(describe(configs) << " rows " << capped(rows) << " D " << D);
        got.push_back(run_kernels(in, configs));
        check_outputs(c, got.back(), ref);
      }
      for (size_t i = 1; i < got.size(); ++i) {
        INFO("'" << gpu::ln_kernel_name(narrow[i]) << "' against '" << gpu::ln_kernel_name(narrow[0]) << "', rows "
                 << capped(rows) << " D " << D);
        CHECK(same_bytes(got[i].dx, got[0].dx));
      }
    }
  }
}

#else
TEST_CASE("layernorm kernels: built without CUDA", "[layernorm][cuda][kernels]") {
  HG_GPU_UNAVAILABLE("no CUDA GPU present (handgrad was built without CUDA); the fused LayerNorm kernel tests run on "
                     "the device machine");
}
#endif
