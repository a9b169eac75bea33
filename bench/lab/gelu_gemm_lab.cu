// The GELU backward GEMM lab: out = (dy W) * gelu'(pre) in bf16 with the
// column sums of out over each 64 rows, as the input gradient of a
// feed-forward block's second Linear needs it (dy [m][k], W [k][n], pre
// [m][n]). It runs the sm_90a candidate of gelu_gemm_lab_kernel.cuh,
// checks out against float64 on sampled rows and the sums against float64
// sums of out as stored, then times it beside cuBLASLt's plain GEMM and its
// DGELU epilogue of the same shape, and the forward's plain, BIAS and
// GELU_AUX_BIAS forms (heuristic's first algorithm, as cuda/gemm_lt.cu
// asks), on rotating inputs: median single calls and calls queued back to
// back. Links the CUDA runtime and cuBLASLt.
//
//   gelu_gemm_lab                  GPT-2 small's fc2 at 8192 and 32768 rows, and a shape cutting every tile
//   gelu_gemm_lab --m 8192 --n 3072 --k 768 --iters 100
//   gelu_gemm_lab --parts          also the kernel with parts of its epilogue left out (timing only)
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/lab/gelu_gemm_lab_kernel.cuh"
#include "bench/lab/gemm_lab_lt.cuh"
#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "cuda/attention_tensor_map.cuh"  // tensor_map_encoder

namespace {

using bf16 = __nv_bfloat16;
namespace gg = gelu_gemm_lab;

struct Shape {
  int64_t m, n, k;
};

struct Options {
  std::vector<Shape> shapes{{8192, 3072, 768}, {32768, 3072, 768}, {1000, 776, 200}};
  int iters = 50;
  bool parts = false;
};

void print_help() {
  std::printf("gelu_gemm_lab: the GELU backward GEMM on sm_90a (bench/lab/gelu_gemm_lab_kernel.cuh) checked against\n"
              "float64 and timed beside cuBLASLt's plain GEMM and DGELU epilogue.\n"
              "  --m M --n N --k K    one shape (n and k multiples of 8; default: 8192 and 32768 x 3072 x 768, and\n"
              "                       1000 x 776 x 200)\n"
              "  --iters N            timed samples per kernel (default 50)\n"
              "  --parts              also time the kernel with parts of its epilogue left out (timing only)\n"
              "  --help               this text\n"
              "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  lab::Flags f("gelu_gemm_lab", argc, argv);
  Shape one{0, 3072, 768};
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--m")) one.m = f.number(1, 1 << 20);
    else if (f.is("--n")) one.n = f.number(8, 1 << 16);
    else if (f.is("--k")) one.k = f.number(8, 1 << 16);
    else if (f.is("--iters")) o.iters = int(f.number(3, 100000));
    else if (f.is("--parts")) o.parts = true;
    else f.unknown();
  }
  if (one.m > 0) {
    if (one.n % 8 != 0 || one.k % 8 != 0) f.fail("--n and --k must be multiples of 8 (16-byte rows for TMA)");
    o.shapes = {one};
  }
  return o;
}

// A bf16 matrix [rows][cols] for TMA: boxes of box_rows x 64 columns,
// 128-byte swizzle, zeros past the ends.
CUtensorMap matrix_map(const void* p, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map;
  const auto encode = hg::gpu::attn::tensor_map_encoder();
  if (encode == nullptr) {
    std::fprintf(stderr, "gelu_gemm_lab: the driver has no cuTensorMapEncodeTiled\n");
    std::exit(1);
  }
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, box, unit,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "gelu_gemm_lab: cuTensorMapEncodeTiled refused a %lld x %lld map (error %d)\n",
                 (long long)rows, (long long)cols, int(r));
    std::exit(1);
  }
  return map;
}

struct Set {
  bf16 *dy, *w, *pre, *out;
};

// The tensor maps of a set, encoded once (the library encodes them per
// call on the host, outside the GPU's time).
struct Maps {
  CUtensorMap a, b, p, o;
};
Maps maps_of(const Set& s, const Shape& sh) {
  return {matrix_map(s.dy, sh.m, sh.k, gg::kRows), matrix_map(s.w, sh.k, sh.n, gg::kDepth),
          matrix_map(s.pre, sh.m, sh.n, 64), matrix_map(s.out, sh.m, sh.n, 64)};
}

template <gg::Parts kParts = gg::Parts::kAll>
void launch(const Maps& mp, float* col_sums, const Shape& sh, int sms) {
  const int64_t tiles = ((sh.m + gg::kRows - 1) / gg::kRows) * ((sh.n + gg::kCols - 1) / gg::kCols);
  const gg::Args args{col_sums, int(sh.m), int(sh.n), int(sh.k)};
  gg::gelu_backward_gemm_kernel<kParts>
      <<<unsigned(std::min<int64_t>(tiles, sms)), gg::kThreads, gg::Plan::kSmem>>>(mp.a, mp.b, mp.p, mp.o, args);
}

double gelu_slope64(double x) {
  const double c = 0.7978845608028654, a = 0.044715, t = std::tanh(c * (x + a * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * a * x * x);
}

// out on sampled rows against float64: |err| <= 2^-8 |ref| (out's bf16
// rounding) + 2^-10 (1 + x^2) |p| (gelu' from tanh.approx, whose 2^-11
// relative error on tanh reaches gelu' through x sech^2) + |gelu'| 2^-16 S
// (S = sum_k |dy w|: the fp32 sum's rounding); the sums against float64
// sums of out as stored (2^-16 of the sum of |out|).
bool check(const Shape& sh, const std::vector<bf16>& dy, const std::vector<bf16>& w, const std::vector<bf16>& pre,
           const std::vector<bf16>& out, const std::vector<float>& sums) {
  std::mt19937 rng(7);
  std::vector<int64_t> rows{0, sh.m - 1};
  for (int i = 0; i < 48; ++i) rows.push_back(int64_t(rng() % uint32_t(sh.m)));
  double worst = 0;
  for (int64_t r : rows)
    for (int64_t c = 0; c < sh.n; ++c) {
      double p = 0, s = 0;
      for (int64_t k = 0; k < sh.k; ++k) {
        const double term = double(lab::to_float(dy[r * sh.k + k])) * double(lab::to_float(w[k * sh.n + c]));
        p += term, s += std::fabs(term);
      }
      const double x = lab::to_float(pre[r * sh.n + c]), slope = gelu_slope64(x);
      const double ref = p * slope, got = lab::to_float(out[r * sh.n + c]);
      const double bound = std::ldexp(std::fabs(ref), -8) + std::ldexp(std::fabs(p) * (1 + x * x), -10) +
                           std::fabs(slope) * std::ldexp(s, -16) + 1e-30;
      worst = std::max(worst, std::fabs(got - ref) / bound);
    }
  double worst_sum = 0;
  const int64_t groups = (sh.m + gg::kSumRows - 1) / gg::kSumRows;
  for (int64_t c = 0; c < sh.n; ++c) {
    double ref = 0, mag = 0, got = 0;
    for (int64_t r = 0; r < sh.m; ++r)
      ref += lab::to_float(out[r * sh.n + c]), mag += std::fabs(lab::to_float(out[r * sh.n + c]));
    for (int64_t g = 0; g < groups; ++g) got += sums[g * sh.n + c];
    worst_sum = std::max(worst_sum, std::fabs(got - ref) / (std::ldexp(mag, -16) + 1e-30));
  }
  std::printf("  check: out err/bound %.3f (%zu rows), column sums err/bound %.3f\n", worst, rows.size(), worst_sum);
  return worst <= 1 && worst_sum <= 1;
}

bool run_shape(const Shape& sh, int iters, bool parts, cublasLtHandle_t lt, void* workspace) {
  std::printf("m %lld, n %lld, k %lld\n", (long long)sh.m, (long long)sh.n, (long long)sh.k);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](std::vector<bf16>& v, size_t count, float scale) {
    v.resize(count);
    for (auto& x : v) x = __float2bfloat16_rn(scale * u(rng));
  };
  std::vector<bf16> dy, w, pre;
  fill(dy, size_t(sh.m * sh.k), 1.f);
  fill(w, size_t(sh.k * sh.n), 0.05f);
  fill(pre, size_t(sh.m * sh.n), 4.f);
  constexpr int kSets = 2;
  Set sets[kSets];
  for (Set& s : sets) {
    CHECK_CUDA(cudaMalloc(&s.dy, dy.size() * 2));
    CHECK_CUDA(cudaMalloc(&s.w, w.size() * 2));
    CHECK_CUDA(cudaMalloc(&s.pre, pre.size() * 2));
    CHECK_CUDA(cudaMalloc(&s.out, pre.size() * 2));
    CHECK_CUDA(cudaMemcpy(s.dy, dy.data(), dy.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(s.w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(s.pre, pre.data(), pre.size() * 2, cudaMemcpyHostToDevice));
  }
  const int64_t groups = (sh.m + gg::kSumRows - 1) / gg::kSumRows;
  float* col_sums = nullptr;
  CHECK_CUDA(cudaMalloc(&col_sums, size_t(groups * sh.n) * 4));
  CHECK_CUDA(cudaMemset(sets[0].out, 0xff, pre.size() * 2));  // NaN: an output never written shows
  const int sms = lab::device_attribute(cudaDevAttrMultiProcessorCount);
  Maps maps[kSets];
  for (int i = 0; i < kSets; ++i) maps[i] = maps_of(sets[i], sh);
  launch(maps[0], col_sums, sh, sms);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<bf16> out(pre.size());
  std::vector<float> sums(size_t(groups * sh.n));
  CHECK_CUDA(cudaMemcpy(out.data(), sets[0].out, out.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(sums.data(), col_sums, sums.size() * 4, cudaMemcpyDeviceToHost));
  const bool ok = check(sh, dy, w, pre, out, sums);

  const double flop = 2.0 * double(sh.m) * double(sh.n) * double(sh.k);
  // Median of single calls, and the mean of calls queued back to back (as
  // in a training step).
  auto report = [&](const char* what, auto&& fn) {
    const double ms = lab::median_ms(5, iters, kSets, fn), queued = lab::back_to_back_ms(5, iters, kSets, fn);
    std::printf("  %-34s %8.1f us %7.1f TFLOP/s   queued %8.1f us %7.1f TFLOP/s\n", what, ms * 1e3, flop / ms * 1e-9,
                queued * 1e3, flop / queued * 1e-9);
  };
  report("wgmma 128x256 + gelu' + sums", [&](int i) { launch(maps[i], col_sums, sh, sms); });
  if (parts) {  // timing only: what each part of the epilogue costs
    report("  without the slopes", [&](int i) { launch<gg::Parts::kNoSlopes>(maps[i], col_sums, sh, sms); });
    report("  without multiply and sums", [&](int i) { launch<gg::Parts::kNoEpilogue>(maps[i], col_sums, sh, sms); });
    report("  products and copies only", [&](int i) { launch<gg::Parts::kCopiesOnly>(maps[i], col_sums, sh, sms); });
  }
  // cuBLASLt's first algorithm for the shape in pass `pass` with epilogue
  // `epi` (a = dy, b = W, aux = pre, vec = bias), timed as the kernel is.
  auto report_lt = [&](const char* what, gemm_lab::Pass pass, gemm_lab::Epi epi, void* bias) {
    const bool forward = pass == gemm_lab::Pass::Forward;  // out = x W^T: W is [n][k]
    gemm_lab::Case c{"lab", forward ? "fc1" : "fc2", pass, epi, sh.m, sh.n, sh.k, false, forward, false, 1.0};
    gemm_lab::Plan plan = gemm_lab::make_plan(c);
    gemm_lab::Set ls[kSets];
    for (int i = 0; i < kSets; ++i) ls[i] = {sets[i].dy, sets[i].w, sets[i].out, sets[i].pre, bias};
    gemm_lab::set_pointers(plan, c, ls[0]);
    const std::vector<gemm_lab::Candidate> cands = gemm_lab::candidates(lt, plan, c, {0}, 1);
    if (cands.empty()) std::printf("  %s: no algorithm\n", what);
    else report(what, [&](int i) { CHECK_CUBLAS(gemm_lab::run(lt, plan, c, cands[0], ls[i], workspace)); });
    gemm_lab::destroy(plan);
  };
  report_lt("cuBLASLt plain (lt#1)", gemm_lab::Pass::Dgrad, gemm_lab::Epi::None, nullptr);
  report_lt("cuBLASLt DGELU (lt#1, no sums)", gemm_lab::Pass::Dgrad, gemm_lab::Epi::DGelu, nullptr);
  // The forward's forms of the same shape (the block's first Linear): what
  // its GELU epilogue costs beside plain.
  void* bias = nullptr;
  CHECK_CUDA(cudaMalloc(&bias, size_t(sh.n) * 2));
  CHECK_CUDA(cudaMemset(bias, 0, size_t(sh.n) * 2));
  report_lt("cuBLASLt forward plain (lt#1)", gemm_lab::Pass::Forward, gemm_lab::Epi::None, bias);
  report_lt("cuBLASLt forward BIAS (lt#1)", gemm_lab::Pass::Forward, gemm_lab::Epi::Bias, bias);
  report_lt("cuBLASLt forward GELU_AUX_BIAS (lt#1)", gemm_lab::Pass::Forward, gemm_lab::Epi::BiasGelu, bias);
  cudaFree(bias);
  for (Set& s : sets) cudaFree(s.dy), cudaFree(s.w), cudaFree(s.pre), cudaFree(s.out);
  cudaFree(col_sums);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int device = 0, major = 0, minor = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    std::printf("gelu_gemm_lab: the kernel is sm_90a (Hopper) only; this GPU is sm_%d%d\n", major, minor);
    return 0;
  }
  for (const void* kernel : {(const void*)gg::gelu_backward_gemm_kernel<gg::Parts::kAll>,
                             (const void*)gg::gelu_backward_gemm_kernel<gg::Parts::kNoSlopes>,
                             (const void*)gg::gelu_backward_gemm_kernel<gg::Parts::kNoEpilogue>,
                             (const void*)gg::gelu_backward_gemm_kernel<gg::Parts::kCopiesOnly>})
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(gg::Plan::kSmem)));
  cublasLtHandle_t lt = nullptr;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, gemm_lab::kMaxWorkspace));
  bool ok = true;
  for (const Shape& sh : o.shapes) ok = run_shape(sh, o.iters, o.parts, lt, workspace) && ok;
  cudaFree(workspace);
  cublasLtDestroy(lt);
  std::printf("%s\n", ok ? "all checks passed" : "CHECK FAILED");
  return ok ? 0 : 1;
}
