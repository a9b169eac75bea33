#pragma once
// BF16 flash attention backward on sm_90a's wgmma: the lab candidate beside
// the mma.sync backward of attention_lab_kernels.cuh. Two kernels of one
// template after the production delta kernel (delta = rowsum(do . o)), as
// the production backward splits it:
//   dq:    per block of 64 NC queries, k, v tiles streamed:
//          s = q k^T, dp = do v^T, p from the forward's stats,
//          ds = p (dp - delta), dq += ds k;
//   dk/dv: per block of 64 NC keys, q, do tiles streamed:
//          s^T = k q^T, dp^T = v do^T, p^T, ds^T, dv += p^T do, dk += ds^T q.
// Every product is one of the forward's two forms: a resident operand
// (64 rows a consumer warpgroup) times a streamed tile transposed (both
// K-major in shared memory), or an accumulator turned A fragments times a
// streamed tile (MN-major). The scale multiplies dq and dk at the end.
// The producer warp stages the resident rows once and the streamed tiles in
// a ring of ST stages (TMA, 128-byte swizzle); the forward's stats and delta
// are read from global memory by the consumers. The library's kernel
// (cuda/attention_wgmma_backward_kernel.cuh: these candidates' register
// split, with the products of a tile overlapped) runs here as
// backward_production.
#include "bench/lab/attention_lab_wgmma.cuh"
#include "cuda/attention_wgmma_backward_kernel.cuh"

namespace hg::gpu::lab_wgmma {

template <int DH, int KB, int ST, int NC>
struct BackwardPlan {
  static constexpr int kRows = rows_of(NC);
  static constexpr int kResBytes = kRows * DH * 2;  // one resident operand
  static constexpr int kTileBytes = KB * DH * 2;    // one streamed operand of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kBarOffset = 2 * kResBytes + ST * kStageBytes;
  static constexpr size_t kSmem = size_t(kBarOffset) + (1 + 2 * ST) * 8 + 1024;
};

// kDkDv false: the dq kernel (resident a1 = q, a2 = do; streamed b1 = k,
// b2 = v). True: the dk/dv kernel (resident a1 = k, a2 = v; streamed b1 = q,
// b2 = do). x = a1 b1^T is s (or s^T), y = a2 b2^T is dp (or dp^T).
// kSplitN: the products with an MN-major tile in n64 halves (mma_mn).
// kRegisters > 0: a producer warpgroup that gives the consumers kRegisters a
// thread (threads_split, setmaxnreg); 0: a producer warp (threads_of).
template <int DH, int KB, int ST, int NC, bool kDkDv, bool kSplitN, int kRegisters = 0>
__global__ void __launch_bounds__(kRegisters > 0 ? threads_split(NC) : threads_of(NC), 1)
    backward_kernel(const __grid_constant__ CUtensorMap a1map, const __grid_constant__ CUtensorMap a2map,
                    const __grid_constant__ CUtensorMap b1map, const __grid_constant__ CUtensorMap b2map, Args a) {
  static_assert((KB == 32 || KB == 64) && (DH == 64 || DH == 128) && ST >= 2);
  static_assert(kRegisters == 0 || kRegisters == consumer_registers(NC));
#if HG_LAB_WGMMA
  using P = BackwardPlan<DH, KB, ST, NC>;
  constexpr int kRows = P::kRows;
  extern __shared__ __align__(1024) unsigned char raw[];
  const uint32_t base = aligned_base(raw);
  uint64_t* bars = barriers_of(raw, base + P::kBarOffset);
  uint64_t *res_full = bars, *full = bars + 1, *empty = bars + 1 + ST;
  const uint32_t a2_at = base + P::kResBytes, stages_at = base + 2 * P::kResBytes;

  const int64_t bh = blockIdx.y;
  // dq: causal blocks with the most keys (the last queries) first; dk/dv:
  // the first keys see the most queries, so the natural order.
  const int r0 = (a.causal && !kDkDv ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;
  const int r_rows = kDkDv ? a.tk : a.tq, s_rows = kDkDv ? a.tq : a.tk;  // resident and streamed extents
  // Streamed tiles first .. first + count - 1 (of KB rows).
  int first = 0, end = s_rows;
  if (!kDkDv) end = a.key_end(min(r0 + kRows, a.tq));
  if (kDkDv && a.causal) first = min(a.first_query(r0), a.tq) / KB;
  const int count = end > first * KB ? (end - first * KB + KB - 1) / KB : 0;
  const int64_t stat_base = bh * a.tq;  // stats and delta of query q at stat_base + q
  init_barriers(res_full, full, empty, ST, NC);

  if (threadIdx.x >= 128 * NC) {  // the producer warp (or warpgroup); one thread issues every copy
    if constexpr (kRegisters > 0) registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 128 * NC && count > 0) {
      const int head = int(bh % a.heads), batch = int(bh / a.heads);
      stage_expect(res_full, 2 * P::kResBytes);
      for (int c = 0; c < DH / kBoxCols; ++c) {
        tma_load(base + c * kRows * kSwizzleBytes, &a1map, c * kBoxCols, r0, head, batch, res_full);
        tma_load(a2_at + c * kRows * kSwizzleBytes, &a2map, c * kBoxCols, r0, head, batch, res_full);
      }
      for (int i = 0; i < count; ++i) {
        const int s = i % ST;
        if (i >= ST) barrier_wait(empty + s, uint32_t((i / ST - 1) & 1));
        stage_expect(full + s, P::kStageBytes);
        const uint32_t b1_at = stages_at + s * P::kStageBytes, b2_at = b1_at + P::kTileBytes;
        for (int c = 0; c < DH / kBoxCols; ++c) {
          tma_load(b1_at + c * KB * kSwizzleBytes, &b1map, c * kBoxCols, (first + i) * KB, head, batch, full + s);
          tma_load(b2_at + c * KB * kSwizzleBytes, &b2map, c * kBoxCols, (first + i) * KB, head, batch, full + s);
        }
      }
    }
    return;
  }

  if constexpr (kRegisters > 0) registers_increase<kRegisters>();
  // Consumer warpgroup cw: resident rows row0 .. row0 + 63; this thread's
  // rows my_row (+ 8 through acc_row), its streamed columns 2 t + acc_col.
  const int cw = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int row0 = r0 + 64 * cw, my_row = row0 + 16 * w + g;
  const float c = a.scale_log2;
  float acc1[DH / 2], acc2[kDkDv ? DH / 2 : 1];  // dq, or dk and dv
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) acc1[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (kDkDv ? DH / 2 : 1); ++i) acc2[i] = 0.f;
  // dq: the stats and delta of this thread's two query rows ({0, 0}, 0 past
  // Tq, where every p is 0 anyway).
  float2 row_stats[2] = {};
  float row_delta[2] = {};
  if constexpr (!kDkDv) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (my_row + 8 * h < a.tq)
        row_stats[h] = a.stats[stat_base + my_row + 8 * h], row_delta[h] = a.delta[stat_base + my_row + 8 * h];
  }
  if (count > 0) barrier_wait<kRegisters == 0>(res_full, 0);
  const uint32_t a1_wg = base + 64 * cw * kSwizzleBytes, a2_wg = a2_at + 64 * cw * kSwizzleBytes;
  for (int i = 0; i < count; ++i) {
    const int s = i % ST, n0 = (first + i) * KB;
    barrier_wait<kRegisters == 0>(full + s, uint32_t((i / ST) & 1));
    if (row0 >= r_rows) {  // a warpgroup past the resident rows only keeps the stage protocol
      barrier_arrive(empty + s);
      continue;
    }
    const uint32_t b1_at = stages_at + s * P::kStageBytes, b2_at = b1_at + P::kTileBytes;
    float x[KB / 2], y[KB / 2];
    // x = a1 b1^T and y = a2 b2^T.
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc) {
      const uint32_t step = (kc % 4) * 32;  // as in the forward
      wgmma_ss(x, desc_k_major(a1_wg + (kc / 4) * kRows * kSwizzleBytes + step),
               desc_k_major(b1_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
    }
#pragma unroll
    for (int kc = 0; kc < DH / 16; ++kc) {
      const uint32_t step = (kc % 4) * 32;
      wgmma_ss(y, desc_k_major(a2_wg + (kc / 4) * kRows * kSwizzleBytes + step),
               desc_k_major(b2_at + (kc / 4) * KB * kSwizzleBytes + step), kc > 0);
    }
    wgmma_commit();
    // Whether key k is seen by query q, and p from x at accumulator index
    // i_acc (0 where unseen) with the query's stats sq.
    auto seen = [&](int q, int k) { return q < a.tq && k < a.tk && !(a.causal && k > q + a.tk - a.tq); };
    auto p_of = [&](int i_acc, int q, int k, float2 sq) {
      return seen(q, k) ? attn::exp2_ftz(fmaf(x[i_acc], c, -sq.x)) * sq.y : 0.f;
    };
    uint32_t pp[kDkDv ? KB / 16 : 1][4], pd[KB / 16][4];
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < KB / 2; ++e) fence_operand(x[e]), fence_operand(y[e]);
      // p and ds in place of x and y, as A fragments: pp (dk/dv only) and pd.
#pragma unroll
    for (int j = 0; j < KB / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n0 + 8 * j + 2 * t + e;  // streamed row: a key (dq) or a query (dk/dv)
        float2 st = {};
        float dl = 0.f;
        if (kDkDv && col < a.tq) st = a.stats[stat_base + col], dl = a.delta[stat_base + col];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i_acc = 4 * j + 2 * h + e, row = my_row + 8 * h;
          const float p = kDkDv ? p_of(i_acc, col, row, st) : p_of(i_acc, row, col, row_stats[h]);
          x[i_acc] = p;
          y[i_acc] = p * (y[i_acc] - (kDkDv ? dl : row_delta[h]));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < KB / 2; e += 2) {
      if constexpr (kDkDv) pp[e / 8][(e % 8) / 2] = attn::pack(x[e], x[e + 1]);
      pd[e / 8][(e % 8) / 2] = attn::pack(y[e], y[e + 1]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk) {
      // dq += ds k, or dk += ds^T q: the streamed b1 tile, MN-major.
      mma_mn<DH, KB, kSplitN>(acc1, pd[kk], b1_at, kk, 1);
      if constexpr (kDkDv)  // dv += p^T do
        mma_mn<DH, KB, kSplitN>(acc2, pp[kk], b2_at, kk, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < DH / 2; ++e) {
      fence_operand(acc1[e]);
      if constexpr (kDkDv) fence_operand(acc2[e]);
    }
#pragma unroll
    for (int kk = 0; kk < KB / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        fence_operand(pd[kk][r]);
        if constexpr (kDkDv) fence_operand(pp[kk][r]);
      }
    barrier_arrive(empty + s);
  }

  // dq (or dk) times the scale; rows past the resident extent unwritten.
  bf16* out1 = static_cast<bf16*>(kDkDv ? a.dk : a.dq) + (kDkDv ? a.kv_base(bh) : a.q_base(bh));
  bf16* out2 = static_cast<bf16*>(a.dv) + a.kv_base(bh);
  const int64_t ld = kDkDv ? a.kv_row : a.q_row;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = my_row + 8 * h;
    if (row >= r_rows) continue;
#pragma unroll
    for (int i = 2 * h; i < DH / 2; i += 4) {
      const int64_t at = int64_t(row) * ld + 2 * t + acc_col(i);
      *reinterpret_cast<uint32_t*>(out1 + at) = attn::pack(acc1[i] * a.scale, acc1[i + 1] * a.scale);
      if constexpr (kDkDv) *reinterpret_cast<uint32_t*>(out2 + at) = attn::pack(acc2[i], acc2[i + 1]);
    }
  }
#else
  __trap();
#endif
}

// The dk/dv kernel (KV query rows a tile, NCV resident warpgroups' rows) on
// `stream`, then the dq kernel (KQ key rows a tile, NCQ) on `dq_stream`, over
// bh = batch * heads heads of a after a.delta is written (the production
// delta kernel), each on its threads and shared memory.
// cudaErrorInvalidValue for what the kernels do not do (see forward).
template <int DH, int KV, int NCV, int KQ, int NCQ, class DkDv, class Dq>
cudaError_t launch_backward(DkDv dkdv, int dkdv_threads, size_t dkdv_smem, Dq dq, int dq_threads, size_t dq_smem,
                            const Args& a, int64_t bh, cudaStream_t stream, cudaStream_t dq_stream) {
  if (a.mask != nullptr || !(a.scale_log2 > 0.f) || a.heads <= 0 || bh % a.heads != 0) return cudaErrorInvalidValue;
  const int64_t batch = bh / a.heads;
  CUtensorMap k_res, v_res, q_tile, do_tile, q_res, do_res, k_tile, v_tile;
  if (!make_map(&k_res, a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, rows_of(NCV)) ||
      !make_map(&v_res, a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, rows_of(NCV)) ||
      !make_map(&q_tile, a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, KV) ||
      !make_map(&do_tile, a.dout, DH, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, KV) ||
      !make_map(&q_res, a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, rows_of(NCQ)) ||
      !make_map(&do_res, a.dout, DH, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, rows_of(NCQ)) ||
      !make_map(&k_tile, a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, KQ) ||
      !make_map(&v_tile, a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, KQ))
    return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dkdv_smem));
  if (e == cudaSuccess) e = cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq_smem));
  if (e != cudaSuccess) return e;
  dkdv<<<dim3(unsigned((a.tk + rows_of(NCV) - 1) / rows_of(NCV)), unsigned(bh)), dkdv_threads, dkdv_smem, stream>>>(
      k_res, v_res, q_tile, do_tile, a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  dq<<<dim3(unsigned((a.tq + rows_of(NCQ) - 1) / rows_of(NCQ)), unsigned(bh)), dq_threads, dq_smem, dq_stream>>>(
      q_res, do_res, k_tile, v_tile, a);
  return cudaGetLastError();
}

// The candidates (backward_kernel): kSplitRegisters both kernels with the
// register split.
template <int DH, int KV, int NCV, int KQ, int NCQ, bool kSplitN = false, bool kSplitRegisters = false>
cudaError_t backward(const Args& a, int64_t bh, cudaStream_t stream = nullptr) {
  constexpr int kStages = 2;
  constexpr int kRegsV = kSplitRegisters ? consumer_registers(NCV) : 0;
  constexpr int kRegsQ = kSplitRegisters ? consumer_registers(NCQ) : 0;
  return launch_backward<DH, KV, NCV, KQ, NCQ>(backward_kernel<DH, KV, kStages, NCV, true, kSplitN, kRegsV>,
                                               kSplitRegisters ? threads_split(NCV) : threads_of(NCV),
                                               BackwardPlan<DH, KV, kStages, NCV>::kSmem,
                                               backward_kernel<DH, KQ, kStages, NCQ, false, kSplitN, kRegsQ>,
                                               kSplitRegisters ? threads_split(NCQ) : threads_of(NCQ),
                                               BackwardPlan<DH, KQ, kStages, NCQ>::kSmem, a, bh, stream, stream);
}

// The library's backward kernels (cuda/attention_wgmma_backward_kernel.cuh)
// on KV-query tiles (dk/dv) and KQ-key tiles (dq); at the library's tiles
// by default. dq on dq_stream (the caller forks and joins), else after
// dk/dv on `stream`.
template <int DH, int KV = attn::backward_tile(DH, true), int KQ = attn::backward_tile(DH, false)>
cudaError_t backward_production(const Args& a, int64_t bh, cudaStream_t stream = nullptr,
                                cudaStream_t dq_stream = nullptr) {
  constexpr int kNc = attn::kBackwardConsumers;
  static_assert(rows_of(kNc) == attn::kBackwardRows);
  return launch_backward<DH, KV, kNc, KQ, kNc>(
      attn::backward_wgmma_kernel<DH, true, KV>, attn::kBackwardThreads, attn::BackwardPlan<DH, KV>::kSmem,
      attn::backward_wgmma_kernel<DH, false, KQ>, attn::kBackwardThreads, attn::BackwardPlan<DH, KQ>::kSmem, a, bh,
      stream, dq_stream != nullptr ? dq_stream : stream);
}

}  // namespace hg::gpu::lab_wgmma
