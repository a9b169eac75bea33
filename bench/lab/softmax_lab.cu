// Softmax forward lab: the candidate register layouts of the fused softmax
// forward side by side, on rows read 16 bytes at a time: production's own
// kernels (cuda/softmax_forward.cuh) and the lab's variants of them.
// Each configuration is checked against a CPU float64 softmax on fresh random
// inputs, then timed with CUDA events (median after warm-up, input sets
// rotated past the L2) and reported as GB/s and % of the best device copy of
// the same bytes. The production configuration is the row marked "*"; to
// promote a winner, edit kVectorForward in cuda/softmax_forward.cuh (bench/lab/softmax.md).
// Standalone: CUDA runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "core/softmax_layout.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/reduce.cuh"
#include "cuda/softmax_forward.cuh"
#include "cuda/vec.cuh"

namespace {

using bf16 = __nv_bfloat16;
using hg::gpu::Load;
using hg::gpu::Store;

// ---- candidates ---------------------------------------------------------------

// Candidates of 2026-11-29 for rows with a key-padding mask (Flags bits).
enum Flags : int {
  kNoL1 = 1,        // x read with ld.global.nc.L1::no_allocate: the mask rows keep L1 to themselves
  kHoldMask = 2,    // (B, 1, 1, Tk) masks: a team keeps its additive mask values in registers and
                    // loads them again only when its next row is of another batch
  kPdl = 4,         // launched programmatically (PDL): starts while the kernel before drains
  kPersistent = 8,  // a resident grid walking the rows (rows of one batch follow each other)
};

struct Config {
  const char* name;
  bool lean;           // z = scale x + mask as one FFMA; exp as ex2.approx of (z - max) log2 e
  bool streaming;      // y stored evict-first (st.global.cs)
  int lane_max_keys;   // rows longer than this go to the block team (0: no limit)
  bool production;     // production itself (the * row)
  int flags = 0;       // Flags
  bool fresh = false;  // a candidate of 2026-11-29 (--new runs these and production)
  bool real = false;   // production's own kernels (cuda/softmax_forward.cuh), not the lab's
};
constexpr Config kConfigs[] = {
    {"exact", false, false, 0, false},
    {"lean", true, false, 0, false},
    {"lean+evict-first", true, true, 0, false},
    {"production (cuda/softmax_forward.cuh)", true, false, 512, true, 0, false, true},
    {"lab copy: lean, block team past 512", true, false, 512, false, 0, true},
    {"lean, past 512, x no-L1", true, false, 512, false, kNoL1, true},
    {"lean, past 512, PDL", true, false, 512, false, kPdl, true},
    {"lean, past 512, resident grid", true, false, 512, false, kPersistent, true},
    {"lean, past 512, resident, mask held", true, false, 512, false, kPersistent | kHoldMask, true},
    {"lean, past 512, resident, mask held, no-L1", true, false, 512, false, kPersistent | kHoldMask | kNoL1, true},
    {"lean, past 512, resident, mask held, PDL", true, false, 512, false, kPersistent | kHoldMask | kPdl, true},
    {"lean, past 256, resident, mask held", true, false, 256, false, kPersistent | kHoldMask, true},
    {"lean, past 1024, resident, mask held", true, false, 1024, false, kPersistent | kHoldMask, true},
    {"lean, past 256, x no-L1", true, false, 256, false, kNoL1, true},
    {"lean, past 1024, x no-L1", true, false, 1024, false, kNoL1, true},
};
constexpr int kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);

// Production's teams and numerics (cuda/softmax_forward.cuh), shared by the lab's variants.
using hg::gpu::additive_mask;
using hg::gpu::BlockTeam;
using hg::gpu::exp2_approx;
using hg::gpu::kLaneTeamBlock;
using hg::gpu::kLog2e;
using hg::gpu::kMaskThreshold;
using hg::gpu::kMaxBlock;
using hg::gpu::LaneTeam;
using hg::gpu::max_nan;
constexpr int kBlockElems = hg::gpu::kForwardBlockElems;

template <class T>
struct Args {
  const T* x;
  T* y;
  int64_t rows, tk, tq;
  float scale;
  bool causal;
  const float* mask = nullptr;  // (B, 1, 1, Tk) key padding, or null
  int64_t rows_per_batch = 1;   // heads * tq
};

// The row's mask (production's row_span, 32-bit division), or null.
template <class T>
__device__ __forceinline__ const float* mask_row(const Args<T>& a, int64_t row) {
  if (a.mask == nullptr) return nullptr;
  return a.mask + int64_t(uint32_t(row) / uint32_t(a.rows_per_batch)) * a.tk;
}

// The causal row's visible keys [0, visible), as cuda/softmax.cu's row_span.
template <class T>
__device__ __forceinline__ int64_t visible_keys(const Args<T>& a, int64_t row) {
  if (!a.causal) return a.tk;
  const int64_t n = row % a.tq + a.tk - a.tq + 1;
  return n < 0 ? 0 : (n > a.tk ? a.tk : n);
}

// x through ld.global.nc.L1::no_allocate, bf16 widened as load_vec_lean does.
template <int W>
__device__ __forceinline__ void load_x_no_l1(const float* p, float (&z)[W]) {
  static_assert(W == 4, "16-byte f32 rows");
  asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(z[0]), "=f"(z[1]), "=f"(z[2]), "=f"(z[3])
               : "l"(p));
}
template <int W>
__device__ __forceinline__ void load_x_no_l1(const bf16* p, float (&z)[W]) {
  static_assert(W == 8, "16-byte bf16 rows");
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  hg::gpu::widen_bf16x8(r, z);
}

// The additive mask values of keys k0 .. k0 + W (production's load_z_lean reads them so).
template <int W>
__device__ __forceinline__ void load_mask(const float* m_row, int64_t k0, float (&add)[W]) {
  hg::gpu::load_vec<W, Load::ReadOnly>(m_row + k0, add);
#pragma unroll
  for (int j = 0; j < W; ++j) add[j] = additive_mask(add[j]);
}

// Lean z of keys k0 .. k0 + W: x (F & kNoL1: not kept in L1), then scale x +
// add in one FFMA where the row has a mask (add: its additive values).
template <class T, int W, int F>
__device__ __forceinline__ void lean_z(const T* x_row, bool masked, const float (&add)[W], int64_t visible, int64_t k0,
                                       float scale, float (&z)[W]) {
  if constexpr ((F & kNoL1) != 0) load_x_no_l1<W>(x_row + k0, z);
  else hg::gpu::load_vec_lean<W>(x_row + k0, z);
  if (masked) {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = fmaf(scale, z[j], add[j]);
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] *= scale;
  }
  if (k0 + W > visible)
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (k0 + j >= visible) z[j] = -INFINITY;
}

template <class T, int W, bool kLean>
__device__ __forceinline__ void load_z(const T* x_row, const float* m_row, int64_t visible, int64_t k0, float scale,
                                       float (&z)[W]) {
  float add[W];
  if (m_row != nullptr) load_mask<W>(m_row, k0, add);
  if constexpr (kLean) {
    lean_z<T, W, 0>(x_row, m_row != nullptr, add, visible, k0, scale, z);
  } else {  // the CPU path's arithmetic: scale x, then + mask, each rounded
    hg::gpu::load_vec<W, Load::ReadOnly>(x_row + k0, z);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      z[j] = __fmul_rn(scale, z[j]);
      if (m_row != nullptr) z[j] = __fadd_rn(z[j], add[j]);
      if (k0 + j >= visible) z[j] = -INFINITY;
    }
  }
}

template <class T, int W, int N, bool kLean, bool kStreaming, int F, class Team>
__device__ __forceinline__ void forward_rows(const Args<T>& a, const Team& team) {
  hg::gpu::wait_for_prior_grids();
  hg::gpu::allow_dependent_grids();
  const int64_t rows_per_block = team.rows_per_block();
  // Rows [begin, end) of this block, `step` at a time: grid-strided, or
  // (F & kPersistent) one contiguous share per block, so that a team's rows
  // follow each other within a batch (one mask row for many rows).
  int64_t begin = blockIdx.x * rows_per_block, end = a.rows, step = int64_t(gridDim.x) * rows_per_block;
  if constexpr ((F & kPersistent) != 0) {
    const int64_t share = ((a.rows + gridDim.x - 1) / gridDim.x + rows_per_block - 1) / rows_per_block * rows_per_block;
    begin = blockIdx.x * share;
    end = std::min(a.rows, begin + share);
    step = rows_per_block;
  }
  // F & kHoldMask: this team's additive mask values, of the mask row held_row.
  float held[N][W];
  const float* held_row = nullptr;
  for (int64_t base = begin; base < end; base += step) {
    const int64_t row = base + team.slot();
    const bool valid = row < end;
    const int64_t visible = valid ? visible_keys(a, row) : 0;
    const T* x_row = a.x + row * a.tk;
    const float* m_row = valid ? mask_row(a, row) : nullptr;
    float v[N][W];
    if constexpr ((F & kHoldMask) != 0) {
      if (m_row != nullptr && m_row != held_row) {
        held_row = m_row;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
          if (k0 < a.tk) load_mask<W>(m_row, k0, held[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < visible) {
        if constexpr ((F & kHoldMask) != 0 && kLean) {
          lean_z<T, W, F>(x_row, m_row != nullptr, held[i], visible, k0, a.scale, v[i]);
        } else if constexpr (kLean && F != 0) {
          float add[W];
          if (m_row != nullptr) load_mask<W>(m_row, k0, add);
          lean_z<T, W, F>(x_row, m_row != nullptr, add, visible, k0, a.scale, v[i]);
        } else {
          load_z<T, W, kLean>(x_row, m_row, visible, k0, a.scale, v[i]);
        }
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

template <class T, int TPR, int W, int N, bool kLean, bool kStreaming, int F>
__global__ void __launch_bounds__(kLaneTeamBlock) lanes_kernel(Args<T> a) {
  forward_rows<T, W, N, kLean, kStreaming, F>(a, LaneTeam<TPR>{});
}
template <class T, int W, int N, bool kLean, bool kStreaming, int F>
__global__ void __launch_bounds__(kMaxBlock) block_kernel(Args<T> a) {
  __shared__ float scratch[32];
  forward_rows<T, W, N, kLean, kStreaming, F>(a, BlockTeam{scratch});
}

unsigned grid_for(int64_t rows, int64_t per_block) { return unsigned((rows + per_block - 1) / per_block); }

// kern<<<grid, threads>>>(a), programmatically (PDL) where F has kPdl; with
// F & kPersistent the grid is capped at the blocks resident at once.
template <int F, class A>
void launch_rows(void (*kern)(A), unsigned grid, unsigned threads, const A& a) {
  if constexpr ((F & kPersistent) != 0) {
    static std::map<std::pair<void*, unsigned>, int> resident;
    int& n = resident[{reinterpret_cast<void*>(kern), threads}];
    if (n == 0) {
      int per_sm = 0, device = 0, sms = 0;
      CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, int(threads), 0));
      CHECK_CUDA(cudaGetDevice(&device));
      CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      n = std::max(per_sm, 1) * sms;
    }
    grid = std::min(grid, unsigned(n));
  }
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.attrs = (F & kPdl) != 0 ? &pdl : nullptr;
  config.numAttrs = (F & kPdl) != 0 ? 1 : 0;
  CHECK_CUDA(cudaLaunchKernelEx(&config, kern, a));
}

// cuda/softmax.cu's dispatch for 16-byte rows (W elements), Tk <= 16384:
// lanes(TPR, N) launches a lane team (integral constants), block(N, threads)
// the block team of rows past lane_max_keys.
template <int W, class Lanes, class Block>
void dispatch_rows(int64_t tk, int lane_max_keys, const Lanes& lanes, const Block& block) {
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
  block(std::integral_constant<int, kN>{}, unsigned(std::min<int64_t>(warps * 32, kMaxBlock)));
}

// The lab's kernels (flags F) through that dispatch.
template <class T, bool kLean, bool kStreaming, int F = 0>
void launch_forward(const Args<T>& a, int lane_max_keys) {
  constexpr int W = 16 / sizeof(T);
  const auto lanes = [&](auto tpr, auto n) {
    constexpr int TPR = decltype(tpr)::value, N = decltype(n)::value;
    launch_rows<F>(lanes_kernel<T, TPR, W, N, kLean, kStreaming, F>, grid_for(a.rows, kLaneTeamBlock / TPR),
                   kLaneTeamBlock, a);
  };
  const auto block = [&](auto n, unsigned threads) {
    launch_rows<F>(block_kernel<T, W, decltype(n)::value, kLean, kStreaming, F>, grid_for(a.rows, 1), threads, a);
  };
  dispatch_rows<W>(a.tk, lane_max_keys, lanes, block);
}

// Production's forward: the same dispatch (the block team past
// kVectorForward's lane_max_keys) of the very kernels of
// cuda/softmax_forward.cuh.
template <class T>
void launch_production(const Args<T>& a) {
  namespace g = hg::gpu;
  constexpr int W = 16 / sizeof(T);
  constexpr g::SoftmaxForwardConfig C = g::kVectorForward[std::is_same_v<T, bf16>];
  const bool index32 = a.rows <= UINT32_MAX && a.rows_per_batch <= UINT32_MAX;
  const g::ForwardArgs<T> p{a.x, a.y,     a.mask,   a.rows, a.tk, a.tq, a.rows_per_batch, a.mask ? a.tk : 0,
                            0,   a.scale, a.causal, index32};
  constexpr int kFlags = C.pdl ? kPdl : 0;  // (launch_rows launches programmatically with kPdl)
  const auto lanes = [&](auto tpr, auto n) {
    constexpr int TPR = decltype(tpr)::value, N = decltype(n)::value;
    launch_rows<kFlags>(g::softmax_forward_lanes_kernel<T, TPR, W, N, C.lean>, grid_for(a.rows, kLaneTeamBlock / TPR),
                        kLaneTeamBlock, p);
  };
  const auto block = [&](auto n, unsigned threads) {
    launch_rows<kFlags>(g::softmax_forward_block_kernel<T, W, decltype(n)::value, C.lean>, grid_for(a.rows, 1), threads,
                        p);
  };
  dispatch_rows<W>(a.tk, C.lane_max_keys, lanes, block);
}

template <class T>
void launch_config(const Config& c, const Args<T>& a) {
  if (c.real) return launch_production(a);
  if (!c.lean) return launch_forward<T, false, false>(a, c.lane_max_keys);
  if (c.streaming) return launch_forward<T, true, true>(a, c.lane_max_keys);
  switch (c.flags) {
    case 0: return launch_forward<T, true, false>(a, c.lane_max_keys);
    case kNoL1: return launch_forward<T, true, false, kNoL1>(a, c.lane_max_keys);
    case kPdl: return launch_forward<T, true, false, kPdl>(a, c.lane_max_keys);
    case kPersistent: return launch_forward<T, true, false, kPersistent>(a, c.lane_max_keys);
    case kPersistent | kHoldMask: return launch_forward<T, true, false, kPersistent | kHoldMask>(a, c.lane_max_keys);
    case kPersistent | kHoldMask | kNoL1:
      return launch_forward<T, true, false, kPersistent | kHoldMask | kNoL1>(a, c.lane_max_keys);
    case kPersistent | kHoldMask | kPdl:
      return launch_forward<T, true, false, kPersistent | kHoldMask | kPdl>(a, c.lane_max_keys);
    default: std::fprintf(stderr, "softmax_lab: no kernel for flags %d\n", c.flags), std::exit(1);
  }
}

// ---- host ----------------------------------------------------------------------

struct Options {
  std::vector<int64_t> b, h, t;  // sizes BxHxT: scores (B, H, T, T)
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int iters = 30, warmup = 5, calls = 0;
  bool causal = false, mask = true, fresh = false;
};

void print_help() {
  std::printf("softmax_lab: candidate fused softmax forward kernels, checked against float64 and timed.\n"
              "  --sizes BxHxT[,...]  scores (B, H, T, T); T a multiple of 8, at most 16384\n"
              "                       (default 8x12x512,4x16x1024,2x16x2048,1x16x4096: bench_softmax's)\n"
              "  --dtypes f32,bf16    dtypes to run (default both)\n"
              "  --iters N            timed samples per case (default 30); --warmup N (default 5)\n"
              "  --calls N            back-to-back calls per sample (default: about 1 ms of work, 1..64,\n"
              "                       as bench_softmax; the copy yardstick is timed the same way)\n"
              "  --no-mask            rows without a mask (default: bench_softmax's key-padding mask\n"
              "                       (B, 1, 1, T), batch b hiding its last (b + 1) T / (2 (B + 1)) keys)\n"
              "  --causal             causal rows (keys past the diagonal masked; implies --no-mask)\n"
              "  --new                only the candidates of 2026-11-29 and production\n"
              "  --help               this text\n"
              "Bytes counted: x read and y written (the mask's B T floats are left out, as bench_softmax's\n"
              "are negligible); %%copy is against the best copy of the scores' bytes.\n"
              "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  std::string sizes = "8x12x512,4x16x1024,2x16x2048,1x16x4096";
  lab::Flags f("softmax_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--sizes")) {
      sizes = f.value();
    } else if (f.is("--dtypes")) {
      o.dtypes = lab::split(f.value());
      for (const std::string& d : o.dtypes)
        if (d != "f32" && d != "bf16") f.fail("--dtypes: unknown dtype '" + d + "' (allowed: f32, bf16)");
    } else if (f.is("--iters")) {
      o.iters = int(f.number(1, 100000));
    } else if (f.is("--warmup")) {
      o.warmup = int(f.number(0, 100000));
    } else if (f.is("--calls")) {
      o.calls = int(f.number(1, 1000));
    } else if (f.is("--causal")) {
      o.causal = true;
      o.mask = false;
    } else if (f.is("--no-mask")) {
      o.mask = false;
    } else if (f.is("--new")) {
      o.fresh = true;
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

float to_float(float v) { return v; }
float to_float(bf16 v) { return __bfloat162float(v); }
template <class T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __float2bfloat16(v);
}

// bench_softmax's key-padding mask (B, 1, 1, T): batch b hides its last (b + 1) T / (2 (B + 1)) keys with -inf.
std::vector<float> padding_mask(int64_t B, int64_t T) {
  std::vector<float> m(size_t(B * T), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = T - (b + 1) * T / (2 * (B + 1)); k < T; ++k) m[size_t(b * T + k)] = -INFINITY;
  return m;
}

// Max over elements of |got - ref| / (|ref| + floor): the error printed and checked.
// The rows a check reads: every row up to 2^22 elements, past that every
// step-th row and the last (spread over every batch and the whole grid).
int64_t check_step(int64_t rows, int64_t tk) { return std::max<int64_t>(1, rows * tk >> 22) | 1; }

template <class T>
double check_rows(const std::vector<T>& x, const std::vector<T>& y, const std::vector<float>& mask,
                  int64_t rows_per_batch, int64_t rows, int64_t tk, int64_t tq, float scale, bool causal) {
  double worst = 0;
  std::vector<double> p(tk);
  const int64_t step = check_step(rows, tk);
  for (int64_t r = 0; r < rows; r = (r + step >= rows && r != rows - 1) ? rows - 1 : r + step) {
    int64_t visible = tk;
    if (causal) visible = std::clamp<int64_t>(r % tq + tk - tq + 1, 0, tk);
    const float* m_row = mask.empty() ? nullptr : &mask[size_t(r / rows_per_batch * tk)];
    const auto shown = [&](int64_t k) { return k < visible && (m_row == nullptr || m_row[k] > kMaskThreshold); };
    const auto z = [&](int64_t k) { return double(scale) * to_float(x[r * tk + k]) + (m_row ? m_row[k] : 0.0); };
    double m = -INFINITY;
    for (int64_t k = 0; k < tk; ++k)
      if (shown(k)) m = std::max(m, z(k));
    double sum = 0;
    for (int64_t k = 0; k < tk; ++k) {
      p[k] = shown(k) ? std::exp(z(k) - m) : 0.0;
      sum += p[k];
    }
    for (int64_t k = 0; k < tk; ++k) {
      const double ref = sum > 0 ? p[k] / sum : 0.0, got = to_float(y[r * tk + k]);
      const double e = std::abs(got - ref) / (std::abs(ref) + 1e-6);
      worst = std::isnan(got) ? INFINITY : std::max(worst, e);
    }
  }
  return worst;
}

// One summary line: production and the best new candidate, % of copy.
struct SummaryLine {
  std::string what;
  double production = 0, best_new = 0;
  std::string best_new_name;
};

template <class T>
bool run_size(const Options& o, int64_t B, int64_t H, int64_t Tn, int l2_bytes, int sms,
              std::vector<SummaryLine>& summary) {
  const int64_t rows = B * H * Tn, tk = Tn, n = rows * tk;
  const size_t bytes = size_t(n) * sizeof(T);
  const float scale = 0.125f;
  // Input sets in rotation: together more than twice the L2.
  const int sets = int(std::clamp<int64_t>(2 * int64_t(l2_bytes) / int64_t(2 * bytes) + 1, 1, 16));
  std::vector<T*> x(sets), y(sets);
  std::mt19937_64 gen(1234 + n);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<T> host_x(n), host_y(n);
  // A pool of 2^22 + 1 draws tiled over the scores (1 G draws would take
  // minutes); the set's index shifts the tiling, so the sets differ.
  std::vector<T> pool((1 << 22) + 1);
  for (T& v : pool) v = from_float<T>(normal(gen));
  for (int s = 0; s < sets; ++s) {
    for (int64_t i = 0; i < n; ++i) host_x[i] = pool[size_t(i + 7919 * s) % pool.size()];
    CHECK_CUDA(cudaMalloc(&x[s], bytes));
    CHECK_CUDA(cudaMalloc(&y[s], bytes));
    CHECK_CUDA(cudaMemcpy(x[s], host_x.data(), bytes, cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMemcpy(host_x.data(), x[0], bytes, cudaMemcpyDeviceToHost));
  const std::vector<float> host_mask = o.mask ? padding_mask(B, Tn) : std::vector<float>();
  float* mask = nullptr;
  if (o.mask) {
    CHECK_CUDA(cudaMalloc(&mask, host_mask.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(mask, host_mask.data(), host_mask.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  const auto args = [&](int s) {
    Args<T> a{x[s], y[s], rows, tk, Tn, scale, o.causal};
    a.mask = mask;
    a.rows_per_batch = H * Tn;
    return a;
  };
  // The copy yardstick: reading and writing the same bytes as a forward,
  // timed as bench_softmax times (calls per sample, the same copy kernels).
  const int calls = o.calls > 0 ? o.calls : lab::calls_for(2.0 * double(bytes));
  const char* copy_name = "";
  const double copy_ms = lab::best_copy_ms(
      o.warmup, o.iters, sets, calls, bytes, sms, [&](int s) { return x[s]; }, [&](int s) { return y[s]; }, &copy_name);
  const double moved = 2.0 * double(bytes);
  const double bound = std::is_same_v<T, float> ? 1e-5 : 1.0 / 128;  // f32 rounding; one bf16 ulp
  const char* rows_kind = o.causal ? " causal" : o.mask ? " padding mask" : " no mask";
  std::printf("%-5s (%lld, %lld, %lld)%s, %d calls per sample: best copy %.0f GB/s (%s)\n",
              std::is_same_v<T, float> ? "f32" : "bf16", (long long)B, (long long)H, (long long)Tn, rows_kind, calls,
              moved / copy_ms / 1e6, copy_name);
  bool ok = true;
  int best = -1;
  double best_ms = 0;
  SummaryLine line;
  line.what = std::string(std::is_same_v<T, float> ? "f32 " : "bf16") + " (" + std::to_string(B) + "," +
              std::to_string(H) + "," + std::to_string(Tn) + ")" + rows_kind;
  for (int c = 0; c < kConfigCount; ++c) {
    const Config& cfg = kConfigs[c];
    if (o.fresh && !cfg.fresh && !cfg.production) continue;
    CHECK_CUDA(cudaMemset(y[0], 0xff, bytes));  // NaN poison: an unwritten element fails the check
    launch_config(cfg, args(0));
    CHECK_CUDA(cudaDeviceSynchronize());
    {  // the checked rows only, each to its own place in host_y
      const size_t row_bytes = size_t(tk) * sizeof(T);
      const int64_t step = check_step(rows, tk), picked = (rows - 1) / step + 1;
      CHECK_CUDA(cudaMemcpy2D(host_y.data(), row_bytes * step, y[0], row_bytes * step, row_bytes, picked,
                              cudaMemcpyDeviceToHost));
      CHECK_CUDA(
          cudaMemcpy(host_y.data() + (rows - 1) * tk, y[0] + (rows - 1) * tk, row_bytes, cudaMemcpyDeviceToHost));
    }
    const double e = check_rows(host_x, host_y, host_mask, H * Tn, rows, tk, Tn, scale, o.causal);
    const bool pass = e <= bound;
    ok &= pass;
    const double ms =
        lab::median_ms_per_call(o.warmup, o.iters, sets, calls, [&](int s) { launch_config(cfg, args(s)); });
    if (pass && (best < 0 || ms < best_ms)) best = c, best_ms = ms;
    const double pct = 100 * copy_ms / ms;
    if (pass && cfg.production) line.production = pct;
    if (pass && cfg.fresh && pct > line.best_new) line.best_new = pct, line.best_new_name = cfg.name;
    std::printf("  %c %-44s %8.1f us %7.0f GB/s %5.1f%% of copy  max rel err %.2e %s\n", cfg.production ? '*' : ' ',
                cfg.name, ms * 1e3, moved / ms / 1e6, pct, e, pass ? "ok" : "FAILED");
  }
  if (best >= 0) std::printf("  winner: %s%s\n", kConfigs[best].name, kConfigs[best].production ? " (production)" : "");
  summary.push_back(line);
  for (int s = 0; s < sets; ++s) {
    CHECK_CUDA(cudaFree(x[s]));
    CHECK_CUDA(cudaFree(y[s]));
  }
  if (mask != nullptr) CHECK_CUDA(cudaFree(mask));
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
  std::printf("softmax_lab on %s (sm_%d%d, L2 %d MiB); * = production (its own kernels, cuda/softmax_forward.cuh)\n",
              prop.name, prop.major, prop.minor, l2 >> 20);
  bool ok = true;
  std::vector<SummaryLine> summary;
  for (const std::string& d : o.dtypes)
    for (size_t i = 0; i < o.t.size(); ++i)
      ok &= d == "f32" ? run_size<float>(o, o.b[i], o.h[i], o.t[i], l2, prop.multiProcessorCount, summary)
                       : run_size<bf16>(o, o.b[i], o.h[i], o.t[i], l2, prop.multiProcessorCount, summary);
  std::printf("\nSummary on %s (%% of copy; prod: production's own kernels; new: the best of 2026-11-29's)\n",
              prop.name);
  std::printf("  %-36s %6s %6s  %s\n", "case", "prod", "new", "best new candidate");
  for (const SummaryLine& l : summary)
    std::printf("  %-36s %6.1f %6.1f  %s\n", l.what.c_str(), l.production, l.best_new, l.best_new_name.c_str());
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a configuration exceeded its error bound\n");
  return ok ? 0 : 1;
}
