// Softmax forward lab: the candidate register layouts of the fused softmax
// forward (cuda/softmax.cu) side by side, on rows read 16 bytes at a time.
// Each configuration is checked against a CPU float64 softmax on fresh random
// inputs, then timed with CUDA events (median after warm-up, input sets
// rotated past the L2) and reported as GB/s and % of the best device copy of
// the same bytes. The production configuration is the row marked "*"; to
// promote a winner, edit kVectorForward in cuda/softmax.cu (bench/lab/softmax.md).
// Standalone: CUDA runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "cuda/reduce.cuh"
#include "cuda/vec.cuh"

namespace {

using bf16 = __nv_bfloat16;
using hg::gpu::Load;
using hg::gpu::Store;

// ---- candidates ---------------------------------------------------------------

struct Config {
  const char* name;
  bool lean;          // z = scale x as one multiply of the lean load; exp as ex2.approx of (z - max) log2 e
  bool streaming;     // y stored evict-first (st.global.cs)
  int lane_max_keys;  // rows longer than this go to the block team (0: no limit)
  bool production;    // cuda/softmax.cu's kVectorForward
};
constexpr Config kConfigs[] = {
    {"exact", false, false, 0, false},
    {"lean", true, false, 0, false},
    {"lean+evict-first", true, true, 0, false},
    {"lean, block team past 512", true, false, 512, true},
};
constexpr int kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);

constexpr int kLaneTeamBlock = 128, kMaxBlock = 1024, kBlockElems = 16;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float exp2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

template <int TPR>
struct LaneTeam {
  __device__ int rank() const { return threadIdx.x % TPR; }
  __device__ int size() const { return TPR; }
  __device__ int slot() const { return threadIdx.x / TPR; }
  __device__ int rows_per_block() const { return blockDim.x / TPR; }
  __device__ float max(float v) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
  }
  __device__ float sum(float v) const {
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
  }
};
struct WarpMaxNan {
  __device__ float operator()(float v) const { return LaneTeam<32>{}.max(v); }
};
struct BlockTeam {
  float* scratch;
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int slot() const { return 0; }
  __device__ int rows_per_block() const { return 1; }
  __device__ float max(float v) const { return hg::gpu::block_reduce(v, scratch, WarpMaxNan{}, -INFINITY); }
  __device__ float sum(float v) const { return hg::gpu::block_sum(v, scratch); }
};

template <class T>
struct Args {
  const T* x;
  T* y;
  int64_t rows, tk, tq;
  float scale;
  bool causal;
};

// The causal row's visible keys [0, visible), as cuda/softmax.cu's row_span.
template <class T>
__device__ __forceinline__ int64_t visible_keys(const Args<T>& a, int64_t row) {
  if (!a.causal) return a.tk;
  const int64_t n = row % a.tq + a.tk - a.tq + 1;
  return n < 0 ? 0 : (n > a.tk ? a.tk : n);
}

template <class T, int W, bool kLean>
__device__ __forceinline__ void load_z(const T* x_row, int64_t visible, int64_t k0, float scale, float (&z)[W]) {
  if constexpr (kLean) {
    hg::gpu::load_vec_lean<W>(x_row + k0, z);
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] *= scale;
  } else {
    hg::gpu::load_vec<W, Load::ReadOnly>(x_row + k0, z);
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = __fmul_rn(scale, z[j]);
  }
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (k0 + j >= visible) z[j] = -INFINITY;
}

template <class T, int W, int N, bool kLean, bool kStreaming, class Team>
__device__ __forceinline__ void forward_rows(const Args<T>& a, const Team& team) {
  const int64_t rows_per_block = team.rows_per_block();
  for (int64_t base = blockIdx.x * rows_per_block; base < a.rows; base += gridDim.x * rows_per_block) {
    const int64_t row = base + team.slot();
    const bool valid = row < a.rows;
    const int64_t visible = valid ? visible_keys(a, row) : 0;
    const T* x_row = a.x + row * a.tk;
    float v[N][W];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < visible) {
        load_z<T, W, kLean>(x_row, visible, k0, a.scale, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;
      }
    }
    float row_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int j = 0; j < W; ++j) row_max = max_nan(row_max, v[i][j]);
    row_max = team.max(row_max);
    const float shift = row_max == -INFINITY ? 0.0f : row_max;
    float row_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int j = 0; j < W; ++j) {
        // the difference first (cuda/softmax.cu says why)
        if constexpr (kLean) v[i][j] = exp2_approx((v[i][j] - shift) * kLog2e);
        else v[i][j] = expf(v[i][j] - shift);
        row_sum += v[i][j];
      }
    const float total = team.sum(row_sum);
    const float inv = row_max == -INFINITY ? 0.0f : 1.0f / total;
    if (!valid) continue;
    T* y_row = a.y + row * a.tk;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < a.tk) {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] *= inv;
        hg::gpu::store_vec<W, kStreaming ? Store::Streaming : Store::Plain>(y_row + k0, v[i]);
      }
    }
  }
}

template <class T, int TPR, int W, int N, bool kLean, bool kStreaming>
__global__ void __launch_bounds__(kLaneTeamBlock) lanes_kernel(Args<T> a) {
  forward_rows<T, W, N, kLean, kStreaming>(a, LaneTeam<TPR>{});
}
template <class T, int W, int N, bool kLean, bool kStreaming>
__global__ void __launch_bounds__(kMaxBlock) block_kernel(Args<T> a) {
  __shared__ float scratch[32];
  forward_rows<T, W, N, kLean, kStreaming>(a, BlockTeam{scratch});
}

unsigned grid_for(int64_t rows, int64_t per_block) { return unsigned((rows + per_block - 1) / per_block); }

// cuda/softmax.cu's dispatch for 16-byte rows (W elements), Tk <= 16384.
template <class T, bool kLean, bool kStreaming>
void launch_forward(const Args<T>& a, int lane_max_keys, cudaStream_t s) {
  constexpr int W = 16 / sizeof(T);
  const int64_t tk = a.tk;
  auto lanes = [&](auto tpr, auto n) {
    constexpr int TPR = decltype(tpr)::value, N = decltype(n)::value;
    lanes_kernel<T, TPR, W, N, kLean, kStreaming><<<grid_for(a.rows, kLaneTeamBlock / TPR), kLaneTeamBlock, 0, s>>>(a);
  };
  using I8 = std::integral_constant<int, 8>;
  using I16 = std::integral_constant<int, 16>;
  using I32 = std::integral_constant<int, 32>;
  using N1 = std::integral_constant<int, 1>;
  using N2 = std::integral_constant<int, 2>;
  using N4 = std::integral_constant<int, 4>;
  using N8 = std::integral_constant<int, 8>;
  if (tk <= 8 * W) return lanes(I8{}, N1{});
  if (tk <= 16 * W) return lanes(I16{}, N1{});
  if (tk <= 32 * W) return lanes(I32{}, N1{});
  if (lane_max_keys == 0 || tk <= lane_max_keys) {
    if (tk <= 64 * W) return lanes(I32{}, N2{});
    if (tk <= 128 * W) return lanes(I32{}, N4{});
    if constexpr (W <= 4) {
      if (tk <= 256 * W) return lanes(I32{}, N8{});
    }
  }
  constexpr int kN = kBlockElems / W;
  const int64_t warps = ((tk + kN * W - 1) / (kN * W) + 31) / 32;
  const int64_t threads = std::min<int64_t>(warps * 32, kMaxBlock);
  block_kernel<T, W, kN, kLean, kStreaming><<<grid_for(a.rows, 1), unsigned(threads), 0, s>>>(a);
}

template <class T>
void launch_config(const Config& c, const Args<T>& a, cudaStream_t s) {
  if (!c.lean) return launch_forward<T, false, false>(a, c.lane_max_keys, s);
  if (c.streaming) return launch_forward<T, true, true>(a, c.lane_max_keys, s);
  launch_forward<T, true, false>(a, c.lane_max_keys, s);
}

// The copy yardstick: a 16-byte grid-stride copy kernel (cudaMemcpyAsync is the other).

// ---- host ----------------------------------------------------------------------

struct Options {
  std::vector<int64_t> b, h, t;  // sizes BxHxT: scores (B, H, T, T)
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int iters = 30, warmup = 5;
  bool causal = false;
};

void print_help() {
  std::printf("softmax_lab: candidate fused softmax forward kernels, checked against float64 and timed.\n"
              "  --sizes BxHxT[,...]  scores (B, H, T, T); T a multiple of 8, at most 16384\n"
              "                       (default 16x12x256,8x12x512,4x16x1024,2x16x2048)\n"
              "  --dtypes f32,bf16    dtypes to run (default both)\n"
              "  --iters N            timed samples per case (default 30); --warmup N (default 5)\n"
              "  --causal             causal rows (keys past the diagonal masked)\n"
              "  --help               this text\n"
              "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  std::string sizes = "16x12x256,8x12x512,4x16x1024,2x16x2048";
  lab::Flags f("softmax_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--sizes")) {
      sizes = f.value();
    } else if (f.is("--dtypes")) {
      o.dtypes = f.choices({"f32", "bf16"});
    } else if (f.is("--iters")) {
      o.iters = int(f.number(1, 100000));
    } else if (f.is("--warmup")) {
      o.warmup = int(f.number(0, 100000));
    } else if (f.is("--causal")) {
      o.causal = true;
    } else {
      f.unknown();
    }
  }
  for (const std::string& s : lab::split(sizes)) {
    const std::vector<std::string> p = lab::split(s, 'x');
    if (p.size() != 3) f.fail("--sizes: '" + s + "' is not BxHxT");
    o.b.push_back(f.parse(p[0], "--sizes B", 1, 1 << 16));
    o.h.push_back(f.parse(p[1], "--sizes H", 1, 1 << 16));
    o.t.push_back(f.parse(p[2], "--sizes T", 8, 16384));
    if (o.t.back() % 8 != 0) f.fail("--sizes: T " + p[2] + " is not a multiple of 8 (16-byte rows)");
  }
  return o;
}

// Max over elements of |got - ref| / (|ref| + floor): the error printed and checked.
template <class T>
double check_rows(const std::vector<T>& x, const std::vector<T>& y, int64_t rows, int64_t tk, int64_t tq, float scale,
                  bool causal) {
  double worst = 0;
  std::vector<double> p(tk);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = tk;
    if (causal) visible = std::clamp<int64_t>(r % tq + tk - tq + 1, 0, tk);
    double m = -INFINITY;
    for (int64_t k = 0; k < visible; ++k) m = std::max(m, double(scale) * lab::to_float(x[r * tk + k]));
    double sum = 0;
    for (int64_t k = 0; k < tk; ++k) {
      p[k] = k < visible ? std::exp(double(scale) * lab::to_float(x[r * tk + k]) - m) : 0.0;
      sum += p[k];
    }
    for (int64_t k = 0; k < tk; ++k) {
      const double ref = visible > 0 ? p[k] / sum : 0.0, got = lab::to_float(y[r * tk + k]);
      const double e = std::abs(got - ref) / (std::abs(ref) + 1e-6);
      worst = std::isnan(got) ? INFINITY : std::max(worst, e);
    }
  }
  return worst;
}

template <class T>
bool run_size(const Options& o, int64_t B, int64_t H, int64_t Tn, int l2_bytes) {
  const int64_t rows = B * H * Tn, tk = Tn, n = rows * tk;
  const size_t bytes = size_t(n) * sizeof(T);
  const float scale = 0.125f;
  // Input sets in rotation: together more than twice the L2.
  const int sets = int(std::clamp<int64_t>(2 * int64_t(l2_bytes) / int64_t(2 * bytes) + 1, 1, 16));
  std::vector<T*> x(sets), y(sets);
  std::mt19937_64 gen(1234 + n);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<T> host_x(n), host_y(n);
  for (int s = 0; s < sets; ++s) {
    for (T& v : host_x) v = lab::from_float<T>(normal(gen));
    CHECK_CUDA(cudaMalloc(&x[s], bytes));
    CHECK_CUDA(cudaMalloc(&y[s], bytes));
    CHECK_CUDA(cudaMemcpy(x[s], host_x.data(), bytes, cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMemcpy(host_x.data(), x[0], bytes, cudaMemcpyDeviceToHost));
  // The copy yardstick: reading and writing the same bytes as a forward.
  const double copy_ms =
      std::min(lab::median_ms(o.warmup, o.iters, sets,
                              [&](int s) { CHECK_CUDA(cudaMemcpyAsync(y[s], x[s], bytes, cudaMemcpyDeviceToDevice)); }),
               lab::median_ms(o.warmup, o.iters, sets, [&](int s) {
                 lab::copy_kernel<<<1024, 512>>>(reinterpret_cast<const uint4*>(x[s]), reinterpret_cast<uint4*>(y[s]),
                                                 int64_t(bytes / 16));
               }));
  const double moved = 2.0 * double(bytes);
  const double bound = std::is_same_v<T, float> ? 1e-5 : 1.0 / 128;  // f32 rounding; one bf16 ulp
  std::printf("%-5s (%lld, %lld, %lld)%s: best copy %.0f GB/s\n", std::is_same_v<T, float> ? "f32" : "bf16",
              (long long)B, (long long)H, (long long)Tn, o.causal ? " causal" : "", moved / copy_ms / 1e6);
  bool ok = true;
  int best = -1;
  double best_ms = 0;
  for (int c = 0; c < kConfigCount; ++c) {
    const Config& cfg = kConfigs[c];
    Args<T> a{x[0], y[0], rows, tk, Tn, scale, o.causal};
    CHECK_CUDA(cudaMemset(y[0], 0xff, bytes));  // NaN poison: an unwritten element fails the check
    launch_config(cfg, a, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(host_y.data(), y[0], bytes, cudaMemcpyDeviceToHost));
    const double e = check_rows(host_x, host_y, rows, tk, Tn, scale, o.causal);
    const bool pass = e <= bound;
    ok &= pass;
    const double ms = lab::median_ms(o.warmup, o.iters, sets, [&](int s) {
      Args<T> as{x[s], y[s], rows, tk, Tn, scale, o.causal};
      launch_config(cfg, as, nullptr);
    });
    if (pass && (best < 0 || ms < best_ms)) best = c, best_ms = ms;
    std::printf("  %c %-28s %8.1f us %7.0f GB/s %5.1f%% of copy  max rel err %.2e %s\n", cfg.production ? '*' : ' ',
                cfg.name, ms * 1e3, moved / ms / 1e6, 100 * copy_ms / ms, e, pass ? "ok" : "FAILED");
  }
  if (best >= 0) std::printf("  winner: %s%s\n", kConfigs[best].name, kConfigs[best].production ? " (production)" : "");
  for (int s = 0; s < sets; ++s) {
    CHECK_CUDA(cudaFree(x[s]));
    CHECK_CUDA(cudaFree(y[s]));
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table line as it is measured, also into a file
  const Options o = parse(argc, argv);
  int device = 0, l2 = 0;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  std::printf("softmax_lab on %s (sm_%d%d, L2 %d MiB); * = production (cuda/softmax.cu kVectorForward)\n", prop.name,
              prop.major, prop.minor, l2 >> 20);
  bool ok = true;
  for (const std::string& d : o.dtypes)
    for (size_t i = 0; i < o.t.size(); ++i)
      ok &= d == "f32" ? run_size<float>(o, o.b[i], o.h[i], o.t[i], l2) : run_size<bf16>(o, o.b[i], o.h[i], o.t[i], l2);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a configuration exceeded its error bound\n");
  return ok ? 0 : 1;
}
