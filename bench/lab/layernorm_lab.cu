// The LayerNorm kernel lab: every candidate kernel for resident rows
// (16-byte aligned, D <= 16384) as a named configuration, the production
// ones (the very kernels of cuda/layernorm_*.cuh) and the lab-only ones,
// each checked against a float64 CPU reference on fresh random inputs and
// timed; it prints GB/s, % of the best device copy of the same bytes, and
// the winner per (dtype, pass, width class) on the GPU it runs on. Links
// only the CUDA runtime. How a winner reaches production:
// bench/lab/layernorm.md.
//
//   layernorm_lab                          every configuration, default sizes
//   layernorm_lab --dtypes bf16 --passes fwd --sizes 16384x768,4096x4096
//   layernorm_lab --configs staged --stage-kb 96
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_util.cuh"
#include "cuda/layernorm_backward.cuh"
#include "cuda/layernorm_forward.cuh"
#include "cuda/layernorm_partial_columns.cuh"
#include "cuda/layernorm_staged_backward.cuh"
#include "cuda/layernorm_staged_forward.cuh"
#include "cuda/layernorm_staged_pair_forward.cuh"

namespace lab {
using namespace hg::gpu;

int attribute(cudaDeviceAttr what) {
  int device = 0, v = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&v, what, device));
  return v;
}

// ---- lab-only kernels ---------------------------------------------------------------

// Asks L2 for `bytes` bytes at p (16-byte aligned, a multiple of 16) with
// sm_90 bulk prefetches, one instruction per 4 KB piece, no registers held
// while the bytes travel.
template <int G, int kMaxBytes>
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, int bytes, int t) {
  constexpr int kPiece = 4096;
  static_assert(kMaxBytes <= G * kPiece, "one piece per thread");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int off = t * kPiece;
  if (off < bytes)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + off),
                 "r"(min(kPiece, bytes - off))
                 : "memory");
#endif
}

// The one-pass forward (layernorm_forward_one_pass_kernel) with the group's
// next row asked of L2 by bulk prefetches, at every block size.
template <class T, int VEC, int EPT, int G, int R, bool PACKED>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    forward_one_pass_prefetch_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                                     float* __restrict__ rstd_out, int64_t rows, int D, float eps) {
  constexpr int NV = EPT / VEC;
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  using Param = ParamRow<VEC, NV, G, false, Load::ReadOnly>;
  const Param gamma_of{gamma, nullptr, grp.t}, beta_of{beta, nullptr, grp.t};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + grp.group; row < rows; row += row_stride) {
    const T* xr = x + row * D;
    HeldRow<T, VEC, NV, G, PACKED> h;
    h.load(xr, D, grp.t);
    if (row + row_stride < rows)
      bulk_prefetch_l2<G, (G * EPT * int(sizeof(T)))>(xr + row_stride * D, D * int(sizeof(T)), grp.t);
    const Moments m = one_pass_moments<VEC, NV, G>(h, D, grp.t, GroupSums<G>{grp}, inv_d, eps);
    normalise_ffma<T, VEC, NV, G>(h, D, m, gamma_of, beta_of, y + row * D, grp.t);
    if (grp.t == 0) save_stats(mean_out, rstd_out, row, h.shift, m);
  }
}

// Kernel 2 with 16-byte loads over many blocks: block s sums column slot s
// (D / 8 blocks: 96 at 768 columns, where layernorm_reduce_partials_kernel
// runs 24), every partial row of a lane in flight at once. PDL: launched as
// a programmatic dependent of kernel 1, it waits for kernel 1 to finish (and
// its partial rows to be visible) before its first read.
template <int LANES>
__global__ void __launch_bounds__(kWideQuads* LANES)
    reduce_partials_wide_kernel(const float* __restrict__ partial_dgamma, const float* __restrict__ partial_dbeta,
                                int n_partials, int D, float* __restrict__ dgamma, float* __restrict__ dbeta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // no-op unless launched as a dependent
#endif
  sum_partial_columns<LANES, 8>(partial_dgamma, partial_dbeta, n_partials, D, blockIdx.x, dgamma, dbeta, false);
}
constexpr int kWideLanes = 128;

// Kernel 2 inside kernel 1 (the "fused reduce" candidates): dgamma, dbeta
// and two arrival counters, zero before the launch and zero again after it.
struct FusedSums {
  float* dgamma;
  float* dbeta;
  unsigned int* arrivals;
};
__device__ unsigned int g_fused_arrivals[2];

// After every block of the grid has written its partial row: each block
// counts itself in, and the last `reducers` blocks to arrive (one per column
// slot, at most half the grid) wait until all have, then sum column slots
// r, r + reducers, ... as the wide kernel 2 does; no second launch. The wait
// needs the grid resident at once (a persistent grid, as every backward
// here launches: the blocks still to arrive are running). The last reducer
// to finish zeroes the counters for the next launch. Two rows a lane in
// flight: unrolled 8 like kernel 2, the epilogue took a 56-register kernel
// to 104 (ptxas, sm_90); unrolled 2, to 69.
template <int THREADS>
__device__ __forceinline__ void reduce_in_last_blocks(const float* partial_dgamma, const float* partial_dbeta, int D,
                                                      const FusedSums& f) {
  __shared__ unsigned int ticket;
  const int n = gridDim.x;
  const int slots = (D + 4 * kWideQuads - 1) / (4 * kWideQuads);
  const int reducers = min(slots, max(1, n / 2));
  __threadfence();  // this block's partial row is visible before it counts in
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(&f.arrivals[0], 1u);
  __syncthreads();
  const int r = static_cast<int>(ticket) - (n - reducers);
  if (r < 0) return;
  if (threadIdx.x == 0)
    while (*reinterpret_cast<volatile unsigned int*>(&f.arrivals[0]) < static_cast<unsigned int>(n)) __nanosleep(100);
  __syncthreads();
  __threadfence();
  for (int slot = r; slot < slots; slot += reducers)
    sum_partial_columns<THREADS / kWideQuads, 2>(partial_dgamma, partial_dbeta, n, D, slot, f.dgamma, f.dbeta, false);
  if (threadIdx.x == 0 && atomicAdd(&f.arrivals[1], 1u) == static_cast<unsigned int>(reducers - 1))
    f.arrivals[0] = 0, f.arrivals[1] = 0;
}

// The resident backward (layernorm_backward_kernel, no clusters) with
// LEAN loads (read-only path, bf16 widened by masks) and, BULK_PREFETCH, the
// next row's x and dy asked of L2 by bulk prefetches at every block size;
// FUSED: the partial rows summed at its end (reduce_in_last_blocks).
template <class T, int VEC, int EPT, int G, int R, bool LEAN, bool BULK_PREFETCH, bool FUSED = false>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    backward_lean_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                         const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                         float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta, int64_t rows, int D,
                         FusedSums fused) {
  constexpr int NV = EPT / VEC;
  constexpr int CAP = G * EPT;
  extern __shared__ float4 acc_storage[];
  __shared__ GroupScratch<G, R> scratch;
  const RowGroup<G> grp = row_group<G, R>(scratch);
  const int t = grp.t;
  const float inv_d = 1.0f / static_cast<float>(D);
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * R;
  float* acc_dgamma = reinterpret_cast<float*>(acc_storage) + grp.group * 2 * CAP;
  float* acc_dbeta = acc_dgamma + CAP;
  zero_group_partials<VEC, NV, G>(acc_dgamma, acc_dbeta, t);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * R; base < rows; base += row_stride) {
    const int64_t row = base + grp.group;
    const bool live = row < rows;
    const int row_len = live ? D : 0;
    const int64_t start = (live ? row : 0) * D;
    float xh[NV][VEC], g_dy[NV][VEC];
    load_part<T, VEC, NV, G, LEAN>(x + start, row_len, t, 0.0f, xh);
    load_part<T, VEC, NV, G, LEAN>(dy + start, row_len, t, 0.0f, g_dy);
    if (row + row_stride < rows) {
      if constexpr (BULK_PREFETCH) {
        bulk_prefetch_l2<G, (CAP * int(sizeof(T)))>(x + start + row_stride * D, D * int(sizeof(T)), t);
        bulk_prefetch_l2<G, (CAP * int(sizeof(T)))>(dy + start + row_stride * D, D * int(sizeof(T)), t);
      } else if (prefetch_next_row(G * R)) {
        prefetch_row_l2<T, G, EPT>(x + start + row_stride * D, D, t);
        prefetch_row_l2<T, G, EPT>(dy + start + row_stride * D, D, t);
      }
    }
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    float s[3] = {0.0f, 0.0f, 0.0f};
    row_terms_in_registers<VEC, NV, G>(xh, g_dy, gamma, row_len, t, m, rs, s);
    grp.sums(s);
    const DxTerms k = dx_terms(s, inv_d);
    dx_in_registers<T, VEC, NV, G>(dx + start, gamma, xh, g_dy, row_len, t, rs, k, acc_dgamma, acc_dbeta);
  }
  write_block_partials<R, CAP>(reinterpret_cast<const float*>(acc_storage), D,
                               partial_dgamma + static_cast<int64_t>(blockIdx.x) * D,
                               partial_dbeta + static_cast<int64_t>(blockIdx.x) * D);
  if constexpr (FUSED) reduce_in_last_blocks<G * R>(partial_dgamma, partial_dbeta, D, fused);
}

// The staged backward (layernorm_backward_staged_kernel, unchanged) on
// bigger blocks and deeper rings, for fewer partial rows: warp rows in two
// blocks of 8 groups a SM (production: four of 4), wider rows in one block
// of up to 1024 threads a SM (production: one or two of 512), each ring 3
// stages deep where the widest row of the layout fits (else 2), groups
// halved until two stages fit in `kBudget` bytes per block.
template <int EPT, int G, int ELT>
struct FewPartialsShape {
  static constexpr int kBlocksPerSm = G == 32 ? 2 : 1;
  static constexpr int kBudget = 200 * 1024 / kBlocksPerSm;
  static constexpr int kRowBytes = G * EPT * ELT;  // the widest row of the layout
  static constexpr int groups() {
    int r = (G == 32 ? 256 : 1024) / G;
    while (r > 1 && r * 2 * 2 * kRowBytes > kBudget) r /= 2;
    return r;
  }
  static constexpr int kGroups = groups();
  static constexpr int kDepth = kGroups * 3 * 2 * kRowBytes <= kBudget ? 3 : 2;
  static constexpr int kThreads = G * kGroups;
};

// ---- configurations -----------------------------------------------------------------

enum class Pass { Forward, Backward };

enum class Rows { InRegisters, Staged, StagedTwoAStep };
struct Config {
  const char* name;
  Pass pass;
  Rows rows = Rows::InRegisters;
  bool one_pass = false;       // forward: one-pass statistics, FFMA normalisation
  bool packed = false;         // forward, bf16: held packed (multi-warp groups: half the threads per row)
  bool narrow = false;         // bf16 read 8 bytes a slot
  bool shared_params = false;  // warp rows: gamma (beta) from a shared-memory copy
  bool fewest_stages = false;  // staged forward: 2 stages, whatever --stage-kb says
  bool bulk_prefetch = false;  // lab only: next row asked of L2 by bulk prefetches
  bool lean = false;           // backward, lab only: read-only loads, bf16 widened by masks
  bool wide = false;           // backward, lab only: 1024-thread blocks where 512 ran
  bool few_partials = false;   // backward, lab only: staged on FewPartialsShape's blocks
  bool wide_reduce = false;    // backward, lab only: kernel 2 is reduce_partials_wide_kernel
  bool pdl = false;            // backward, lab only: kernel 2 launched as a programmatic dependent
  bool fused_reduce = false;   // backward, lab only: lean, no kernel 2 (reduce_in_last_blocks)
  bool production = true;      // shipped in cuda/layernorm_table.hpp somewhere
};

Config fwd(const char* name) { return Config{name, Pass::Forward}; }
Config bwd(const char* name) { return Config{name, Pass::Backward}; }

std::vector<Config> all_configs() {
  std::vector<Config> c;
  c.push_back(fwd("in registers"));
  {
    Config k = fwd("one-pass");
    k.one_pass = true;
    c.push_back(k);
  }
  {
    Config k = fwd("one-pass, bf16 packed");
    k.one_pass = k.packed = true;
    c.push_back(k);
  }
  {
    Config k = fwd("one-pass, bf16 packed, params in smem");
    k.one_pass = k.packed = k.shared_params = true;
    c.push_back(k);
  }
  {
    Config k = fwd("staged");
    k.rows = Rows::Staged;
    c.push_back(k);
  }
  {
    Config k = fwd("staged, params in smem, 2 stages");
    k.rows = Rows::Staged;
    k.shared_params = k.fewest_stages = true;
    c.push_back(k);
  }
  {
    Config k = fwd("staged two a step");
    k.rows = Rows::StagedTwoAStep;
    c.push_back(k);
  }
  {
    Config k = fwd("one-pass, bulk prefetch");
    k.one_pass = k.bulk_prefetch = true;
    k.production = false;
    c.push_back(k);
  }
  {
    Config k = fwd("one-pass, bf16 packed, bulk prefetch");
    k.one_pass = k.packed = k.bulk_prefetch = true;
    k.production = false;
    c.push_back(k);
  }
  c.push_back(bwd("in registers"));
  {
    Config k = bwd("in registers, bf16 8-byte");
    k.narrow = true;
    c.push_back(k);
  }
  {
    Config k = bwd("staged");
    k.rows = Rows::Staged;
    c.push_back(k);
  }
  {
    Config k = bwd("staged, bf16 8-byte");
    k.rows = Rows::Staged;
    k.narrow = true;
    c.push_back(k);
  }
  {
    Config k = bwd("staged, gamma in smem");
    k.rows = Rows::Staged;
    k.shared_params = true;
    c.push_back(k);
  }
  {
    Config k = bwd("lean");
    k.lean = true;
    k.production = false;
    c.push_back(k);
  }
  {
    Config k = bwd("lean, bulk prefetch");
    k.lean = k.bulk_prefetch = true;
    k.production = false;
    c.push_back(k);
  }
  {
    Config k = bwd("lean, wide blocks");
    k.lean = k.wide = true;
    k.production = false;
    c.push_back(k);
  }
  {
    Config k = bwd("lean, bulk prefetch, wide blocks");
    k.lean = k.bulk_prefetch = k.wide = true;
    k.production = false;
    c.push_back(k);
  }
  for (const bool narrow : {false, true})
    for (const bool fused : {false, true}) {
      if (!narrow && !fused) continue;  // "lean" above
      Config k = bwd(!narrow ? "lean, fused reduce" : fused ? "lean, bf16 8-byte, fused reduce" : "lean, bf16 8-byte");
      k.lean = true;
      k.narrow = narrow;
      k.fused_reduce = fused;
      k.production = false;
      c.push_back(k);
    }
  // Lab only: where the backward's fixed costs go (bench/lab/layernorm.md,
  // "The backward's fixed costs on the H200"). Production's H200 kernel 1s
  // with the wide kernel 2:
  for (const bool staged : {true, false}) {
    Config k = bwd(staged ? "staged, gamma in smem, wide reduce" : "in registers, bf16 8-byte, wide reduce");
    k.rows = staged ? Rows::Staged : Rows::InRegisters;
    k.shared_params = staged;
    k.narrow = !staged;
    k.wide_reduce = true;
    k.production = false;
    c.push_back(k);
  }
  for (const bool narrow : {false, true})
    for (const int variant : {0, 1, 2}) {  // kernel 2: production's, wide, wide as a dependent launch
      static const char* kNames[2][3] = {
          {"staged few partials", "staged few partials, wide reduce", "staged few partials, wide reduce, PDL"},
          {"staged few partials, bf16 8-byte", "staged few partials, bf16 8-byte, wide reduce",
           "staged few partials, bf16 8-byte, wide reduce, PDL"}};
      Config k = bwd(kNames[narrow][variant]);
      k.rows = Rows::Staged;
      k.few_partials = true;
      k.narrow = narrow;
      k.wide_reduce = variant >= 1;
      k.pdl = variant == 2;
      k.production = false;
      c.push_back(k);
    }
  return c;
}

// ---- launches -----------------------------------------------------------------------

struct Buffers {  // one rotating set; device pointers
  void *x, *dy, *y, *dx;
  float *gamma, *beta, *mean, *rstd, *partials, *dgamma, *dbeta;
};

struct Case {
  int64_t rows;
  int D;
  float eps;
  int sms;
  int max_partials;  // rows of the partial buffer
};

int persistent_grid(int64_t rows, int rows_per_block, int per_sm, int sms) {
  return static_cast<int>(std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, int64_t(per_sm) * sms));
}

template <class Kernel>
int occupancy(Kernel k, int threads, size_t smem) {
  if (smem > 48 * 1024) CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int n = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem));
  return n;
}

template <class Kernel>
StagedRoom staged_room(Kernel k, int threads) {
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, k));
  StagedRoom room{};
  room.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  room.smem_per_block = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  room.reserved_per_block = attribute(cudaDevAttrReservedSharedMemoryPerBlock);
  room.static_smem = static_cast<int>(attr.sharedSizeBytes);
  CHECK_CUDA(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, room.smem_per_block - room.static_smem));
  room.blocks_per_sm = occupancy(k, threads, 0);
  return room;
}

// Launches config c's pass on one buffer set; false where c does not apply.
template <class T, int VEC>
struct Launch {
  const Config& c;
  const Case& k;
  const Buffers& b;
  int stage_kb;

  template <int EPT, int G, int R>
  bool resident() const {
    if (c.pass == Pass::Forward) return forward<EPT, G, R>();
    return backward<EPT, G, R>();
  }
  template <int EPT, int G, int R>
  bool forward() const {
    constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
    if (c.rows == Rows::Staged) {
      if constexpr (G == 32) {
        if (c.shared_params) return staged<EPT, G, R, true>();
      }
      return c.shared_params ? false : staged<EPT, G, R, false>();
    }
    if (c.rows == Rows::StagedTwoAStep) {
      auto kern = layernorm_forward_staged_pair_kernel<T, VEC, EPT, G, R>;
      return run_staged(kern, G, R,
                        plan_staged_pairs(staged_room(kern, G * R), R, k.D * int(sizeof(T)), stage_kb * 1024));
    }
    if (!c.one_pass) return plain(layernorm_forward_kernel<T, VEC, EPT, G, R>, G, R);
    if constexpr (kBf16) {
      if (c.packed) {
        if constexpr (G >= 64) return one_pass<2 * EPT, G / 2, 2 * R, true>();
        else return one_pass<EPT, G, R, true>();
      }
    }
    if (c.packed) return false;  // f32: the same kernel as unpacked
    return one_pass<EPT, G, R, false>();
  }
  template <int EPT, int G, int R, bool PACKED>
  bool one_pass() const {
    if (c.bulk_prefetch) {
      if (c.shared_params) return false;
      return plain(forward_one_pass_prefetch_kernel<T, VEC, EPT, G, R, PACKED>, G, R);
    }
    if constexpr (G == 32) {
      if (c.shared_params) return plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, true>, G, R);
    }
    if (c.shared_params) return false;
    return plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, false>, G, R);
  }
  template <int EPT, int G, int R, bool SHARED>
  bool staged() const {
    auto kern = layernorm_forward_staged_kernel<T, VEC, EPT, G, R, SHARED>;
    const int target = c.fewest_stages ? 0 : stage_kb * 1024;
    return run_staged(kern, G, R, plan_staged(staged_room(kern, G * R), R, k.D * int(sizeof(T)), target));
  }
  template <class Kernel>
  bool plain(Kernel kern, int G, int R) const {
    static std::map<void*, int> per_sm;
    int& n = per_sm[reinterpret_cast<void*>(kern)];
    if (n == 0) n = occupancy(kern, G * R, 0);
    kern<<<persistent_grid(k.rows, R, n, k.sms), G * R>>>(static_cast<const T*>(b.x), b.gamma, b.beta,
                                                          static_cast<T*>(b.y), b.mean, b.rstd, k.rows, k.D, k.eps);
    return true;
  }
  template <class Kernel>
  bool run_staged(Kernel kern, int G, int R, const StagedPlan& plan) const {
    if (plan.stages < 2) return false;
    kern<<<persistent_grid(k.rows, R, plan.blocks_per_sm, k.sms), G * R, plan.smem>>>(
        static_cast<const T*>(b.x), b.gamma, b.beta, static_cast<T*>(b.y), b.mean, b.rstd, k.rows, k.D, k.eps,
        plan.stages);
    return true;
  }

  static int capped(int per_sm, int threads) { return std::min(per_sm, std::max(2, 1024 / threads)); }
  template <int EPT, int G, int R>
  bool backward() const {
    if (c.few_partials) return few_partials<EPT, G>();
    if (c.rows == Rows::Staged) {
      using S = StagedShape<EPT, G, R>;
      constexpr bool kWarp = G == 32;
      if (c.shared_params && !kWarp) return false;
      auto kern = c.shared_params
                      ? layernorm_backward_staged_kernel<T, VEC, EPT, G, S::kGroups, S::kDepth, S::kMinBlocks, kWarp>
                      : layernorm_backward_staged_kernel<T, VEC, EPT, G, S::kGroups, S::kDepth, S::kMinBlocks, false>;
      return staged_backward(kern, S::kGroups, S::kThreads, S::kDepth, capped(1 << 20, S::kThreads));
    }
    if (c.wide) {
      if constexpr (G * R == 512 && G >= 128) return lean<EPT, G, 2 * R>();
      else return false;
    }
    if (c.lean) return lean<EPT, G, R>();
    auto kern = layernorm_backward_kernel<T, VEC, EPT, G, R, false>;
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    return with_partials(kern, persistent_grid(k.rows, R, capped(occupancy(kern, G * R, kSmem), G * R), k.sms), G * R,
                         kSmem);
  }
  template <int EPT, int G>
  bool few_partials() const {
    using S = FewPartialsShape<EPT, G, int(sizeof(T))>;
    constexpr bool kWarp = G == 32;
    auto kern = layernorm_backward_staged_kernel<T, VEC, EPT, G, S::kGroups, S::kDepth, S::kBlocksPerSm, kWarp>;
    return staged_backward(kern, S::kGroups, S::kThreads, S::kDepth, S::kBlocksPerSm);
  }
  // A staged backward kernel 1 of `groups` rings of `depth` stages, at most
  // `most_per_sm` blocks a SM; false where its stages do not fit a block.
  template <class Kernel>
  bool staged_backward(Kernel kern, int groups, int threads, int depth, int most_per_sm) const {
    const size_t smem = staged_smem_bytes(k.D, sizeof(T), groups, depth);
    cudaFuncAttributes attr{};
    CHECK_CUDA(cudaFuncGetAttributes(&attr, kern));
    if (smem + attr.sharedSizeBytes > size_t(attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin))) return false;
    const int n = occupancy(kern, threads, smem);
    if (n < 1) return false;
    return with_partials(kern, persistent_grid(k.rows, groups, std::min(n, most_per_sm), k.sms), threads, smem);
  }
  template <int EPT, int G, int R>
  bool lean() const {
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    auto kern = c.fused_reduce    ? backward_lean_kernel<T, VEC, EPT, G, R, true, false, true>
                : c.bulk_prefetch ? backward_lean_kernel<T, VEC, EPT, G, R, true, true>
                                  : backward_lean_kernel<T, VEC, EPT, G, R, true, false>;
    static unsigned int* arrivals = [] {
      void* p = nullptr;
      CHECK_CUDA(cudaGetSymbolAddress(&p, g_fused_arrivals));
      return static_cast<unsigned int*>(p);
    }();
    return with_partials(kern, persistent_grid(k.rows, R, capped(occupancy(kern, G * R, kSmem), G * R), k.sms), G * R,
                         kSmem, FusedSums{b.dgamma, b.dbeta, arrivals});
  }
  // Kernel 1 (`fused`: the lean kernels' trailing argument), then kernel 2
  // unless kernel 1 sums its partial rows itself.
  template <class Kernel, class... Fused>
  bool with_partials(Kernel kern, int blocks, int threads, size_t smem, Fused... fused) const {
    // No block fits a SM (occupancy 0: the fused reduce's registers at 1024
    // threads, say): the configuration does not apply to this width.
    if (blocks < 1 || blocks > k.max_partials) return false;
    float* pg = b.partials;
    float* pb = b.partials + int64_t(k.max_partials) * k.D;
    kern<<<blocks, threads, smem>>>(static_cast<const T*>(b.dy), static_cast<const T*>(b.x), b.gamma, b.mean, b.rstd,
                                    static_cast<T*>(b.dx), pg, pb, k.rows, k.D, fused...);
    if (c.fused_reduce) return true;
    if (c.wide_reduce) return wide_reduce(pg, pb, blocks);
    layernorm_reduce_partials_kernel<<<(k.D + kReduceCols - 1) / kReduceCols, dim3(kReduceCols, kReduceLanes)>>>(
        pg, pb, blocks, k.D, b.dgamma, b.dbeta, false);
    return true;
  }
  bool wide_reduce(const float* pg, const float* pb, int n_partials) const {
    constexpr int kCols = 4 * kWideQuads;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3((k.D + kCols - 1) / kCols);
    config.blockDim = dim3(kWideQuads * kWideLanes);
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    if (c.pdl) config.attrs = &dependent, config.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&config, reduce_partials_wide_kernel<kWideLanes>, pg, pb, n_partials, k.D,
                                             b.dgamma, b.dbeta);
    if (e != cudaSuccess && c.pdl) {  // a runtime that refuses the dependent launch: the configuration is skipped
      (void)cudaGetLastError();
      std::printf("  (%s: dependent launch refused: %s)\n", c.name, cudaGetErrorString(e));
      return false;
    }
    CHECK_CUDA(e);
    return true;
  }
};

// The resident layouts of cuda/layernorm.cu, per D.
template <class L>
bool for_layout(int D, const L& l, bool backward) {
  if (D <= 256) return l.template resident<8, 32, 8>();
  if (D <= 512) return l.template resident<16, 32, 8>();
  if (D <= 768) return l.template resident<24, 32, 8>();
  if (D <= 1024) return l.template resident<32, 32, 8>();
  if (D <= 2048) return l.template resident<16, 128, 4>();
  if (D <= 4096) return l.template resident<16, 256, 2>();
  if (D <= 8192) return l.template resident<16, 512, 1>();
  if (backward) return l.template resident<16, 1024, 1>();
  return l.template resident<32, 512, 1>();
}

bool launch(const Config& c, bool bf16, const Case& k, const Buffers& b, int stage_kb) {
  const bool backward = c.pass == Pass::Backward;
  if (!bf16) {
    if (c.narrow) return false;
    return for_layout(k.D, Launch<float, 4>{c, k, b, stage_kb}, backward);
  }
  if (c.narrow) return for_layout(k.D, Launch<__nv_bfloat16, 4>{c, k, b, stage_kb}, backward);
  return for_layout(k.D, Launch<__nv_bfloat16, 8>{c, k, b, stage_kb}, backward);
}

// ---- host data, reference, copy yardstick -------------------------------------------

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Host rows in the storage dtype, and their float values.
struct HostMatrix {
  std::vector<float> value;
  std::vector<unsigned char> bytes;
};
HostMatrix make_matrix(int64_t n, bool bf16, std::mt19937& rng, float offset) {
  std::normal_distribution<float> dist(offset, 1.0f);
  HostMatrix m;
  m.value.resize(n);
  m.bytes.resize(n * (bf16 ? 2 : 4));
  for (int64_t i = 0; i < n; ++i) {
    float v = dist(rng);
    if (bf16) {
      const uint16_t h = to_bf16(v);
      v = from_bf16(h);
      std::memcpy(&m.bytes[i * 2], &h, 2);
    } else {
      std::memcpy(&m.bytes[i * 4], &v, 4);
    }
    m.value[i] = v;
  }
  return m;
}
std::vector<double> read_back(const void* dev, int64_t n, bool bf16) {
  std::vector<unsigned char> raw(n * (bf16 ? 2 : 4));
  CHECK_CUDA(cudaMemcpy(raw.data(), dev, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (bf16) {
      uint16_t h;
      std::memcpy(&h, &raw[i * 2], 2);
      out[i] = from_bf16(h);
    } else {
      float f;
      std::memcpy(&f, &raw[i * 4], 4);
      out[i] = f;
    }
  }
  return out;
}

// A pass's outputs on one buffer set as raw bytes: y (forward) or dx,
// dgamma, dbeta (backward), for the run-to-run comparison.
std::vector<unsigned char> outputs(bool forward, const Buffers& b, size_t bytes, int D) {
  std::vector<unsigned char> out(bytes + (forward ? 0 : size_t(2) * D * 4));
  CHECK_CUDA(cudaMemcpy(out.data(), forward ? b.y : b.dx, bytes, cudaMemcpyDeviceToHost));
  if (!forward) {
    CHECK_CUDA(cudaMemcpy(out.data() + bytes, b.dgamma, size_t(D) * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(out.data() + bytes + size_t(D) * 4, b.dbeta, size_t(D) * 4, cudaMemcpyDeviceToHost));
  }
  return out;
}

// max |got - want| / max |want|.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return std::isfinite(num) ? num / std::max(den, 1e-30) : INFINITY;
}

// The float64 forward (y) and backward (dx, dgamma, dbeta) of LayerNorm.
struct Reference {
  std::vector<double> y, dx, dgamma, dbeta;
};
Reference reference(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>& gamma,
                    const std::vector<float>& beta, int64_t rows, int D, double eps) {
  Reference r;
  r.y.resize(x.size()), r.dx.resize(x.size()), r.dgamma.assign(D, 0.0), r.dbeta.assign(D, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = &x[i * D];
    const float* dyr = &dy[i * D];
    double mean = 0, var = 0;
    for (int j = 0; j < D; ++j) mean += xr[j];
    mean /= D;
    for (int j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1.0 / std::sqrt(var / D + eps);
    double mg = 0, mgx = 0;
    for (int j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mean) * rstd, g = dyr[j] * double(gamma[j]);
      r.y[i * D + j] = xhat * gamma[j] + beta[j];
      mg += g, mgx += g * xhat;
      r.dgamma[j] += dyr[j] * xhat, r.dbeta[j] += dyr[j];
    }
    mg /= D, mgx /= D;
    for (int j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.dx[i * D + j] = rstd * (dyr[j] * double(gamma[j]) - mg - xhat * mgx);
    }
  }
  return r;
}

// ---- command line -------------------------------------------------------------------

struct Options {
  std::vector<std::pair<int64_t, int>> sizes;
  bool f32 = true, bf16 = true, fwd = true, bwd = true;
  std::string configs;  // substring filter on names
  int iters = 30, warmup = 5, stage_kb = 64;
  bool lab_only = false;
  bool back_to_back = false;  // time the launches queued back to back (lab_util.cuh's back_to_back_ms)
};

// The time of one call of fn(set): the median of single launches, or the
// mean of launches queued back to back.
template <class Fn>
double timed_ms(const Options& o, int sets, Fn&& fn) {
  return o.back_to_back ? back_to_back_ms(o.warmup, o.iters, sets, fn) : median_ms(o.warmup, o.iters, sets, fn);
}

const char* kUsage =
    "usage: layernorm_lab [--sizes RxD,...] [--dtypes f32,bf16] [--passes fwd,bwd] [--configs SUBSTRING]\n"
    "                     [--lab-only] [--back-to-back] [--iters N] [--warmup N] [--stage-kb KB] [--help]\n"
    "  --sizes     rows x D cases, D in 1..16384 and D * elt a multiple of 16 (default: one case per\n"
    "              width class, 64 MiB of x in f32)\n"
    "  --dtypes    f32, bf16 or both (default both)\n"
    "  --passes    fwd, bwd or both (default both)\n"
    "  --configs   only configurations whose name contains SUBSTRING (e.g. staged, one-pass)\n"
    "  --lab-only  only the configurations production does not ship (and 'in registers' to compare)\n"
    "  --back-to-back  time the launches queued back to back, mean reported (the host's launch\n"
    "              latency paid once, not in every sample; the copy yardstick too)\n"
    "  --iters     timed launches per case, median reported (default 30)\n"
    "  --warmup    untimed launches first (default 5)\n"
    "  --stage-kb  bytes in flight per SM the staged forwards aim at, KB (default 64, production's)\n"
    "Each configuration is checked against a float64 CPU reference first, and after its timing run\n"
    "once more on the same inputs for bitwise the same outputs; an error over the bound (f32 1e-4,\n"
    "bf16 1e-2 of the largest output) or a different second result ends the program with status 1.\n";

[[noreturn]] void bad_flag(const std::string& what) {
  std::fprintf(stderr, "layernorm_lab: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

long parse_int(const std::string& flag, const std::string& text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi)
    bad_flag(flag + " must be a whole number in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" + text +
             "'");
  return v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--lab-only" || flag == "--back-to-back") {
      (flag == "--lab-only" ? o.lab_only : o.back_to_back) = true;
      continue;
    }
    const auto value = [&] {
      if (i + 1 >= argc) bad_flag(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--sizes") {
      for (const std::string& item : split(value())) {
        const size_t x = item.find('x');
        if (x == std::string::npos) bad_flag("--sizes items are ROWSxD, got '" + item + "'");
        o.sizes.push_back({parse_int("--sizes rows", item.substr(0, x), 1, 1L << 30),
                           static_cast<int>(parse_int("--sizes D", item.substr(x + 1), 1, 16384))});
      }
    } else if (flag == "--dtypes") {
      o.f32 = o.bf16 = false;
      for (const std::string& d : split(value())) {
        if (d == "f32") o.f32 = true;
        else if (d == "bf16") o.bf16 = true;
        else bad_flag("--dtypes takes f32 and bf16, got '" + d + "'");
      }
    } else if (flag == "--passes") {
      o.fwd = o.bwd = false;
      for (const std::string& p : split(value())) {
        if (p == "fwd") o.fwd = true;
        else if (p == "bwd") o.bwd = true;
        else bad_flag("--passes takes fwd and bwd, got '" + p + "'");
      }
    } else if (flag == "--configs") {
      o.configs = value();
    } else if (flag == "--iters") {
      o.iters = static_cast<int>(parse_int(flag, value(), 1, 100000));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value(), 0, 100000));
    } else if (flag == "--stage-kb") {
      o.stage_kb = static_cast<int>(parse_int(flag, value(), 0, 1024));
    } else {
      bad_flag("unknown flag '" + flag + "'");
    }
  }
  if (o.sizes.empty())
    for (const int D : {256, 512, 768, 1024, 2048, 3072, 4096, 8192, 16384}) o.sizes.push_back({(16 << 20) / D, D});
  return o;
}

int width_class(int D) {
  const int up_to[] = {256, 512, 1024, 2048, 3072, 4096, 8192};
  int c = 0;
  while (c < 7 && D > up_to[c]) ++c;
  return c;
}
const char* kClassNames[] = {"<=256", "<=512", "<=1024", "<=2048", "<=3072", "<=4096", "<=8192", "<=16384"};

struct Winner {
  std::string name;
  double gbps = 0;
};

int run(const Options& o) {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double l2 = prop.l2CacheSize;
  std::printf("GPU: %s, %d SMs, L2 %.0f MB, sm_%d%d\n", prop.name, sms, l2 / 1e6, prop.major, prop.minor);
  if (prop.major < 9) std::printf("(below sm_90: staged configurations are skipped)\n");
  std::mt19937 rng(20261201);
  std::map<std::string, Winner> winners;  // "dtype pass class" -> best
  bool failed = false;
  for (const auto& [rows, D] : o.sizes)
    for (const bool bf16 : {false, true}) {
      if ((bf16 && !o.bf16) || (!bf16 && !o.f32)) continue;
      const int elt = bf16 ? 2 : 4;
      if ((int64_t(D) * elt) % 16 != 0) {
        std::printf("skip %lldx%d %s: rows are not 16-byte aligned\n", (long long)rows, D, bf16 ? "bf16" : "f32");
        continue;
      }
      const int64_t n = rows * D;
      const size_t mat = size_t(n) * elt;
      const int sets = static_cast<int>(std::max<double>(2, std::ceil(3 * l2 / mat)));
      const int max_partials = 32 * sms;  // the most blocks any backward here launches (1024 / 32 per SM)
      // Fresh inputs: x ~ N(1, 1) in set 0 (checked), copies in the others.
      const HostMatrix x = make_matrix(n, bf16, rng, 1.0f), dy = make_matrix(n, bf16, rng, 0.0f);
      std::vector<float> gamma(D), beta(D);
      std::normal_distribution<float> pd(1.0f, 0.5f);
      for (int j = 0; j < D; ++j) gamma[j] = pd(rng), beta[j] = pd(rng) - 1.0f;
      const Reference ref = reference(x.value, dy.value, gamma, beta, rows, D, 1e-5);
      std::vector<Buffers> bufs(sets);
      for (Buffers& b : bufs) {
        CHECK_CUDA(cudaMalloc(&b.x, mat));
        CHECK_CUDA(cudaMalloc(&b.dy, mat));
        CHECK_CUDA(cudaMalloc(&b.y, mat));
        CHECK_CUDA(cudaMalloc(&b.dx, mat));
        CHECK_CUDA(cudaMalloc(&b.mean, rows * 4));
        CHECK_CUDA(cudaMalloc(&b.rstd, rows * 4));
        CHECK_CUDA(cudaMemcpy(b.x, x.bytes.data(), mat, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(b.dy, dy.bytes.data(), mat, cudaMemcpyHostToDevice));
      }
      float *g, *bt, *dg, *db, *partials;
      CHECK_CUDA(
          cudaMalloc(&partials, size_t(2) * max_partials * D * 4));  // one for every set: kernel 2 reads them at once
      CHECK_CUDA(cudaMalloc(&g, D * 4));
      CHECK_CUDA(cudaMalloc(&bt, D * 4));
      CHECK_CUDA(cudaMalloc(&dg, D * 4));
      CHECK_CUDA(cudaMalloc(&db, D * 4));
      CHECK_CUDA(cudaMemcpy(g, gamma.data(), D * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(bt, beta.data(), D * 4, cudaMemcpyHostToDevice));
      for (Buffers& b : bufs) b.gamma = g, b.beta = bt, b.dgamma = dg, b.dbeta = db, b.partials = partials;
      const Case k{rows, D, 1e-5f, sms, max_partials};
      // The copy yardstick: the best of cudaMemcpyAsync and a float4 kernel on x's bytes.
      const double memcpy_ms = timed_ms(
          o, sets, [&](int s) { CHECK_CUDA(cudaMemcpyAsync(bufs[s].y, bufs[s].x, mat, cudaMemcpyDeviceToDevice)); });
      const double kernel_ms = timed_ms(o, sets, [&](int s) {
        copy_kernel<<<sms * 8, 512>>>(static_cast<const uint4*>(bufs[s].x), static_cast<uint4*>(bufs[s].y),
                                      int64_t(mat / 16));
      });
      const double copy_gbps = 2.0 * mat / (std::min(memcpy_ms, kernel_ms) * 1e6);
      // Statistics for the backward: the production two-pass forward's.
      const Config base = fwd("in registers");
      for (const Buffers& b : bufs) launch(base, bf16, k, b, o.stage_kb);
      std::printf("\n%s rows %lld x D %d (%d buffer sets), best copy %.0f GB/s\n", bf16 ? "bf16" : "f32",
                  (long long)rows, D, sets, copy_gbps);
      std::printf("  %-4s %-50s %9s %7s %10s\n", "pass", "configuration", "GB/s", "%copy", "max rel err");
      for (const Config& c : all_configs()) {
        const bool is_fwd = c.pass == Pass::Forward;
        if ((is_fwd && !o.fwd) || (!is_fwd && !o.bwd)) continue;
        if (!o.configs.empty() && std::string(c.name).find(o.configs) == std::string::npos) continue;
        if (o.lab_only && c.production && std::string(c.name) != "in registers") continue;
        if (c.rows != Rows::InRegisters && prop.major < 9) continue;
        if (c.bulk_prefetch && prop.major < 9) continue;
        // Check on set 0 (the backward on the statistics the forward above stored).
        if (!launch(c, bf16, k, bufs[0], o.stage_kb)) continue;
        // A launch the GPU refuses is reported with its configuration (the
        // error is not sticky), and the others still run.
        if (const cudaError_t refused = cudaGetLastError(); refused != cudaSuccess) {
          std::printf("  %-4s %-50s launch refused: %s\n", is_fwd ? "fwd" : "bwd", c.name, cudaGetErrorString(refused));
          failed = true;
          continue;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        double err;
        if (is_fwd) {
          err = rel_error(read_back(bufs[0].y, n, bf16), ref.y);
        } else {
          err =
              std::max({rel_error(read_back(bufs[0].dx, n, bf16), ref.dx),
                        rel_error(read_back(dg, D, false), ref.dgamma), rel_error(read_back(db, D, false), ref.dbeta)});
        }
        const std::vector<unsigned char> first = outputs(is_fwd, bufs[0], n * elt, D);
        if (is_fwd) launch(base, bf16, k, bufs[0], o.stage_kb);  // restore the statistics for the backward
        const double bound = bf16 ? 1e-2 : 1e-4;
        const double ms = timed_ms(o, sets, [&](int s) { launch(c, bf16, k, bufs[s], o.stage_kb); });
        // Run to run: the same inputs again give bitwise the same outputs (fixed order of every sum).
        launch(c, bf16, k, bufs[0], o.stage_kb);
        CHECK_CUDA(cudaDeviceSynchronize());
        const bool same = outputs(is_fwd, bufs[0], n * elt, D) == first;
        if (is_fwd) launch(base, bf16, k, bufs[0], o.stage_kb);
        const double gbps = (is_fwd ? 2.0 : 3.0) * mat / (ms * 1e6);
        std::printf("  %-4s %-50s %9.0f %6.1f%% %10.2e%s%s%s\n", is_fwd ? "fwd" : "bwd", c.name, gbps,
                    100.0 * gbps / copy_gbps, err, c.production ? "" : "  (lab)", err > bound ? "  OVER THE BOUND" : "",
                    same ? "" : "  NOT DETERMINISTIC");
        if (err > bound || !same) failed = true;
        const std::string key =
            std::string(bf16 ? "bf16" : "f32 ") + " " + (is_fwd ? "fwd" : "bwd") + " D " + kClassNames[width_class(D)];
        Winner& w = winners[key];
        if (err <= bound && same && gbps > w.gbps) w = {c.name, gbps};
      }
      for (Buffers& b : bufs)
        for (void* p : {b.x, b.dy, b.y, b.dx, static_cast<void*>(b.mean), static_cast<void*>(b.rstd)})
          CHECK_CUDA(cudaFree(p));
      for (float* p : {g, bt, dg, db, partials}) CHECK_CUDA(cudaFree(p));
    }
  std::printf("\nWinners on %s (a table entry is cuda/layernorm_table.hpp):\n", prop.name);
  for (const auto& [key, w] : winners) std::printf("  %-24s %-50s %9.0f GB/s\n", key.c_str(), w.name.c_str(), w.gbps);
  if (failed) {
    std::fprintf(stderr, "layernorm_lab: some configuration is over its error bound (marked above)\n");
    return 1;
  }
  return 0;
}

}  // namespace lab

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table line as it is measured, also into a file
  const lab::Options o = lab::parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "layernorm_lab: no CUDA device\n");
    return 2;
  }
  return lab::run(o);
}
