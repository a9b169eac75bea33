// Attention softmax bandwidth benchmark: scores (B, H, T, T), float32 and
// bf16, forward with a key-padding mask, without one (plain) and with the
// causal flag, backward, fused vs unfused (the public ops under
// hg::KernelModeScope), on CUDA and the CPU. On CUDA it also times the raw
// fused kernels on preallocated outputs and a device-to-device copy of the
// scores, so results read as % of copy rate.
//
// Bytes counted (the minimum traffic of an unmasked row): forward
// 2*numel*elt (+ the mask's bytes), backward 3*numel*elt. The causal forward
// is counted the same although the fused kernel skips the scores above the
// diagonal (about half the reads): its GB/s is "effective", and may pass copy.
//
//   bench_softmax --device cuda --csv softmax.csv
//   bench_softmax --device cpu --sizes 2x4x128 --iters 5
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/kernel_mode.hpp"
#include "core/tensor.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/softmax_kernels.hpp"
#include "examples/common/progress.hpp"
#include "ops/softmax.hpp"
#ifdef HG_WITH_CUDA
#include "bench/copy_rates.hpp"
#include "cuda/cuda_check.hpp"
#endif

namespace {

using namespace hg;

constexpr const char* kBench = "bench_softmax";
constexpr double kScale = 0.125;  // 1/sqrt(64): a typical head width

struct Size {
  int64_t B, H, T;
  Shape scores() const { return {B, H, T, T}; }
  double numel() const { return double(B) * double(H) * double(T) * double(T); }
};

std::vector<Size> parse_sizes(const std::string& text) {
  std::vector<Size> sizes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Size s{};
    char x1 = 0, x2 = 0;
    std::stringstream is(item);
    long long b = 0, h = 0, t = 0;
    char rest = 0;
    if (!((is >> b >> x1 >> h >> x2 >> t) && x1 == 'x' && x2 == 'x' && b > 0 && h > 0 && t > 0 && !(is >> rest)) ||
        b > (1LL << 20) || h > (1LL << 20) || t > (1LL << 20))
      cli::usage_error("--sizes", text, ": '", item, "' is not BxHxT with 1 <= B, H, T <= 2^20");
    s.B = b, s.H = h, s.T = t;
    sizes.push_back(s);
  }
  return sizes;
}

// The sweep on CUDA; two shared CPU cores get a smaller one.
std::vector<Size> default_sizes(Device device) {
  if (device == Device::CUDA) return {{8, 8, 128}, {8, 12, 512}, {4, 16, 1024}, {2, 16, 2048}, {1, 16, 4096}};
  return {{2, 4, 128}, {1, 4, 512}, {1, 2, 1024}};
}

struct Result {
  std::string device, dtype, pass, variant, impl;
  Size size{};
  double bytes = 0, median_ms = 0, min_ms = 0;
  double max_abs_diff = -1;  // fused vs unfused outputs; -1: not compared
  double gbps() const { return bench::gbps(bytes, median_ms); }
};

// Random scores without drawing every element on the host (1 G elements of
// Box-Muller would take minutes): a 4 M-element pool drawn once per tensor,
// tiled with device copies. Speed depends on the values only through their
// being non-constant, and the fused/unfused comparison does not care either.
Tensor random_tensor(const Shape& shape, DType dtype, Device device, Generator& gen, double stddev) {
  constexpr int64_t kPool = int64_t{1} << 22;
  const int64_t n = shape_numel(shape);
  if (n <= kPool || device != Device::CUDA) return Tensor::randn(shape, gen, DType::F32, device, 0.0, stddev).to(dtype);
  const Tensor pool = Tensor::randn({kPool}, gen, DType::F32, device, 0.0, stddev).to(dtype);
  Tensor out = Tensor::empty(shape, dtype, device);
  const size_t elt = dtype_size(dtype);
  for (int64_t i = 0; i < n; i += kPool) {
    const int64_t len = std::min(kPool, n - i);
    gpu::copy_bytes(static_cast<char*>(out.raw_data()) + i * elt, device, pool.raw_data(), device, len * elt);
  }
  return out;
}

// Key padding (B, 1, 1, T), F32 (the math dtype of F32 and BF16 scores):
// batch b hides its last (b + 1) * T / (2 (B + 1)) keys with -inf.
Tensor padding_mask(const Size& s, Device device) {
  std::vector<double> values(static_cast<size_t>(s.B * s.T), 0.0);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t hidden = (b + 1) * s.T / (2 * (s.B + 1));
    for (int64_t k = s.T - hidden; k < s.T; ++k) values[b * s.T + k] = -std::numeric_limits<double>::infinity();
  }
  return Tensor::from_vector(values, {s.B, 1, 1, s.T}, DType::F32).to(device);
}

// max |a - b| over all elements, computed on a's device (NaN if either has one).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const int64_t t = a.size(-1);
  const Tensor d = map(UnaryOp::Abs, sub(a.to(DType::F32), b.to(DType::F32))).reshape({-1, t});
  const std::vector<double> row_max = hg::max(d, 1).to_vector();
  double m = 0;
  for (const double v : row_max) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}

struct Options {
  std::string device = "all";
  std::string sizes;
  std::string dtypes = "f32,bf16";
  int iters = 0;  // 0 (not given): 30 on CUDA, 5 on the CPU
  int warmup = 3;
  bool kernels_only = false;
  std::string csv = "bench_softmax.csv";
  std::string png = "bench_softmax.png";
  cli::CommonFlags common;
};

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  cli::usage_error("--dtypes", name, ": unknown dtype (allowed: f32, bf16)");
}

// One (device, size, dtype): forward (mask, plain, causal) and backward, each fused,
// unfused and (CUDA) as the raw kernel, plus a copy of the scores on CUDA.
class SizeRun {
 public:
  SizeRun(Device device, Size size, DType dtype, const Options& opt, int iters, std::vector<Result>& results)
      : device_(device), size_(size), dtype_(dtype), opt_(opt), iters_(iters), results_(results) {
    const double elt = double(dtype_size(dtype));
    const double cache_bytes = device == Device::CUDA ? 50e6 : 32e6;  // H100 L2; a typical CPU LLC
    // Input sets in rotation: several caches' worth of the backward's inputs.
    n_sets_ = int(std::clamp(std::ceil(4 * cache_bytes / (2 * size.numel() * elt)), 1.0, 32.0));
    // Enough calls per timed sample for ~1 ms of GPU work at ~2.5 TB/s.
    reps_ =
        device == Device::CUDA ? int(std::clamp(std::ceil(1e-3 / (2 * size.numel() * elt / 2.5e12)), 1.0, 64.0)) : 1;
    Generator gen(1234);
    const Tensor x = random_tensor(size.scores(), dtype, device, gen, 2.0);
    const Tensor dy = random_tensor(size.scores(), dtype, device, gen, 1.0);
    mask_ = padding_mask(size, device);
    KernelModeScope fused(KernelMode::Fused);
    SoftmaxOptions plain;
    plain.scale = kScale;
    const Tensor y = attention_softmax_forward(x, plain);  // a real softmax output for the backward
    for (int i = 0; i < n_sets_; ++i) {
      x_.push_back(i == 0 ? x : x.clone());
      dy_.push_back(i == 0 ? dy : dy.clone());
      y_.push_back(i == 0 ? y : y.clone());
    }
  }

  void run_all() {
    const double elt = double(dtype_size(dtype_));
    const double fwd_bytes = 2 * size_.numel() * elt;
    const double mask_bytes = double(mask_.nbytes());
    const double bwd_bytes = 3 * size_.numel() * elt;

    // mask: the attention padding mask; plain: rows without a mask or the
    // causal flag (a softmax over whole rows); causal.
    struct Variant {
      const char* name;
      bool masked, causal;
    };
    for (const Variant v :
         {Variant{"mask", true, false}, Variant{"plain", false, false}, Variant{"causal", false, true}}) {
      const char* variant = v.name;
      SoftmaxOptions o;
      o.scale = kScale;
      o.causal = v.causal;
      if (v.masked) o.mask = mask_;
      const double bytes = fwd_bytes + (v.masked ? mask_bytes : 0.0);
      if (!opt_.kernels_only)
        compare_modes("forward", variant, bytes, [&](int i) { return attention_softmax_forward(x_[i], o); });
#ifdef HG_WITH_CUDA
      if (device_ == Device::CUDA) time_forward_kernel(o, variant, bytes);
#endif
    }
    if (!opt_.kernels_only)
      compare_modes("backward", "-", bwd_bytes, [&](int i) { return softmax_backward(dy_[i], y_[i], kScale); });
#ifdef HG_WITH_CUDA
    if (device_ == Device::CUDA) {
      time_backward_kernel(bwd_bytes);
      time_copy(fwd_bytes);
    }
#endif
  }

  // "f32 (B, H, T) (n input sets, r calls per sample)", for the progress line.
  std::string describe() const {
    return std::string(dtype_name(dtype_)) + " (" + std::to_string(size_.B) + ", " + std::to_string(size_.H) + ", " +
           std::to_string(size_.T) + ") (" + std::to_string(n_sets_) + " input sets, " + std::to_string(reps_) +
           " calls per sample)";
  }

 private:
  using Op = std::function<Tensor(int)>;

  void record(const char* pass, const char* variant, const char* impl, double bytes, const bench::Timing& t,
              double diff = -1) {
    results_.push_back(
        {device_name(device_), dtype_name(dtype_), pass, variant, impl, size_, bytes, t.median_ms, t.min_ms, diff});
  }

  // Times op(set) fused and unfused, and checks that both give the same answer
  // on set 0 (a fast wrong kernel must not pass as a result).
  void compare_modes(const char* pass, const char* variant, double bytes, const Op& op) {
    Tensor outputs[2];
    bench::Timing timings[2];
    const KernelMode modes[2] = {KernelMode::Fused, KernelMode::Unfused};
    for (int m = 0; m < 2; ++m) {
      KernelModeScope scope(modes[m]);
      try {
        std::vector<Tensor> keep(n_sets_);  // outputs stay alive across a rotation: distinct buffers
        timings[m] =
            bench::time_rotating(device_, n_sets_, opt_.warmup, iters_, reps_, [&](int i) { keep[i] = op(i); });
        outputs[m] = keep[0];
      } catch (const hg::Error& e) {
        spdlog::warn("skipped {} {} {} {}: {}", pass, variant, kernel_mode_name(modes[m]), dtype_name(dtype_),
                     e.what());
      }
    }
    const double diff = outputs[0].defined() && outputs[1].defined() ? max_abs_diff(outputs[0], outputs[1]) : -1.0;
    for (int m = 0; m < 2; ++m)
      if (outputs[m].defined())
        record(pass, variant, kernel_mode_name(modes[m]), bytes, timings[m], m == 0 ? diff : -1);
  }

#ifdef HG_WITH_CUDA
  // The raw kernels on preallocated outputs: the op's host-side cost removed.
  void time_forward_kernel(const SoftmaxOptions& o, const char* variant, double bytes) {
    std::vector<Tensor> y(n_sets_);
    for (Tensor& t : y) t = Tensor::empty(size_.scores(), dtype_, device_);
    hg::SoftmaxRows l;
    l.rows = size_.B * size_.H * size_.T;
    l.tk = size_.T;
    l.tq = size_.T;
    l.heads = size_.H;
    l.mask = o.mask.defined() ? &o.mask : nullptr;
    l.mask_batch_stride = o.mask.defined() ? size_.T : 0;  // (B, 1, 1, T)
    l.causal = o.causal;
    l.scale = static_cast<float>(o.scale);
    const auto t = bench::time_rotating(device_, n_sets_, opt_.warmup, iters_, reps_,
                                        [&](int i) { gpu::softmax_forward_fused(x_[i], l, y[i]); });
    record("forward", variant, "kernel", bytes, t);
  }

  void time_backward_kernel(double bytes) {
    std::vector<Tensor> dx(n_sets_);
    for (Tensor& t : dx) t = Tensor::empty(size_.scores(), dtype_, device_);
    const int64_t rows = size_.B * size_.H * size_.T;
    const auto t = bench::time_rotating(device_, n_sets_, opt_.warmup, iters_, reps_, [&](int i) {
      gpu::softmax_backward_fused(dy_[i], y_[i], rows, size_.T, static_cast<float>(kScale), dx[i]);
    });
    record("backward", "-", "kernel", bytes, t);
  }

  // cudaMemcpyAsync and our copy kernels on the scores' bytes (Tensor::clone
  // would synchronise the host after each copy); the fastest is the %copy
  // yardstick.
  void time_copy(double bytes) {
    std::vector<Tensor> dst(n_sets_);
    for (Tensor& t : dst) t = Tensor::empty(size_.scores(), dtype_, device_);
    const std::vector<bench::CopyRate> copies = bench::time_copies(
        n_sets_, opt_.warmup, iters_, reps_, x_[0].nbytes(), [&](int i) { return x_[i].raw_data(); },
        [&](int i) { return dst[i].raw_data(); });
    record("copy", "-", "memcpy", bytes, copies.front().timing);
    record("copy", "-", "best", bytes, bench::best_copy(copies).timing);
    spdlog::info("{} ({}, {}, {}): best copy {}", dtype_name(dtype_), size_.B, size_.H, size_.T,
                 bench::best_copy(copies).name);
  }
#endif

  Device device_;
  Size size_;
  DType dtype_;
  const Options& opt_;
  int iters_;
  std::vector<Result>& results_;
  int n_sets_ = 1, reps_ = 1;
  std::vector<Tensor> x_, dy_, y_;
  Tensor mask_;
};

void run_device(Device device, const Options& opt, std::vector<Result>& results) {
  const bool cuda = device == Device::CUDA;
  const std::vector<Size> sizes = opt.sizes.empty() ? default_sizes(device) : parse_sizes(opt.sizes);
  const int iters = opt.iters > 0 ? opt.iters : (cuda ? 30 : 5);
  std::vector<DType> dtypes;
  std::stringstream ds(opt.dtypes);
  std::string name;
  while (std::getline(ds, name, ',')) {
    const DType d = parse_dtype(name);
    if (!cuda && d == DType::BF16) continue;  // BF16 softmax runs only on CUDA
    dtypes.push_back(d);
  }
  if (dtypes.empty())
    cli::usage_error("--dtypes", opt.dtypes, ": none of them runs on ", device_name(device), " (allowed there: f32",
                     cuda ? ", bf16" : "", ")");
  cli::Progress progress(std::string(kBench) + " " + device_name(device) + " case",
                         int64_t(sizes.size() * dtypes.size()), 0, "cases", 1);
  int64_t cases_done = 0;
  for (const Size& s : sizes)
    for (const DType dtype : dtypes) {
      {
        SizeRun run(device, s, dtype, opt, iters, results);
        run.run_all();
        progress.update(++cases_done, 1, run.describe());
      }
      if (cuda) gpu::empty_cache();  // the largest sizes hold GBs of cached blocks
    }
  progress.finish();
}

const Result* find(const std::vector<Result>& results, const Result& r, const char* pass, const char* impl) {
  for (const Result& o : results)
    if (o.pass == pass && o.impl == impl && o.device == r.device && o.dtype == r.dtype && o.size.B == r.size.B &&
        o.size.H == r.size.H && o.size.T == r.size.T && (o.pass == "copy" || o.variant == r.variant))
      return &o;
  return nullptr;
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void report(const std::vector<Result>& results, const std::string& csv_path) {
  bench::Csv csv(csv_path,
                 "device,dtype,pass,variant,impl,B,H,T,bytes,median_ms,min_ms,gbps,speedup_vs_unfused,pct_of_copy,"
                 "max_abs_diff_vs_unfused");
  std::printf("%-5s %-5s %-8s %-6s %-7s %16s %10s %8s %8s %6s %9s\n", "dev", "dtype", "pass", "var", "impl",
              "(B, H, T)", "ms", "GB/s", "vs_unf", "%copy", "max|diff|");
  for (const Result& r : results) {
    const Result* unf = r.impl != "unfused" ? find(results, r, r.pass.c_str(), "unfused") : nullptr;
    const double speedup = unf != nullptr ? unf->median_ms / r.median_ms : 0.0;
    const Result* cp = r.impl != "best" ? find(results, r, "copy", "best") : nullptr;
    const double pct = cp != nullptr ? 100.0 * r.gbps() / cp->gbps() : 0.0;
    csv.row(r.device, r.dtype, r.pass, r.variant, r.impl, r.size.B, r.size.H, r.size.T, r.bytes, r.median_ms, r.min_ms,
            r.gbps(), speedup, pct, r.max_abs_diff);
    const std::string shape =
        "(" + std::to_string(r.size.B) + ", " + std::to_string(r.size.H) + ", " + std::to_string(r.size.T) + ")";
    std::printf("%-5s %-5s %-8s %-6s %-7s %16s %10.4f %8.1f %8s %6s %9s\n", r.device.c_str(), r.dtype.c_str(),
                r.pass.c_str(), r.variant.c_str(), r.impl.c_str(), shape.c_str(), r.median_ms, r.gbps(),
                speedup > 0 ? (fixed(speedup, 2) + "x").c_str() : "-", pct > 0 ? fixed(pct, 1).c_str() : "-",
                r.max_abs_diff >= 0 || std::isnan(r.max_abs_diff) ? fixed(r.max_abs_diff, 6).c_str() : "-");
  }
  spdlog::info("CSV written to {}", csv_path);
}

// GB/s against T for every fused and unfused case and the copy.
void write_plot(const std::vector<Result>& results, const std::string& path) {
  bench::PlotLines lines;
  for (const Result& r : results)
    if (r.impl == "fused" || r.impl == "unfused" || r.pass == "copy")
      lines.add(r.device + " " + r.dtype + " " + r.pass + " " + r.variant + " " + r.impl, r.size.T, r.gbps());
  bench::write_gbps_plot(path, "Attention softmax bandwidth, scores (B, H, T, T)", "T (sequence length)",
                         lines.lines());
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Attention softmax forward/backward bandwidth: fused vs unfused, CUDA and CPU", kBench};
  app.add_option("--device", opt.device, "cuda, cpu or all (all: CUDA when a GPU is present, then CPU)")
      ->check(CLI::IsMember({"cuda", "cpu", "all"}))
      ->capture_default_str();
  app.add_option("--sizes", opt.sizes, "comma-separated BxHxT list, scores (B, H, T, T) (default: per device)");
  app.add_option("--dtypes", opt.dtypes, "comma-separated: f32, bf16 (CUDA only)")->capture_default_str();
  app.add_option("--iters", opt.iters, "timed samples per case (default 30 CUDA, 5 CPU)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", opt.warmup, "untimed samples per case")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--kernels-only", opt.kernels_only, "CUDA: only the raw kernels and the copies (no op-level rows)");
  app.add_option("--csv", opt.csv, "CSV output path")->capture_default_str();
  app.add_option("--png", opt.png, "plot of GB/s against T, .png or .svg ('' for none)")->capture_default_str();
  cli::add_common_flags(app, opt.common);

  return cli::run_program(app, opt.common, argc, argv, [&] {
    cli::check_writable(opt.csv, "--csv");
    bench::check_plot_path(opt.png, "--png");
    if (!opt.sizes.empty()) parse_sizes(opt.sizes);  // a bad list fails now, not after the first device
    std::vector<Result> results;
    bench::for_each_device(opt.device, kBench, [&](Device d) { run_device(d, opt, results); });
    report(results, opt.csv);
    if (!opt.png.empty()) write_plot(results, opt.png);
    return cli::kExitOk;
  });
}
