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
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench/lab/lab_util.cuh"
#include "cuda/layernorm_backward.cuh"
#include "cuda/layernorm_forward.cuh"
#include "cuda/layernorm_staged_backward.cuh"
#include "cuda/layernorm_staged_forward.cuh"
#include "cuda/layernorm_staged_pair_forward.cuh"
#include "cuda/layernorm_table.hpp"

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

// The resident backward (layernorm_backward_kernel, no clusters) with
// LEAN loads (read-only path, bf16 widened by masks) and, BULK_PREFETCH, the
// next row's x and dy asked of L2 by bulk prefetches at every block size.
template <class T, int VEC, int EPT, int G, int R, bool LEAN, bool BULK_PREFETCH>
__global__ void __launch_bounds__((G * R), min_blocks_for((G * R)))
    backward_lean_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ gamma,
                         const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                         float* __restrict__ partial_dgamma, float* __restrict__ partial_dbeta, int64_t rows, int D) {
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
}

// Kernel 2 with narrow blocks (lab): 8 columns x 128 lanes a block, D / 8
// blocks (96 at D = 768, where production's 32 x 32 runs 24).
constexpr int kNarrowCols = 8, kNarrowLanes = 128;

// ---- configurations -----------------------------------------------------------------

enum class Pass { Forward, Backward };

enum class Rows { InRegisters, Staged, StagedTwoAStep };
struct Config {
  std::string name;
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
  bool production = true;      // shipped in cuda/layernorm_table.hpp somewhere
  // Candidates of 2026-11-29 (fresh: what --new runs beside production's entry):
  bool cluster_sums = false;   // backward: blocks in clusters add their partials in distributed
                               // shared memory, one partial row per cluster (write_cluster_partials)
  bool pdl = false;            // programmatic dependent launches: a kernel starts while the one before drains
  int depth = 0;               // staged backward: ring depth (0: StagedShape's), rows of G >= 256 threads
  bool narrow_reduce = false;  // backward: kernel 2 in blocks of 8 columns x 128 lanes
  // Forward one-pass: registers capped for twice the blocks a SM (2048 threads
  // at most), more rows in flight; backward (cluster sums): blocks a SM not
  // capped for the partial rows' sake, as many as fit.
  bool more_blocks = false;
  bool fresh = false;
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
    k.fresh = true;  // lab since 2026-11-26 (H100); timed on the H200 with --new
    c.push_back(k);
  }
  {
    Config k = fwd("one-pass, bf16 packed, bulk prefetch");
    k.one_pass = k.packed = k.bulk_prefetch = true;
    k.production = false;
    k.fresh = true;  // lab since 2026-11-26 (H100); timed on the H200 with --new
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
    k.fresh = true;  // lost on the H100 (2026-11-26); timed again on the H200 with --new
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
  // Fresh candidates: the forward's launches overlapped (PDL); the
  // backward's partial rows cut by clusters, its two kernels overlapped,
  // deeper rings for wide staged rows.
  const auto fresh = [&](Config k, bool pdl) {
    k.production = false;
    k.fresh = true;
    k.pdl = pdl;
    c.push_back(k);
  };
  for (const Config& base : std::vector<Config>(c)) {
    if (!base.production) continue;
    if (base.pass == Pass::Forward) {
      if (base.name == "staged") continue;  // the 64 KB ring lost to registers on the H200
      Config k = base;
      k.name = base.name + ", PDL";
      fresh(k, true);
      if (base.one_pass) {
        Config m = base;
        m.more_blocks = true;
        m.name = base.name + ", 2x blocks a SM, PDL";
        fresh(m, true);
      }
    } else {
      Config k = base;
      k.cluster_sums = true;
      k.name = base.name + ", cluster sums";
      fresh(k, false);
      k.name = base.name + ", cluster sums, PDL";
      fresh(k, true);
      Config p = base;
      p.name = base.name + ", PDL";
      fresh(p, true);
      Config r = base;
      r.cluster_sums = r.narrow_reduce = true;
      r.name = base.name + ", cluster sums, PDL, narrow reduce";
      fresh(r, true);
      Config u = base;
      u.cluster_sums = u.more_blocks = true;
      u.name = base.name + ", cluster sums, PDL, blocks uncapped";
      fresh(u, true);
      if (base.rows == Rows::Staged && !base.shared_params) {
        Config d = base;
        d.cluster_sums = true;
        d.depth = 3;
        d.name = base.name + ", depth 3, cluster sums, PDL";
        fresh(d, true);
      }
    }
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
  // (allowed whatever smem is: static and dynamic together past 48 KB need it too)
  if (smem > 0) CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
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

// Launches kern<<<blocks, threads, smem>>>(args...) with cudaLaunchKernelEx:
// in clusters of C blocks where C > 1, programmatically (PDL) where pdl.
template <class... Params, class... Args>
void launch_ex(void (*kern)(Params...), int blocks, int threads, size_t smem, int C, bool pdl, Args... args) {
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (C > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = unsigned(C), attrs[n].val.clusterDim.y = 1, attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.attrs = n > 0 ? attrs : nullptr;
  config.numAttrs = unsigned(n);
  CHECK_CUDA(cudaLaunchKernelEx(&config, kern, args...));
}

// The cluster size for a backward kernel 1 of `blocks` blocks (the grid
// without clusters): of C = 2..8, the one that keeps the most of them
// resident at once (clusters live in one GPC each), the largest on a tie;
// 0 where none runs. The grid is then rounded down to a multiple of C.
template <class Kernel>
int cluster_for(Kernel kern, int threads, size_t smem, int blocks) {
  static std::map<std::tuple<void*, int, size_t>, std::vector<int>> fits;
  std::vector<int>& fit = fits[{reinterpret_cast<void*>(kern), threads, smem}];
  if (fit.empty()) {
    fit.assign(9, 0);
    if (smem > 48 * 1024)
      CHECK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    for (int C = 2; C <= 8; ++C) {
      cudaLaunchAttribute a{};
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = unsigned(C), a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(C));
      config.blockDim = dim3(unsigned(threads));
      config.dynamicSmemBytes = smem;
      config.attrs = &a;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&fit[C], kern, &config) != cudaSuccess) fit[C] = 0, (void)cudaGetLastError();
    }
  }
  int best = 0, best_blocks = 0;
  for (int C = 2; C <= 8; ++C) {
    const int resident = std::min(blocks, fit[C] * C) / C * C;
    if (resident > 0 && resident >= best_blocks) best = C, best_blocks = resident;
  }
  return best;
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
                        plan_staged_pairs(staged_room(kern, G * R), R, k.D * int(sizeof(T)), stage_kb * 1024), 2);
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
    constexpr int kMore = std::min(2 * min_blocks_for(G * R), 2048 / (G * R));
    if constexpr (G == 32) {
      if (c.shared_params)
        return c.more_blocks ? plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, true, kMore>, G, R)
                             : plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, true>, G, R);
    }
    if (c.shared_params) return false;
    return c.more_blocks ? plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, false, kMore>, G, R)
                         : plain(layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, false>, G, R);
  }
  template <int EPT, int G, int R, bool SHARED>
  bool staged() const {
    auto kern = layernorm_forward_staged_kernel<T, VEC, EPT, G, R, SHARED>;
    const int target = c.fewest_stages ? 0 : stage_kb * 1024;
    return run_staged(kern, G, R, plan_staged(staged_room(kern, G * R), R, k.D * int(sizeof(T)), target), 1);
  }
  template <class Kernel>
  bool plain(Kernel kern, int G, int R) const {
    static std::map<void*, int> per_sm;
    int& n = per_sm[reinterpret_cast<void*>(kern)];
    if (n == 0) n = occupancy(kern, G * R, 0);
    launch_ex(kern, persistent_grid(k.rows, R, n, k.sms), G * R, 0, 1, c.pdl, static_cast<const T*>(b.x), b.gamma,
              b.beta, static_cast<T*>(b.y), b.mean, b.rstd, k.rows, k.D, k.eps);
    return true;
  }
  template <class Kernel>
  // least: the stages a group needs (production's: 1 staged row, 2 two a step).
  bool run_staged(Kernel kern, int G, int R, const StagedPlan& plan, int least) const {
    if (plan.stages < least) return false;
    launch_ex(kern, persistent_grid(k.rows, R, plan.blocks_per_sm, k.sms), G * R, plan.smem, 1, c.pdl,
              static_cast<const T*>(b.x), b.gamma, b.beta, static_cast<T*>(b.y), b.mean, b.rstd, k.rows, k.D, k.eps,
              plan.stages);
    return true;
  }

  static int capped(int per_sm, int threads) { return std::min(per_sm, std::max(2, 1024 / threads)); }
  template <int EPT, int G, int R>
  bool backward() const {
    if (c.rows == Rows::Staged) {
      using S = StagedShape<EPT, G, R>;
      if (c.depth == 0) return staged_backward<EPT, G, S::kGroups, S::kDepth, S::kMinBlocks>();
      if constexpr (G >= 256) {
        if (c.depth == 3) return staged_backward<EPT, G, S::kGroups, 3, S::kMinBlocks>();
      }
      return false;
    }
    if (c.wide) {
      if constexpr (G * R == 512 && G >= 128) return lean<EPT, G, 2 * R>();
      else return false;
    }
    if (c.lean) return lean<EPT, G, R>();
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    auto kern = c.cluster_sums ? layernorm_backward_kernel<T, VEC, EPT, G, R, false, true>
                               : layernorm_backward_kernel<T, VEC, EPT, G, R, false, false>;
    const int n = occupancy(kern, G * R, kSmem);
    return with_partials(kern, persistent_grid(k.rows, R, c.more_blocks ? n : capped(n, G * R), k.sms), G * R, kSmem);
  }
  template <int EPT, int G, int R, int DEPTH, int MIN_BLOCKS>
  bool staged_backward() const {
    constexpr bool kWarp = G == 32;
    if (c.shared_params && !kWarp) return false;
    auto kern =
        c.cluster_sums
            ? (c.shared_params ? layernorm_backward_staged_kernel<T, VEC, EPT, G, R, DEPTH, MIN_BLOCKS, kWarp, true>
                               : layernorm_backward_staged_kernel<T, VEC, EPT, G, R, DEPTH, MIN_BLOCKS, false, true>)
            : (c.shared_params ? layernorm_backward_staged_kernel<T, VEC, EPT, G, R, DEPTH, MIN_BLOCKS, kWarp, false>
                               : layernorm_backward_staged_kernel<T, VEC, EPT, G, R, DEPTH, MIN_BLOCKS, false, false>);
    const size_t smem = staged_smem_bytes(k.D, sizeof(T), R, DEPTH);
    cudaFuncAttributes attr{};
    CHECK_CUDA(cudaFuncGetAttributes(&attr, kern));
    if (smem + attr.sharedSizeBytes > size_t(attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin))) return false;
    const int n = occupancy(kern, G * R, smem);
    if (n < 1) return false;
    return with_partials(kern, persistent_grid(k.rows, R, c.more_blocks ? n : capped(n, G * R), k.sms), G * R, smem);
  }
  template <int EPT, int G, int R>
  bool lean() const {
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    auto kern = c.bulk_prefetch ? backward_lean_kernel<T, VEC, EPT, G, R, true, true>
                                : backward_lean_kernel<T, VEC, EPT, G, R, true, false>;
    return with_partials(kern, persistent_grid(k.rows, R, capped(occupancy(kern, G * R, kSmem), G * R), k.sms), G * R,
                         kSmem);
  }
  // Kernel 1 on `blocks` blocks (cluster_sums: rounded down to clusters),
  // then kernel 2 over its partial rows.
  template <class Kernel>
  bool with_partials(Kernel kern, int blocks, int threads, size_t smem) const {
    int C = 1;
    if (c.cluster_sums) {
      C = cluster_for(kern, threads, smem, blocks);
      if (C == 0) return false;
      blocks = blocks / C * C;
    }
    const int partial_rows = blocks / C;
    if (partial_rows > k.max_partials) return false;
    float* pg = b.partials;
    float* pb = b.partials + int64_t(k.max_partials) * k.D;
    launch_ex(kern, blocks, threads, smem, C, c.pdl, static_cast<const T*>(b.dy), static_cast<const T*>(b.x), b.gamma,
              b.mean, b.rstd, static_cast<T*>(b.dx), pg, pb, k.rows, k.D);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned((k.D + kReduceCols - 1) / kReduceCols));
    config.blockDim = dim3(kReduceCols, kReduceLanes);
    cudaLaunchAttribute pdl{};
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = c.pdl ? &pdl : nullptr;
    config.numAttrs = c.pdl ? 1 : 0;
    if (c.narrow_reduce) {
      config.gridDim = dim3(unsigned((k.D + kNarrowCols - 1) / kNarrowCols));
      config.blockDim = dim3(kNarrowCols, kNarrowLanes);
    }
    CHECK_CUDA(cudaLaunchKernelEx(&config,
                                  c.narrow_reduce ? layernorm_reduce_partials_kernel<kNarrowCols, kNarrowLanes>
                                                  : layernorm_reduce_partials_kernel<>,
                                  static_cast<const float*>(pg), static_cast<const float*>(pb), partial_rows, k.D,
                                  b.dgamma, b.dbeta));
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
std::vector<double> to_doubles(const std::vector<unsigned char>& raw, bool bf16) {
  const int64_t n = int64_t(raw.size()) / (bf16 ? 2 : 4);
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
std::vector<double> read_back(const void* dev, int64_t n, bool bf16) {
  std::vector<unsigned char> raw(n * (bf16 ? 2 : 4));
  CHECK_CUDA(cudaMemcpy(raw.data(), dev, raw.size(), cudaMemcpyDeviceToHost));
  return to_doubles(raw, bf16);
}

// Rows 0, step, 2 step, ... and the last row of a rows x D matrix on the
// device (what a check reads back of a large case: rows spread over the
// whole grid's share, in two copies); pick_rows: the same rows of a host one.
std::vector<double> read_back_rows(const void* dev, int64_t rows, int D, bool bf16, int64_t step) {
  const size_t row_bytes = size_t(D) * (bf16 ? 2 : 4);
  const int64_t picked = (rows - 1) / step + 1;
  std::vector<unsigned char> raw((picked + 1) * row_bytes);
  CHECK_CUDA(cudaMemcpy2D(raw.data(), row_bytes, dev, row_bytes * step, row_bytes, picked, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(raw.data() + picked * row_bytes, static_cast<const char*>(dev) + (rows - 1) * row_bytes,
                        row_bytes, cudaMemcpyDeviceToHost));
  return to_doubles(raw, bf16);
}
std::vector<double> pick_rows(const std::vector<double>& m, int64_t rows, int D, int64_t step) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; r += step) out.insert(out.end(), m.begin() + r * D, m.begin() + (r + 1) * D);
  out.insert(out.end(), m.end() - D, m.end());
  return out;
}

// max |got - want| / max |want|.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // (std::max would pass over a NaN)
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
  std::vector<std::string> configs;  // substring filters on names (any of them)
  int iters = 30, warmup = 5, stage_kb = 64;
  int calls = 0;  // calls per timed sample; 0: about 1 ms of work (the benchmarks' rule)
  bool lab_only = false;
  bool fresh = false;  // --new: the fresh candidates and production's entry of each case
};

const char* kUsage =
    "usage: layernorm_lab [--sizes RxD,...] [--dtypes f32,bf16] [--passes fwd,bwd] [--configs SUBSTRING,...]\n"
    "                     [--lab-only] [--new] [--iters N] [--warmup N] [--calls N] [--stage-kb KB] [--help]\n"
    "  --sizes     rows x D cases, D in 1..16384 and D * elt a multiple of 16 (default: one case per\n"
    "              width class, 64 MiB of x in f32)\n"
    "  --dtypes    f32, bf16 or both (default both)\n"
    "  --passes    fwd, bwd or both (default both)\n"
    "  --configs   only configurations whose name contains one of the SUBSTRINGs (e.g. staged,one-pass)\n"
    "  --lab-only  only the configurations production does not ship (and 'in registers' to compare)\n"
    "  --new       only the candidates of 2026-11-29 (cluster sums, PDL, depth 3) and, per case, the\n"
    "              configuration production runs there on this GPU's memory system\n"
    "  --calls     back-to-back calls per timed sample (default: about 1 ms of work, 1..64, as\n"
    "              bench_layernorm times; the copy yardstick is timed the same way)\n"
    "  --iters     timed launches per case, median reported (default 30)\n"
    "  --warmup    untimed launches first (default 5)\n"
    "  --stage-kb  bytes in flight per SM the staged forwards aim at, KB (default 64, production's)\n"
    "Each configuration is checked against a float64 CPU reference first; an error over the bound\n"
    "(f32 1e-4, bf16 1e-2 of the largest output) stops the program with status 1.\n";

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
    if (flag == "--lab-only") {
      o.lab_only = true;
      continue;
    }
    if (flag == "--new") {
      o.fresh = true;
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
      o.configs = split(value());
    } else if (flag == "--calls") {
      o.calls = static_cast<int>(parse_int(flag, value(), 1, 1000));
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

// The memory system whose table production runs on this GPU (as
// hg::gpu::device_memory_system: peak DRAM GB/s against kHbm3eGbps).
MemorySystem memory_system() {
  const double gbps =
      2.0 * attribute(cudaDevAttrMemoryClockRate) * 1e3 * (attribute(cudaDevAttrGlobalMemoryBusWidth) / 8) * 1e-9;
  return gbps >= kHbm3eGbps ? MemorySystem::HBM3e : MemorySystem::HBM3;
}

// Whether lab configuration c is production's kernel k for its pass.
bool is_entry(const Config& c, const LnKernel& k) {
  if (c.lean || c.wide || c.bulk_prefetch || c.depth != 0 || c.narrow_reduce || c.more_blocks) return false;
  if (c.cluster_sums || c.pdl != k.pdl) return false;
  const Rows rows = k.rows == LnRows::InRegisters ? Rows::InRegisters
                    : k.rows == LnRows::Staged    ? Rows::Staged
                                                  : Rows::StagedTwoAStep;
  if (c.rows != rows || c.shared_params != k.params_in_shared_memory) return false;
  if (c.pass == Pass::Backward) return c.narrow == k.bf16_8_byte_access;
  return c.one_pass == k.one_pass_stats && c.packed == k.bf16_packed && !c.narrow &&
         c.fewest_stages == (k.rows == LnRows::Staged && k.stage_kb == 0);
}

// One measured row of the summary.
struct Measured {
  std::string name;
  double pct = 0;
};
struct CaseSummary {
  std::string what;  // "bf16 bwd 4096x1024"
  Measured production, best_fresh, best;
};

int run(const Options& o) {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double l2 = prop.l2CacheSize;
  std::printf("GPU: %s, %d SMs, L2 %.0f MB, sm_%d%d\n", prop.name, sms, l2 / 1e6, prop.major, prop.minor);
  if (prop.major < 9) std::printf("(below sm_90: staged configurations are skipped)\n");
  const MemorySystem memory = memory_system();
  std::printf("production table: %s (cuda/layernorm_table.hpp)\n", memory_system_name(memory));
  std::vector<CaseSummary> summary;
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
      // y and dx are checked on every row up to 4M elements, past that on
      // every check_step-th row and the last (dgamma, dbeta sum all rows).
      const int64_t check_step = std::max<int64_t>(1, n >> 22);
      const std::vector<double> ref_y = pick_rows(ref.y, rows, D, check_step);
      const std::vector<double> ref_dx = pick_rows(ref.dx, rows, D, check_step);
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
      // Calls per timed sample as bench_layernorm's (about 1 ms of work), the
      // same for the copy yardstick: the best of cudaMemcpyAsync and the
      // benchmarks' copy kernels on x's bytes.
      const int calls = o.calls > 0 ? o.calls : calls_for(3.0 * double(mat));
      const char* copy_name = "";
      const double copy_ms = best_copy_ms(
          o.warmup, o.iters, sets, calls, mat, sms, [&](int s) { return bufs[s].x; }, [&](int s) { return bufs[s].y; },
          &copy_name);
      const double copy_gbps = 2.0 * mat / (copy_ms * 1e6);
      // Statistics for the backward: the production two-pass forward's.
      const Config base = fwd("in registers");
      for (const Buffers& b : bufs) launch(base, bf16, k, b, o.stage_kb);
      std::printf("\n%s rows %lld x D %d (%d buffer sets, %d calls per sample), best copy %.0f GB/s (%s)\n",
                  bf16 ? "bf16" : "f32", (long long)rows, D, sets, calls, copy_gbps, copy_name);
      std::printf("  %-4s %-52s %9s %7s %10s\n", "pass", "configuration", "GB/s", "%copy", "max rel err");
      const std::string dims = std::to_string(rows) + "x" + std::to_string(D);
      CaseSummary sums[2] = {{std::string(bf16 ? "bf16" : "f32 ") + " fwd " + dims, {}, {}, {}},
                             {std::string(bf16 ? "bf16" : "f32 ") + " bwd " + dims, {}, {}, {}}};
      for (const Config& c : all_configs()) {
        const bool is_fwd = c.pass == Pass::Forward;
        if ((is_fwd && !o.fwd) || (!is_fwd && !o.bwd)) continue;
        const LnKernel entry =
            ln_table_entry(memory, is_fwd ? LnPass::Forward : LnPass::Backward, bf16, ln_width_class(D));
        const bool prod = is_entry(c, entry);
        if (!o.configs.empty() && std::none_of(o.configs.begin(), o.configs.end(), [&](const std::string& f) {
              return c.name.find(f) != std::string::npos;
            }))
          continue;
        if (o.fresh && !c.fresh && !prod) continue;
        if (o.lab_only && c.production && c.name != "in registers") continue;
        if (c.rows != Rows::InRegisters && prop.major < 9) continue;
        if (c.bulk_prefetch && prop.major < 9) continue;
        // Check on set 0 (the backward on the statistics the forward above
        // stored), its outputs poisoned with NaN first: whatever a kernel
        // leaves unwritten fails the check.
        CHECK_CUDA(cudaMemset(is_fwd ? bufs[0].y : bufs[0].dx, 0xff, mat));
        CHECK_CUDA(cudaMemset(dg, 0xff, D * 4));
        CHECK_CUDA(cudaMemset(db, 0xff, D * 4));
        if (!launch(c, bf16, k, bufs[0], o.stage_kb)) continue;
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaGetLastError());
        double err;
        if (is_fwd) {
          err = rel_error(read_back_rows(bufs[0].y, rows, D, bf16, check_step), ref_y);
        } else {
          err =
              std::max({rel_error(read_back_rows(bufs[0].dx, rows, D, bf16, check_step), ref_dx),
                        rel_error(read_back(dg, D, false), ref.dgamma), rel_error(read_back(db, D, false), ref.dbeta)});
        }
        if (is_fwd) launch(base, bf16, k, bufs[0], o.stage_kb);  // restore the statistics for the backward
        const double bound = bf16 ? 1e-2 : 1e-4;
        const double ms =
            median_ms_per_call(o.warmup, o.iters, sets, calls, [&](int s) { launch(c, bf16, k, bufs[s], o.stage_kb); });
        const double gbps = (is_fwd ? 2.0 : 3.0) * mat / (ms * 1e6);
        const double pct = 100.0 * gbps / copy_gbps;
        std::printf("  %-4s %-52s %9.0f %6.1f%% %10.2e%s%s\n", is_fwd ? "fwd" : "bwd", c.name.c_str(), gbps, pct, err,
                    prod           ? "  *production"
                    : c.production ? ""
                                   : "  (lab)",
                    err > bound ? "  OVER THE BOUND" : "");
        if (err > bound) failed = true;
        if (err <= bound) {
          CaseSummary& cs = sums[is_fwd ? 0 : 1];
          if (prod) cs.production = {c.name, pct};
          if (c.fresh && pct > cs.best_fresh.pct) cs.best_fresh = {c.name, pct};
          if (pct > cs.best.pct) cs.best = {c.name, pct};
        }
        const std::string key =
            std::string(bf16 ? "bf16" : "f32 ") + " " + (is_fwd ? "fwd" : "bwd") + " D " + kClassNames[width_class(D)];
        Winner& w = winners[key];
        if (err <= bound && gbps > w.gbps) w = {c.name, gbps};
      }
      for (Buffers& b : bufs)
        for (void* p : {b.x, b.dy, b.y, b.dx, static_cast<void*>(b.mean), static_cast<void*>(b.rstd)})
          CHECK_CUDA(cudaFree(p));
      for (float* p : {g, bt, dg, db, partials}) CHECK_CUDA(cudaFree(p));
      for (const CaseSummary& cs : sums)
        if (cs.best.pct > 0) summary.push_back(cs);
    }
  std::printf("\nSummary on %s (%%copy; production: the %s table's entry; new: the best of 2026-11-29's)\n", prop.name,
              memory_system_name(memory));
  std::printf("  %-24s %6s  %6s %-50s %6s %s\n", "case", "prod", "new", "best new candidate", "best", "best overall");
  for (const CaseSummary& cs : summary)
    std::printf("  %-24s %6.1f  %6.1f %-50s %6.1f %s\n", cs.what.c_str(), cs.production.pct, cs.best_fresh.pct,
                cs.best_fresh.name.c_str(), cs.best.pct, cs.best.name.c_str());
  std::printf("\nWinners on %s (a table entry is cuda/layernorm_table.hpp):\n", prop.name);
  for (const auto& [key, w] : winners) std::printf("  %-24s %-42s %9.0f GB/s\n", key.c_str(), w.name.c_str(), w.gbps);
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
