// sm_90a instruction wrappers shared by the wgmma attention forward and
// backward (cuda/attention_wgmma_kernel.cuh, _backward_kernel.cuh) and the
// attention lab's Hopper candidates (bench/lab/attention_lab_wgmma*.cuh):
// mbarriers, TMA tile loads and a producer's ring of them, wgmma with its
// shared-memory descriptors and accumulator layout. Only an sm_90a
// device compile sees them (wgmma and the tensor-map copies exist nowhere
// else); the includer tests HG_SM90A_DEVICE before using them.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only)

#include <cstdint>

#include "cuda/bulk_stage.cuh"  // shared_address

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HG_SM90A_DEVICE 1
#else
#define HG_SM90A_DEVICE 0
#endif

namespace hg::gpu::sm90 {
// Set by a barrier_wait<false> that gave up; each .cu has its own (internal
// linkage), which its host code reads after a launch.
static __device__ unsigned int wait_timed_out = 0;

// A block of two consumer warpgroups and a producer warpgroup (384
// threads, one a SM) that moves registers (registers_decrease /
// registers_increase, below): the register file (65536) gives 168 a thread
// in steps of 8; the producer keeps 24 and the consumers split the rest.
constexpr int kSplitProducerRegisters = 24;
constexpr int kSplitConsumerRegisters = 240;
static_assert(128 * kSplitProducerRegisters + 256 * kSplitConsumerRegisters <= 384 * (65536 / 384 / 8 * 8));
}  // namespace hg::gpu::sm90

#if HG_SM90A_DEVICE
namespace hg::gpu::sm90 {

__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
// Waits for the phase of `parity`. A phase that never completes (a wrong
// byte count, a lost copy or arrival) traps after two seconds, so the call
// fails with a launch error instead of hanging; the clock is read once per
// 1024 polls. kTrap false: the thread sets wait_timed_out and exits instead,
// for code after registers_increase: a trap there makes ptxas (nvcc 13.0)
// size that code to the launch bound again, and it spills.
template <bool kTrap = true>
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  uint64_t start = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
    if (!done && polls % 1024 == 1023) {
      const uint64_t now = global_ns();
      if (start == 0) start = now;
      else if (now - start > 2000000000ull) {
        if constexpr (kTrap) {
          __trap();
        } else {
          wait_timed_out = 1;
          asm volatile("exit;");
        }
      }
    }
  }
}

// A block's barriers: `once` for what is staged once (one arrival: the
// producer's expect_tx), then st "full" ones (the same, plus
// `extra_fill_arrivals` from threads that fill a stage by plain stores) and
// st "empty" ones (every thread of `consumers` warpgroups arrives). The
// whole block calls it.
__device__ __forceinline__ void init_barriers(uint64_t* once, uint64_t* full, uint64_t* empty, int st, int consumers,
                                              int extra_fill_arrivals = 0) {
  if (threadIdx.x == 0) {
    barrier_init(once, 1);
    for (int s = 0; s < st; ++s)
      barrier_init(full + s, 1 + extra_fill_arrivals), barrier_init(empty + s, 128 * consumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// One TMA box of a 4-D map at coordinates {c0 (column), c1 (row), c2 (head),
// c3 (batch)} into shared `dst`, counted against `bar`'s expected bytes
// (a box past the tensor's end still counts its full size: the hardware
// writes zeros there).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar))
      : "memory");
}

// Rows row0 .. row0 + rows - 1 of one head of two bf16 operands [..][DH]
// through their maps (boxes of `rows` x 64 columns, 128-byte swizzle): DH /
// 64 boxes each, `rows` 128-byte rows apart, at dst1 and dst2, counted
// against `bar`.
template <int DH>
__device__ __forceinline__ void tma_load_rows_pair(uint32_t dst1, const CUtensorMap* map1, uint32_t dst2,
                                                   const CUtensorMap* map2, int rows, int row0, int head, int batch,
                                                   uint64_t* bar) {
  for (int c = 0; c < DH / 64; ++c) {
    tma_load(dst1 + c * rows * 128, map1, c * 64, row0, head, batch, bar);
    tma_load(dst2 + c * rows * 128, map2, c * 64, row0, head, batch, bar);
  }
}

// Fill i of a ring of ST stages goes to stage i % ST; before a producer
// makes it, the fill that stage held ST fills ago must have been read (its
// "empty" barrier's phase).
template <int ST>
__device__ __forceinline__ void wait_stage_free(uint64_t* empty, int i) {
  if (i >= ST) barrier_wait(empty + i % ST, uint32_t((i / ST - 1) & 1));
}

// After `count` fills: until the consumers have read the last of them. A
// trapping wait, for blocks whose consumers' waits exit instead
// (barrier_wait<false>): a lost stage becomes a launch error here.
template <int ST>
__device__ __forceinline__ void wait_ring_read(uint64_t* empty, int count) {
  for (int i = max(count, ST); i < count + ST; ++i)  // each i >= ST: wait_stage_free without its test
    barrier_wait(empty + i % ST, uint32_t((i / ST - 1) & 1));
}

// One producer thread: tiles first .. first + count - 1 of KB rows of two
// operands into a ring of ST stages at ring_at (a stage: map1's tile, then
// map2's, KB * DH * 2 bytes each). A stage is refilled once its `empty`
// barrier says its last tiles were read; its `full` barrier expects the
// stage's bytes.
template <int DH, int KB, int ST>
__device__ __forceinline__ void load_tile_pairs(const CUtensorMap* map1, const CUtensorMap* map2, uint32_t ring_at,
                                                int first, int count, int head, int batch, uint64_t* full,
                                                uint64_t* empty) {
  constexpr uint32_t kTileBytes = KB * DH * 2;
  for (int i = 0; i < count; ++i) {
    const int s = i % ST;
    wait_stage_free<ST>(empty, i);
    stage_expect(full + s, 2 * kTileBytes);
    const uint32_t at = ring_at + s * 2 * kTileBytes;
    tma_load_rows_pair<DH>(at, map1, at + kTileBytes, map2, KB, (first + i) * KB, head, batch, full + s);
  }
}

// Moves registers between a block's warpgroups (every thread of the
// warpgroup runs it): a producer gives back what it does not need so that
// the consumers hold more than the launch bound's share. ptxas sizes the
// code after it to N only where it sits inside the branch of that
// warpgroup's role; issued before the branch, the consumer code spills.
template <int N>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// Transposes an 8 x 8 matrix of bf16 held as mma fragments across a warp:
// lane 4 g + t gives row g, columns (2 t, 2 t + 1) and gets back row g of
// the transpose (columns 2 t, 2 t + 1 of it are rows 2 t, 2 t + 1 of the
// input), the lower column in the low half either way.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>  // until at most N committed groups are pending
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from reading an accumulator before wgmma_wait_all or
// reusing an A register while a wgmma may still read it.
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
template <int N>
__device__ __forceinline__ void fence_operands(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(x[i]);
}

// Shared memory matrix descriptors (PTX ISA "Matrix Descriptor Format";
// CUTLASS's GmmaDescriptor): bits 0-13 start address >> 4, 16-29 leading
// byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset (0: every
// box is 1024-byte aligned), 62-63 layout (1 = 128-byte swizzle).
//
// K-major (q, k: the reduced dimension contiguous, rows of 64 bf16 = 128
// bytes): 8-row groups 1024 bytes apart (stride offset); the leading offset
// is unused with a swizzle (1 by convention). A k16 step moves the start 32
// bytes along the row (the hardware applies the swizzle to the final
// address), a new box every 4 steps.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// MN-major (v as the B of p v: N = the head dim contiguous, K = the keys as
// rows of 128 bytes): CUTLASS's canonical SW128 MN-major layout
// ((8 x 16 B, n), (8, k)) : ((1, LBO), (128 B, SBO)), i.e. 64 head-dim
// columns per 128-byte row, the next 64 columns `lbo` bytes on (the next
// box), and 8-key groups 1024 bytes apart (stride offset). A k16 step is 16
// key rows: 2048 bytes.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t lbo) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// The accumulator of wgmma m64nNk16 (CUTLASS CLayout_64xN): thread
// 32 w + 4 g + t (warp w of the warpgroup, g = lane / 4, t = lane % 4) holds
// d[i], i < N / 2, at row 16 w + g + 8 ((i >> 1) & 1), column
// 8 (i >> 2) + 2 t + (i & 1): mma.sync's m16n8 C fragment, one per 8
// columns, warp w owning rows 16 w .. 16 w + 15.
// The register A of m64nNk16 with 16-bit inputs (CUTLASS ALayout_64x16, the
// same layout as CLayout_64x16): a[r] packs columns (2 t, 2 t + 1) + 8 (r >> 1)
// of row g + 8 (r & 1), the lower column in the low half. So columns
// 16 kk .. 16 kk + 15 of an accumulator are A fragment kk as they stand:
// a[r] = pack(d[8 kk + 2 r], d[8 kk + 2 r + 1]).
__device__ __forceinline__ int acc_row(int i) { return 8 * ((i >> 1) & 1); }      // + 16 w + g
__device__ __forceinline__ int acc_col(int i) { return 8 * (i >> 2) + (i & 1); }  // + 2 t

// f(row, i) for each pair of elements (i, i + 1) of an m64nN accumulator
// in a thread's rows row0 and row0 + 8 (row0 = 16 w + g of its tile; those
// from `rows` on skipped): columns 2 t + acc_col(i) and the next, as one
// 4-byte store of a bf16 pair takes them.
template <int N, class F>
__device__ __forceinline__ void for_acc_pairs(int row0, int rows, F&& f) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int i = 2 * h; i < N / 2; i += 4) f(row, i);
  }
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N], N = 32, 64, 128: A, B from shared
// memory (K-major descriptors). accumulate == 0 overwrites D.
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
               "%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 64] += A[64 x 16] * B[16 x 64]: A from registers (the accumulator
// layout, bf16 pairs), B from shared memory with its N dimension contiguous
// (imm-trans-b 1: the MN-major descriptor). accumulate == 0 overwrites D.
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
               "%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
               "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
               "53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] += A[64 x 16] * B[16 x 128]: A from registers (the accumulator
// layout, bf16 pairs), B from shared memory with its N dimension contiguous
// (imm-trans-b 1: the MN-major descriptor). accumulate == 0 overwrites D.
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
               "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
               "53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

}  // namespace hg::gpu::sm90
#endif  // HG_SM90A_DEVICE
