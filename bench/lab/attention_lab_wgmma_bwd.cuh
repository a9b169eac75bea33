#pragma once
// BF16 flash attention backward on sm_90a's wgmma in the lab: the
// library's kernels (cuda/attention_wgmma_backward_kernel.cuh) launched on
// any of their streamed tiles, with dq beside dk/dv or after it, or with ds
// stored by dk/dv for the dq kernel (variant 20), beside the
// mma.sync backward of attention_lab_kernels.cuh. The first candidates
// (variants 11-13: a producer warp, dk/dv on 32-query tiles, no overlap
// inside a tile) lost to the mma.sync backward everywhere and are retired;
// their figures are in bench/lab/attention.md.
#include "bench/lab/attention_lab_wgmma.cuh"
#include "cuda/attention_wgmma_backward_kernel.cuh"

namespace hg::gpu::lab_wgmma {

// The library's backward kernels over bh = batch * heads heads of a after
// a.delta is written (the production delta kernel): dk/dv on KV-query tiles
// on `stream`, dq on KQ-key tiles on dq_stream (the caller forks and joins)
// or after dk/dv on `stream`; at the library's tiles and stages (SV in
// dk/dv, SQ in dq) by default. cudaErrorInvalidValue for what the kernels
// do not do (see forward).
template <int DH, int KV = attn::backward_tile(DH, true), int KQ = attn::backward_tile(DH, false),
          int SV = attn::kBackwardStages, int SQ = attn::kBackwardStages>
cudaError_t backward_production(const Args& a, int64_t bh, cudaStream_t stream = nullptr,
                                cudaStream_t dq_stream = nullptr) {
  if (a.mask != nullptr || !(a.scale_log2 > 0.f) || a.heads <= 0 || bh % a.heads != 0) return cudaErrorInvalidValue;
  constexpr int kRows = attn::kBackwardRows;
  const int64_t batch = bh / a.heads;
  CUtensorMap k_res, v_res, q_tile, do_tile, q_res, do_res, k_tile, v_tile;
  if (!make_map(&k_res, a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kRows) ||
      !make_map(&v_res, a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kRows) ||
      !make_map(&q_tile, a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, KV) ||
      !make_map(&do_tile, a.dout, DH, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, KV) ||
      !make_map(&q_res, a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, kRows) ||
      !make_map(&do_res, a.dout, DH, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, kRows) ||
      !make_map(&k_tile, a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, KQ) ||
      !make_map(&v_tile, a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, KQ))
    return cudaErrorInvalidValue;
  const auto dkdv = attn::backward_wgmma_kernel<DH, true, KV, SV>;
  const auto dq = attn::backward_wgmma_kernel<DH, false, KQ, SQ>;
  constexpr size_t kDkdvSmem = attn::BackwardPlan<DH, KV, SV>::kSmem, kDqSmem = attn::BackwardPlan<DH, KQ, SQ>::kSmem;
  cudaError_t e = cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDkdvSmem));
  if (e == cudaSuccess) e = cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDqSmem));
  if (e != cudaSuccess) return e;
  constexpr int kThreads = attn::kBackwardThreads;
  dkdv<<<dim3(unsigned((a.tk + kRows - 1) / kRows), unsigned(bh)), kThreads, kDkdvSmem, stream>>>(k_res, v_res, q_tile,
                                                                                                  do_tile, a, {});
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  dq<<<dim3(unsigned((a.tq + kRows - 1) / kRows), unsigned(bh)), kThreads, kDqSmem,
       dq_stream != nullptr ? dq_stream : stream>>>(q_res, do_res, k_tile, v_tile, a, {});
  return cudaGetLastError();
}

// The library's stored-ds backward over all bh heads in one launch each
// (the library cuts a call into chunks of heads, cuda/attention_dispatch.hpp):
// the dk/dv kernel writing ds into a scratch kept between calls, then
// dq_from_ds_kernel, on the default stream.
template <int DH>
cudaError_t backward_stored_ds(const Args& a, int64_t bh) {
  if (a.mask != nullptr || !(a.scale_log2 > 0.f) || a.heads <= 0 || bh % a.heads != 0) return cudaErrorInvalidValue;
  constexpr int kRows = attn::kBackwardRows, KV = attn::backward_tile(DH, true);
  const int64_t batch = bh / a.heads;
  CUtensorMap k_res, v_res, q_tile, do_tile;
  if (!make_map(&k_res, a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kRows) ||
      !make_map(&v_res, a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, kRows) ||
      !make_map(&q_tile, a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, KV) ||
      !make_map(&do_tile, a.dout, DH, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, KV))
    return cudaErrorInvalidValue;
  attn::DsTiles ds = attn::DsTiles::of(a);
  static void* scratch = nullptr;
  static size_t scratch_bytes = 0;
  const size_t bytes = size_t(ds.uint4s(bh)) * sizeof(uint4);
  cudaError_t e = cudaSuccess;
  if (bytes > scratch_bytes) {
    if (scratch != nullptr) cudaFree(scratch);
    if ((e = cudaMalloc(&scratch, bytes)) != cudaSuccess) return scratch = nullptr, scratch_bytes = 0, e;
    scratch_bytes = bytes;
  }
  ds.at = static_cast<uint4*>(scratch);
  const auto dkdv = attn::backward_wgmma_kernel<DH, true, KV, attn::kBackwardStages, false, true>;
  const auto dq = attn::dq_from_ds_kernel<DH>;
  constexpr size_t kDkdvSmem = attn::BackwardPlan<DH, KV>::kSmem, kDqSmem = attn::DqFromDsPlan<DH>::kSmem;
  e = cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDkdvSmem));
  if (e == cudaSuccess) e = cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDqSmem));
  if (e != cudaSuccess) return e;
  dkdv<<<dim3(unsigned(ds.key_tiles), unsigned(bh)), attn::kBackwardThreads, kDkdvSmem>>>(k_res, v_res, q_tile, do_tile,
                                                                                          a, ds);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  dq<<<dim3(unsigned(ds.query_groups / 8), unsigned(bh)), attn::kDqFromDsThreads, kDqSmem>>>(k_res, a, ds);
  return cudaGetLastError();
}

}  // namespace hg::gpu::lab_wgmma
