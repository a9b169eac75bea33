#pragma once
// For the fused attention kernels (the library's F32 ones, the attention
// lab's): the fixed order in which the key blocks of the one-kernel backward
// (the F32 kernels) add their dq partials into a query tile, without
// floating-point atomics. Why it is bitwise repeatable and why it cannot
// hang: docs/attention.md, "One kernel".
//
// Work items are (head, key tile) in ascending order, handed out by an
// integer ticket at block start (never by blockIdx: the order in which the
// hardware dispatches blocks is not promised). Key tile kt adds into query
// ("flush") tile f after key tiles 0 .. kt - 1 of the same head: each warp
// waits until the tile's counter shows every warp of kt - 1 arrived, adds its
// slice (plain loads and stores), and arrives (fence, integer add). Key tile 0
// writes instead of adding; the tile's last contributor writes dq itself.
// (The kernels sweep each block's query tiles from the last: causal blocks
// then reach a tile together instead of waiting for tile 0 to get there.)
// F32 adds in place into dq (each head has its own). With a ring of `ring`
// fp32 slots of Tq x dh (for kernels whose output type cannot hold partial
// sums), head bh sums in slot bh % ring and key tile 0 of head bh first
// waits until head bh - ring's last contributor has left the tile; ring =
// heads_total (no slots) never waits. Every wait is on a smaller ticket.
// Device code only, so that the attention lab runs these kernels' order
// too; the library allocates it with cuda/attention_dq_workspace.hpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_args.cuh"

namespace hg::gpu::attn {

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Release: the writes this thread saw before (its warp's, through
// __syncwarp) are visible at gpu scope before the counter moves.
__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

struct DqOrder {
  int* counters;                // [heads_total][flush_tiles] warp arrivals; zero at launch
  unsigned long long* ticket;   // next work item; zero at launch
  float* slots;                 // [ring][Tq][dh] fp32, or null (F32: dq accumulates in place)
  int ring;                     // slots (heads_total without slots: no head waits for another)
  int key_tiles, key_rows;      // key tiles per head and keys per tile
  int flush_tiles, flush_rows;  // query tiles per head and rows per tile (the unit of one wait)
  int warps;                    // warps per block: each arrives once per tile

  // The block's work item: (head, key tile) = divmod(ticket, key_tiles).
  // Taken by a running block, so every smaller ticket is held by a block
  // that is running or done.
  __device__ int64_t take_ticket() const {
    __shared__ unsigned long long item;
    if (threadIdx.x == 0) item = atomicAdd(ticket, 1ull);
    __syncthreads();
    return static_cast<int64_t>(item);
  }

  // First query tile key tile kt contributes to: the one holding its first
  // visible query. Key tile 0 starts at 0 so that every query tile has a
  // contributor (rows that see no key get dq = 0 from it).
  __device__ int first_flush(const Args& a, int kt) const {
    return kt == 0 ? 0 : a.first_query(kt * key_rows) / flush_rows;
  }

  // The last key tile that contributes to query tile f: the contributors are
  // exactly 0 .. last (first_flush grows with kt). Tile kt >= 1 contributes
  // iff kt * key_rows - (Tk - Tq) < (f + 1) * flush_rows.
  __device__ int last_contributor(const Args& a, int f) const {
    if (!a.causal) return key_tiles - 1;
    const int64_t x = int64_t(f + 1) * flush_rows + a.tk - a.tq;
    const int64_t last = x <= 0 ? 0 : (x - 1) / key_rows;
    return last < key_tiles - 1 ? static_cast<int>(last) : key_tiles - 1;
  }

  __device__ int* counter(int64_t bh, int f) const { return counters + bh * flush_tiles + f; }

  // Until this warp may touch query tile f of head bh as key tile kt (lane 0
  // spins, the warp then reads what the previous contributor wrote).
  __device__ void wait_turn(int64_t bh, int kt, int f, int last) const {
    if (threadIdx.x % 32 == 0) {
      const int* c = kt > 0 ? counter(bh, f) : bh >= ring ? counter(bh - ring, f) : nullptr;
      const int target = kt > 0 ? warps * kt : warps * (last + 1);
      if (c != nullptr)
        while (load_acquire(c) < target) __nanosleep(32);
    }
    __syncwarp();
  }

  // This warp's slice of query tile f is written.
  __device__ void arrive(int64_t bh, int f) const {
    __syncwarp();
    if (threadIdx.x % 32 == 0) add_release(counter(bh, f), 1);
  }
};

}  // namespace hg::gpu::attn
