// Softmax forward lab: candidate fused softmax forward kernels
// (bench/lab/softmax_lab_kernels.cuh) on rows read 16 bytes at a time, with
// the padding mask of attention (a (B, 1, 1, Tk) key mask) unless --no-mask.
// Each candidate is checked against a CPU float64 softmax on random rows of
// the timed size and on hostile rows (fully masked, logits of +-1e30, NaN,
// +inf, constant rows, one visible key), then timed with CUDA events (median
// after warm-up, input sets rotated past the L2) and reported as GB/s and %
// of the best device copy of the same bytes. The production configuration is
// the row marked "*"; promoting a winner: bench/lab/softmax.md.
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
#include <utility>
#include <vector>

#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "bench/lab/softmax_lab_kernels.cuh"

namespace {

using namespace softmax_lab;

// ---- candidates ---------------------------------------------------------------

// Production (cuda/softmax.cu) runs the register layout of kVectorForward
// except where its staged forward (cuda/softmax_staged_forward.cuh, the lab's
// "staged, 96 KB a SM") applies: sm_90+, non-causal, Tk 1024..16384 (bf16
// without a mask from Tk 4097); from
// Tk 2048 with a padding mask it is the kernel that keeps the mask row
// ("staged, 96 KB a SM, mask kept").
enum class Prod { No, Registers, Staged, StagedKeptMask };
constexpr Prod kNo = Prod::No;

struct Config {
  const char* name;
  bool lean;                // z = scale x + mask as one FFMA; exp as ex2.approx of (z - max) log2 e
  bool streaming;           // y stored evict-first (st.global.cs)
  int lane_max_keys;        // register layouts: rows longer than this go to the block team (0: no limit)
  int block_elems;          // register layouts: keys a thread of the block team holds (16 or 32)
  int rows_per_team;        // register layouts: rows a team holds at once (1 or 2)
  XLoad x_load;             // register layouts: how x is loaded
  int staged_kb;            // > 0: the staged layout, its rings aiming at this many KB in flight a SM
  int staged_ept;           // staged layout: keys a thread holds at most (16 or 32)
  bool staged_mask;         // staged layout: the mask row staged with x (else loaded through L1)
  bool resident;            // register layouts: a grid of the blocks that fit at once, looping over the rows
  Prod production;          // what cuda/softmax.cu runs of it
  bool kept_mask = false;   // staged layout: the mask row kept in registers while a group's rows share it
  bool bulk_store = false;  // staged layout: y through two out stages a group, copied out by bulk copies
};
constexpr XLoad kNc = XLoad::ReadOnly, kNoL1 = XLoad::NoL1, kNoL1P = XLoad::NoL1Prefetch256;
// {name, lean, streaming, lane_max_keys, block_elems, rows_per_team, x_load,
//  staged_kb, staged_ept, staged_mask, resident, production[, kept_mask, bulk_store]}
constexpr Config kConfigs[] = {
    {"exact", false, false, 0, 16, 1, kNc, 0, 0, false, false, kNo},
    {"lean", true, false, 0, 16, 1, kNc, 0, 0, false, false, kNo},
    {"lean+evict-first", true, true, 0, 16, 1, kNc, 0, 0, false, false, kNo},
    {"lean, block team past 512", true, false, 512, 16, 1, kNc, 0, 0, false, false, Prod::Registers},
    {"lean, block past 512, 32 a thread", true, false, 512, 32, 1, kNc, 0, 0, false, false, kNo},
    {"lean, two rows a team", true, false, 0, 16, 2, kNc, 0, 0, false, false, kNo},
    {"lean, block past 512, two rows", true, false, 512, 16, 2, kNc, 0, 0, false, false, kNo},
    {"lean, block past 512, resident grid", true, false, 512, 16, 1, kNc, 0, 0, false, true, kNo},
    {"lean, block past 512, two rows, res.", true, false, 512, 16, 2, kNc, 0, 0, false, true, kNo},
    {"lean, block past 512, x no L1", true, false, 512, 16, 1, kNoL1, 0, 0, false, false, kNo},
    {"lean, block past 512, x no L1 L2:256B", true, false, 512, 16, 1, kNoL1P, 0, 0, false, false, kNo},
    {"staged, 32 KB a SM", true, false, 0, 0, 1, kNc, 32, 32, false, false, kNo},
    {"staged, 96 KB a SM", true, false, 0, 0, 1, kNc, 96, 32, false, false, Prod::Staged},
    {"staged, 96 KB a SM, 16 a thread", true, false, 0, 0, 1, kNc, 96, 16, false, false, kNo},
    {"staged, 96 KB a SM, evict-first", true, true, 0, 0, 1, kNc, 96, 32, false, false, kNo},
    {"staged, 96 KB a SM, mask staged", true, false, 0, 0, 1, kNc, 96, 32, true, false, kNo},
    {"staged, 96 KB, mask staged, 16 a thr", true, false, 0, 0, 1, kNc, 96, 16, true, false, kNo},
    {"staged, 96 KB a SM, mask kept", true, false, 0, 0, 1, kNc, 96, 32, false, false, Prod::StagedKeptMask, true},
    {"staged, 96 KB a SM, bulk store", true, false, 0, 0, 1, kNc, 96, 32, false, false, kNo, false, true},
    {"staged, 96 KB, bulk store, 16 a thr", true, false, 0, 0, 1, kNc, 96, 16, false, false, kNo, false, true},
    {"staged, 32 KB a SM, bulk store", true, false, 0, 0, 1, kNc, 32, 32, false, false, kNo, false, true},
};
constexpr int kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);

// Whether cuda/softmax.cu runs candidate c on the lab's rows (16-byte rows,
// mask strides Tk and 0, or no mask) of tk keys: its staged forward where
// that applies (bf16 rows without a mask only past Tk 4096; keeping the
// mask row from kStagedKeptMaskMinTk), else its register layout.
template <class T>
bool runs_in_production(const Config& c, int64_t tk, bool causal, bool mask) {
  const bool staged = lab::device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9 && !causal && tk >= 1024 &&
                      tk <= hg::gpu::kStagedSoftmaxMaxTk &&
                      (mask || !std::is_same_v<T, bf16> || tk > hg::gpu::kRegistersUnmaskedBf16MaxTk);
  const bool kept = staged && mask && tk >= hg::gpu::kStagedKeptMaskMinTk;
  return c.production == (kept ? Prod::StagedKeptMask : staged ? Prod::Staged : Prod::Registers);
}

unsigned grid_for(int64_t rows, int64_t per_block) { return unsigned((rows + per_block - 1) / per_block); }

// `grid`, or with a resident grid at most the blocks of fn (of `threads`)
// that fit the GPU at once; the kernels loop over the rows. The fit is
// asked once per kernel and block size (outside the timed launches).
unsigned capped(unsigned grid, bool resident, const void* fn, int threads) {
  if (!resident) return grid;
  static std::map<std::pair<const void*, int>, unsigned> fit;
  const auto [at, fresh] = fit.try_emplace({fn, threads}, 0u);
  if (fresh) {
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, 0));
    at->second = unsigned(per_sm * lab::device_attribute(cudaDevAttrMultiProcessorCount));
  }
  return std::min(grid, at->second);
}

template <int V>
using I = std::integral_constant<int, V>;

// cuda/softmax.cu's dispatch for 16-byte rows (W elements), Tk <= 16384, with
// K rows a team and BlockElems keys a block-team thread.
template <class T, bool kLean, bool kStreaming, int K, int BlockElems, XLoad L = XLoad::ReadOnly>
void launch_registers(const Config& c, const Args<T>& a, cudaStream_t s) {
  constexpr int W = 16 / sizeof(T);
  const int64_t tk = a.tk;
  auto lanes = [&](auto tpr, auto n) {
    constexpr int TPR = decltype(tpr)::value, N = decltype(n)::value;
    auto* kernel = lanes_kernel<T, TPR, W, N, K, kLean, kStreaming, L>;
    const unsigned grid = grid_for(a.rows, K * kLaneTeamBlock / TPR);
    kernel<<<capped(grid, c.resident, reinterpret_cast<const void*>(kernel), kLaneTeamBlock), kLaneTeamBlock, 0, s>>>(
        a);
  };
  if (tk <= 8 * W) return lanes(I<8>{}, I<1>{});
  if (tk <= 16 * W) return lanes(I<16>{}, I<1>{});
  if (tk <= 32 * W) return lanes(I<32>{}, I<1>{});
  if (c.lane_max_keys == 0 || tk <= c.lane_max_keys) {
    if (tk <= 64 * W) return lanes(I<32>{}, I<2>{});
    if (tk <= 128 * W) return lanes(I<32>{}, I<4>{});
    if constexpr (W <= 4) {
      if (tk <= 256 * W) return lanes(I<32>{}, I<8>{});
    }
  }
  constexpr int kN = BlockElems / W;
  const int64_t warps = ((tk + kN * W - 1) / (kN * W) + 31) / 32;
  const int threads = int(std::min<int64_t>(warps * 32, kMaxBlock));
  auto* kernel = block_kernel<T, W, kN, K, kLean, kStreaming, L>;
  kernel<<<capped(grid_for(a.rows, K), c.resident, reinterpret_cast<const void*>(kernel), threads), threads, 0, s>>>(a);
}

template <class T>
void launch_registers(const Config& c, const Args<T>& a, cudaStream_t s) {
  if (!c.lean) return launch_registers<T, false, false, 1, 16>(c, a, s);
  if (c.streaming) return launch_registers<T, true, true, 1, 16>(c, a, s);
  if (c.rows_per_team == 2) return launch_registers<T, true, false, 2, 16>(c, a, s);
  if (c.block_elems == 32) return launch_registers<T, true, false, 1, 32>(c, a, s);
  if (c.x_load == XLoad::NoL1) return launch_registers<T, true, false, 1, 16, XLoad::NoL1>(c, a, s);
  if (c.x_load == XLoad::NoL1Prefetch256)
    return launch_registers<T, true, false, 1, 16, XLoad::NoL1Prefetch256>(c, a, s);
  launch_registers<T, true, false, 1, 16>(c, a, s);
}

using lab::device_attribute;

// A staged kernel, its groups (R of G threads a block) and its plan for one
// Tk: blocks a SM, stages a group, dynamic shared memory. `why` says why it
// does not apply (empty when it does).
template <class T>
struct Staged {
  void (*kernel)(Args<T>, int) = nullptr;                   // a lab kernel, or
  void (*product)(hg::gpu::ForwardArgs<T>, int) = nullptr;  // cuda/softmax_staged_forward.cuh's
  int G = 0, R = 0;
  const void* fn() const {
    return product ? reinterpret_cast<const void*>(product) : reinterpret_cast<const void*>(kernel);
  }
  hg::gpu::StagedPlan plan;
  int grid = 0;
  std::string why;
};

// The staged kernel for rows of tk keys at EPT keys a thread at most: a
// warp a row (4 a block) while tk <= 32 EPT, holding the fewest chunks of W
// keys (a power of two) that cover the row; past that G = tk / EPT threads
// (a power of two), EPT keys each. kKeepMask: the product's kernel that
// keeps the mask row in registers.
template <class T, bool kStreaming, int EPT, bool kStageMask, bool kKeepMask = false, bool kBulkStore = false>
Staged<T> staged_kernel_for(int64_t tk) {
  constexpr int W = 16 / sizeof(T), NF = EPT / W;
  Staged<T> k;
  if constexpr (!kStreaming && EPT == hg::gpu::kStagedSoftmaxKeys && !kStageMask && !kBulkStore) {  // product kernel
    const hg::gpu::StagedSoftmaxKernel<T> p = hg::gpu::staged_softmax_kernel<T, 1, kKeepMask>(tk);
    k.product = p.kernel, k.G = p.G, k.R = p.R;
    return k;
  }
  auto pick = [&](auto g, auto n, auto r) {
    k.kernel = staged_kernel<T, decltype(g)::value, decltype(n)::value, decltype(r)::value, kStreaming, kStageMask,
                             kBulkStore>;
    k.G = decltype(g)::value, k.R = decltype(r)::value;
  };
  if (tk <= 32 * W) pick(I<32>{}, I<1>{}, I<4>{});
  else if (tk <= 64 * W) pick(I<32>{}, I<2>{}, I<4>{});
  else if (tk <= 128 * W && NF >= 4) pick(I<32>{}, I<std::min(NF, 4)>{}, I<4>{});
  else if (tk <= 256 * W && NF >= 8) pick(I<32>{}, I<std::min(NF, 8)>{}, I<4>{});
  else if (tk <= 64 * EPT) pick(I<64>{}, I<NF>{}, I<2>{});
  else if (tk <= 128 * EPT) pick(I<128>{}, I<NF>{}, I<1>{});
  else if (tk <= 256 * EPT) pick(I<256>{}, I<NF>{}, I<1>{});
  else if (tk <= 512 * EPT) pick(I<512>{}, I<NF>{}, I<1>{});
  else if constexpr (EPT == 16) {  // 1024 threads of 16 keys: Tk 16384
    if (tk <= 1024 * EPT) pick(I<1024>{}, I<NF>{}, I<1>{});
  }
  return k;
}

template <class T>
Staged<T> staged_kernel_for(const Config& c, int64_t tk) {
  if (c.streaming) return staged_kernel_for<T, true, 32, false>(tk);
  if (c.bulk_store) {
    if (c.staged_ept == 16) return staged_kernel_for<T, false, 16, false, false, true>(tk);
    return staged_kernel_for<T, false, 32, false, false, true>(tk);
  }
  if (c.staged_ept == 16) {
    if (c.staged_mask) return staged_kernel_for<T, false, 16, true>(tk);
    return staged_kernel_for<T, false, 16, false>(tk);
  }
  if (c.staged_mask) return staged_kernel_for<T, false, 32, true>(tk);
  if (c.kept_mask) return staged_kernel_for<T, false, 32, false, true>(tk);
  return staged_kernel_for<T, false, 32, false>(tk);
}

// As cuda/layernorm.cu sets up its staged forward: all the dynamic shared
// memory a block may have, then plan_staged for rows of tk keys.
template <class T>
Staged<T> staged_plan(const Config& c, int64_t rows, int64_t tk) {
  Staged<T> k = staged_kernel_for<T>(c, tk);
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) < 9) {
    k.why = "bulk copies need sm_90";
    return k;
  }
  if (k.fn() == nullptr || (tk * int64_t(sizeof(T))) % 16 != 0) {
    k.why = "rows past Tk 16384 or not whole 16-byte words";
    return k;
  }
  lab::allow_all_shared_memory(k.fn());
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, k.fn()));
  hg::gpu::StagedRoom room{};
  // bulk_store: two out rows a group after the input rings, counted as the kernel's own.
  const int out_bytes = c.bulk_store ? int(k.R * 2 * tk * int64_t(sizeof(T))) : 0;
  room.static_smem = int(attr.sharedSizeBytes) + out_bytes;
  room.smem_per_block = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  room.smem_per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  room.reserved_per_block = device_attribute(cudaDevAttrReservedSharedMemoryPerBlock);
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&room.blocks_per_sm, k.fn(), k.G * k.R, 0));
  // A stage: a row of x, then (staged_mask) its mask row; the target counts both.
  const int stage_bytes = int(tk * (sizeof(T) + (c.staged_mask ? sizeof(float) : 0)));
  k.plan = hg::gpu::plan_staged(room, k.R, stage_bytes, c.staged_kb * 1024);
  if (k.plan.stages < 1) {
    k.why = "a row does not fit in shared memory";
    return k;
  }
  k.plan.smem += size_t(out_bytes);
  const int64_t resident = int64_t(k.plan.blocks_per_sm) * device_attribute(cudaDevAttrMultiProcessorCount);
  k.grid = int(std::min<int64_t>(resident, grid_for(rows, k.R)));
  return k;
}

// What one candidate runs for one size, set up before it is timed.
template <class T>
struct Prepared {
  const Config* c;
  Staged<T> staged;
  bool applies() const { return staged.why.empty(); }
  std::string note() const {
    if (!c->staged_kb) return "";
    if (!applies()) return "does not apply: " + staged.why;
    const hg::gpu::StagedPlan& p = staged.plan;
    return std::to_string(staged.G) + " threads a row, " + std::to_string(p.blocks_per_sm) + " blocks x " +
           std::to_string(staged.R) + " rings x " + std::to_string(p.stages) + " stages a SM";
  }
  void launch(const Args<T>& a, cudaStream_t s) const {
    if (!c->staged_kb) return launch_registers(*c, a, s);
    if (staged.product) {  // the lab's rows keep row numbers below 2^32 (index32)
      const hg::gpu::ForwardArgs<T> pa{
          a.x,     a.y,      a.mask, a.rows, a.tk, a.tq, a.rows_per_batch, a.mask_batch_stride, a.mask_query_stride,
          a.scale, a.causal, true};
      staged.product<<<staged.grid, staged.G * staged.R, staged.plan.smem, s>>>(pa, staged.plan.stages);
    } else {
      staged.kernel<<<staged.grid, staged.G * staged.R, staged.plan.smem, s>>>(a, staged.plan.stages);
    }
  }
};

template <class T>
Prepared<T> prepare(const Config& c, int64_t rows, int64_t tk) {
  Prepared<T> p{&c, {}};
  if (c.staged_kb) p.staged = staged_plan<T>(c, rows, tk);
  return p;
}

// ---- host ----------------------------------------------------------------------

struct Options {
  std::vector<int64_t> b, h, t;  // sizes BxHxT: scores (B, H, T, T)
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int iters = 30, warmup = 5;
  bool causal = false;
  bool mask = true;
  std::string only;  // run only the candidates whose name holds this (and production)
};

void print_help() {
  std::printf("softmax_lab: candidate fused softmax forward kernels, checked against float64 and timed.\n"
              "  --sizes BxHxT[,...]  scores (B, H, T, T); T a multiple of 8, at most 16384\n"
              "                       (default 8x12x512,4x16x1024,2x16x2048,1x16x4096)\n"
              "  --dtypes f32,bf16    dtypes to run (default both)\n"
              "  --iters N            timed samples per case (default 30); --warmup N (default 5)\n"
              "  --causal             causal rows (keys past the diagonal masked)\n"
              "  --no-mask            no key-padding mask (default: a (B, 1, 1, T) mask)\n"
              "  --only TEXT          only the candidates whose name contains TEXT, and production\n"
              "  --help               this text\n"
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
      o.dtypes = f.choices({"f32", "bf16"});
    } else if (f.is("--iters")) {
      o.iters = int(f.number(1, 100000));
    } else if (f.is("--warmup")) {
      o.warmup = int(f.number(0, 100000));
    } else if (f.is("--causal")) {
      o.causal = true;
    } else if (f.is("--no-mask")) {
      o.mask = false;
    } else if (f.is("--only")) {
      o.only = f.value();
    } else {
      f.unknown();
    }
  }
  if (!o.only.empty() && std::none_of(std::begin(kConfigs), std::end(kConfigs), [&](const Config& c) {
        return c.production == kNo && std::string(c.name).find(o.only) != std::string::npos;
      })) {
    std::string names;
    for (const Config& c : kConfigs) names += std::string(names.empty() ? "" : "; ") + c.name;
    f.fail("--only: no candidate's name contains '" + o.only + "' (candidates: " + names + ")");
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

// One problem on the host: scores x (rows of tk), its key-padding mask
// (B x tk, empty for none) and the layout the kernels see.
template <class T>
struct Problem {
  int64_t batches, heads, tq, tk;
  float scale = 0.125f;
  bool causal = false;
  std::vector<T> x;
  std::vector<float> mask;
  int64_t rows() const { return batches * heads * tq; }
  int64_t visible(int64_t row) const { return causal ? std::clamp<int64_t>(row % tq + tk - tq + 1, 0, tk) : tk; }
};

// The float64 softmax of one row as docs/softmax.md defines it: z = scale x
// + mask (a mask value <= -1e9 adds -inf, a NaN one NaN) over the visible
// keys; a NaN anywhere there makes the row NaN; a row with max -inf is zeros.
template <class T>
void reference_row(const Problem<T>& p, int64_t row, std::vector<double>& y) {
  const int64_t tk = p.tk, visible = p.visible(row);
  const float* m = p.mask.empty() ? nullptr : p.mask.data() + (row / (p.heads * p.tq)) * tk;
  double mx = -INFINITY;
  bool nan = false;
  for (int64_t k = 0; k < visible; ++k) {
    double z = double(p.scale) * lab::to_float(p.x[row * tk + k]);
    if (m) z += m[k] > -1e9f ? double(m[k]) : double(m[k]) - INFINITY;
    y[k] = z;
    nan |= std::isnan(z);
    mx = std::max(mx, z);
  }
  if (mx == -INFINITY && !nan) return std::fill(y.begin(), y.end(), 0.0);
  double sum = 0;
  for (int64_t k = 0; k < tk; ++k) {
    y[k] = k < visible ? std::exp(y[k] - mx) : 0.0;  // inf - inf = NaN: a +inf logit makes the row NaN
    sum += y[k];
  }
  for (int64_t k = 0; k < tk; ++k) y[k] = nan ? NAN : y[k] / sum;
}

// Max over the checked elements of |got - ref| / (|ref| + 1e-6), infinite
// where exactly one of them is NaN. Every row up to ~4M elements, else an
// even sample of rows and the last 64; every element is checked for NaN
// (the output is NaN-poisoned before the launch).
template <class T>
double check_rows(const Problem<T>& p, const std::vector<T>& y) {
  const int64_t rows = p.rows(), tk = p.tk;
  const int64_t step = std::max<int64_t>(1, rows * tk / (int64_t(1) << 22));
  double worst = 0;
  std::vector<double> ref(tk);
  std::vector<bool> checked(rows, false);
  for (int64_t r = 0; r < rows; ++r) {
    if (r % step != 0 && r < rows - 64) continue;
    reference_row(p, r, ref);
    checked[r] = true;
    for (int64_t k = 0; k < tk; ++k) {
      const double got = lab::to_float(y[r * tk + k]);
      if (std::isnan(ref[k]) || std::isnan(got)) {
        if (std::isnan(ref[k]) != std::isnan(got)) worst = INFINITY;
        continue;
      }
      worst = std::max(worst, std::abs(got - ref[k]) / (std::abs(ref[k]) + 1e-6));
    }
  }
  // The rows not compared above: no NaN in a finite input (the random problems).
  for (int64_t r = 0; r < rows; ++r)
    if (!checked[r])
      for (int64_t k = 0; k < tk; ++k)
        if (std::isnan(lab::to_float(y[r * tk + k]))) worst = INFINITY;
  return worst;
}

// Key-padding mask of the timed problems: batch b keeps its first
// tk - b tk / (2B) keys; the rest are -inf (even b) or -1e9 (odd b).
std::vector<float> padding_mask(int64_t batches, int64_t tk) {
  std::vector<float> m(batches * tk, 0.0f);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t k = tk - b * tk / (2 * batches); k < tk; ++k) m[b * tk + k] = b % 2 ? -1e9f : -INFINITY;
  return m;
}

// Hostile rows at Tk = tk: 4 batches x 2 heads x 4 queries. Batch 0 fully
// masked (-inf, -1e9, -3e9), one of its rows with a NaN score (NaN, not
// zeros); batch 1 padded past 2/3 with -1e4 biases on every fifth key;
// batch 2 unmasked; batch 3 sees key 1 only. Rows of +-1e30 (all or one
// key), constant rows, NaN and +inf scores; a NaN past a causal row's
// diagonal is never read (docs/softmax.md).
template <class T>
Problem<T> hostile_problem(int64_t tk, bool causal, std::mt19937_64& gen) {
  Problem<T> p{4, 2, 4, tk};
  p.causal = causal;
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> x(p.rows() * tk);
  for (float& v : x) v = normal(gen);
  p.mask.assign(4 * tk, 0.0f);
  for (int64_t k = 0; k < tk; ++k) {
    p.mask[k] = k % 3 == 0 ? -INFINITY : (k % 3 == 1 ? -1e9f : -3e9f);
    p.mask[tk + k] = k >= 2 * tk / 3 ? -INFINITY : (k % 5 == 1 ? -1e4f : 0.0f);
    p.mask[3 * tk + k] = k == 1 ? 0.0f : -INFINITY;
  }
  const auto row = [&](int64_t b, int64_t h, int64_t q) { return x.data() + ((b * 2 + h) * 4 + q) * tk; };
  const auto fill = [&](float* r, float v) { std::fill(r, r + tk, v); };
  row(0, 1, 0)[5] = NAN;
  fill(row(1, 0, 0), 1e30f);
  row(1, 0, 1)[3] = 1e30f;
  fill(row(1, 0, 2), 7.0f);
  row(1, 0, 3)[0] = NAN;
  row(1, 1, 0)[7] = -1e30f;
  row(1, 1, 1)[2] = INFINITY;
  fill(row(1, 1, 2), -1e30f);
  fill(row(2, 0, 0), -1e30f);
  row(2, 0, 1)[tk - 1] = 1e30f;
  fill(row(2, 0, 2), 0.0f);
  row(2, 0, 3)[tk - 1] = NAN;
  row(2, 1, 0)[tk - 1] = NAN;  // past the diagonal of causal query 0
  row(3, 1, 2)[0] = NAN;       // a masked key: still NaN
  for (float v : x) p.x.push_back(lab::from_float<T>(v));
  return p;
}

// Runs candidate `prep` once on problem p (x, y on the device) and checks y.
template <class T>
double run_and_check(const Prepared<T>& prep, const Problem<T>& p, T* x, T* y, const float* mask) {
  const size_t bytes = p.x.size() * sizeof(T);
  CHECK_CUDA(cudaMemcpy(x, p.x.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y, 0xff, bytes));  // NaN poison: an unwritten element fails the check
  prep.launch({x, y, mask, p.rows(), p.tk, p.tq, p.heads * p.tq, p.tk, 0, p.scale, p.causal}, nullptr);
  cudaError_t e = cudaGetLastError();  // the launch itself (its shared memory, its block size)
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {  // a trap (a stage that never lands) or a bad launch: name the candidate
    std::fprintf(stderr, "softmax_lab: candidate '%s' at Tk %lld: %s\n", prep.c->name, (long long)p.tk,
                 cudaGetErrorString(e));
    std::exit(1);
  }
  std::vector<T> out(p.x.size());
  CHECK_CUDA(cudaMemcpy(out.data(), y, bytes, cudaMemcpyDeviceToHost));
  return check_rows(p, out);
}

float* upload(const std::vector<float>& m) {
  if (m.empty()) return nullptr;
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, m.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(d, m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
bool run_size(const Options& o, int64_t B, int64_t H, int64_t Tn, int l2_bytes) {
  Problem<T> p{B, H, Tn, Tn};
  p.causal = o.causal;
  const int64_t rows = p.rows(), tk = Tn, n = rows * tk;
  const size_t bytes = size_t(n) * sizeof(T);
  // Input sets in rotation: together more than twice the L2.
  const int sets = int(std::clamp<int64_t>(2 * int64_t(l2_bytes) / int64_t(2 * bytes) + 1, 1, 16));
  std::vector<T*> x(sets), y(sets);
  std::mt19937_64 gen(1234 + n);
  std::normal_distribution<float> normal(0.f, 3.f);
  p.x.resize(n);
  for (int s = 0; s < sets; ++s) {
    for (T& v : p.x) v = lab::from_float<T>(normal(gen));
    CHECK_CUDA(cudaMalloc(&x[s], bytes));
    CHECK_CUDA(cudaMalloc(&y[s], bytes));
    CHECK_CUDA(cudaMemcpy(x[s], p.x.data(), bytes, cudaMemcpyHostToDevice));
  }
  if (o.mask) p.mask = padding_mask(B, tk);
  float* mask = upload(p.mask);
  const Problem<T> hostile = hostile_problem<T>(tk, o.causal, gen);
  float* hostile_mask = upload(hostile.mask);
  T *hostile_x = nullptr, *hostile_y = nullptr;
  CHECK_CUDA(cudaMalloc(&hostile_x, hostile.x.size() * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&hostile_y, hostile.x.size() * sizeof(T)));
  // The copy yardstick: reading and writing the same bytes as a forward.
  const double copy_ms =
      std::min(lab::median_ms(o.warmup, o.iters, sets,
                              [&](int s) { CHECK_CUDA(cudaMemcpyAsync(y[s], x[s], bytes, cudaMemcpyDeviceToDevice)); }),
               lab::median_ms(o.warmup, o.iters, sets, [&](int s) {
                 lab::copy_kernel<<<1024, 512>>>(reinterpret_cast<const uint4*>(x[s]), reinterpret_cast<uint4*>(y[s]),
                                                 int64_t(bytes / 16));
               }));
  const double moved = 2.0 * double(bytes);                          // the mask (B x Tk floats) is left out: < 0.1%
  const double bound = std::is_same_v<T, float> ? 1e-5 : 1.0 / 128;  // f32 rounding; one bf16 ulp
  std::printf("%-5s (%lld, %lld, %lld)%s%s: best copy %.0f GB/s\n", std::is_same_v<T, float> ? "f32" : "bf16",
              (long long)B, (long long)H, (long long)Tn, o.mask ? " mask" : "", o.causal ? " causal" : "",
              moved / copy_ms / 1e6);
  bool ok = true;
  int best = -1;
  double best_ms = 0;
  for (int c = 0; c < kConfigCount; ++c) {
    const Config& cfg = kConfigs[c];
    if (cfg.production == kNo && std::string(cfg.name).find(o.only) == std::string::npos) continue;
    const Prepared<T> prep = prepare<T>(cfg, rows, tk);
    const char star = runs_in_production<T>(cfg, tk, o.causal, o.mask) ? '*' : ' ';
    if (!prep.applies()) {
      std::printf("  %c %-38s %s\n", star, cfg.name, prep.note().c_str());
      continue;
    }
    // The timed problem's last set (p.x holds its x), then the hostile rows.
    const double e = std::max(run_and_check(prep, p, x[sets - 1], y[sets - 1], mask),
                              run_and_check(prep, hostile, hostile_x, hostile_y, hostile_mask));
    const bool pass = e <= bound;
    ok &= pass;
    const double ms = lab::median_ms(o.warmup, o.iters, sets, [&](int s) {
      prep.launch({x[s], y[s], mask, rows, tk, Tn, H * Tn, tk, 0, p.scale, o.causal}, nullptr);
    });
    if (pass && (best < 0 || ms < best_ms)) best = c, best_ms = ms;
    std::printf("  %c %-38s %8.1f us %7.0f GB/s %5.1f%% of copy  max rel err %.2e %s  %s\n", star, cfg.name, ms * 1e3,
                moved / ms / 1e6, 100 * copy_ms / ms, e, pass ? "ok" : "FAILED", prep.note().c_str());
  }
  if (best >= 0)
    std::printf("  winner: %s (%.1f%% of copy)%s\n", kConfigs[best].name, 100 * copy_ms / best_ms,
                runs_in_production<T>(kConfigs[best], tk, o.causal, o.mask) ? " (production)" : "");
  for (int s = 0; s < sets; ++s) {
    CHECK_CUDA(cudaFree(x[s]));
    CHECK_CUDA(cudaFree(y[s]));
  }
  CHECK_CUDA(cudaFree(mask));
  CHECK_CUDA(cudaFree(hostile_mask));
  CHECK_CUDA(cudaFree(hostile_x));
  CHECK_CUDA(cudaFree(hostile_y));
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
  std::printf("softmax_lab on %s (sm_%d%d, L2 %d MiB); * = production (cuda/softmax.cu: staged where it applies, the "
              "mask kept from Tk %lld, else kVectorForward)\n",
              prop.name, prop.major, prop.minor, l2 >> 20, (long long)hg::gpu::kStagedKeptMaskMinTk);
  bool ok = true;
  for (const std::string& d : o.dtypes)
    for (size_t i = 0; i < o.t.size(); ++i)
      ok &= d == "f32" ? run_size<float>(o, o.b[i], o.h[i], o.t[i], l2) : run_size<bf16>(o, o.b[i], o.h[i], o.t[i], l2);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a configuration exceeded its error bound\n");
  return ok ? 0 : 1;
}
