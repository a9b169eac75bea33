// Fused LayerNorm launchers (API: cuda/layernorm_kernels.hpp): which kernel
// and which launch for each case. The kernels: cuda/layernorm_forward.cuh,
// cuda/layernorm_backward.cuh, cuda/layernorm_staged_*.cuh,
// cuda/layernorm_residual.cuh; which configuration runs where:
// cuda/layernorm_table.hpp. Design, thread mapping and numerics:
// docs/layernorm.md, "Fused GPU kernels".
//
// Only the kernels a table entry, an entry's fallback, or the paths for
// other rows (scalar, chunked, cluster, residual) can reach are compiled:
// each width class instantiates the configurations its entries name.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"
#include "cuda/layernorm_backward.cuh"
#include "cuda/layernorm_forward.cuh"
#include "cuda/layernorm_kernels.hpp"
#include "cuda/layernorm_partial_columns.cuh"
#include "cuda/layernorm_residual.cuh"
#include "cuda/layernorm_rows.cuh"
#include "cuda/layernorm_staged_backward.cuh"
#include "cuda/layernorm_staged_forward.cuh"
#include "cuda/layernorm_staged_pair_forward.cuh"
#include "cuda/residual_layernorm_kernels.hpp"
#include "cuda/staged_room.cuh"
#include "cuda/vec.cuh"

namespace hg::gpu {
namespace {

// ---- configurations as template arguments ---------------------------------------------
// An LnKernel packed into one integer (C++17 takes no class-type template
// arguments), and back.
constexpr uint32_t code_of(const LnKernel& k) {
  return uint32_t(k.rows) | uint32_t(k.one_pass_stats) << 2 | uint32_t(k.bf16_packed) << 3 |
         uint32_t(k.bf16_8_byte_access) << 4 | uint32_t(k.params_in_shared_memory) << 5 | uint32_t(k.stage_kb) << 6;
}
constexpr LnKernel kernel_of(uint32_t c) {
  LnKernel k;
  k.rows = static_cast<LnRows>(c & 3);
  k.one_pass_stats = (c >> 2) & 1;
  k.bf16_packed = (c >> 3) & 1;
  k.bf16_8_byte_access = (c >> 4) & 1;
  k.params_in_shared_memory = (c >> 5) & 1;
  k.stage_kb = static_cast<int>(c >> 6);
  return k;
}
constexpr uint32_t kInRegistersCode = code_of(ln::kInRegisters);

// ---- which layout for which width --------------------------------------------------
// Rows of up to 16384 elements are held by groups of G threads, EPT elements
// each, R groups per block: a warp per row up to 1024, then several warps.
// 513-768 (GPT-2's 768) has its own 24 elements a lane: with 32, a quarter of
// each lane's registers would hold nothing there. At 8193-16384 the passes
// differ only in how they spread the row: Pass::wide_ept() elements per
// thread (the forward 32: 512 threads, two blocks per SM; the backward,
// which holds x and dy, 16: one 1024-thread block).
template <int C, class Pass>
void resident_in_class(int D, const Pass& pass) {
  static_assert(C >= 0 && C < kLnWidthClasses, "no such width class");
  if constexpr (C == 0) pass.template resident<8, 32, 8>();
  else if constexpr (C == 1) pass.template resident<16, 32, 8>();
  else if constexpr (C == 2) {
    if (D <= 32 * 24) pass.template resident<24, 32, 8>();
    else pass.template resident<32, 32, 8>();
  } else if constexpr (C == 3) pass.template resident<16, 128, 4>();
  else if constexpr (C <= 5) pass.template resident<16, 256, 2>();
  else if constexpr (C == 6) pass.template resident<16, 512, 1>();
  else pass.template resident<Pass::wide_ept(), kLnResidentMaxD / Pass::wide_ept(), 1>();
}

// Calls fn(std::integral_constant<int, c>) for a width class c in [First, Last].
template <int First, int Last, class Fn>
void with_width_class(int c, Fn&& fn) {
  if constexpr (First <= Last) {
    if (c == First) return fn(std::integral_constant<int, First>{});
    with_width_class<First + 1, Last>(c, fn);
  }
}

// Rows of D <= 16384 in the width classes [First, Last]: the layout of D's
// class. False, launching nothing, for other rows.
template <int First = 0, int Last = kLnWidthClasses - 1, class Pass>
bool for_resident_width(int D, const Pass& pass) {
  const int c = ln_width_class(D);
  if (D > kLnResidentMaxD || c < First || c > Last) return false;
  with_width_class<First, Last>(c, [&](auto C) { resident_in_class<decltype(C)::value>(D, pass); });
  return true;
}

// Rows past the resident widths: the pass's cluster kernel where it has one
// and the device runs it, else chunks of 512 x 16.
template <class Pass>
void for_long_rows(const Pass& pass) {
  if (pass.clusters()) return;
  pass.template chunked<16, 512>();
}

// Any width, one configuration (the scalar path).
template <class Pass>
void for_width(int D, const Pass& pass) {
  if (!for_resident_width(D, pass)) for_long_rows(pass);
}

// A persistent grid: `per_sm` blocks per SM, or fewer if the rows need fewer;
// each block walks rows with a grid-sized stride.
int persistent_grid(int64_t rows, int rows_per_block, int per_sm) {
  const int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<int>(std::min<int64_t>(wanted, int64_t(per_sm) * sm_count()));
}

// Cluster support of one kernel: how many clusters of C = 2..kMaxCluster
// blocks are resident at once (all 0 where the device or the kernel's
// compiled code cannot run clusters).
template <class Kernel>
std::array<int, kMaxCluster + 1> clusters_that_fit(Kernel kernel, int threads, size_t smem) {
  std::array<int, kMaxCluster + 1> fit{};
  if (!runs_sm90_code(kernel)) return fit;
  allow_dynamic_smem(kernel, smem);
  for (int C = 2; C <= kMaxCluster; ++C) {
    cudaLaunchAttribute cluster_dim = cluster_attribute(C);
    const cudaLaunchConfig_t config = launch_config(dim3(C), threads, smem, &cluster_dim);
    HG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit[C], kernel, &config));
  }
  return fit;
}

// The cluster size for rows of D: among the sizes whose blocks hold a
// slice of at most CAP, the one that keeps the most blocks resident, the
// smallest on a tie; 0 if none can run. (A cluster lives in one GPC: 18 SMs
// hold 14 blocks in clusters of 7, but 16 in clusters of 8.)
int cluster_size_for(int D, int VEC, int CAP, const std::array<int, kMaxCluster + 1>& fit) {
  if (D > kMaxCluster * CAP) return 0;  // (and D + C - 1 cannot overflow below)
  int best = 0;
  for (int C = 2; C <= kMaxCluster; ++C)
    if (cluster_slice(D, C, VEC) <= CAP && fit[C] * C > fit[best] * best) best = C;
  return best;
}

// ---- forward --------------------------------------------------------------------------

struct ForwardArgs {
  const void* x;
  const float* gamma;
  const float* beta;
  void* y;
  float* mean;
  float* rstd;
  int64_t rows;
  int D;
  float eps;
};

// The forward of configuration K (code_of) on rows of T, VEC elements a slot.
template <class T, int VEC, uint32_t K>
struct Forward {
  static constexpr const char* kOp = "layernorm_forward_fused";
  static constexpr LnKernel kKernel = kernel_of(K);
  static constexpr int wide_ept() { return 32; }
  const ForwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    if constexpr (kKernel.rows == LnRows::StagedTwoAStep) {
      if (!staged_two_a_step<EPT, G, R>()) in_registers<EPT, G, R>();  // below sm_90
    } else if constexpr (kKernel.rows == LnRows::Staged) {
      if (!staged<EPT, G, R>()) in_registers<EPT, G, R>();  // below sm_90
    } else if constexpr (kKernel.one_pass_stats) {
      constexpr bool kPacked = kKernel.bf16_packed && std::is_same_v<T, __nv_bfloat16>;
      // Packed rows of several warps: twice the elements per thread, the same block size.
      if constexpr (kPacked && G >= 64) one_pass<2 * EPT, G / 2, 2 * R, kPacked>();
      else one_pass<EPT, G, R, kPacked>();
    } else {
      in_registers<EPT, G, R>();
    }
  }
  template <int EPT, int G, int R>
  void in_registers() const {
    auto kernel = layernorm_forward_kernel<T, VEC, EPT, G, R>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    launch(kernel, G * R, persistent_grid(a.rows, R, per_sm));
  }
  template <int EPT, int G, int R, bool PACKED>
  void one_pass() const {
    auto kernel = layernorm_forward_one_pass_kernel<T, VEC, EPT, G, R, PACKED, uses_param_copy(G)>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    launch(kernel, G * R, persistent_grid(a.rows, R, per_sm));
  }
  // Rows staged in shared memory by bulk copies; false where the device or
  // the compiled code is below sm_90.
  template <int EPT, int G, int R>
  bool staged() const {
    static_assert(VEC > 1, "staged rows are 16-byte rows");
    auto kernel = layernorm_forward_staged_kernel<T, VEC, EPT, G, R, uses_param_copy(G)>;
    static const std::optional<StagedRoom> room = staged_room(kernel, G * R, kOp);
    return room && launch_staged(kernel, G, R, plan_staged(*room, R, a.D * int(sizeof(T)), target_bytes()), 1);
  }
  template <int EPT, int G, int R>
  bool staged_two_a_step() const {
    static_assert(VEC > 1, "staged rows are 16-byte rows");
    auto kernel = layernorm_forward_staged_pair_kernel<T, VEC, EPT, G, R>;
    static const std::optional<StagedRoom> room = staged_room(kernel, G * R, kOp);
    return room && launch_staged(kernel, G, R, plan_staged_pairs(*room, R, a.D * int(sizeof(T)), target_bytes()), 2);
  }
  // The bytes in flight per SM the ring depth aims at.
  static constexpr int target_bytes() { return kKernel.stage_kb * 1024; }
  // Only warp rows take the shared-memory parameter copy.
  static constexpr bool uses_param_copy(int G) { return kKernel.params_in_shared_memory && G == 32; }

  // Launches a staged forward kernel (R groups of G threads a block) on
  // `plan`, which must give each group at least `least` stages.
  template <class Kernel>
  bool launch_staged(Kernel kernel, int G, int R, const StagedPlan& plan, int least) const {
    HG_CHECK(plan.stages >= least, kOp, least, " staged row(s) of ", a.D, " elements do not fit in shared memory");
    kernel<<<persistent_grid(a.rows, R, plan.blocks_per_sm), G * R, plan.smem, stream()>>>(
        static_cast<const T*>(a.x), a.gamma, a.beta, static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps,
        plan.stages);
    HG_CUDA_CHECK_LAUNCH("layernorm_forward_staged_kernel");
    return true;
  }
  template <int EPT, int G>
  void chunked() const {
    auto kernel = layernorm_forward_chunked_kernel<T, VEC, EPT, G>;
    static const int per_sm = blocks_per_sm(kernel, G, 0, kOp);
    launch(kernel, G, persistent_grid(a.rows, 1, per_sm));
  }
  // f32 rows of 65536+ elements (16-byte aligned) on sm_90+: a cluster per
  // row, each block 1024 threads x 16 elements, reads the row once where the
  // chunked forward reads it twice. It wins only there; bf16 and shorter or
  // unaligned rows are faster chunked (bench/lab/layernorm.md).
  bool clusters() const {
    if constexpr (!std::is_same_v<T, float> || VEC == 1) {
      return false;
    } else {
      constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT, kMinD = 65536;
      if (a.D < kMinD) return false;
      auto kernel = layernorm_forward_cluster_kernel<T, VEC, kEPT, kThreads>;
      static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, 0);
      const int C = cluster_size_for(a.D, VEC, kCap, fit);
      if (C == 0) return false;
      const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
      cudaLaunchAttribute cluster_dim = cluster_attribute(C);
      const cudaLaunchConfig_t config = launch_config(dim3(C * clusters), kThreads, 0, &cluster_dim);
      HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(a.x), a.gamma, a.beta,
                                       static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps));
      HG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel (clusters)");
      return true;
    }
  }

  template <class Kernel>
  void launch(Kernel kernel, int threads, int blocks) const {
    kernel<<<blocks, threads, 0, stream()>>>(static_cast<const T*>(a.x), a.gamma, a.beta, static_cast<T*>(a.y), a.mean,
                                             a.rstd, a.rows, a.D, a.eps);
    HG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  }
};

// ---- backward -------------------------------------------------------------------------

struct BackwardArgs {
  const void* dy;
  const void* x;
  const float* gamma;
  const float* mean;
  const float* rstd;
  void* dx;
  float* dgamma;
  float* dbeta;
  int64_t rows;
  int D;
  bool accumulate;  // ParamGradWrite::Accumulate: kernel 2 adds into dgamma / dbeta
};

// The arguments of a backward on (rows, D) tensors. A D past INT_MAX is
// clamped here and never runs: check_rows_d refuses it, the resident
// residual rows do not take it.
BackwardArgs backward_args(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, ParamGradWrite write) {
  return {dy.raw_data(),
          x.raw_data(),
          gamma.data<float>(),
          mean.data<float>(),
          rstd.data<float>(),
          dx.raw_data(),
          dgamma.data<float>(),
          dbeta.data<float>(),
          x.size(0),
          int(std::min<int64_t>(x.size(1), INT_MAX)),
          write == ParamGradWrite::Accumulate};
}

// The backward of configuration K (code_of) on rows of T, VEC elements a slot.
template <class T, int VEC, uint32_t K>
struct Backward {
  static constexpr const char* kOp = "layernorm_backward_fused";
  static constexpr LnKernel kKernel = kernel_of(K);
  static_assert(kKernel.rows != LnRows::StagedTwoAStep && !kKernel.one_pass_stats && !kKernel.bf16_packed,
                "forward-only configuration");
  static constexpr int wide_ept() { return 16; }
  const BackwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    if constexpr (kKernel.rows == LnRows::Staged) {
      if (!staged<EPT, G, R>()) in_registers<EPT, G, R>();  // below sm_90, or rows too wide for two stages
    } else {
      in_registers<EPT, G, R>();
    }
  }
  template <int EPT, int G, int R>
  void in_registers() const {
    auto kernel = layernorm_backward_kernel<T, VEC, EPT, G, R, false>;
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    static const int per_sm = capped(blocks_per_sm(kernel, G * R, kSmem, kOp), G * R);
    const int blocks = persistent_grid(a.rows, R, per_sm);
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), G * R, kSmem, nullptr, partial_dgamma, partial_dbeta);
    });
  }
  // x and dy of S rows per group staged in shared memory by bulk copies
  // (cuda/layernorm_staged_backward.cuh). False (nothing launched) where it
  // cannot run: a device or a build below sm_90, or 2 D sizeof(T) bytes
  // times the block's groups and stages past what a block may have.
  template <int EPT, int G, int R>
  bool staged() const {
    using Staged = StagedShape<EPT, G, R>;
    constexpr bool kSharedGamma = kKernel.params_in_shared_memory && G == 32;
    auto kernel = layernorm_backward_staged_kernel<T, VEC, EPT, G, Staged::kGroups, Staged::kDepth, Staged::kMinBlocks,
                                                   kSharedGamma>;
    static const size_t max_smem = runs_sm90_code(kernel) ? allow_max_dynamic_smem(kernel) : 0;
    const size_t smem = staged_smem_bytes(a.D, sizeof(T), Staged::kGroups, Staged::kDepth);
    if (smem > max_smem) return false;
    // Blocks per SM depend on D through the stages; asked again only when the smem changes.
    thread_local size_t asked_smem = 0;
    thread_local int asked_per_sm = 0;
    if (smem != asked_smem) asked_smem = smem, asked_per_sm = active_blocks_per_sm(kernel, Staged::kThreads, smem);
    if (asked_per_sm < 1) return false;
    const int blocks = persistent_grid(a.rows, Staged::kGroups, capped(asked_per_sm, Staged::kThreads));
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), Staged::kThreads, smem, nullptr, partial_dgamma, partial_dbeta);
    });
    return true;
  }
  template <int EPT, int G>
  void chunked() const {
    auto kernel = layernorm_backward_chunked_kernel<T, VEC, EPT, G>;
    static const int per_sm = capped(blocks_per_sm(kernel, G, 0, kOp), G);
    const int blocks = persistent_grid(a.rows, 1, per_sm);
    with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      launch(kernel, dim3(blocks), G, 0, nullptr, partial_dgamma, partial_dbeta);
    });
  }
  // Rows of 16385 .. kMaxCluster * 16384 on sm_90+: a cluster per row, each
  // block 1024 threads x 16 elements (as the resident 8193-16384 kernel);
  // one partial row per cluster. False where no cluster can run.
  bool clusters() const {
    constexpr int kEPT = 16, kThreads = 1024, kCap = kThreads * kEPT;
    constexpr size_t kSmem = sizeof(float) * 2 * kCap;
    auto kernel = layernorm_backward_kernel<T, VEC, kEPT, kThreads, 1, true>;
    static const std::array<int, kMaxCluster + 1> fit = clusters_that_fit(kernel, kThreads, kSmem);
    const int C = cluster_size_for(a.D, VEC, kCap, fit);
    if (C == 0) return false;
    const int clusters = static_cast<int>(std::min<int64_t>(a.rows, fit[C]));
    with_partials(clusters, [&](float* partial_dgamma, float* partial_dbeta) {
      cudaLaunchAttribute cluster_dim = cluster_attribute(C);
      launch(kernel, dim3(C * clusters), kThreads, kSmem, &cluster_dim, partial_dgamma, partial_dbeta);
    });
    return true;
  }

  // Enough threads per SM to keep loads in flight, few enough blocks that
  // the partial buffer stays small next to the main traffic.
  static int capped(int per_sm, int threads) { return std::min(per_sm, std::max(2, 1024 / threads)); }

  // Kernel 1 through launch(partial_dgamma, partial_dbeta) into n_partials
  // partial rows, then kernel 2, which writes (or adds into) dgamma / dbeta:
  // every configuration's last store. Partial sums, [2][n_partials][D]; the
  // caching allocator makes this cheap, and everything runs on the one
  // stream, so freeing it at scope exit is safe.
  template <class LaunchKernel1>
  void with_partials(int n_partials, LaunchKernel1 launch_kernel1) const {
    Tensor partials;
    float* partial_dgamma = nullptr;
    float* partial_dbeta = nullptr;
    if (n_partials > 0) {
      partials = Tensor::empty({2, n_partials, a.D}, DType::F32, Device::CUDA);
      partial_dgamma = partials.data<float>();
      partial_dbeta = partial_dgamma + int64_t(n_partials) * a.D;
      launch_kernel1(partial_dgamma, partial_dbeta);
    }
    if (a.D % 4 == 0) {  // partial rows of 16-byte aligned floats: 16-byte loads over D / 8 blocks
      const int grid = static_cast<int>((a.D + kWideReduceCols - 1) / kWideReduceCols);
      layernorm_reduce_partials_wide_kernel<<<grid, kWideReduceThreads, 0, stream()>>>(
          partial_dgamma, partial_dbeta, n_partials, a.D, a.dgamma, a.dbeta, a.accumulate);
      HG_CUDA_CHECK_LAUNCH("layernorm_reduce_partials_wide_kernel");
      return;
    }
    const dim3 reduce_block(kReduceCols, kReduceLanes);
    const int reduce_grid = (a.D + kReduceCols - 1) / kReduceCols;
    layernorm_reduce_partials_kernel<<<reduce_grid, reduce_block, 0, stream()>>>(
        partial_dgamma, partial_dbeta, n_partials, a.D, a.dgamma, a.dbeta, a.accumulate);
    HG_CUDA_CHECK_LAUNCH("layernorm_reduce_partials_kernel");
  }

  // Launches kernel 1 (`cluster_dim`: the cluster shape, or null for none).
  template <class... Params>
  void launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, cudaLaunchAttribute* cluster_dim,
              float* partial_dgamma, float* partial_dbeta) const {
    const cudaLaunchConfig_t config = launch_config(grid, threads, smem, cluster_dim);
    HG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.gamma,
                                     a.mean, a.rstd, static_cast<T*>(a.dx), partial_dgamma, partial_dbeta, a.rows,
                                     a.D));
    HG_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  }
};

// ---- residual + LayerNorm on the resident rows (cuda/layernorm_residual.cuh) ---------
// The resident layouts, one kernel per pass; the backward's partial rows and
// kernel 2 are the LayerNorm backward's.

// The LayerNorm forward's arguments plus the residual and the stored sum.
struct ResidualForwardArgs : ForwardArgs {
  const void* r;
  void* h;
};

// ADD false: y again from the stored h (a.x; a.r, a.h unused).
template <class T, int VEC, bool ADD = true>
struct ResidualForward {
  static constexpr const char* kOp = "residual_layernorm_forward_fused";
  static constexpr int wide_ept() { return Forward<T, VEC, kInRegistersCode>::wide_ept(); }
  const ResidualForwardArgs& a;

  template <int EPT, int G, int R>
  void resident() const {
    auto kernel = residual_layernorm_forward_kernel<T, VEC, EPT, G, R, ADD>;
    static const int per_sm = blocks_per_sm(kernel, G * R, 0, kOp);
    kernel<<<persistent_grid(a.rows, R, per_sm), G * R, 0, stream()>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.r), a.gamma, a.beta, static_cast<T*>(a.h),
        static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.D, a.eps);
    HG_CUDA_CHECK_LAUNCH("residual_layernorm_forward_kernel");
  }
};

template <class T, int VEC, template <class, int, int, int> class AddIn>
struct ResidualBackward {
  static constexpr const char* kOp = "residual_layernorm_backward_fused";
  using Ln = Backward<T, VEC, kInRegistersCode>;
  static constexpr int wide_ept() { return Ln::wide_ept(); }
  const BackwardArgs& a;  // x: h, dx: dh
  const void* dh_in;

  template <int EPT, int G, int R>
  void resident() const {
    auto kernel = residual_layernorm_backward_kernel<T, VEC, EPT, G, R, AddIn>;
    constexpr size_t kSmem = sizeof(float) * R * 2 * G * EPT;
    static const int per_sm = Ln::capped(blocks_per_sm(kernel, G * R, kSmem, kOp), G * R);
    const int blocks = persistent_grid(a.rows, R, per_sm);
    Ln{a}.with_partials(blocks, [&](float* partial_dgamma, float* partial_dbeta) {
      kernel<<<blocks, G * R, kSmem, stream()>>>(static_cast<const T*>(a.dy), static_cast<const T*>(dh_in),
                                                 static_cast<const T*>(a.x), a.gamma, a.mean, a.rstd,
                                                 static_cast<T*>(a.dx), partial_dgamma, partial_dbeta, a.rows, a.D);
      HG_CUDA_CHECK_LAUNCH("residual_layernorm_backward_kernel");
    });
  }
};

// ---- dispatch -------------------------------------------------------------------------

// 16-byte accesses need every row start aligned: the base pointers and D * elt.
template <class T>
bool can_vectorize(int D, std::initializer_list<const void*> ptrs) {
  if ((static_cast<size_t>(D) * sizeof(T)) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// The configurations compiled for (pass, dtype, width class C), as
// candidate I of ln_kernel_compiled's list: I < kMemorySystems the table
// entry of memory system I, else the fallback of entry I - kMemorySystems.
template <LnPass P, bool BF16, int C, int I>
constexpr LnKernel candidate() {
  constexpr LnKernel entry = ln_table_entry(static_cast<MemorySystem>(I % kMemorySystems), P, BF16, C);
  return I < kMemorySystems ? entry : ln_fallback(entry);
}

std::string compiled_list(LnPass pass, bool bf16, int c) {
  std::ostringstream out;
  for (int m = 0; m < kMemorySystems; ++m)
    for (const bool fallback : {false, true}) {
      const LnKernel e = ln_table_entry(static_cast<MemorySystem>(m), pass, bf16, c);
      out << (m || fallback ? "; " : "") << ln_kernel_name(fallback ? ln_fallback(e) : e);
    }
  return out.str();
}

// Runs configuration k, which must be a candidate of (P, T, C), on 16-byte
// rows of D <= 16384 in width class C. A configuration with 8-byte bf16
// access runs bf16 rows 4 elements a slot.
template <template <class, int, uint32_t> class Pass, LnPass P, class T, int C, class Args, int... Is>
void run_candidate(const Args& a, const LnKernel& k, std::integer_sequence<int, Is...>) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  bool ran = false;
  const auto try_one = [&](auto I) {
    constexpr LnKernel cand = candidate<P, kBf16, C, decltype(I)::value>();
    static_assert(kBf16 || !cand.bf16_8_byte_access, "8-byte access is for bf16 rows");
    if (ran || k != cand) return;
    ran = true;
    constexpr int VEC = cand.bf16_8_byte_access ? 4 : VecWidth<T>::value;
    resident_in_class<C>(a.D, Pass<T, VEC, code_of(cand)>{a});
  };
  (try_one(std::integral_constant<int, Is>{}), ...);
  if (!ran)
    fail(Pass<T, 1, kInRegistersCode>::kOp, "LayerNorm kernel '", ln_kernel_name(k), "' is not compiled for ",
         kBf16 ? "bf16" : "f32", " rows of ", a.D, " elements; compiled there: ", compiled_list(P, kBf16, C));
}

// Runs configuration k on 16-byte rows of T: the kernels of k's width class
// up to 16384, the long-row kernels past it.
template <template <class, int, uint32_t> class Pass, LnPass P, class T, class Args>
void run_aligned(const Args& a, const LnKernel& k) {
  constexpr int VEC = VecWidth<T>::value;
  if (a.D > kLnResidentMaxD) return for_long_rows(Pass<T, VEC, kInRegistersCode>{a});
  with_width_class<0, kLnWidthClasses - 1>(ln_width_class(a.D), [&](auto C) {
    run_candidate<Pass, P, T, decltype(C)::value>(a, k, std::make_integer_sequence<int, 2 * kMemorySystems>{});
  });
}

// Configuration k on 16-byte rows; rows the kernels cannot read 16 bytes at
// a time take the scalar path (rows in registers, VEC 1).
template <template <class, int, uint32_t> class Pass, LnPass P, class Args>
void dispatch(const Tensor& x, const Args& a, std::initializer_list<const void*> ptrs, const LnKernel& k) {
  switch (x.dtype()) {
    case DType::F32:
      if (can_vectorize<float>(a.D, ptrs)) return run_aligned<Pass, P, float>(a, k);
      return for_width(a.D, Pass<float, 1, kInRegistersCode>{a});
    case DType::BF16:
      if (can_vectorize<__nv_bfloat16>(a.D, ptrs)) return run_aligned<Pass, P, __nv_bfloat16>(a, k);
      return for_width(a.D, Pass<__nv_bfloat16, 1, kInRegistersCode>{a});
    default:
      fail(Pass<float, 1, kInRegistersCode>::kOp, "x ", x.shape(), " has dtype ", dtype_name(x.dtype()),
           "; fused kernels take f32 or bf16");
  }
}

void check_rows_d(const char* op, const Tensor& x) {
  HG_DCHECK(x.ndim() == 2, op, "expects (rows, D), got x ", x.shape());
  HG_CHECK(x.size(1) <= INT_MAX, op, "D too large for the kernels' 32-bit widths: x ", x.shape());
}

LnKernel production_kernel(LnPass pass, const Tensor& x) {
  return ln_production_kernel(device_memory_system(), pass, x.dtype(), x.size(1));
}

}  // namespace

MemorySystem device_memory_system() {
  static const MemorySystem m = dram_peak_gbps() >= kHbm3eGbps ? MemorySystem::HBM3e : MemorySystem::HBM3;
  return m;
}

void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd, const LnKernel& kernel) {
  constexpr const char* kOp = "layernorm_forward_fused";
  check_rows_d(kOp, x);
  HG_DCHECK(y.dtype() == x.dtype() && gamma.dtype() == DType::F32 && beta.dtype() == DType::F32, kOp, "dtypes: x ",
            dtype_name(x.dtype()), " y ", dtype_name(y.dtype()), " gamma/beta must be f32");
  const ForwardArgs a{x.raw_data(),       gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                      rstd.data<float>(), x.size(0),           int(x.size(1)),     eps};
  if (a.rows == 0 || a.D == 0) return;
  dispatch<Forward, LnPass::Forward>(x, a, {a.x, a.y, a.gamma, a.beta}, kernel);
}

void layernorm_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  layernorm_forward_fused(x, gamma, beta, eps, y, mean, rstd, production_kernel(LnPass::Forward, x));
}

void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, const LnKernel& kernel,
                              ParamGradWrite write) {
  constexpr const char* kOp = "layernorm_backward_fused";
  check_rows_d(kOp, x);
  HG_DCHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && gamma.dtype() == DType::F32 &&
                dgamma.dtype() == DType::F32 && dbeta.dtype() == DType::F32,
            kOp, "dtypes: x ", dtype_name(x.dtype()), " dy ", dtype_name(dy.dtype()), " dx ", dtype_name(dx.dtype()),
            "; gamma, dgamma, dbeta must be f32");
  const BackwardArgs a = backward_args(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, write);
  if (a.D == 0) return;
  dispatch<Backward, LnPass::Backward>(x, a, {a.dy, a.x, a.dx, a.gamma}, kernel);
}

void layernorm_backward_fused(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, ParamGradWrite write) {
  layernorm_backward_fused(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, production_kernel(LnPass::Backward, x), write);
}

// The resident residual rows: 16-byte aligned rows of 1 <= D <= 16384.
template <class T>
bool residual_rows_fit(int64_t D, std::initializer_list<const void*> ptrs) {
  return D >= 1 && D <= kLnResidentMaxD && can_vectorize<T>(static_cast<int>(D), ptrs);
}

// The residual backward of memory system `memory` for 16-byte rows in
// width class C: the table entry of each memory system is compiled there.
template <class T, int C>
void residual_backward_in_class(const BackwardArgs& a, const void* dh_in, MemorySystem memory) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const auto run_entry = [&](auto M) {
    constexpr LnResidualBackward k = ln_residual_backward_entry(static_cast<MemorySystem>(M.value), kBf16, C);
    static_assert(kBf16 || !k.bf16_8_byte_access, "8-byte access is for bf16 rows");
    constexpr int VEC = k.bf16_8_byte_access ? 4 : VecWidth<T>::value;
    if constexpr (k.holds_dh_in) resident_in_class<C>(a.D, ResidualBackward<T, VEC, HeldAddIn>{a, dh_in});
    else resident_in_class<C>(a.D, ResidualBackward<T, VEC, StreamedAddIn>{a, dh_in});
  };
  static_assert(kMemorySystems == 2, "one branch per memory system");
  if (memory == MemorySystem::HBM3) run_entry(std::integral_constant<int, 0>{});
  else run_entry(std::integral_constant<int, 1>{});
}

bool residual_layernorm_forward_resident(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                         float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd) {
  const ResidualForwardArgs a{{x.raw_data(), gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                               rstd.data<float>(), x.size(0), int(std::min<int64_t>(x.size(1), INT_MAX)), eps},
                              r.raw_data(),
                              h.raw_data()};
  const std::initializer_list<const void*> ptrs = {a.x, a.r, a.h, a.y, a.gamma, a.beta};
  if (x.dtype() == DType::F32 && residual_rows_fit<float>(x.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<float, VecWidth<float>::value>{a});
  if (x.dtype() == DType::BF16 && residual_rows_fit<__nv_bfloat16>(x.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<__nv_bfloat16, VecWidth<__nv_bfloat16>::value>{a});
  return false;
}

bool residual_layernorm_output_resident(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                        Tensor& mean, Tensor& rstd) {
  const ResidualForwardArgs a{{h.raw_data(), gamma.data<float>(), beta.data<float>(), y.raw_data(), mean.data<float>(),
                               rstd.data<float>(), h.size(0), int(std::min<int64_t>(h.size(1), INT_MAX)), eps},
                              nullptr,
                              nullptr};
  const std::initializer_list<const void*> ptrs = {a.x, a.y, a.gamma, a.beta};
  if (h.dtype() == DType::F32 && residual_rows_fit<float>(h.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<float, VecWidth<float>::value, false>{a});
  if (h.dtype() == DType::BF16 && residual_rows_fit<__nv_bfloat16>(h.size(1), ptrs))
    return for_resident_width(a.D, ResidualForward<__nv_bfloat16, VecWidth<__nv_bfloat16>::value, false>{a});
  return false;
}

bool residual_layernorm_backward_resident(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                          const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                          Tensor& dbeta, ParamGradWrite write, MemorySystem memory) {
  const BackwardArgs a = backward_args(dy, h, gamma, mean, rstd, dh, dgamma, dbeta, write);  // x: h, dx: dh
  const void* in = dh_in != nullptr ? dh_in->raw_data() : nullptr;
  const std::initializer_list<const void*> ptrs = {a.dy, a.x, a.dx, a.gamma, in != nullptr ? in : a.dy};
  const bool f32 = h.dtype() == DType::F32;
  if (!(f32 ? residual_rows_fit<float>(h.size(1), ptrs) : residual_rows_fit<__nv_bfloat16>(h.size(1), ptrs)))
    return false;
  if (in == nullptr) {  // dh is LayerNorm's dx alone: the LayerNorm backward, its own production configuration
    layernorm_backward_fused(dy, h, gamma, mean, rstd, dh, dgamma, dbeta, write);
    return true;
  }
  // Held or read at the store, and the bf16 slot width: the memory system's
  // entry of cuda/layernorm_table.hpp for the row's width class.
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    with_width_class<0, kLnWidthClasses - 1>(
        ln_width_class(a.D), [&](auto C) { residual_backward_in_class<T, decltype(C)::value>(a, in, memory); });
  };
  if (f32) run(float{});
  else run(__nv_bfloat16{});
  return true;
}

}  // namespace hg::gpu
