// Fused attention lab: every BF16 forward and backward tiling and every F32
// backward kernel set of bench/lab/attention_lab_kernels.cuh, side by side.
// Each configuration is checked against a CPU float64 attention (o, dq, dk,
// dv) on fresh random inputs, then timed with CUDA events (median after
// warm-up, input sets rotated past the L2) and reported in TFLOP/s. The
// production configuration is marked "*"; to promote a winner, edit
// kBf16Forward / kBf16Backward in cuda/attention.cu (or Tiles in
// cuda/attention_f32.cu) and run the GPU tests (bench/lab/attention.md).
// Standalone: CUDA runtime only.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench/lab/attention_lab_kernels.cuh"
#include "bench/lab/attention_lab_wgmma.cuh"
#include "bench/lab/attention_lab_wgmma_bwd.cuh"
#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"

namespace {

using hg::gpu::attn::Args;
using hg::gpu::attn::DqOrder;
using bf16 = __nv_bfloat16;

int g_ring = 0;  // --ring: slots of the BF16 one-kernel backward's dq ring (0: twice the heads resident blocks span)

template <class Kernel, class... More>
void launch_kernel(cudaStream_t s, Kernel kernel, dim3 grid, int threads, size_t smem, const Args& a,
                   const More&... more) {
  if (smem > 48 * 1024)
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, threads, smem, s>>>(a, more...);
  CHECK_CUDA(cudaGetLastError());
}

dim3 grid_of(int64_t rows, int per_block, int64_t heads) {
  return dim3(unsigned((rows + per_block - 1) / per_block), unsigned(heads));
}

template <class Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t smem) {
  if (smem > 48 * 1024)
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int per_sm = 0, sms = 0, device = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return int64_t(std::max(per_sm, 1)) * sms;
}

// The dq order's memory (cuda/attention_dq_order.cu's dq_workspace), from a
// scratch buffer that grows as needed.
DqOrder dq_order(const Args& a, int64_t heads, int key_rows, int flush_rows, int warps, int ring, int dh) {
  static void* scratch = nullptr;
  static size_t scratch_bytes = 0;
  DqOrder o{};
  o.key_rows = key_rows, o.key_tiles = int((a.tk + key_rows - 1) / key_rows);
  o.flush_rows = flush_rows, o.flush_tiles = int((a.tq + flush_rows - 1) / flush_rows);
  o.warps = warps;
  o.ring = ring > 0 ? ring : int(heads);
  const int64_t head_words = 2 + heads * o.flush_tiles, slots_at = (head_words + 3) / 4 * 4;
  const int64_t words = slots_at + (ring > 0 ? int64_t(ring) * a.tq * dh : 0);
  if (size_t(words) * 4 > scratch_bytes) {
    if (scratch != nullptr) CHECK_CUDA(cudaFree(scratch));
    scratch_bytes = size_t(words) * 4;
    CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
  }
  int* base = static_cast<int*>(scratch);
  CHECK_CUDA(cudaMemsetAsync(base, 0, size_t(head_words) * 4));
  o.ticket = reinterpret_cast<unsigned long long*>(base);
  o.counters = base + 2;
  o.slots = ring > 0 ? reinterpret_cast<float*>(base + slots_at) : nullptr;
  return o;
}

// ---- BF16 configurations ------------------------------------------------------------
namespace b = hg::gpu::lab_bf16;

// Forward variants 0 .. 8: 1 stages twice the keys per barrier at dh 128
// (computed in halves), 2-5 skip the rescale when no row max grew, 6 stages
// with the unrolled copies and compiles the fast tile apart (lean), 7 adds
// the lazy rescale, 8 is 7 with 64-key tiles at dh 128.
template <int DH, int V>
struct ForwardTiling {
  static constexpr int kSub = DH == 128 && V < 8 ? 32 : 64;
  static constexpr int kKeys = V >= 1 && V < 8 && DH == 128 ? 2 * kSub : kSub;
  static constexpr b::Rescale kRescale = V >= 7             ? b::Rescale::Lazy
                                         : V >= 2 && V <= 5 ? b::Rescale::SkipUnchanged
                                                            : b::Rescale::Always;
  static constexpr bool kLean = V >= 6;
};
// Backward variants 0 .. 10: 1 twice the keys per dq barrier, 3 64 staged
// queries in dk/dv, 4 the 16-byte delta kernel, 5 dq at dh 128 on 32-key
// tiles with s then dp, 6 the one-kernel backward (dq added by the dk/dv
// blocks in a fixed order, through a ring of fp32 slots), 7 6 with 8 warps
// and 128 keys at dh 128, 8 5 with the lean tiles, 9 8 with the eight-warp
// phased dk/dv at dh 128, 10 9 with dq on a second stream.
template <int DH, int V>
struct BackwardTiling {
  static constexpr bool kFusedDq = V == 6 || V == 7;
  static constexpr int kDkdvSub = 32, kDkdvQueries = V >= 3 && DH >= 64 && !(kFusedDq && DH == 128) ? 64 : 32,
                       kDkdvMT = DH == 128 ? 1 : 2;
  static constexpr bool kDqSplit = V >= 5 && DH == 128;
  static constexpr int kDqSub = DH == 128 ? (kDqSplit ? 32 : 16) : DH == 64 ? 32 : 64;
  static constexpr int kDqKeys = V >= 1 && DH >= 64 && !kDqSplit ? 2 * kDqSub : kDqSub;
  static constexpr bool kDelta16 = V >= 4;
  static constexpr int kDsBuffers = DH == 64 ? 1 : 2;
  static constexpr int kDkdvWarps = V == 7 && DH == 128 ? 8 : 4;
  static constexpr bool kLean = V >= 8;
  static constexpr bool kDkdvPhased = V >= 9 && DH == 128;
  static constexpr bool kDqBeside = V == 10;
};
constexpr int kBf16ForwardVariants = 9, kBf16BackwardVariants = 11;
// cuda/attention.cu's kBf16Forward / kBf16Backward: {dh 32, 64, 128}.
constexpr int kBf16ForwardProduction[3] = {7, 7, 8};
constexpr int kBf16BackwardProduction = 10;  // the mma.sync backward (every GPU; dh 32, 64 on sm_90)
// Forward variants 9-16: the wgmma kernels (sm_90a, dh 64 and 128), 128
// queries per block (two consumer warpgroups) unless said: 9 the library's
// kernel (cuda/attention_wgmma_kernel.cuh: 128-key tiles in 2 stages), then
// the candidates of attention_lab_wgmma.cuh: 10 64-key tiles in 2 stages, 11
// 64-key tiles in 3 stages with the next tile's q k^T beside this tile's p
// v, 12 192 queries per block (three consumer warpgroups) with 11's tiles at
// dh 64 and 10's at dh 128 (the overlap spills at 128 registers a thread),
// 13 11 with p v in two n64 halves at dh 128 (no leading byte offset in the
// MN-major descriptor; the same kernel as 11 at dh 64); 14 the overlap on
// 128-key tiles in 2 stages with a producer warpgroup that gives the
// consumers 240 registers a thread (setmaxnreg), 15 14 in 3 stages, 16 14
// with the two consumer warpgroups taking turns to issue their products
// (ping-pong).
constexpr int kWgmmaForwardFirst = kBf16ForwardVariants, kWgmmaForwardVariants = 8;
constexpr int kWgmmaBackwardFirst = 14, kWgmmaBackwardVariants = 7;  // 11-13 retired
bool is_wgmma(bool bf16, bool backward, int v) {
  return bf16 && v >= (backward ? kWgmmaBackwardFirst : kWgmmaForwardFirst);
}
bool retired(bool bf16, bool backward, int v) {
  return bf16 && backward && v >= kBf16BackwardVariants && v < kWgmmaBackwardFirst;
}

constexpr size_t forward_smem(int dh, int kb) { return 2 * (b::kRowsBf16 + 2 * 2 * kb) * (dh + 8); }
constexpr size_t dkdv_smem(int dh, int qb, int mt, int warps = 4) {
  return 2 * 2 * 16 * warps * mt * (dh + 8) + 2 * (2 * 2 * qb * (dh + 8) + 12 * qb);
}
constexpr size_t dkdv_phased_smem(int dh, int qb) { return dkdv_smem(dh, qb, 1, 8) + 2 * 2 * 128 * (qb + 8); }
constexpr size_t dq_smem(int dh, int kb) { return 2 * (2 * b::kRowsBf16 + 2 * 2 * kb) * (dh + 8); }

// A second stream for a dq kernel beside dk/dv: side_fork() makes it wait
// for the work queued so far on the default stream and returns it;
// side_join() makes the default stream wait for it.
struct Side {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
Side& side() {
  static Side s = [] {
    Side x;
    CHECK_CUDA(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&x.join, cudaEventDisableTiming));
    return x;
  }();
  return s;
}
cudaStream_t side_fork() {
  CHECK_CUDA(cudaEventRecord(side().fork, nullptr));
  CHECK_CUDA(cudaStreamWaitEvent(side().stream, side().fork));
  return side().stream;
}
void side_join() {
  CHECK_CUDA(cudaEventRecord(side().join, side().stream));
  CHECK_CUDA(cudaStreamWaitEvent(nullptr, side().join));
}

template <int DH, int V>
void bf16_forward(const Args& a, int64_t bh) {
  using T = ForwardTiling<DH, V>;
  launch_kernel(nullptr, b::forward_bf16_kernel<DH, T::kKeys, T::kSub, DH <= 64, T::kRescale, T::kLean>,
                grid_of(a.tq, b::kRowsBf16, bh), 128, forward_smem(DH, T::kKeys), a);
}

template <int DH>
void wgmma_forward(int v, const Args& a, int64_t bh) {
  namespace w = hg::gpu::lab_wgmma;
  if constexpr (DH == 64 || DH == 128) {
    constexpr bool kOverlap12 = DH == 64;  // variant 12: 11's tiles at dh 64, 10's at dh 128
    constexpr int kStages12 = kOverlap12 ? 3 : 2;
    cudaError_t e = cudaSuccess;
    switch (v - kWgmmaForwardFirst) {
      case 0: e = w::forward_production<DH>(a, bh); break;
      case 1: e = w::forward<DH, 64, 2, false>(a, bh); break;
      case 2: e = w::forward<DH, 64, 3, true>(a, bh); break;
      case 3: e = w::forward<DH, 64, kStages12, kOverlap12, 3>(a, bh); break;
      case 4: e = w::forward<DH, 64, 3, true, 2, true>(a, bh); break;
      case 5: e = w::forward_split<DH, 128, 2>(a, bh); break;
      case 6: e = w::forward_split<DH, 128, 3>(a, bh); break;
      default: e = w::forward_split<DH, 128, 2, 2, true>(a, bh); break;
    }
    CHECK_CUDA(e);
  } else {
    std::fprintf(stderr, "wgmma forward: dh %d not built (64, 128)\n", DH);
    std::exit(1);
  }
}

// Backward variants 14-20 (11-13, the first wgmma candidates, are retired:
// bench/lab/attention.md): the library's kernels of
// cuda/attention_wgmma_backward_kernel.cuh after the 16-byte delta kernel
// (attention_lab_wgmma_bwd.cuh). 14 as the library runs them: 128 streamed
// rows a stage but in dk/dv at dh 128, dq on a second stream beside dk/dv;
// then with dq after dk/dv on one stream, on other tiles: 15 64 rows in
// both, 16 dk/dv on 128-query tiles at dh 64 (64 at dh 128: the
// accumulators would not fit) and dq on 64-key tiles, 17 dk/dv on 64, dq on
// 128, 18 the library's tiles; 19 14 in 3 stages (dq at dh 128 in 2: 3
// stages of 128 keys pass the shared memory); 20 the library's stored-ds
// pair (dk/dv writes ds, dq reads it: one product instead of three).
template <int DH>
void wgmma_backward(int v, const Args& a, int64_t bh) {
  namespace w = hg::gpu::lab_wgmma;
  if constexpr (DH == 64 || DH == 128) {
    const int64_t rows = bh * a.tq;
    b::delta_bf16_kernel<DH><<<unsigned((rows * (DH / 8) + 127) / 128), 128>>>(a, rows);
    CHECK_CUDA(cudaGetLastError());
    constexpr int kWideQueryTile = DH == 64 ? 128 : 64;  // variant 16
    switch (v - kWgmmaBackwardFirst) {
      case 0:
        CHECK_CUDA(w::backward_production<DH>(a, bh, nullptr, side_fork()));
        side_join();
        break;
      case 1: CHECK_CUDA((w::backward_production<DH, 64, 64>(a, bh))); break;
      case 2: CHECK_CUDA((w::backward_production<DH, kWideQueryTile, 64>(a, bh))); break;
      case 3: CHECK_CUDA((w::backward_production<DH, 64, 128>(a, bh))); break;
      case 4: CHECK_CUDA(w::backward_production<DH>(a, bh)); break;
      case 6: CHECK_CUDA(w::backward_stored_ds<DH>(a, bh)); break;
      default: {
        constexpr int kTv = hg::gpu::attn::backward_tile(DH, true), kTq = hg::gpu::attn::backward_tile(DH, false);
        constexpr int kDqStages = DH == 64 ? 3 : 2;  // 3 stages of 128 keys at dh 128 pass the shared memory
        CHECK_CUDA((w::backward_production<DH, kTv, kTq, 3, kDqStages>(a, bh, nullptr, side_fork())));
        side_join();
        break;
      }
    }
  } else {
    std::fprintf(stderr, "wgmma backward: dh %d not built (64, 128)\n", DH);
    std::exit(1);
  }
}

template <int DH, int V>
void bf16_backward(const Args& a, int64_t bh) {
  using T = BackwardTiling<DH, V>;
  // (each variant reads only some of its fields)
  static_assert(T::kDqKeys % T::kDqSub == 0 && T::kDsBuffers >= 1 && T::kDkdvWarps >= 4 &&
                !((T::kDkdvPhased || T::kDqBeside) && T::kFusedDq));
  const int64_t rows = bh * a.tq;
  if constexpr (T::kDelta16) {
    b::delta_bf16_kernel<DH><<<unsigned((rows * (DH / 8) + 127) / 128), 128>>>(a, rows);
  } else {
    b::delta_kernel<bf16><<<unsigned((rows + 3) / 4), 128>>>(a, rows, DH);
  }
  CHECK_CUDA(cudaGetLastError());
  constexpr int kQB = T::kDkdvQueries, kQS = T::kDkdvSub, kMT = T::kDkdvMT;
  if constexpr (T::kFusedDq) {
    constexpr int kWarps = T::kDkdvWarps, kKeys = 16 * kMT * kWarps;
    const auto kernel = b::backward_dkdv_bf16_kernel<DH, kQB, kQS, kMT, DH * kMT <= 64, true, T::kDsBuffers, kWarps>;
    const size_t smem = dkdv_smem(DH, kQB, kMT, kWarps) + size_t(T::kDsBuffers) * kKeys * (kQS + 8) * 2;
    const dim3 blocks = grid_of(a.tk, kKeys, bh);
    const int64_t spanned = (resident_blocks(kernel, 32 * kWarps, smem) + blocks.x - 1) / blocks.x + 1;
    const int ring = int(std::min<int64_t>(bh, g_ring > 0 ? g_ring : 2 * spanned));
    const DqOrder order = dq_order(a, bh, kKeys, kQS, kWarps, ring, DH);
    kernel<<<blocks, 32 * kWarps, smem>>>(a, order);
    CHECK_CUDA(cudaGetLastError());
    return;
  }
  const cudaStream_t dq_stream = T::kDqBeside ? side_fork() : nullptr;
  if constexpr (T::kDkdvPhased) {
    launch_kernel(nullptr, b::backward_dkdv_phased_bf16_kernel<DH, kQB>, grid_of(a.tk, 128, bh), 256,
                  dkdv_phased_smem(DH, kQB), a);
  } else {
    launch_kernel(nullptr, b::backward_dkdv_bf16_kernel<DH, kQB, kQS, kMT, DH * kMT <= 64, false, 1, 4, T::kLean>,
                  grid_of(a.tk, 64 * kMT, bh), 128, dkdv_smem(DH, kQB, kMT), a, DqOrder{});
  }
  launch_kernel(dq_stream, b::backward_dq_bf16_kernel<DH, T::kDqKeys, T::kDqSub, T::kDqSplit, T::kLean>,
                grid_of(a.tq, b::kRowsBf16, bh), 128, dq_smem(DH, T::kDqKeys), a);
  if constexpr (T::kDqBeside) side_join();
}

// ---- F32 configurations ---------------------------------------------------------------
namespace f = hg::gpu::attn::lab_f32;
constexpr int kCols = 64;

template <int DH>
struct F32Tiles {
  static constexpr int kFwdTy = DH == 128 ? 16 : 8, kFwdRm = 8;
  static constexpr int kBwdTy = DH == 128 ? 16 : 8, kBwdRm = DH == 128 ? 4 : 8;
  static constexpr int kFwdRows = kFwdTy * kFwdRm, kBwdRows = kBwdTy * kBwdRm;
  static constexpr size_t kFwdSmem = 4 * ((kFwdRows + 2 * kCols) * (DH + 4) + kCols * (kFwdRows + 4));
  static constexpr size_t kDqSmem = 4 * ((2 * kBwdRows + 2 * kCols) * (DH + 4) + kCols * (kBwdRows + 4));
  static constexpr size_t kDkdvSmem =
      4 * ((2 * kBwdRows + 2 * kCols) * (DH + 4) + 2 * kCols * (kBwdRows + 4) + 3 * kCols);
};
// Backward variants 0 .. 6: 0 the two-sweep dq kernel, then dk/dv; 1 delta
// by do . o and one sweep, dk/dv prefetching; 2 as 1 without the prefetch;
// 3 the one-kernel backward (dq added in the fixed order); 5 3 with the next
// tile's loads during dq; 4 5 with backward_split_kernel at dh 128; 6 4 with
// the dq add moved into the next tile (production, cuda/attention_f32.cu).
constexpr int kF32BackwardVariants = 7, kF32BackwardProduction = 6;

template <int DH>
void f32_forward(const Args& a, int64_t bh) {
  using T = F32Tiles<DH>;
  launch_kernel(nullptr, f::forward_kernel<DH, T::kFwdTy, T::kFwdRm>, grid_of(a.tq, T::kFwdRows, bh), 16 * T::kFwdTy,
                T::kFwdSmem, a);
}

template <int DH, bool kOneSweep, bool kPrefetch, bool kFusedDq = false, bool kSplit = false, bool kSharedDq = false>
void f32_backward_kernels(const Args& a, int64_t bh) {
  using T = F32Tiles<DH>;
  if (kOneSweep) {
    const int64_t rows = bh * a.tq;
    f::delta_kernel<DH><<<unsigned((rows + 127) / 128), 128>>>(a, rows);
    CHECK_CUDA(cudaGetLastError());
  }
  launch_kernel(nullptr, f::backward_dq_kernel<DH, T::kBwdTy, T::kBwdRm, kOneSweep, kFusedDq>,
                grid_of(a.tq, T::kBwdRows, bh), 16 * T::kBwdTy, T::kDqSmem, a);
  if constexpr (kFusedDq) {
    constexpr bool kShared = kSplit && kSharedDq && DH == 128;
    const DqOrder order = dq_order(a, bh, T::kBwdRows, kCols, kShared ? 4 : T::kBwdTy / 2, 0, DH);
    if constexpr (kSplit && DH == 128) {
      const size_t smem = T::kDkdvSmem + (kShared ? 4 * kCols * (DH + 4) : 0);
      launch_kernel(nullptr, f::backward_split_kernel<DH, kShared>, grid_of(a.tk, T::kBwdRows, bh), 256, smem, a,
                    order);
      return;
    }
    launch_kernel(nullptr, f::backward_dkdv_kernel<DH, T::kBwdTy, T::kBwdRm, kPrefetch, true>,
                  grid_of(a.tk, T::kBwdRows, bh), 16 * T::kBwdTy, T::kDkdvSmem, a, order);
  } else {
    launch_kernel(nullptr, f::backward_dkdv_kernel<DH, T::kBwdTy, T::kBwdRm, kPrefetch, false>,
                  grid_of(a.tk, T::kBwdRows, bh), 16 * T::kBwdTy, T::kDkdvSmem, a, DqOrder{});
  }
}

template <int DH>
void f32_backward(int v, const Args& a, int64_t bh) {
  switch (v) {
    case 1: return f32_backward_kernels<DH, true, true>(a, bh);
    case 2: return f32_backward_kernels<DH, true, false>(a, bh);
    case 3: return f32_backward_kernels<DH, true, false, true>(a, bh);
    case 4: return f32_backward_kernels<DH, true, true, true, true>(a, bh);
    case 5: return f32_backward_kernels<DH, true, true, true>(a, bh);
    case 6: return f32_backward_kernels<DH, true, true, true, true, true>(a, bh);
    default: return f32_backward_kernels<DH, false, false>(a, bh);
  }
}

// fn(std::integral_constant<int, v>{}) for a run-time v in 0 .. N-1.
template <class Fn, int... Is>
void with_index(int v, Fn& fn, std::integer_sequence<int, Is...>) {
  (void)((v == Is && (fn(std::integral_constant<int, Is>{}), true)) || ...);
}
template <int N, class Fn>
void with_index(int v, Fn&& fn) {
  with_index(v, fn, std::make_integer_sequence<int, N>{});
}

// One configuration: the dtype, the direction and its variant number.
struct Config {
  bool bf16, backward;
  int variant;
};

template <int DH>
void run_config(const Config& c, const Args& a, int64_t bh) {
  if (is_wgmma(c.bf16, c.backward, c.variant))
    return c.backward ? wgmma_backward<DH>(c.variant, a, bh) : wgmma_forward<DH>(c.variant, a, bh);
  if (c.bf16 && !c.backward)
    return with_index<kBf16ForwardVariants>(c.variant, [&](auto v) { bf16_forward<DH, decltype(v)::value>(a, bh); });
  if (c.bf16)
    return with_index<kBf16BackwardVariants>(c.variant, [&](auto v) { bf16_backward<DH, decltype(v)::value>(a, bh); });
  if (!c.backward) return f32_forward<DH>(a, bh);
  f32_backward<DH>(c.variant, a, bh);
}

void run(const Config& c, int dh, const Args& a, int64_t bh) {
  if (dh == 32) return run_config<32>(c, a, bh);
  if (dh == 64) return run_config<64>(c, a, bh);
  run_config<128>(c, a, bh);
}

// ---- buffers, reference, checks -------------------------------------------------------

// q, k, v, o, do, dq, dk, dv (B, H, T, dh) contiguous, lse, stats, delta.
struct Buffers {
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *delta;
  float2* stats;
};

Buffers alloc(size_t n, int64_t rows, size_t elt) {
  Buffers b{};
  for (void** p : {&b.q, &b.k, &b.v, &b.o, &b.dout, &b.dq, &b.dk, &b.dv}) CHECK_CUDA(cudaMalloc(p, n * elt));
  CHECK_CUDA(cudaMalloc(&b.lse, rows * 4));
  CHECK_CUDA(cudaMalloc(&b.delta, rows * 4));
  CHECK_CUDA(cudaMalloc(&b.stats, rows * 8));
  return b;
}
void release(Buffers& b) {
  for (void* p : {b.q, b.k, b.v, b.o, b.dout, b.dq, b.dk, b.dv}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(b.lse));
  CHECK_CUDA(cudaFree(b.delta));
  CHECK_CUDA(cudaFree(b.stats));
}

Args args_of(const Buffers& b, int64_t heads, int64_t tq, int64_t tk, int dh, bool causal, double scale) {
  Args a{};
  a.q = b.q, a.k = b.k, a.v = b.v, a.o = b.o, a.dout = b.dout, a.out = b.o, a.dq = b.dq, a.dk = b.dk, a.dv = b.dv;
  a.lse = b.lse, a.stats = b.stats, a.delta = b.delta, a.mask = nullptr;
  a.heads = int(heads), a.tq = int(tq), a.tk = int(tk), a.causal = causal;
  a.scale = float(scale), a.scale_log2 = float(scale * 1.4426950408889634);
  a.q_batch = a.o_batch = heads * tq * dh, a.kv_batch = heads * tk * dh;
  a.q_head = a.o_head = tq * dh, a.kv_head = tk * dh;
  a.q_row = a.kv_row = a.o_row = dh;
  return a;
}

// Host values as the kernel reads them (bf16-rounded for BF16).
std::vector<double> upload(void* dst, size_t n, bool bf16_inputs, std::mt19937_64& gen) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> seen(n);
  if (bf16_inputs) {
    std::vector<bf16> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = __float2bfloat16(float(normal(gen))), seen[i] = __bfloat162float(h[i]);
    CHECK_CUDA(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
  } else {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = float(normal(gen)), seen[i] = h[i];
    CHECK_CUDA(cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice));
  }
  return seen;
}
std::vector<double> download(const void* src, size_t n, bool bf16_inputs) {
  std::vector<double> out(n);
  if (bf16_inputs) {
    std::vector<bf16> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  } else {
    std::vector<float> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), src, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = h[i];
  }
  return out;
}

// float64 attention of heads (Tq or Tk, dh): o, lse, and dq, dk, dv from
// dout. Causal: query i sees keys j <= i + Tk - Tq (none: o = 0, lse = -inf).
void reference(int64_t heads, int64_t tq, int64_t tk, int dh, bool causal, double scale, const std::vector<double>& q,
               const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& dout,
               std::vector<double>& o, std::vector<double>& lse, std::vector<double>& dq, std::vector<double>& dk,
               std::vector<double>& dv) {
  const size_t nq = size_t(heads * tq * dh), nk = size_t(heads * tk * dh);
  o.assign(nq, 0), dq.assign(nq, 0), dk.assign(nk, 0), dv.assign(nk, 0), lse.assign(size_t(heads * tq), -INFINITY);
  std::vector<double> p(tk), dp(tk);
  for (int64_t h = 0; h < heads; ++h) {
    const size_t qb = size_t(h * tq * dh), kb = size_t(h * tk * dh);
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t keys = causal ? std::clamp<int64_t>(i + 1 + tk - tq, 0, tk) : tk;
      double m = -INFINITY, sum = 0, delta = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double s = 0;
        for (int c = 0; c < dh; ++c) s += q[qb + i * dh + c] * k[kb + j * dh + c];
        p[j] = s * scale, m = std::max(m, p[j]);
      }
      for (int64_t j = 0; j < keys; ++j) p[j] = std::exp(p[j] - m), sum += p[j];
      if (keys > 0) lse[size_t(h * tq + i)] = m + std::log(sum);
      for (int64_t j = 0; j < keys; ++j) {
        p[j] /= sum;
        double d = 0;
        for (int c = 0; c < dh; ++c) {
          o[qb + i * dh + c] += p[j] * v[kb + j * dh + c];
          d += dout[qb + i * dh + c] * v[kb + j * dh + c];
        }
        dp[j] = d, delta += p[j] * d;
      }
      for (int64_t j = 0; j < keys; ++j) {
        const double ds = p[j] * (dp[j] - delta) * scale;
        for (int c = 0; c < dh; ++c) {
          dq[qb + i * dh + c] += ds * k[kb + j * dh + c];
          dk[kb + j * dh + c] += ds * q[qb + i * dh + c];
          dv[kb + j * dh + c] += p[j] * dout[qb + i * dh + c];
        }
      }
    }
  }
}

// ||got - want|| / max(||want||, 1).
double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  }
  // Absolute below a norm of 1, as tests/test_attention.cpp's err: the
  // gradients of two keys or queries are near 0 (ds cancels), where a
  // relative error measures only rounding.
  return std::sqrt(num / std::max(den, 1.0));
}

struct Options {
  std::vector<int> dhs = {32, 64, 128};
  std::vector<int64_t> seqs = {1024, 4096};
  int64_t batch_heads = 32;
  int64_t tokens = 0, width = 2048;  // --tokens: B * H = tokens / T * width / dh instead of batch_heads
  bool bf16 = true, f32 = true, forward = true, backward = true, causal = false;
  int iters = 10, warmup = 3;
  std::vector<std::string> variants;  // --variants: numbers, "wgmma", "production"; empty: all
  bool self_test = false;
};

bool g_sm90 = false;  // the device runs sm_90a code (the wgmma candidates)

// A consumer of a register-split wgmma kernel whose stage wait gives up
// exits instead of failing the launch (cuda/wgmma.cuh, barrier_wait<false>):
// whether that happened since the last call (the flag is cleared).
bool wait_timed_out() {
  unsigned int flag = 0;
  CHECK_CUDA(cudaMemcpyFromSymbol(&flag, hg::gpu::sm90::wait_timed_out, sizeof flag));
  if (flag != 0) {
    const unsigned int zero = 0;
    CHECK_CUDA(cudaMemcpyToSymbol(hg::gpu::sm90::wait_timed_out, &zero, sizeof zero));
  }
  return flag != 0;
}

// The error of configuration c on a small problem (two heads, Tq = Tk = 300
// unless given: edges of every tile size) against float64; max over o or dq, dk, dv. A wgmma
// forward also has its lse checked (absolute error 1e-3) and the production
// backward run from its o and stats (gradient bound): INFINITY when either
// fails. A wgmma candidate's two heads are addressed as a batch of 2 with
// one head each (the TMA maps' batch coordinate). A wgmma backward also
// reports the mma.sync backward's error on the same inputs (`shared`).
struct Checked {
  double err = 0, shared = 0;
};
// Within bound, or (a wgmma backward) within 10% of the mma.sync backward's
// error on the same inputs: a few keys' gradients cancel in ds, and delta
// is read from the bf16 o, in any kernel.
bool passes(const Checked& c, double bound) { return c.err <= std::max(bound, 1.1 * c.shared); }

Checked check(const Config& c, int dh, bool causal, int64_t tq = 300, int64_t tk = 0) {
  if (tk == 0) tk = tq;
  const int64_t heads = 2;
  const size_t nq = size_t(heads * tq * dh), nk = size_t(heads * tk * dh), elt = c.bf16 ? 2 : 4;
  Buffers b = alloc(std::max(nq, nk), heads * std::max(tq, tk), elt);
  std::mt19937_64 gen(77 + dh + 1000 * c.variant);
  const double scale = 1.0 / std::sqrt(double(dh));
  const std::vector<double> q = upload(b.q, nq, c.bf16, gen), k = upload(b.k, nk, c.bf16, gen),
                            v = upload(b.v, nk, c.bf16, gen), dout = upload(b.dout, nq, c.bf16, gen);
  Args a = args_of(b, heads, tq, tk, dh, causal, scale);
  if (is_wgmma(c.bf16, c.backward, c.variant)) a.heads = 1, a.q_batch = a.o_batch = tq * dh, a.kv_batch = tk * dh;
  const bool wgmma = is_wgmma(c.bf16, c.backward, c.variant) && !c.backward;
  // The backward reads the forward's o and stats: the production forward's.
  const Config fwd{c.bf16, false, c.bf16 ? kBf16ForwardProduction[dh == 32 ? 0 : dh == 64 ? 1 : 2] : 0};
  // NaN poison: an unwritten element fails the check.
  if (!c.backward) CHECK_CUDA(cudaMemset(b.o, 0xff, nq * elt));
  run(c.backward ? fwd : c, dh, a, heads);
  if (c.backward) {
    CHECK_CUDA(cudaMemset(b.dq, 0xff, nq * elt));
    CHECK_CUDA(cudaMemset(b.dk, 0xff, nk * elt));
    CHECK_CUDA(cudaMemset(b.dv, 0xff, nk * elt));
    run(c, dh, a, heads);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  if (wait_timed_out()) {
    std::printf("    variant %2d at Tq %3lld Tk %3lld: a stage wait gave up after 2 s\n", c.variant, (long long)tq,
                (long long)tk);
    release(b);
    return Checked{INFINITY, 0};
  }
  std::vector<double> o, lse, dq, dk, dv;
  reference(heads, tq, tk, dh, causal, scale, q, k, v, dout, o, lse, dq, dk, dv);
  auto grad_err = [&] {
    return std::max({rel_err(download(b.dq, nq, c.bf16), dq), rel_err(download(b.dk, nk, c.bf16), dk),
                     rel_err(download(b.dv, nk, c.bf16), dv)});
  };
  double e = c.backward ? grad_err() : rel_err(download(b.o, nq, c.bf16), o), shared = 0;
  if (c.backward && is_wgmma(c.bf16, true, c.variant)) {
    // Beside the mma.sync backward's error on the same inputs: bf16 gradients
    // of a few keys or queries lose relative accuracy in any kernel
    // (cancellation in ds).
    const auto each = [&] {
      return std::array<double, 3>{rel_err(download(b.dq, nq, true), dq), rel_err(download(b.dk, nk, true), dk),
                                   rel_err(download(b.dv, nk, true), dv)};
    };
    const std::array<double, 3> mine = each();
    run(Config{true, true, kBf16BackwardProduction}, dh, a, heads);
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::array<double, 3> prod = each();
    shared = std::max({prod[0], prod[1], prod[2]});
    std::printf("    variant %2d check at Tq %3lld Tk %3lld: dq, dk, dv rel err %.2e %.2e %.2e; the mma.sync "
                "backward on the same inputs %.2e %.2e %.2e\n",
                c.variant, (long long)tq, (long long)tk, mine[0], mine[1], mine[2], prod[0], prod[1], prod[2]);
  }
  if (wgmma) {
    std::vector<float> got(lse.size());
    CHECK_CUDA(cudaMemcpy(got.data(), b.lse, got.size() * 4, cudaMemcpyDeviceToHost));
    double lse_err = 0;
    for (size_t i = 0; i < got.size(); ++i)
      lse_err = std::max(lse_err, std::isinf(lse[i])      ? (got[i] == lse[i] ? 0.0 : INFINITY)
                                  : std::isfinite(got[i]) ? std::abs(got[i] - lse[i])
                                                          : INFINITY);
    double bwd_err = 0;  // (one key: the gradients are 0, no relative error)
    if (std::min(tq, tk) > 1) {
      CHECK_CUDA(cudaMemset(b.dq, 0xff, nq * elt));
      run(Config{true, true, kBf16BackwardProduction}, dh, a, heads);
      CHECK_CUDA(cudaDeviceSynchronize());
      bwd_err = grad_err();
    }
    const bool ok = lse_err <= 1e-3 && bwd_err <= 2e-2;
    std::printf("    variant %2d check at Tq %3lld Tk %3lld: o rel err %.2e, lse max abs err %.2e (bound 1e-03), "
                "production backward from its o and stats: rel err %.2e (bound 2e-02) %s\n",
                c.variant, (long long)tq, (long long)tk, e, lse_err, bwd_err, ok ? "ok" : "FAILED");
    if (!ok) e = INFINITY;
  }
  release(b);
  return Checked{e, shared};
}

// The wgmma building blocks on one tile (attention_lab_wgmma.cuh's
// self_test_kernel) against float64: prints one line per stage.
template <int DH, int KB>
bool self_test_one() {
  namespace w = hg::gpu::lab_wgmma;
  std::mt19937_64 gen(11 + DH + KB);
  void *q, *k, *v, *p;
  float *tile, *s, *o, *o2;
  for (void** x : {&q, &k, &v}) CHECK_CUDA(cudaMalloc(x, size_t(std::max(KB, 64)) * DH * 2));
  CHECK_CUDA(cudaMalloc(&p, size_t(64) * KB * 2));
  CHECK_CUDA(cudaMalloc(&tile, size_t(64) * DH * 4));
  CHECK_CUDA(cudaMalloc(&s, size_t(64) * KB * 4));
  CHECK_CUDA(cudaMalloc(&o, size_t(64) * DH * 4));
  CHECK_CUDA(cudaMalloc(&o2, size_t(64) * DH * 4));
  const std::vector<double> hq = upload(q, size_t(64) * DH, true, gen), hk = upload(k, size_t(KB) * DH, true, gen),
                            hv = upload(v, size_t(KB) * DH, true, gen), hp = upload(p, size_t(64) * KB, true, gen);
  CUtensorMap qmap, kmap, vmap;
  if (!w::make_map(&qmap, q, DH, 64, 1, 1, DH, 64 * DH, 64 * DH, 64) ||
      !w::make_map(&kmap, k, DH, KB, 1, 1, DH, KB * DH, KB * DH, KB) ||
      !w::make_map(&vmap, v, DH, KB, 1, 1, DH, KB * DH, KB * DH, KB)) {
    std::printf("  self-test dh %d keys %d: FAILED to encode the TMA maps (cuTensorMapEncodeTiled)\n", DH, KB);
    return false;
  }
  const size_t smem = size_t(64 + 2 * KB) * DH * 2 + 8 + 1024;
  const auto kernel = w::self_test_kernel<DH, KB>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CHECK_CUDA(cudaMemset(tile, 0xff, size_t(64) * DH * 4));
  CHECK_CUDA(cudaMemset(s, 0xff, size_t(64) * KB * 4));
  CHECK_CUDA(cudaMemset(o, 0xff, size_t(64) * DH * 4));
  CHECK_CUDA(cudaMemset(o2, 0xff, size_t(64) * DH * 4));
  kernel<<<1, 128, smem>>>(qmap, kmap, vmap, static_cast<const bf16*>(p), tile, s, o, o2);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> want_s(size_t(64) * KB, 0.0), want_o(size_t(64) * DH, 0.0);
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < KB; ++j)
      for (int d = 0; d < DH; ++d) want_s[i * KB + j] += hq[i * DH + d] * hk[j * DH + d];
    for (int d = 0; d < DH; ++d)
      for (int j = 0; j < KB; ++j) want_o[i * DH + d] += hp[i * KB + j] * hv[j * DH + d];
  }
  auto floats = [](const float* src, size_t count) {
    std::vector<float> h(count);
    CHECK_CUDA(cudaMemcpy(h.data(), src, count * 4, cudaMemcpyDeviceToHost));
    return std::vector<double>(h.begin(), h.end());
  };
  const double e_tile = rel_err(floats(tile, size_t(64) * DH), hq), e_s = rel_err(floats(s, size_t(64) * KB), want_s),
               e_o = rel_err(floats(o, size_t(64) * DH), want_o), e_o2 = rel_err(floats(o2, size_t(64) * DH), want_o);
  auto verdict = [](double e, double bound) { return e <= bound ? "ok" : "FAILED"; };
  std::printf("  self-test dh %3d keys %3d: TMA box + 128B swizzle read-back rel err %.1e %s; s = q k^T (wgmma ss, "
              "K-major) %.1e %s; o = p v (wgmma rs, MN-major v, n = dh) %.1e %s; the same in n64 halves %.1e %s\n",
              DH, KB, e_tile, verdict(e_tile, 0), e_s, verdict(e_s, 1e-5), e_o, verdict(e_o, 1e-5), e_o2,
              verdict(e_o2, 1e-5));
  const bool ok = e_tile == 0 && e_s <= 1e-5 && e_o <= 1e-5 && e_o2 <= 1e-5;
  for (void* x : {q, k, v, p}) CHECK_CUDA(cudaFree(x));
  for (float* x : {tile, s, o, o2}) CHECK_CUDA(cudaFree(x));
  return ok;
}

// Every tile shape the wgmma variants use.
bool self_test(int dh) {
  std::printf("wgmma self-test (one warpgroup, one tile; errors vs float64, bound 1e-05; the read-back exact):\n");
  bool ok = true;
  if (dh == 0 || dh == 64) ok &= self_test_one<64, 128>() & self_test_one<64, 64>() & self_test_one<64, 32>();
  if (dh == 0 || dh == 128) ok &= self_test_one<128, 128>() & self_test_one<128, 64>() & self_test_one<128, 32>();
  return ok;
}

// Whether variant v of a case is selected by --variants.
bool selected(const Options& o, bool bf16_inputs, bool backward, int v, int production) {
  if (is_wgmma(bf16_inputs, backward, v) && !g_sm90) return false;
  if (o.variants.empty()) return true;
  for (const std::string& item : o.variants) {
    if (item == "wgmma"        ? is_wgmma(bf16_inputs, backward, v)
        : item == "production" ? v == production
                               : item == std::to_string(v))
      return true;
  }
  return false;
}

bool run_case(const Options& o, bool bf16_inputs, bool backward, int dh, int l2) {
  const int count = !bf16_inputs ? (backward ? kF32BackwardVariants : 1)
                    : backward   ? (dh >= 64 ? kWgmmaBackwardFirst + kWgmmaBackwardVariants : kBf16BackwardVariants)
                                 : kBf16ForwardVariants + (dh >= 64 ? kWgmmaForwardVariants : 0);
  // On sm_90 the library runs the wgmma kernels at dh 128, the wgmma
  // forward at dh 64 from T 256 and the wgmma backward there from T 1024
  // (cuda/attention_dispatch.hpp; marked here as at T 256 and more, and as
  // below T 1024). The wgmma backward stores ds (20) at dh 128, and at dh 64
  // from T 1024 (marked at dh 128 only; the lab runs every head in one
  // launch, the library in chunks of 512 key tiles on two streams).
  const bool wgmma = bf16_inputs && g_sm90 && (dh == 128 || (dh == 64 && !backward));
  const int production = !bf16_inputs ? (backward ? kF32BackwardProduction : 0)
                         : wgmma      ? (backward ? kWgmmaBackwardFirst + 6 : kWgmmaForwardFirst)
                         : backward   ? kBf16BackwardProduction
                                      : kBf16ForwardProduction[dh == 32 ? 0 : 1];
  std::vector<int> ids;
  for (int v = 0; v < count; ++v) {
    if (!selected(o, bf16_inputs, backward, v, production)) continue;
    if (!retired(bf16_inputs, backward, v)) ids.push_back(v);
    else if (!o.variants.empty())
      std::printf("bf16 backward variant %d is retired (bench/lab/attention.md); skipped\n", v);
  }
  if (ids.empty()) return true;
  const double bound = bf16_inputs ? (backward ? 2e-2 : 8e-3) : (backward ? 2e-5 : 2e-6);
  std::printf("%s %s dh %d%s (error vs float64 at 2 heads x T 300; bound %.0e)\n", bf16_inputs ? "bf16" : "f32",
              backward ? "backward" : "forward", dh, o.causal ? " causal" : "", bound);
  static bool tested[2] = {false, false};
  bool ok = true;
  std::vector<double> errors(count);
  std::vector<char> pass(count, 1), shared(count, 0);  // shared: passed only as the mma.sync backward does
  for (const int v : ids) {
    if (is_wgmma(bf16_inputs, backward, v) && !tested[dh == 128]) {
      tested[dh == 128] = true;
      ok &= self_test(dh);
    }
    const auto judge = [&](const Checked& r) {
      errors[v] = std::max(errors[v], r.err);
      pass[v] &= passes(r, bound);
      shared[v] |= r.err > bound;
    };
    judge(check(Config{bf16_inputs, backward, v}, dh, o.causal));
    // The wgmma candidates also at one row (two for the backward: the
    // gradients of one key are 0, no relative error), one tile, a few tiles
    // plus one (the tile loops' first, peeled and last passes), and Tq != Tk
    // (causal: the diagonal moved; at Tq > Tk the first queries see no key).
    if (is_wgmma(bf16_inputs, backward, v))
      for (const auto& [tq, tk] : std::vector<std::pair<int64_t, int64_t>>{
               {backward ? 2 : 1, 0}, {64, 0}, {77, 0}, {129, 0}, {193, 0}, {77, 200}, {200, 77}})
        judge(check(Config{bf16_inputs, backward, v}, dh, o.causal, tq, tk));
    ok &= bool(pass[v]);
  }
  for (const int64_t t : o.seqs) {
    const int64_t heads =
        o.tokens > 0 ? std::max<int64_t>(1, o.tokens / t) * std::max(1, int(o.width / dh)) : o.batch_heads;
    const size_t n = size_t(heads * t * dh), elt = bf16_inputs ? 2 : 4;
    const int sets = int(std::clamp<int64_t>(2 * int64_t(l2) / int64_t(8 * n * elt) + 1, 1, 8));
    std::vector<Buffers> bufs;
    std::vector<Args> args;
    std::mt19937_64 gen(5 + t);
    for (int s = 0; s < sets; ++s) {
      bufs.push_back(alloc(n, heads * t, elt));
      for (void* p : {bufs[s].q, bufs[s].k, bufs[s].v, bufs[s].dout}) upload(p, n, bf16_inputs, gen);
      args.push_back(args_of(bufs[s], heads, t, t, dh, o.causal, 1.0 / std::sqrt(double(dh))));
      const Config fwd{bf16_inputs, false, bf16_inputs ? kBf16ForwardProduction[dh == 32 ? 0 : dh == 64 ? 1 : 2] : 0};
      run(fwd, dh, args[s], heads);  // o and stats for the backward
    }
    const double flops = (backward ? 10.0 : 4.0) * double(heads) * double(t) * double(t) * dh * (o.causal ? 0.5 : 1.0);
    std::printf("  B*H %lld, T %lld:\n", (long long)heads, (long long)t);
    int best = -1;
    double best_ms = 0;
    for (const int v : ids) {
      const Config c{bf16_inputs, backward, v};
      const double ms = lab::median_ms(o.warmup, o.iters, sets, [&](int s) { run(c, dh, args[s], heads); });
      if (wait_timed_out()) errors[v] = INFINITY, pass[v] = 0, ok = false;  // a timed run whose stage wait gave up
      if (pass[v] && (best < 0 || ms < best_ms)) best = v, best_ms = ms;
      std::printf("    %c variant %2d %9.3f ms %7.1f TFLOP/s  rel err %.2e %s%s\n", v == production ? '*' : ' ', v, ms,
                  flops / ms / 1e9, errors[v],
                  !pass[v]    ? "FAILED"
                  : shared[v] ? "ok (the mma.sync backward's error on those inputs)"
                              : "ok",
                  is_wgmma(bf16_inputs, backward, v) ? "  (wgmma)" : "");
    }
    if (best >= 0) std::printf("    winner: variant %d%s\n", best, best == production ? " (production)" : "");
    for (Buffers& bb : bufs) release(bb);
  }
  return ok;
}

Options parse(int argc, char** argv) {
  Options o;
  lab::Flags f("attention_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      std::printf(
          "attention_lab: fused attention kernel candidates, checked against float64 and timed.\n"
          "  --dtypes bf16,f32      (default both)\n"
          "  --directions fwd,bwd   (default both)\n"
          "  --dh 32,64,128         head dims (default all three)\n"
          "  --seq 1024,4096        sequence lengths timed (Tq = Tk; default 1024,4096)\n"
          "  --batch-heads N        B * H timed (default 32)\n"
          "  --tokens N             B * H timed = N / T * width / dh instead (bench_attention's shapes: 16384)\n"
          "  --width N              H * dh with --tokens (default 2048)\n"
          "  --causal               causal attention\n"
          "  --variants LIST        only these variants: numbers, 'wgmma' (the sm_90a candidates: forward 9-16,\n"
          "                         backward 14-20; 11-13 are retired), 'production' (default: all)\n"
          "  --self-test            only the wgmma one-tile tests (TMA + swizzle, q k^T, p v), then exit\n"
          "  --ring N               dq ring slots of the BF16 one-kernel backward (variants 6, 7; default: twice\n"
          "                         the heads the resident blocks span)\n"
          "  --iters N, --warmup N  timed and untimed samples (default 10, 3)\n"
          "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
      std::exit(0);
    } else if (f.is("--dtypes") || f.is("--directions")) {
      const bool dtypes = f.is("--dtypes");
      const char* a = dtypes ? "bf16" : "fwd";
      const char* b2 = dtypes ? "f32" : "bwd";
      bool first = false, second = false;
      for (const std::string& item : lab::split(f.value())) {
        if (item == a) first = true;
        else if (item == b2) second = true;
        else f.fail(f.flag() + ": unknown value '" + item + "' (allowed: " + a + ", " + b2 + ")");
      }
      (dtypes ? o.bf16 : o.forward) = first;
      (dtypes ? o.f32 : o.backward) = second;
    } else if (f.is("--dh")) {
      o.dhs.clear();
      for (const int64_t d : f.numbers(32, 128)) {
        if (d != 32 && d != 64 && d != 128) f.fail("--dh: " + std::to_string(d) + " (allowed: 32, 64, 128)");
        o.dhs.push_back(int(d));
      }
    } else if (f.is("--seq")) {
      o.seqs = f.numbers(1, 1 << 17);
    } else if (f.is("--batch-heads")) {
      o.batch_heads = f.number(1, 65535);
    } else if (f.is("--tokens")) {
      o.tokens = f.number(1, int64_t(1) << 30);
    } else if (f.is("--width")) {
      o.width = f.number(32, 1 << 20);
    } else if (f.is("--variants")) {
      for (const std::string& item : lab::split(f.value())) {
        if (item != "wgmma" && item != "production") f.parse(item, "--variants", 0, 63);
        o.variants.push_back(item);
      }
    } else if (f.is("--self-test")) {
      o.self_test = true;
    } else if (f.is("--ring")) {
      g_ring = int(f.number(1, 1 << 20));
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
  return o;
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
  std::printf("attention_lab on %s (sm_%d%d, L2 %d MiB); * = production\n", prop.name, prop.major, prop.minor,
              l2 >> 20);
  g_sm90 = prop.major == 9 && prop.minor == 0;
  if (!g_sm90) std::printf("(not sm_90: the wgmma forward candidates are skipped)\n");
  if (o.self_test) {
    const bool ok = g_sm90 && self_test(0);
    std::printf(ok ? "self-test passed\n" : "SELF-TEST FAILED\n");
    return ok ? 0 : 1;
  }
  bool ok = true;
  for (const bool bf16_inputs : {true, false}) {
    if (bf16_inputs ? !o.bf16 : !o.f32) continue;
    for (const bool backward : {false, true}) {
      if (backward ? !o.backward : !o.forward) continue;
      for (const int dh : o.dhs) ok &= run_case(o, bf16_inputs, backward, dh, l2);
    }
  }
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a configuration exceeded its error bound\n");
  return ok ? 0 : 1;
}
