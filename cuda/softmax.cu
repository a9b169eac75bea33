// Fused attention softmax: one forward kernel, one backward kernel per call.
// Thread mapping, numerics and byte counts: docs/softmax.md, "Fused GPU kernels".
//
// Three layouts, picked on the host from Tk, dtype and alignment:
//  - lane team: TPR (8/16/32) lanes of one warp own a row, held in registers;
//    reductions are warp shuffles, several rows per block (Tk <= ~1024);
//  - block team: a whole block owns a row, held in registers, reductions
//    through shared memory (Tk <= 16384);
//  - streaming: a block loops over a row of any length in chunks (online
//    max/sum forward, two-pass backward).
// Every layout reads W elements per access: 16 bytes (float4 / 8 x bf16) when
// Tk and the pointers allow it, one element otherwise.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>

#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/reduce.cuh"
#include "cuda/softmax_kernels.hpp"
#include "cuda/softmax_row_math.cuh"
#include "cuda/softmax_staged_forward.cuh"
#include "cuda/staged_room.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kLaneTeamBlock = 128;  // threads per block in the lane-team layout
constexpr int kMaxBlock = 1024;      // block-team and streaming layouts
// Elements per thread in the block-team layout: the row lives in registers,
// capped at 64 per thread by __launch_bounds__(1024). The scalar backward
// (two arrays, per-element addresses) spills at 16, so it holds 8.
constexpr int kForwardBlockElems = 16;
constexpr int kBackwardBlockElems = 16;
constexpr int kBackwardScalarBlockElems = 8;

// ---- who owns a row (LaneTeam: cuda/softmax_row_math.cuh) ----------------------------

struct WarpMaxNan {
  __device__ float operator()(float v) const { return LaneTeam<32>{}.max(v); }
};

// The whole block owns one row; `scratch` holds one float per warp.
struct BlockTeam {
  float* scratch;
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int slot() const { return 0; }
  __device__ int rows_per_block() const { return 1; }
  __device__ float max(float v) const { return block_reduce(v, scratch, WarpMaxNan{}, -INFINITY); }
  __device__ float sum(float v) const { return block_sum(v, scratch); }
};

// ---- forward --------------------------------------------------------------------

// z for the W keys starting at k0 (all < tk): scale * x + mask, -inf past `visible`.
template <class T, int W>
__device__ __forceinline__ void load_z(const T* x_row, const RowSpan& span, int64_t k0, float scale, float (&z)[W]) {
  load_vec<W, Load::ReadOnly>(x_row + k0, z);
  if (span.mask != nullptr) {
    float m[W];
    load_vec<W, Load::ReadOnly>(span.mask + k0, m);
    // _rn: no fused multiply-add, so z rounds exactly as the CPU path's z.
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = __fadd_rn(__fmul_rn(scale, z[j]), additive_mask(m[j]));
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = __fmul_rn(scale, z[j]);
  }
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (k0 + j >= span.visible) z[j] = -INFINITY;  // only the chunk that straddles the diagonal
}

// ---- forward configuration -------------------------------------------------------
// What the forward's register layouts (lane and block teams) do for one
// dtype and access width. The streaming layout has no options, nor has the
// backward.
struct SoftmaxForwardConfig {
  bool lean;          // z = scale x + mask as one FFMA; exp as ex2.approx of (z - max) log2e; bf16 widened by masks
  int lane_max_keys;  // rows longer than this (past one chunk a lane) go to the block team; 0: no limit
};

// Per dtype {f32, bf16} for rows read 16 bytes at a time: lean arithmetic,
// and rows of Tk > 512 in the block team (bf16 Tk 1024: 64 threads a row).
// Measured alternatives and how to promote one: bench/lab/softmax.md.
constexpr SoftmaxForwardConfig kVectorForward[2] = {{true, 512}, {true, 512}};
// Rows read one element at a time: the exact arithmetic of the CPU path.
constexpr SoftmaxForwardConfig kScalarForward = {false, 0};

// load_z with one FFMA per element (scale x + mask rounded once, not twice:
// within an ulp of z of the CPU path), bf16 widened by masks, and the
// per-key causal test only in the chunk that straddles `visible`.
template <class T, int W>
__device__ __forceinline__ void load_z_lean(const T* x_row, const RowSpan& span, int64_t k0, float scale,
                                            float (&z)[W]) {
  load_vec_lean<W>(x_row + k0, z);
  if (span.mask != nullptr) {
    float m[W];
    load_vec<W, Load::ReadOnly>(span.mask + k0, m);
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = fmaf(scale, z[j], additive_mask(m[j]));
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] *= scale;
  }
  if (k0 + W > span.visible)
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (k0 + j >= span.visible) z[j] = -INFINITY;
}

// Row held in registers: chunk i of a thread covers keys [(rank + i * size) * W, +W).
// Requires tk <= size * N * W and, for W > 1, tk % W == 0 (chunks never straddle tk).
// kLean: SoftmaxForwardConfig::lean.
template <class T, int W, int N, bool kLean, class Team>
__device__ __forceinline__ void forward_rows_in_registers(const ForwardArgs<T>& a, const Team& team) {
  const int64_t rows_per_block = team.rows_per_block();
  for (int64_t base = blockIdx.x * rows_per_block; base < a.rows; base += gridDim.x * rows_per_block) {
    const int64_t row = base + team.slot();
    const bool valid = row < a.rows;  // false only for spare teams of the last block
    const RowSpan span = valid ? row_span(a, row) : RowSpan{nullptr, 0};
    const T* x_row = a.x + row * a.tk;

    float v[N][W];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < span.visible) {
        if constexpr (kLean) load_z_lean<T, W>(x_row, span, k0, a.scale, v[i]);
        else load_z<T, W>(x_row, span, k0, a.scale, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;  // masked or past the row: no load
      }
    }

    const float inv = exp_and_inverse<W, N, kLean>(team, v);

    if (!valid) continue;
    T* y_row = a.y + row * a.tk;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < a.tk) {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] *= inv;
        store_vec<W>(y_row + k0, v[i]);
      }
    }
  }
}

template <class T, int TPR, int W, int N, bool kLean>
__global__ void __launch_bounds__(kLaneTeamBlock) softmax_forward_lanes_kernel(ForwardArgs<T> a) {
  forward_rows_in_registers<T, W, N, kLean>(a, LaneTeam<TPR>{});
}

template <class T, int W, int N, bool kLean>
__global__ void __launch_bounds__(kMaxBlock) softmax_forward_block_kernel(ForwardArgs<T> a) {
  __shared__ float scratch[32];
  forward_rows_in_registers<T, W, N, kLean>(a, BlockTeam{scratch});
}

// Rows of any length: pass 1 keeps a running (max m, sum s of exp(z - m)) per
// thread, rescaling s when m grows; the block merges them; pass 2 re-reads
// x and writes y. Bytes: 2 reads + 1 write of the row.
template <class T, int W>
__global__ void __launch_bounds__(kMaxBlock) softmax_forward_streaming_kernel(ForwardArgs<T> a) {
  __shared__ float scratch[32];
  const BlockTeam team{scratch};
  const int64_t stride = static_cast<int64_t>(blockDim.x) * W;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const RowSpan span = row_span(a, row);
    const T* x_row = a.x + row * a.tk;

    float m = -INFINITY, s = 0.0f;
    for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * W; k0 < span.visible; k0 += stride) {
      float z[W];
      load_z<T, W>(x_row, span, k0, a.scale, z);
      float chunk_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < W; ++j) chunk_max = max_nan(chunk_max, z[j]);
      const float new_m = max_nan(m, chunk_max);
      if (new_m == -INFINITY) continue;  // everything so far masked: s stays 0
      float chunk_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < W; ++j) chunk_sum += expf(z[j] - new_m);
      s = s * expf(m - new_m) + chunk_sum;  // m = -inf gives s * 0 = 0
      m = new_m;
    }
    const float row_max = team.max(m);
    const Normaliser norm(row_max);
    // A thread that saw only masked keys (m = -inf) adds nothing; with a NaN
    // row max, expf(m - NaN) = NaN carries the NaN into the sum.
    const float part = m == -INFINITY ? 0.0f : s * expf(m - norm.shift);
    const float inv = norm.inverse(team.sum(part));

    T* y_row = a.y + row * a.tk;
    for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * W; k0 < a.tk; k0 += stride) {
      float z[W];
      if (k0 < span.visible) {
        load_z<T, W>(x_row, span, k0, a.scale, z);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) z[j] = -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < W; ++j) z[j] = expf(z[j] - norm.shift) * inv;
      store_vec<W>(y_row + k0, z);
    }
  }
}

// ---- backward -------------------------------------------------------------------

template <class T>
struct BackwardArgs {
  const T* dy;
  const T* y;
  T* dx;
  int64_t rows, tk;
  float scale;
};

template <class T, int W, int N, class Team>
__device__ __forceinline__ void backward_rows_in_registers(const BackwardArgs<T>& a, const Team& team) {
  const int64_t rows_per_block = team.rows_per_block();
  for (int64_t base = blockIdx.x * rows_per_block; base < a.rows; base += gridDim.x * rows_per_block) {
    const int64_t row = base + team.slot();
    const int64_t tk = row < a.rows ? a.tk : 0;  // spare teams load and store nothing
    const int64_t offset = row * a.tk;

    float yv[N][W], gv[N][W];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < tk) {
        load_vec<W, Load::ReadOnly>(a.y + offset + k0, yv[i]);
        load_vec<W, Load::ReadOnly>(a.dy + offset + k0, gv[i]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) yv[i][j] = gv[i][j] = 0.0f;
      }
    }

    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int j = 0; j < W; ++j) dot += yv[i][j] * gv[i][j];
    dot = team.sum(dot);

#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t k0 = static_cast<int64_t>(team.rank() + i * team.size()) * W;
      if (k0 < tk) {
#pragma unroll
        for (int j = 0; j < W; ++j) gv[i][j] = a.scale * yv[i][j] * (gv[i][j] - dot);
        store_vec<W>(a.dx + offset + k0, gv[i]);
      }
    }
  }
}

template <class T, int TPR, int W, int N>
__global__ void __launch_bounds__(kLaneTeamBlock) softmax_backward_lanes_kernel(BackwardArgs<T> a) {
  backward_rows_in_registers<T, W, N>(a, LaneTeam<TPR>{});
}

template <class T, int W, int N>
__global__ void __launch_bounds__(kMaxBlock) softmax_backward_block_kernel(BackwardArgs<T> a) {
  __shared__ float scratch[32];
  backward_rows_in_registers<T, W, N>(a, BlockTeam{scratch});
}

// Rows of any length: pass 1 computes sum(dy * y), pass 2 re-reads and writes dx.
template <class T, int W>
__global__ void __launch_bounds__(kMaxBlock) softmax_backward_streaming_kernel(BackwardArgs<T> a) {
  __shared__ float scratch[32];
  const BlockTeam team{scratch};
  const int64_t stride = static_cast<int64_t>(blockDim.x) * W;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* y_row = a.y + row * a.tk;
    const T* dy_row = a.dy + row * a.tk;
    float dot = 0.0f;
    for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * W; k0 < a.tk; k0 += stride) {
      float yv[W], gv[W];
      load_vec<W, Load::ReadOnly>(y_row + k0, yv);
      load_vec<W, Load::ReadOnly>(dy_row + k0, gv);
#pragma unroll
      for (int j = 0; j < W; ++j) dot += yv[j] * gv[j];
    }
    dot = team.sum(dot);
    T* dx_row = a.dx + row * a.tk;
    for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * W; k0 < a.tk; k0 += stride) {
      float yv[W], gv[W];
      load_vec<W, Load::ReadOnly>(y_row + k0, yv);
      load_vec<W, Load::ReadOnly>(dy_row + k0, gv);
#pragma unroll
      for (int j = 0; j < W; ++j) gv[j] = a.scale * yv[j] * (gv[j] - dot);
      store_vec<W>(dx_row + k0, gv);
    }
  }
}

// ---- host-side choice of layout ----------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for `rows` rows at `rows_per_block`; the kernels loop when it is capped.
unsigned grid_for(int64_t rows, int64_t rows_per_block) {
  constexpr int64_t kMaxGrid = int64_t{1} << 30;
  return static_cast<unsigned>(std::min(ceil_div(rows, rows_per_block), kMaxGrid));
}

// Threads for a block-team row of tk keys at `per_thread` keys each: whole warps.
unsigned block_team_threads(int64_t tk, int per_thread) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div(ceil_div(tk, per_thread), 32) * 32, kMaxBlock));
}

// Runs `launch(kernel_tag)` for the layout that fits tk. Each Launcher supplies
// lanes<TPR, W, N>(), block<W, N>(threads) and streaming<W>().
// Launcher::kLaneMaxKeys (0: no limit) sends rows longer than it, and longer
// than one chunk a lane, to the block team.
template <int W, int BlockElems, class Launcher>
void dispatch(int64_t tk, Launcher& L) {
  // Lane teams: one 16-byte (or one-element) access per lane for short rows;
  // a full warp with up to 8 (scalar: 8) accesses per lane up to Tk ~ 1024.
  if constexpr (W > 1) {
    if (tk <= 8 * W) return L.template lanes<8, W, 1>();
    if (tk <= 16 * W) return L.template lanes<16, W, 1>();
  }
  if (tk <= 32 * W) return L.template lanes<32, W, 1>();
  if (Launcher::kLaneMaxKeys == 0 || tk <= Launcher::kLaneMaxKeys) {
    if (tk <= 64 * W) return L.template lanes<32, W, 2>();
    if (tk <= 128 * W) return L.template lanes<32, W, 4>();
    if constexpr (W <= 4) {  // float4 rows up to 1024; bf16 x 8 already covered 1024 above
      if (tk <= 256 * W) return L.template lanes<32, W, 8>();
    }
  }
  constexpr int kN = BlockElems / W;
  if (tk <= int64_t{kMaxBlock} * kN * W) return L.template block<W, kN>(block_team_threads(tk, kN * W));
  return L.template streaming<W>();
}

// The fields of a SoftmaxForwardConfig (the streaming kernel has none).
template <class T, bool kLean, int kLaneMaxKeys_>
struct ForwardLauncher {
  static constexpr int kLaneMaxKeys = kLaneMaxKeys_;
  ForwardArgs<T> args;

  template <int TPR, int W, int N>
  void lanes() {
    const int rows_per_block = kLaneTeamBlock / TPR;
    softmax_forward_lanes_kernel<T, TPR, W, N, kLean>
        <<<grid_for(args.rows, rows_per_block), kLaneTeamBlock, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_forward_lanes_kernel");
  }
  template <int W, int N>
  void block(unsigned threads) {
    softmax_forward_block_kernel<T, W, N, kLean><<<grid_for(args.rows, 1), threads, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_forward_block_kernel");
  }
  template <int W>
  void streaming() {
    softmax_forward_streaming_kernel<T, W><<<grid_for(args.rows, 1), kMaxBlock, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_forward_streaming_kernel");
  }
};

template <class T>
struct BackwardLauncher {
  static constexpr int kLaneMaxKeys = 0;
  BackwardArgs<T> args;

  template <int TPR, int W, int N>
  void lanes() {
    const int rows_per_block = kLaneTeamBlock / TPR;
    softmax_backward_lanes_kernel<T, TPR, W, N>
        <<<grid_for(args.rows, rows_per_block), kLaneTeamBlock, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_backward_lanes_kernel");
  }
  template <int W, int N>
  void block(unsigned threads) {
    softmax_backward_block_kernel<T, W, N><<<grid_for(args.rows, 1), threads, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_backward_block_kernel");
  }
  template <int W>
  void streaming() {
    softmax_backward_streaming_kernel<T, W><<<grid_for(args.rows, 1), kMaxBlock, 0, stream()>>>(args);
    HG_CUDA_CHECK_LAUNCH("softmax_backward_streaming_kernel");
  }
};

// Non-causal 16-byte rows of kStagedForwardMinTk..kStagedSoftmaxMaxTk keys go
// to the staged forward (cuda/softmax_staged_forward.cuh) where the device and
// the compiled code are sm_90+: on the H200 it beat the register layouts
// there by 3.5 to ~15 points of the copy rate with a mask, and by up to 23
// without one in f32. At Tk 512 and on causal rows the register layouts win,
// and on bf16 rows without a mask up to kRegistersUnmaskedBf16MaxTk
// (cuda/softmax_staged_forward.cuh; docs/softmax.md).
constexpr int64_t kStagedForwardMinTk = 1024;
// Bytes in flight a SM the rings aim at (bench/lab/softmax.md: "96 KB a SM").
constexpr int kStagedForwardTargetBytes = 96 * 1024;

// The staged forward's kernel and plan for `a` (16-byte rows), or nothing
// where it does not apply (causal, bf16 without a mask to Tk 4096, Tk out
// of range, row numbers past 32-bit division, below sm_90, a row too big
// for shared memory).
template <class T>
struct StagedForward {
  StagedSoftmaxKernel<T> k;
  StagedPlan plan;
};

// Whether the staged forward keeps the mask row in registers: the rows of
// a batch share one mask row (a (B, 1, 1, Tk) or (1, 1, 1, Tk) mask, query
// stride 0) and the rows are long enough for it to pay (kStagedKeptMaskMinTk).
template <class T>
bool staged_keeps_mask_row(const ForwardArgs<T>& a) {
  return a.mask != nullptr && a.mask_query_stride == 0 && a.tk >= kStagedKeptMaskMinTk;
}

template <class T>
std::optional<StagedForward<T>> staged_forward_plan(const ForwardArgs<T>& a) {
  if (a.causal || !a.index32 || a.tk < kStagedForwardMinTk || a.tk > kStagedSoftmaxMaxTk) return std::nullopt;
  if (std::is_same_v<T, bf16> && a.mask == nullptr && a.tk <= kRegistersUnmaskedBf16MaxTk) return std::nullopt;
  const StagedSoftmaxKernel<T> k = staged_keeps_mask_row(a) ? staged_softmax_kernel<T, kStagedKeptMaskMinTk, true>(a.tk)
                                                            : staged_softmax_kernel<T, kStagedForwardMinTk>(a.tk);
  if (k.kernel == nullptr) return std::nullopt;
  // One look at the device and the kernel's compiled code per kernel
  // (nullopt below sm_90), under a lock: forwards may run on several threads.
  static std::mutex lock;
  static std::map<const void*, std::optional<StagedRoom>> rooms;
  std::optional<StagedRoom> room;
  {
    const std::lock_guard<std::mutex> hold(lock);
    const void* key = reinterpret_cast<const void*>(k.kernel);
    auto at = rooms.find(key);
    if (at == rooms.end()) at = rooms.emplace(key, staged_room(k.kernel, k.G * k.R, "softmax_forward_fused")).first;
    room = at->second;
  }
  if (!room) return std::nullopt;
  const StagedPlan plan =
      plan_staged(*room, k.R, static_cast<int>(a.tk * int64_t(sizeof(T))), kStagedForwardTargetBytes);
  if (plan.stages < 1) return std::nullopt;  // the register layouts take it
  return StagedForward<T>{k, plan};
}

template <class T>
void launch_staged_forward(const ForwardArgs<T>& a, const StagedForward<T>& s) {
  const int64_t resident = int64_t(s.plan.blocks_per_sm) * sm_count();
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(resident, ceil_div(a.rows, s.k.R)));
  s.k.kernel<<<grid, s.k.G * s.k.R, s.plan.smem, stream()>>>(a, s.plan.stages);
  HG_CUDA_CHECK_LAUNCH("softmax_forward_staged_kernel");
}

template <class T>
ForwardArgs<T> forward_args(const Tensor& x, const SoftmaxRows& l, const Tensor& y) {
  return {static_cast<const T*>(x.raw_data()),
          static_cast<T*>(y.raw_data()),
          l.mask != nullptr ? l.mask->data<float>() : nullptr,
          l.rows,
          l.tk,
          l.tq,
          l.heads * l.tq,
          l.mask_batch_stride,
          l.mask_query_stride,
          static_cast<float>(l.scale),
          l.causal,
          l.rows <= UINT32_MAX && l.heads * l.tq <= UINT32_MAX};
}

// 16-byte access needs every row start 16-byte aligned: Tk a multiple of
// the vector width and aligned base pointers (a mask row is read V floats
// at a time, so its strides must keep 16-byte alignment too).
template <class T>
bool vector_rows(const ForwardArgs<T>& a) {
  return a.tk % VecWidth<T>::value == 0 && aligned16(a.x) && aligned16(a.y) &&
         (a.mask == nullptr || (aligned16(a.mask) && a.mask_batch_stride % 4 == 0 && a.mask_query_stride % 4 == 0));
}

template <class T>
void forward_typed(const Tensor& x, const SoftmaxRows& l, Tensor& y) {
  constexpr int V = VecWidth<T>::value;
  const ForwardArgs<T> args = forward_args<T>(x, l, y);
  if (vector_rows(args)) {
    if (const auto staged = staged_forward_plan(args)) return launch_staged_forward(args, *staged);
    constexpr SoftmaxForwardConfig C = kVectorForward[std::is_same_v<T, bf16>];
    ForwardLauncher<T, C.lean, C.lane_max_keys> launcher{args};
    return dispatch<V, kForwardBlockElems>(l.tk, launcher);
  }
  ForwardLauncher<T, kScalarForward.lean, kScalarForward.lane_max_keys> launcher{args};
  dispatch<1, kForwardBlockElems>(l.tk, launcher);
}

template <class T>
bool forward_is_staged(const Tensor& x, const SoftmaxRows& l, const Tensor& y) {
  const ForwardArgs<T> args = forward_args<T>(x, l, y);
  return vector_rows(args) && staged_forward_plan(args).has_value();
}

template <class T>
bool forward_keeps_mask_row(const Tensor& x, const SoftmaxRows& l, const Tensor& y) {
  return forward_is_staged<T>(x, l, y) && staged_keeps_mask_row(forward_args<T>(x, l, y));
}

template <class T>
void backward_typed(const Tensor& dy, const Tensor& y, int64_t rows, int64_t tk, float scale, Tensor& dx) {
  constexpr int V = VecWidth<T>::value;
  BackwardLauncher<T> launcher{BackwardArgs<T>{static_cast<const T*>(dy.raw_data()),
                                               static_cast<const T*>(y.raw_data()), static_cast<T*>(dx.raw_data()),
                                               rows, tk, scale}};
  const bool vector_ok = tk % V == 0 && aligned16(dy.raw_data()) && aligned16(y.raw_data()) && aligned16(dx.raw_data());
  if (vector_ok) return dispatch<V, kBackwardBlockElems>(tk, launcher);
  dispatch<1, kBackwardScalarBlockElems>(tk, launcher);
}

void check_storage(const char* op, const Tensor& t, const Tensor& like, int64_t numel) {
  t.check_device(Device::CUDA, op);
  check_same_dtype(op, t, like);
  HG_CHECK(t.numel() == numel, op, "tensor ", t.shape(), " does not hold rows * tk = ", numel, " elements");
}

}  // namespace

void softmax_forward_fused(const Tensor& x, const SoftmaxRows& layout, Tensor& y) {
  constexpr const char* op = "softmax_forward_fused";
  HG_DCHECK(layout.rows >= 0 && layout.tk >= 1 && layout.tq >= 1 && layout.heads >= 1, op, "bad layout: rows ",
            layout.rows, " tk ", layout.tk, " tq ", layout.tq, " heads ", layout.heads);
  HG_DCHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, op, "dtype ", dtype_name(x.dtype()),
            " is not supported (F32 or BF16)");
  if (HG_DEBUG_CHECKS) {
    check_storage(op, x, x, layout.rows * layout.tk);
    check_storage(op, y, x, layout.rows * layout.tk);
  }
  if ((layout.mask != nullptr || layout.causal) && layout.rows > 0)
    HG_DCHECK(layout.rows % (layout.heads * layout.tq) == 0, op, "rows ", layout.rows,
              " is not a multiple of heads * tq = ", layout.heads * layout.tq);
  if (HG_DEBUG_CHECKS && layout.mask != nullptr) {
    layout.mask->check_device(Device::CUDA, op);
    layout.mask->check_dtype(DType::F32, op);
  }
  if (layout.rows == 0) return;
  if (x.dtype() == DType::F32) return forward_typed<float>(x, layout, y);
  forward_typed<bf16>(x, layout, y);
}

bool softmax_forward_is_staged(const Tensor& x, const SoftmaxRows& layout, const Tensor& y) {
  if (layout.rows == 0) return false;
  return x.dtype() == DType::F32 ? forward_is_staged<float>(x, layout, y) : forward_is_staged<bf16>(x, layout, y);
}

bool softmax_forward_keeps_mask_row(const Tensor& x, const SoftmaxRows& layout, const Tensor& y) {
  if (layout.rows == 0) return false;
  return x.dtype() == DType::F32 ? forward_keeps_mask_row<float>(x, layout, y)
                                 : forward_keeps_mask_row<bf16>(x, layout, y);
}

void softmax_backward_fused(const Tensor& dy, const Tensor& y, int64_t rows, int64_t tk, float scale, Tensor& dx) {
  constexpr const char* op = "softmax_backward_fused";
  HG_DCHECK(rows >= 0 && tk >= 1, op, "bad layout: rows ", rows, " tk ", tk);
  HG_DCHECK(y.dtype() == DType::F32 || y.dtype() == DType::BF16, op, "dtype ", dtype_name(y.dtype()),
            " is not supported (F32 or BF16)");
  if (HG_DEBUG_CHECKS) {
    check_storage(op, y, y, rows * tk);
    check_storage(op, dy, y, rows * tk);
    check_storage(op, dx, y, rows * tk);
  }
  if (rows == 0) return;
  if (y.dtype() == DType::F32) return backward_typed<float>(dy, y, rows, tk, scale, dx);
  backward_typed<bf16>(dy, y, rows, tk, scale, dx);
}

}  // namespace hg::gpu
