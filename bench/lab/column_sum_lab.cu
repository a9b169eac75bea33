// The column-sum lab: cuda/column_sum.cuh's one-launch kernel (the bias
// gradients' column sums) at every shape of work it can take: row lanes per
// block (LANES) and the number of blocks the chunking aims for. Each is
// checked against float64 CPU sums of the same input and timed on rotating
// inputs; it prints microseconds, the bytes read per second, % of the device
// copy's bandwidth, and the fastest per shape. Links only the CUDA runtime.
//
//   column_sum_lab                                    default shapes, bf16 and f32
//   column_sum_lab --rows 8192 --cols 768,3072 --dtypes bf16 --targets 256,512 --lanes 8,16
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "cuda/column_sum.cuh"

namespace {

using bf16 = __nv_bfloat16;
using hg::gpu::column_chunks;
using hg::gpu::ColumnChunks;
using hg::gpu::kColumnGroups;

constexpr int kProductionLanes = 16;
constexpr int64_t kProductionTarget = 256;  // cuda/column_sum.cu's kLanes and kTargetBlocks

struct Options {
  std::vector<int64_t> rows{8192, 32768}, cols{512, 768, 1536, 2048, 2304, 3072};
  std::vector<std::string> dtypes{"bf16", "f32"};
  std::vector<int64_t> targets{128, 256, 512, 1024}, lanes{4, 8, 16};
  int iters = 50;
};

void print_help() {
  std::printf("column_sum_lab: the column-sum kernel (cuda/column_sum.cuh) at each shape of work, checked against\n"
              "float64 and timed.\n"
              "  --rows N[,...]       rows (default 8192,32768)\n"
              "  --cols N[,...]       widths, multiples of 8 (bf16) or 4 (f32) (default 512,768,1536,2048,2304,3072)\n"
              "  --dtypes bf16,f32    input dtypes (default both)\n"
              "  --lanes L[,...]      row lanes a block: 4, 8 or 16 (default all)\n"
              "  --targets N[,...]    blocks the chunking aims for (default 128,256,512,1024)\n"
              "  --iters N            timed samples per case (default 50)\n"
              "  --help               this text\n"
              "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  lab::Flags f("column_sum_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--rows")) o.rows = f.numbers(1, 1 << 20);
    else if (f.is("--cols")) o.cols = f.numbers(1, 1 << 20);
    else if (f.is("--targets")) o.targets = f.numbers(1, 65535);
    else if (f.is("--lanes")) {
      o.lanes = f.numbers(4, 16);
      for (int64_t l : o.lanes)
        if (l != 4 && l != 8 && l != 16) f.fail("--lanes: " + std::to_string(l) + " is not one of 4, 8, 16");
    } else if (f.is("--dtypes")) {
      o.dtypes = f.choices({"bf16", "f32"});
    } else if (f.is("--iters")) o.iters = int(f.number(3, 100000));
    else f.unknown();
  }
  return o;
}

// Launches the kernel with LANES row lanes and chunks aimed at `target` blocks.
template <class T, int LANES>
void launch(const T* x, float* out, float* scratch, unsigned* arrivals, int64_t rows, int64_t cols, int64_t target) {
  constexpr int V = 16 / sizeof(T);  // the lab's widths are multiples of V: the product's vector path
  const int64_t tiles = (cols + kColumnGroups * V - 1) / (kColumnGroups * V);
  const ColumnChunks c = column_chunks(rows, tiles, target, LANES);
  hg::gpu::column_sum_kernel<T, float, V, LANES><<<dim3(unsigned(tiles), unsigned(c.chunks)), kColumnGroups * LANES>>>(
      x, out, scratch, arrivals, rows, cols, cols, c.rows_per_chunk, int(c.chunks), false);
}

template <class T>
void launch_lanes(int lanes, const T* x, float* out, float* scratch, unsigned* arrivals, int64_t rows, int64_t cols,
                  int64_t target) {
  if (lanes == 4) launch<T, 4>(x, out, scratch, arrivals, rows, cols, target);
  else if (lanes == 8) launch<T, 8>(x, out, scratch, arrivals, rows, cols, target);
  else launch<T, 16>(x, out, scratch, arrivals, rows, cols, target);
}

template <class T>
bool run_shape(const Options& o, int64_t rows, int64_t cols, int l2_bytes) {
  constexpr int V = 16 / sizeof(T);
  const char* dtype = sizeof(T) == 4 ? "f32" : "bf16";
  if (cols % V != 0) {
    std::printf("%-4s %6lld x %-5lld skipped: the width is not a multiple of %d\n", dtype, (long long)rows,
                (long long)cols, V);
    return true;
  }
  const int64_t n = rows * cols;
  const size_t bytes = size_t(n) * sizeof(T);
  // Enough input copies that the rotation reads twice the L2 from memory.
  const int sets = int(std::max<size_t>(2, (2 * size_t(l2_bytes) + bytes - 1) / bytes));
  std::mt19937 rng(uint32_t(rows * 7919 + cols));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<T> host(n);
  for (auto& v : host) v = lab::from_float<T>(normal(rng));
  std::vector<double> want(cols, 0.0), magnitude(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double v = lab::to_float(host[i * cols + j]);
      want[j] += v, magnitude[j] += std::abs(v);
    }
  std::vector<T*> x(sets);
  for (auto& p : x) {
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  T* copy_dst = nullptr;
  float *out = nullptr, *scratch = nullptr;
  unsigned* arrivals = nullptr;
  const int64_t tiles = (cols + kColumnGroups * V - 1) / (kColumnGroups * V);
  CHECK_CUDA(cudaMalloc(&copy_dst, bytes));
  CHECK_CUDA(cudaMalloc(&out, cols * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&scratch, size_t(std::max<int64_t>(rows, 1)) * cols * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&arrivals, tiles * sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(arrivals, 0, tiles * sizeof(unsigned)));

  const double copy_ms = lab::median_ms(
      3, o.iters, sets, [&](int s) { CHECK_CUDA(cudaMemcpyAsync(copy_dst, x[s], bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * bytes / copy_ms * 1e-6;  // the copy reads and writes
  std::printf("%-4s %6lld x %-5lld %6.1f MB, %d input sets: copy %.0f GB/s (read + write)\n", dtype, (long long)rows,
              (long long)cols, bytes * 1e-6, sets, copy_gbs);
  bool ok = true;
  double best_us = 1e30;
  std::string best;
  for (int64_t lanes : o.lanes)
    for (int64_t target : o.targets) {
      CHECK_CUDA(cudaMemset(out, 0xff, cols * sizeof(float)));  // NaN: a column never written fails
      launch_lanes<T>(int(lanes), x[0], out, scratch, arrivals, rows, cols, target);
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<float> got(cols);
      CHECK_CUDA(cudaMemcpy(got.data(), out, cols * sizeof(float), cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double bound = double(rows + 8) * std::ldexp(magnitude[j], -24) + 1e-30;
        const double r = std::abs(double(got[j]) - want[j]) / bound;
        worst = std::isnan(r) ? INFINITY : std::max(worst, r);
      }
      const double ms = lab::median_ms(3, o.iters, sets, [&](int s) {
        launch_lanes<T>(int(lanes), x[s], out, scratch, arrivals, rows, cols, target);
      });
      std::vector<unsigned> counts(tiles);
      CHECK_CUDA(cudaMemcpy(counts.data(), arrivals, tiles * sizeof(unsigned), cudaMemcpyDeviceToHost));
      bool reset = true;
      for (unsigned c : counts) reset &= c == 0;
      const ColumnChunks c = column_chunks(rows, tiles, target, int(lanes));
      const bool production = lanes == kProductionLanes && target == kProductionTarget;
      const bool pass = worst <= 1.0 && reset;
      ok &= pass;
      const double us = ms * 1e3, gbs = bytes / ms * 1e-6;
      char name[64];
      std::snprintf(name, sizeof name, "lanes %2lld, aim %4lld blocks", (long long)lanes, (long long)target);
      std::printf("  %s %s (%4lld chunks of %5lld rows)  %8.2f us  %6.0f GB/s  %5.1f%% of copy  error/bound %.3f%s\n",
                  production ? "*" : " ", name, (long long)c.chunks, (long long)c.rows_per_chunk, us, gbs,
                  100.0 * gbs / copy_gbs, worst,
                  pass    ? ""
                  : reset ? "  FAILED"
                          : "  FAILED: counters not reset");
      if (pass && us < best_us) best_us = us, best = name;
    }
  std::printf("  fastest: %s\n", best.c_str());
  for (auto p : x) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(copy_dst));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(scratch));
  CHECK_CUDA(cudaFree(arrivals));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options o = parse(argc, argv);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int l2 = prop.l2CacheSize;
  std::printf("column_sum_lab on %s (%d SMs, L2 %d MiB); * = production (cuda/column_sum.cu)\n", prop.name,
              prop.multiProcessorCount, l2 >> 20);
  bool ok = true;
  for (const std::string& d : o.dtypes)
    for (int64_t rows : o.rows)
      for (int64_t cols : o.cols)
        ok &= d == "f32" ? run_shape<float>(o, rows, cols, l2) : run_shape<bf16>(o, rows, cols, l2);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED\n");
  return ok ? 0 : 1;
}
