// Tensor core: factories, views, casts, printing, RNG determinism, error messages.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/backend.hpp"
#include "core/host_allocator.hpp"
#include "core/tensor.hpp"
#include "tests/test_util.hpp"

using hg::Device;
using hg::DType;
using hg::Tensor;

namespace {
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const hg::Error& e) {
    return e.what();
  }
  return "<no hg::Error thrown>";
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("factories fill the right values and shapes") {
  const Tensor z = Tensor::zeros({2, 3});
  REQUIRE(z.shape() == hg::Shape{2, 3});
  REQUIRE(z.numel() == 6);
  REQUIRE(z.dtype() == DType::F32);
  REQUIRE(z.device() == Device::CPU);
  for (double v : z.to_vector()) REQUIRE(v == 0.0);
  for (double v : Tensor::ones({4}, DType::F64).to_vector()) REQUIRE(v == 1.0);
  for (double v : Tensor::full({3, 1}, -2.5).to_vector()) REQUIRE(v == -2.5);
  REQUIRE(Tensor::arange(5).to_vector() == std::vector<double>{0, 1, 2, 3, 4});

  const Tensor f = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F64);
  REQUIRE(f.at({1, 2}) == 6.0);
  REQUIRE(f.at({0, 1}) == 2.0);
  REQUIRE(f.size(-1) == 3);
  REQUIRE(f.nbytes() == 48);
  REQUIRE(f.describe() == "Tensor(2, 3) f64 cpu");

  const Tensor scalar = Tensor::full({}, 7.0);
  REQUIRE(scalar.ndim() == 0);
  REQUIRE(scalar.item() == 7.0);

  const Tensor empty = Tensor::zeros({0, 4});
  REQUIRE(empty.numel() == 0);
  REQUIRE(empty.to_vector().empty());

  // CPU storage is 64-byte aligned (Eigen and vector loads rely on it).
  REQUIRE(reinterpret_cast<uintptr_t>(Tensor::empty({3}).raw_data()) % 64 == 0);
}

TEST_CASE("factories reject bad arguments") {
  REQUIRE_THROWS_AS(Tensor::zeros({2, -1}), hg::Error);
  REQUIRE_THROWS_AS(Tensor::from_vector({1, 2, 3}, {2, 2}), hg::Error);
  REQUIRE_THROWS_AS(Tensor::arange(-1), hg::Error);
  REQUIRE_THROWS_AS(Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}), hg::Error);
  REQUIRE_THROWS_AS(Tensor::zeros({2, 3}).item(), hg::Error);
  REQUIRE_THROWS_AS(Tensor::zeros({2, 3}).at({2, 0}), hg::Error);
  REQUIRE_THROWS_AS(Tensor::zeros({2, 3}).at({0}), hg::Error);
  REQUIRE_THROWS_AS(Tensor().to_vector(), hg::Error);
}

TEST_CASE("views share storage with their base") {
  Tensor base = Tensor::arange(12, DType::F64);
  Tensor m = base.reshape({3, 4});
  REQUIRE(m.shares_storage_with(base));
  m.set({1, 2}, 100.0);
  REQUIRE(base.at({6}) == 100.0);

  Tensor rows = m.slice(1, 3);
  REQUIRE(rows.shape() == hg::Shape{2, 4});
  REQUIRE(rows.shares_storage_with(base));
  REQUIRE(rows.at({0, 0}) == 4.0);
  REQUIRE(rows.at({1, 3}) == 11.0);
  rows.set({1, 0}, -1.0);
  REQUIRE(base.at({8}) == -1.0);

  Tensor row = m[2];
  REQUIRE(row.shape() == hg::Shape{4});
  REQUIRE(row.to_vector() == std::vector<double>{-1, 9, 10, 11});
  REQUIRE(m[-1].to_vector() == row.to_vector());
  // A view of a slice keeps the slice's offset.
  REQUIRE(rows.reshape({8}).at({4}) == -1.0);
  // A slice of a slice composes offsets.
  REQUIRE(rows.slice(1, 2).at({0, 1}) == 9.0);

  REQUIRE_THROWS_AS(m.slice(2, 4), hg::Error);
  REQUIRE_THROWS_AS(m.slice(-1, 2), hg::Error);
  REQUIRE_THROWS_AS(m.slice(2, 1), hg::Error);
  REQUIRE_THROWS_AS(m[3], hg::Error);
  REQUIRE_THROWS_AS(Tensor::full({}, 1.0)[0], hg::Error);
  REQUIRE(m.slice(3, 3).numel() == 0);
}

TEST_CASE("reshape infers -1 and rejects impossible shapes") {
  const Tensor t = Tensor::zeros({2, 3, 4});
  REQUIRE(t.reshape({-1, 4}).shape() == hg::Shape{6, 4});
  REQUIRE(t.reshape({2, -1}).shape() == hg::Shape{2, 12});
  REQUIRE(t.reshape({24}).shape() == hg::Shape{24});
  REQUIRE(Tensor::full({1}, 3.0).reshape({}).item() == 3.0);

  const std::string msg = error_message([&] { t.reshape({5, -1}); });
  REQUIRE(contains(msg, "reshape"));
  REQUIRE(contains(msg, "(2, 3, 4)"));
  REQUIRE(contains(msg, "(5, -1)"));
  REQUIRE_THROWS_AS(t.reshape({-1, -1}), hg::Error);
  REQUIRE_THROWS_AS(t.reshape({25}), hg::Error);
  REQUIRE_THROWS_AS(t.reshape({-2, 12}), hg::Error);
  REQUIRE_THROWS_AS(Tensor::zeros({0, 3}).reshape({0, -1}), hg::Error);  // -1 is ambiguous with 0 elements
}

TEST_CASE("clone, copy_ and fill_") {
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor b = a.clone();
  REQUIRE_FALSE(b.shares_storage_with(a));
  b.set({0, 0}, 9.0);
  REQUIRE(a.at({0, 0}) == 1.0);

  Tensor c = Tensor::zeros({2, 2}, DType::F64);
  c.copy_(a);  // f32 -> f64 through the backend's cast
  REQUIRE(c.to_vector() == std::vector<double>{1, 2, 3, 4});
  REQUIRE_THROWS_AS(c.copy_(Tensor::zeros({4})), hg::Error);

  // copy_ into a slice writes into the base storage only there.
  Tensor base = Tensor::zeros({3, 2});
  base.slice(1, 2).copy_(Tensor::from_vector({5, 6}, {1, 2}));
  REQUIRE(base.to_vector() == std::vector<double>{0, 0, 5, 6, 0, 0});
  base.slice(2, 3).fill_(-1.0);
  REQUIRE(base.to_vector() == std::vector<double>{0, 0, 5, 6, -1, -1});
}

TEST_CASE("to(dtype) converts, bf16 rounds to nearest even") {
  const Tensor a = Tensor::from_vector({0.1, -2.5, 1e30}, {3});
  const Tensor d = a.to(DType::F64);
  REQUIRE(d.dtype() == DType::F64);
  REQUIRE(d.at({0}) == static_cast<double>(0.1f));   // exactly the float value, widened
  REQUIRE(a.to(DType::F32).shares_storage_with(a));  // no-op cast returns the same tensor

  // bf16 keeps 8 significant bits: ulp(1) = 2^-7.
  const double h = std::ldexp(1.0, -8);
  const std::vector<double> in = {1.0 + h,                         // tie -> even (1.0)
                                  1.0 + 3 * h,                     // tie -> even (1 + 2^-6)
                                  1.0 + h + std::ldexp(1.0, -20),  // above the tie -> up
                                  -(1.0 + h),                      // ties are symmetric in sign
                                  3.4e38,                          // above bf16 max + half ulp (3.396e38) -> inf
                                  1.0};
  const std::vector<double> expected = {1.0, 1.0 + 4 * h, 1.0 + 2 * h, -1.0, INFINITY, 1.0};
  const Tensor b = Tensor::from_vector(in, {6}).to(DType::BF16);
  REQUIRE(b.dtype() == DType::BF16);
  REQUIRE(b.nbytes() == 12);
  REQUIRE(b.to_vector() == expected);
  // The host conversion used by kernels' reference checks agrees.
  for (size_t i = 0; i < in.size(); ++i)
    REQUIRE(hg::bf16_to_float(hg::float_to_bf16(static_cast<float>(in[i]))) == static_cast<float>(expected[i]));
  REQUIRE(std::isnan(hg::bf16_to_float(hg::float_to_bf16(NAN))));
  // And back to f32 is exact.
  REQUIRE(b.to(DType::F32).to_vector() == expected);

  // f16 round trip of representable values is exact.
  const Tensor half = Tensor::from_vector({0.5, -3.0, 1024.0}, {3}).to(DType::F16);
  REQUIRE(half.to_vector() == std::vector<double>{0.5, -3.0, 1024.0});
}

TEST_CASE("printing shows shape, dtype, device and values") {
  std::ostringstream os;
  os << Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(os.str() == "Tensor(shape=(2, 3), f32, cpu)\n[[1, 2, 3],\n [4, 5, 6]]");

  std::ostringstream scalar;
  scalar << Tensor::full({}, 2.5, DType::F64);
  REQUIRE(scalar.str() == "Tensor(shape=(), f64, cpu)\n2.5");

  std::ostringstream big;
  big << Tensor::arange(10000).reshape({100, 100});
  REQUIRE(contains(big.str(), "Tensor(shape=(100, 100), f32, cpu)"));
  REQUIRE(contains(big.str(), "..."));
  REQUIRE(contains(big.str(), "9999"));
  REQUIRE(big.str().size() < 1000);  // abbreviated, not 10000 numbers

  std::ostringstream undefined;
  undefined << Tensor();
  REQUIRE(undefined.str() == "Tensor(undefined)");
}

TEST_CASE("same seed gives the same numbers; the stream looks random") {
  hg::Generator g1(42), g2(42), g3(43);
  const Tensor a = Tensor::randn({1000}, g1);
  const Tensor b = Tensor::randn({1000}, g2);
  const Tensor c = Tensor::randn({1000}, g3);
  REQUIRE(a.to_vector() == b.to_vector());
  REQUIRE(a.to_vector() != c.to_vector());

  // Resuming from a saved (seed, counter) reproduces the continuation.
  hg::Generator saved(7);
  saved.next_u64();
  hg::Generator resumed(0);
  resumed.set_state(saved.seed(), saved.counter());
  REQUIRE(saved.next_u64() == resumed.next_u64());

  hg::Generator g(123);
  const auto n = Tensor::randn({20000}, g, DType::F64).to_vector();
  double mean = 0, sq = 0;
  for (double v : n) mean += v;
  mean /= n.size();
  for (double v : n) sq += (v - mean) * (v - mean);
  const double stddev = std::sqrt(sq / n.size());
  // Standard error of the mean is 1/sqrt(20000) ~ 0.007; 0.03 is > 4 sigma.
  REQUIRE(std::abs(mean) < 0.03);
  REQUIRE(std::abs(stddev - 1.0) < 0.03);

  const auto u = Tensor::rand({20000}, g, DType::F64, Device::CPU, -2.0, 3.0).to_vector();
  double umean = 0;
  for (double v : u) {
    REQUIRE(v >= -2.0);
    REQUIRE(v < 3.0);
    umean += v;
  }
  REQUIRE(std::abs(umean / u.size() - 0.5) < 0.05);  // sd of the mean ~ 1.44/141 = 0.01
  REQUIRE_THROWS_AS(Tensor::rand({2}, g, DType::F32, Device::CPU, 1.0, 0.0), hg::Error);
}

TEST_CASE("shape checks name the op and the shapes") {
  const Tensor a = Tensor::zeros({2, 3});
  const Tensor b = Tensor::zeros({3, 2}, DType::F64);
  std::string msg = error_message([&] { hg::check_same_shape("my_op", a, b); });
  REQUIRE(contains(msg, "my_op"));
  REQUIRE(contains(msg, "(2, 3)"));
  REQUIRE(contains(msg, "(3, 2)"));
  msg = error_message([&] { hg::check_same_dtype("other_op", a, b); });
  REQUIRE(contains(msg, "other_op"));
  REQUIRE(contains(msg, "f32"));
  REQUIRE(contains(msg, "f64"));
  msg = error_message([&] { a.check_dtype(DType::F64, "needs_f64"); });
  REQUIRE(contains(msg, "needs_f64"));
  REQUIRE(contains(msg, "(2, 3)"));
  msg = error_message([&] { a.check_device(Device::CUDA, "gpu_op"); });
  REQUIRE(contains(msg, "gpu_op"));
  REQUIRE(contains(msg, "cuda"));
  REQUIRE_NOTHROW(hg::check_same_device("fine", a, b));
  REQUIRE_THROWS_AS(a.data<double>(), hg::Error);
  msg = error_message([&] { hg::broadcast_shapes({2, 3}, {4, 3}, "bcast"); });
  REQUIRE(contains(msg, "bcast"));
  REQUIRE(contains(msg, "(4, 3)"));
  REQUIRE(hg::broadcast_shapes({2, 1, 3}, {4, 1}, "bcast") == hg::Shape{2, 4, 3});
  REQUIRE_THROWS_AS(hg::normalize_dim(2, 2, "dim_op"), hg::Error);
  REQUIRE(hg::normalize_dim(-1, 2, "dim_op") == 1);
}

TEST_CASE("moving to CUDA without a GPU fails loudly") {
  if (hg::cuda_available()) return;  // covered by the GPU case below
  REQUIRE_THROWS_AS(Tensor::zeros({2}).to(Device::CUDA), hg::Error);
}

TEST_CASE("GPU round trip, element access and casts", "[cuda]") {
  HG_REQUIRE_GPU();
  hg::Generator g(5);
  const Tensor host = Tensor::randn({37, 5}, g);
  Tensor dev = host.to(Device::CUDA);
  REQUIRE(dev.is_cuda());
  REQUIRE(dev.to(Device::CPU).to_vector() == host.to_vector());
  REQUIRE(dev.at({36, 4}) == host.at({36, 4}));
  dev.set({3, 1}, 42.0);
  REQUIRE(dev.at({3, 1}) == 42.0);
  Tensor rows = dev.slice(3, 5);
  REQUIRE(rows.at({0, 1}) == 42.0);
  // The CUDA cast rounds exactly like the CPU one.
  REQUIRE(dev.to(DType::BF16).to_vector() == dev.to(Device::CPU).to(DType::BF16).to_vector());
  Tensor z = Tensor::zeros({4, 4}, DType::F32, Device::CUDA);
  for (double v : z.to_vector()) REQUIRE(v == 0.0);
  Tensor d64 = dev.to(DType::F64);
  REQUIRE(d64.at({3, 1}) == 42.0);
  REQUIRE(d64.at({0, 0}) == static_cast<double>(static_cast<float>(host.at({0, 0}))));
  Tensor back = Tensor::zeros({37, 5});
  back.copy_(dev);
  REQUIRE(back.at({3, 1}) == 42.0);
}

// Small core services that every program touches.
#include "core/kernel_mode.hpp"
#include "core/logging.hpp"

TEST_CASE("kernel mode switch and its scope guard") {
  REQUIRE(hg::kernel_mode() == hg::KernelMode::Fused);  // the default
  {
    hg::KernelModeScope scope(hg::KernelMode::Unfused);
    REQUIRE(hg::kernel_mode() == hg::KernelMode::Unfused);
    REQUIRE(std::string(hg::kernel_mode_name(hg::kernel_mode())) == "unfused");
  }
  REQUIRE(hg::kernel_mode() == hg::KernelMode::Fused);
}

TEST_CASE("init_logging accepts level names and rejects others") {
  hg::init_logging("debug");
  REQUIRE(spdlog::get_level() == spdlog::level::debug);
  hg::init_logging("off");
  REQUIRE(spdlog::get_level() == spdlog::level::off);
  const std::string msg = error_message([] { hg::init_logging("loud"); });
  REQUIRE(contains(msg, "init_logging"));
  REQUIRE(contains(msg, "loud"));
  ::setenv("HG_LOG_LEVEL", "error", 1);
  hg::init_logging();
  REQUIRE(spdlog::get_level() == spdlog::level::err);
  ::setenv("HG_LOG_LEVEL", "nonsense", 1);
  REQUIRE_THROWS_AS(hg::init_logging(), hg::Error);
  REQUIRE_NOTHROW(hg::init_logging("info"));  // an explicit level wins over the environment
  ::unsetenv("HG_LOG_LEVEL");
}

TEST_CASE("host allocator: CPU blocks are cached and reused; a much smaller request does not pin one",
          "[tensor][allocator]") {
  if (!hg::host::caching_enabled()) {
    WARN("SKIPPED: host block cache is off in sanitizer builds (AddressSanitizer must see every free)");
    return;
  }
  hg::host::empty_cache();
  REQUIRE(hg::host::memory_stats().cached == 0);
  const void* first = nullptr;
  {
    Tensor big = Tensor::empty({1024, 1024}, DType::F32);  // 4 MiB
    first = big.raw_data();
    REQUIRE(reinterpret_cast<uintptr_t>(first) % 64 == 0);
  }
  const auto after_free = hg::host::memory_stats();
  CHECK(after_free.cached >= (4u << 20));
  {
    // Same size again: the cached block, no new system allocation.
    Tensor again = Tensor::empty({1024, 1024}, DType::F32);
    CHECK(again.raw_data() == first);
    CHECK(hg::host::memory_stats().fresh_allocs == after_free.fresh_allocs);
    again.fill_(3.0);  // the reused block is fully usable
    CHECK(again.at({1023, 1023}) == 3.0);
  }
  {
    // Far smaller than the cached block: not pinned to it (at most 2x waste).
    Tensor half_mib = Tensor::empty({1 << 17}, DType::F32);
    CHECK(half_mib.raw_data() != first);
  }
  hg::host::empty_cache();
  CHECK(hg::host::memory_stats().cached == 0);
}

TEST_CASE("from_blob uses external memory in place and releases it once, after the last view") {
  std::vector<float> buffer = {1, 2, 3, 4, 5, 6};
  int released = 0;
  {
    Tensor t = Tensor::from_blob(buffer.data(), {2, 3}, DType::F32, Device::CPU, [&released] { ++released; });
    REQUIRE(t.raw_data() == buffer.data());
    REQUIRE(t.at({1, 2}) == 6.0);
    Tensor row = t[1];
    t = Tensor();  // the view still holds the storage
    REQUIRE(released == 0);
    row.fill_(-1);  // writes land in the caller's buffer
    REQUIRE(buffer[3] == -1.0f);
    REQUIRE(buffer[0] == 1.0f);
  }
  REQUIRE(released == 1);
  REQUIRE(contains(error_message([] { Tensor::from_blob(nullptr, {-1}, DType::F32, Device::CPU, [] {}); }),
                   "Tensor::from_blob: negative dimension"));
  REQUIRE(contains(error_message([] { Tensor::from_blob(nullptr, {4}, DType::F32, Device::CPU, [] {}); }),
                   "Storage::wrap: null data"));
  REQUIRE(contains(error_message([] {
                     float x = 0;
                     Tensor::from_blob(&x, {1}, DType::F32, Device::CPU, nullptr);
                   }),
                   "release callback is required"));
  const Tensor empty = Tensor::from_blob(nullptr, {0, 3}, DType::F64, Device::CPU, [] {});
  REQUIRE(empty.numel() == 0);
}
