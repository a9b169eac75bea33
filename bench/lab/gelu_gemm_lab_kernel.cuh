#pragma once
// The GELU backward GEMM on sm_90a, the lab's candidate (not in the
// library: bench/lab/findings.md, "GEMM"): the input gradient of a Linear
// that feeds on gelu(pre), out = (dy W) * gelu'(pre), rounded once to bf16,
// with column sums of the rounded out over each 64 rows (the producing
// Linear's bias gradient). The library runs cuBLASLt's DGELU epilogue and
// a column-sum pass instead (cuda/gemm_lt.cu).
//
// A persistent block a SM walks output tiles of 128 x 256 (k steps of 64
// need 85 flops a byte of L2 traffic, where 128 x 128 tiles needed 64 and
// stopped near 350 TFLOP/s). At GPT-2's shapes the epilogue's bytes (pre
// in, out back) take about half the products' time at copy speed, so each
// warp has one job and the tensor cores wait only for the multiply that
// frees the accumulators:
//   - two MMA warpgroups of 64 rows each (one m64n256 accumulator a
//     thread, 128 floats): k steps from a ring of 3 stages of 48 KB (dy's
//     128 x 64 tile K-major, W's 64 x 256 tile N-contiguous: wgmma's
//     transposed B), then out = acc * slope over the slopes in the tile
//     buffer (each thread reads and writes the same pairs);
//   - three slope warps: pre's tile lands in the tile buffer by TMA and
//     becomes gelu'(pre) in place, fp16 (11 bits: more than tanh.approx's
//     own 2^-11), while the products run; once out is written they sum the
//     columns, and one thread stores the tile by TMA and loads the next
//     pre there as soon as the store has read it;
//   - a producer warp, one thread of which fills the ring.
// (wgmma m64n256 needs more than the 128 registers a thread of four
// warpgroups would have, so the slope and producer warps share one.)
// Measured level with cuBLASLt's DGELU plus the column-sum pass, not ahead
// of it; the lab's findings have the versions tried and where the time goes.
#include <cuda.h>  // CUtensorMap (a type only)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bulk_stage.cuh"
#include "cuda/wgmma.cuh"

namespace gelu_gemm_lab {

using bf16 = __nv_bfloat16;

constexpr int kRows = 128;    // outputs a tile: two MMA warpgroups of 64 rows
constexpr int kCols = 256;    // and 256 columns (one m64n256 accumulator a thread)
constexpr int kDepth = 64;    // a k step: one 128-byte swizzled row of dy and of W
constexpr int kBox = 64;      // columns of a TMA box (128 bytes, the swizzle's span)
constexpr int kSumRows = 64;  // rows of out behind one row of column sums
constexpr int kStages = 3;
constexpr int kMma = 2;                     // MMA warpgroups 0 and 1
constexpr int kSlopeThreads = 96;           // then the slope warps
constexpr int kThreads = 128 * kMma + 128;  // and the producer warp

struct Plan {
  static constexpr int kABytes = kRows * kDepth * 2;  // dy's tile: one box of 128 rows
  static constexpr int kBBytes = kDepth * kCols * 2;  // W's tile: four boxes of 64 k rows
  static constexpr int kBoxBytes = 64 * kBox * 2;     // one box of 64 rows
  static constexpr int kHalfBytes = 64 * kCols * 2;   // an MMA warpgroup's rows of the tile: four boxes
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBufOffset = kStages * kStageBytes;  // the tile buffer: pre, slopes, out
  static constexpr int kBarOffset = kBufOffset + kMma * kHalfBytes;
  static constexpr size_t kSmem = size_t(kBarOffset) + (2 * kStages + 3) * 8 + 1024;  // + the base's alignment
};
constexpr int kBufChunks = kMma * Plan::kHalfBytes / 16;  // 16-byte chunks of the tile buffer

struct Args {
  float* col_sums;  // [ceil(m / kSumRows)][n]; null: none
  int m, n, k;
};

// What a launch computes: everything, or (timing only: out is then not
// the GELU backward) the same copies and products with parts left out, to
// tell what each part of the epilogue costs. The products always run: a
// variant whose accumulators nothing reads would lose its wgmma
// instructions to ptxas.
enum class Parts {
  kAll,
  kNoSlopes,    // pre is not turned into gelu' (the multiply reads pre's bits as fp16)
  kNoEpilogue,  // the slopes are made, but no multiply, column sums or out written
  kCopiesOnly,  // neither: the products, pre's loads and the stores of the untouched buffer
};
constexpr bool makes_slopes(Parts p) { return p == Parts::kAll || p == Parts::kNoEpilogue; }
constexpr bool has_epilogue(Parts p) { return p == Parts::kAll || p == Parts::kNoSlopes; }

#if HG_SM90A_DEVICE
using namespace hg::gpu;        // shared_address, stage_expect: cuda/bulk_stage.cuh
using namespace hg::gpu::sm90;  // the instructions: cuda/wgmma.cuh

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256]: A from shared memory (K-major
// descriptor), B from shared memory with its N dimension contiguous
// (imm-trans-b 1: the MN-major descriptor). accumulate == 0 overwrites D.
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
               "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
               "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
               "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
               "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
               "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
               "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                 "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                 "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                 "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
                 "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
                 "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),
                 "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
                 "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(a), "l"(b), "r"(accumulate));
}

// tanh.approx.f32: one instruction, relative error under 2^-10.98 (PTX ISA).
__device__ __forceinline__ float tanh_approx(float v) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(v));
  return t;
}
// d gelu / dx (tanh form, as cuda/gelu.cuh's gelu_slope) with tanh.approx.
__device__ __forceinline__ float gelu_slope_approx(float x) {
  constexpr float c = 0.7978845608028654f, a = 0.044715f;
  const float t = tanh_approx(c * (x + a * x * x * x)), sech2 = 1.f - t * t;
  // Far in the tails sech2 is exactly 0 while x^2 may overflow: 0 * inf would be NaN.
  if (sech2 == 0.f) return 0.5f * (1.f + t);
  return 0.5f * (1.f + t) + 0.5f * x * sech2 * c * (1.f + 3.f * a * x * x);
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, uint32_t src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}

// The pair at row r (0..63) of a half, columns c and c + 1 (c even): box
// c / 64, 16-byte chunk (c % 64) / 8 of the row, which the 128-byte swizzle
// moves to chunk ((c % 64) / 8) ^ (r % 8). A warp's eight rows land on all
// 32 banks.
__device__ __forceinline__ uint32_t* half_pair(unsigned char* half, int r, int c) {
  const int chunk = ((c % kBox) / 8) ^ (r % 8);
  return reinterpret_cast<uint32_t*>(half + (c / kBox) * Plan::kBoxBytes + r * 128 + chunk * 16 + (c % 8) * 2);
}

// Two bf16 pre-activations to their fp16 gelu' (tanh.approx), and eight.
__device__ __forceinline__ uint32_t gelu_slopes_f16(uint32_t pre) {
  const float2 x =
      __bfloat1622float2(__halves2bfloat162(__ushort_as_bfloat16(pre & 0xFFFF), __ushort_as_bfloat16(pre >> 16)));
  const __half2 d = __floats2half2_rn(gelu_slope_approx(x.x), gelu_slope_approx(x.y));
  return uint32_t(__half_as_ushort(__low2half(d))) | uint32_t(__half_as_ushort(__high2half(d))) << 16;
}
__device__ __forceinline__ uint4 gelu_slopes_f16(uint4 pre) {
  return {gelu_slopes_f16(pre.x), gelu_slopes_f16(pre.y), gelu_slopes_f16(pre.z), gelu_slopes_f16(pre.w)};
}
#endif  // HG_SM90A_DEVICE

// amap: dy [m][k] in boxes of 128 rows; bmap: W [k][n], pmap: pre [m][n]
// and omap: out [m][n] in boxes of 64 rows. Tiles in row-major order of
// (m / 128, n / 256), block b taking tiles b, b + gridDim.x, ...
template <Parts kParts = Parts::kAll>
__global__ void __launch_bounds__(kThreads, 1)
    gelu_backward_gemm_kernel(const __grid_constant__ CUtensorMap amap, const __grid_constant__ CUtensorMap bmap,
                              const __grid_constant__ CUtensorMap pmap, const __grid_constant__ CUtensorMap omap,
                              Args g) {
#if HG_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = (shared_address(raw) + 1023u) & ~1023u;
  unsigned char* at_base = raw + (base - shared_address(raw));
  unsigned char* buf = at_base + Plan::kBufOffset;
  uint64_t* full = reinterpret_cast<uint64_t*>(at_base + Plan::kBarOffset);
  uint64_t *empty = full + kStages, *pre_full = empty + kStages, *slopes_ready = pre_full + 1,
           *out_ready = slopes_ready + 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) barrier_init(full + s, 1), barrier_init(empty + s, 128 * kMma);
    barrier_init(pre_full, 1), barrier_init(slopes_ready, kSlopeThreads), barrier_init(out_ready, 128 * kMma);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int steps = (g.k + kDepth - 1) / kDepth;
  const int tiles_n = (g.n + kCols - 1) / kCols, tiles = ((g.m + kRows - 1) / kRows) * tiles_n;
  const int group = threadIdx.x / 128, ct = threadIdx.x % 128;
  const bool elected = ct == 0;

  if (threadIdx.x >= 128 * kMma + kSlopeThreads) {  // the producer warp: one thread fills the ring
    if (threadIdx.x != 128 * kMma + kSlopeThreads) return;
    int f = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int m0 = (tile / tiles_n) * kRows, n0 = (tile % tiles_n) * kCols;
      for (int i = 0; i < steps; ++i, ++f) {
        const int s = f % kStages;
        wait_stage_free<kStages>(empty, f);
        stage_expect(full + s, Plan::kStageBytes);
        const uint32_t at = base + s * Plan::kStageBytes;
        tma_load_2d(at, &amap, i * kDepth, m0, full + s);
        for (int b = 0; b < kCols / kBox; ++b)
          tma_load_2d(at + Plan::kABytes + b * Plan::kBoxBytes, &bmap, n0 + b * kBox, i * kDepth, full + s);
      }
    }
    return;
  }

  if (group == kMma) {                         // the slope warps
    auto tile_io = [&](int tile, bool load) {  // one thread: the tile buffer to out, or pre into it
      const int m0 = (tile / tiles_n) * kRows, n0 = (tile % tiles_n) * kCols;
      if (load) stage_expect(pre_full, kMma * Plan::kHalfBytes);
      for (int h = 0; h < kMma; ++h)
        for (int b = 0; b < kCols / kBox; ++b) {
          const uint32_t at = base + Plan::kBufOffset + h * Plan::kHalfBytes + b * Plan::kBoxBytes;
          if (load) tma_load_2d(at, &pmap, n0 + b * kBox, m0 + 64 * h, pre_full);
          else if (m0 + 64 * h < g.m) tma_store_2d(&omap, n0 + b * kBox, m0 + 64 * h, at);
        }
      if (!load) asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    };
    if (elected && blockIdx.x < tiles) tile_io(blockIdx.x, true);
    int round = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++round) {
      const int m0 = (tile / tiles_n) * kRows, n0 = (tile % tiles_n) * kCols;
      barrier_wait(pre_full, uint32_t(round & 1));
#pragma unroll 4
      for (int j = ct; j < kBufChunks; j += kSlopeThreads) {
        uint4* chunk = reinterpret_cast<uint4*>(buf) + j;
        if constexpr (makes_slopes(kParts)) *chunk = gelu_slopes_f16(*chunk);
      }
      barrier_arrive(slopes_ready);
      barrier_wait(out_ready, uint32_t(round & 1));
      if (elected) tile_io(tile, false);
      // Column sums of out as stored: a thread takes columns 2 c and 2 c + 1
      // of a half, its 64 rows in order.
      if (has_epilogue(kParts) && g.col_sums != nullptr)
        for (int job = ct; job < kMma * kCols / 2; job += kSlopeThreads) {
          const int h = job / (kCols / 2), c = 2 * (job % (kCols / 2));
          if (m0 + 64 * h >= g.m || n0 + c >= g.n) continue;
          unsigned char* half = buf + h * Plan::kHalfBytes;
          float s0 = 0.f, s1 = 0.f;
#pragma unroll 8
          for (int r = 0; r < 64; ++r) {
            const __nv_bfloat162 o = *reinterpret_cast<const __nv_bfloat162*>(half_pair(half, r, c));
            s0 += __low2float(o), s1 += __high2float(o);
          }
          float* sums = g.col_sums + int64_t((m0 + 64 * h) / kSumRows) * g.n + n0 + c;
          sums[0] = s0, sums[1] = s1;
        }
      asm volatile("bar.sync 1, %0;" ::"n"(kSlopeThreads) : "memory");  // every sum read
      if (elected && tile + int(gridDim.x) < tiles) {
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the store has read the buffer
        tile_io(tile + gridDim.x, true);
      }
    }
    if (elected) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the last stores done
    return;
  }

  // MMA warpgroup `group`: rows m0 + 64 group .. + 63 of each tile; this
  // thread's rows 16 w + lane / 4 and + 8 of them, columns 8 j + 2 t (+ 1).
  const int w = ct / 32, lane = threadIdx.x % 32, t = lane % 4, r0 = 16 * w + lane / 4;
  unsigned char* half = buf + group * Plan::kHalfBytes;
  float acc[kCols / 2];
  int f = 0, round = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, f += steps, ++round) {
    for (int i = 0; i < steps; ++i) {
      const int s = (f + i) % kStages;
      const uint32_t a_at = base + s * Plan::kStageBytes + 64 * group * 128;  // this warpgroup's rows
      const uint32_t b_at = base + s * Plan::kStageBytes + Plan::kABytes;
      barrier_wait(full + s, uint32_t(((f + i) / kStages) & 1));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kDepth / 16; ++kk)  // k16 steps: 32 bytes along dy's rows, 16 rows of W's boxes
        wgmma_ss_mn(acc, desc_k_major(a_at + kk * 32), desc_mn_major(b_at + kk * 16 * 128, Plan::kBoxBytes),
                    i > 0 || kk > 0);
      wgmma_commit();
      wgmma_wait<1>();  // step i - 1's products are done: its stage may be refilled
      if (i > 0) barrier_arrive(empty + (f + i - 1) % kStages);
    }
    wgmma_wait<0>();
    fence_operands(acc);
    barrier_arrive(empty + (f + steps - 1) % kStages);
    if constexpr (!has_epilogue(kParts))
      if (g.k < 0) {  // never: without a read of the products ptxas drops the wgmma instructions
        float any = 0.f;
        for (int i = 0; i < kCols / 2; ++i) any += acc[i];
        g.col_sums[threadIdx.x] = any;
      }
    barrier_wait(slopes_ready, uint32_t(round & 1));
#pragma unroll
    for (int i = 0; i < kCols / 2 && has_epilogue(kParts); i += 2) {  // pairs: rows r0 (+ 8), columns 8 (i / 4) + 2 t
      uint32_t* p = half_pair(half, r0 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t);
      const float2 slope = __half22float2(*reinterpret_cast<const __half2*>(p));
      const __nv_bfloat162 o = __floats2bfloat162_rn(acc[i] * slope.x, acc[i + 1] * slope.y);
      *p = *reinterpret_cast<const uint32_t*>(&o);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes, seen by the TMA store
    barrier_arrive(out_ready);
  }
#endif  // HG_SM90A_DEVICE
}

}  // namespace gelu_gemm_lab
