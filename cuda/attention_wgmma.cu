// The BF16 flash attention forward and backward on sm_90a (wgmma + TMA):
// the library's launchers of the kernels in cuda/attention_wgmma_kernel.cuh
// and cuda/attention_wgmma_backward_kernel.cuh (which the attention lab runs
// too, as its forward variant 9 and backward variants 14 and 20). Only an sm_90a
// compile holds the device code (cuda/CMakeLists.txt builds this file for
// 90a where the build targets 90); elsewhere the kernel bodies are empty and
// wgmma_available() says no.
#include <cuda.h>  // CUtensorMap, CUresult (types only: the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/attention_tensor_map.cuh"
#include "cuda/attention_wgmma.cuh"
#include "cuda/attention_wgmma_backward_kernel.cuh"
#include "cuda/attention_wgmma_kernel.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"

namespace hg::gpu::attn {
namespace {

// The map of a bf16 operand (cuda/attention_tensor_map.cuh). The caller
// checked what TMA needs (16-byte aligned base and byte strides); a refusal
// is an error.
CUtensorMap make_map(const void* p, int dh, int rows, int heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                     int64_t batch_stride, int box_rows, const char* name, const char* op = "attention_forward") {
  CUtensorMap map;
  const CUresult r = encode_map(&map, p, dh, rows, heads, batch, row_stride, head_stride, batch_stride, box_rows);
  HG_CHECK(r == CUDA_SUCCESS, op, "cuTensorMapEncodeTiled refused ", name, " (error ", int(r), "; dh ", dh, ", rows ",
           rows, ", heads ", heads, ", batch ", batch, ", element strides ", row_stride, ", ", head_stride, ", ",
           batch_stride, ")");
  return map;
}

template <int DH, bool kMasked>
void launch(const Args& a, int64_t batch) {
  constexpr int keys = forward_keys<DH, kMasked>();
  const CUtensorMap qmap = make_map(a.q, DH, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, kRows, "q");
  const CUtensorMap kmap = make_map(a.k, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, keys, "k");
  const CUtensorMap vmap = make_map(a.v, DH, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, keys, "v");
  const auto kernel = forward_wgmma_kernel<DH, kMasked>;
  constexpr size_t smem = Plan<DH, kMasked>::kSmem;
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(unsigned((a.tq + kRows - 1) / kRows), unsigned(batch * a.heads));
  kernel<<<grid, forward_threads(kMasked), smem, stream()>>>(qmap, kmap, vmap, a);
  HG_CUDA_CHECK_LAUNCH("attention_forward_wgmma");
}

template <int DH>
void launch(const Args& a, int64_t batch) {
  if (a.mask != nullptr) launch<DH, true>(a, batch);
  else launch<DH, false>(a, batch);
}

// The backward's maps over the key rows (k, v), the query rows (q) and the
// output rows (do, at o's strides), in boxes of `box_rows` rows.
struct BackwardMaps {
  const Args& a;
  int64_t batch;
  int dh;
  static constexpr const char* kOp = "attention_backward";
  CUtensorMap keys(const void* p, int box_rows, const char* name) const {
    return make_map(p, dh, a.tk, a.heads, batch, a.kv_row, a.kv_head, a.kv_batch, box_rows, name, kOp);
  }
  CUtensorMap queries(const void* p, int box_rows, const char* name) const {
    return make_map(p, dh, a.tq, a.heads, batch, a.q_row, a.q_head, a.q_batch, box_rows, name, kOp);
  }
  CUtensorMap outputs(const void* p, int box_rows, const char* name) const {
    return make_map(p, dh, a.tq, a.heads, batch, a.o_row, a.o_head, a.o_batch, box_rows, name, kOp);
  }
};

// The backward after delta is written: the dk/dv kernel (k, v resident; q,
// do streamed) on stream(), the dq kernel (q, do resident; k, v streamed) on
// dq_stream; kMasked, the kernels that read a.mask.
template <int DH, bool kMasked>
void launch_backward(const Args& a, int64_t batch, cudaStream_t dq_stream) {
  const BackwardMaps m{a, batch, DH};
  constexpr int kQueryTile = backward_tile(DH, true), kKeyTile = backward_tile(DH, false);
  const CUtensorMap k_res = m.keys(a.k, kBackwardRows, "k"), v_res = m.keys(a.v, kBackwardRows, "v");
  const CUtensorMap q_tile = m.queries(a.q, kQueryTile, "q"), do_tile = m.outputs(a.dout, kQueryTile, "dout");
  const CUtensorMap q_res = m.queries(a.q, kBackwardRows, "q"), do_res = m.outputs(a.dout, kBackwardRows, "dout");
  const CUtensorMap k_tile = m.keys(a.k, kKeyTile, "k"), v_tile = m.keys(a.v, kKeyTile, "v");
  const auto dkdv = backward_wgmma_kernel<DH, true, kQueryTile, kBackwardStages, kMasked>;
  const auto dq = backward_wgmma_kernel<DH, false, kKeyTile, kBackwardStages, kMasked>;
  constexpr size_t kDkdvSmem = BackwardPlan<DH, kQueryTile>::kSmem, kDqSmem = BackwardPlan<DH, kKeyTile>::kSmem;
  allow_dynamic_smem(dkdv, kDkdvSmem);
  allow_dynamic_smem(dq, kDqSmem);
  const unsigned heads_total = unsigned(batch * a.heads);
  dkdv<<<dim3(unsigned((a.tk + kBackwardRows - 1) / kBackwardRows), heads_total), kBackwardThreads, kDkdvSmem,
         stream()>>>(k_res, v_res, q_tile, do_tile, a, DsTiles{});
  HG_CUDA_CHECK_LAUNCH("attention_backward_dkdv_wgmma");
  dq<<<dim3(unsigned((a.tq + kBackwardRows - 1) / kBackwardRows), heads_total), kBackwardThreads, kDqSmem, dq_stream>>>(
      q_res, do_res, k_tile, v_tile, a, DsTiles{});
  HG_CUDA_CHECK_LAUNCH("attention_backward_dq_wgmma");
}

// The backward that stores ds: per chunk of `heads_per_chunk` heads, the
// dk/dv kernel writing ds into the chunk's scratch, then dq from it. Chunks
// alternate between stream() and `side` with a scratch each (the second
// right after the first), so that one chunk's last blocks run beside the
// next chunk's first.
template <int DH, bool kMasked>
void launch_backward_stored_ds(const Args& a, int64_t batch, void* scratch, int64_t heads_per_chunk,
                               cudaStream_t side) {
  const BackwardMaps m{a, batch, DH};
  constexpr int kQueryTile = backward_tile(DH, true);
  const CUtensorMap k_res = m.keys(a.k, kBackwardRows, "k"), v_res = m.keys(a.v, kBackwardRows, "v");
  const CUtensorMap q_tile = m.queries(a.q, kQueryTile, "q"), do_tile = m.outputs(a.dout, kQueryTile, "dout");
  const auto dkdv = backward_wgmma_kernel<DH, true, kQueryTile, kBackwardStages, kMasked, true>;
  const auto dq = dq_from_ds_kernel<DH>;
  constexpr size_t kDkdvSmem = BackwardPlan<DH, kQueryTile>::kSmem, kDqSmem = DqFromDsPlan<DH>::kSmem;
  allow_dynamic_smem(dkdv, kDkdvSmem);
  allow_dynamic_smem(dq, kDqSmem);
  const int64_t heads_total = batch * a.heads;
  DsTiles ds = DsTiles::of(a);
  const int64_t chunk_uint4 = ds.uint4s(heads_per_chunk);
  for (int64_t h0 = 0, c = 0; h0 < heads_total; h0 += heads_per_chunk, ++c) {
    const unsigned heads = unsigned(std::min(heads_per_chunk, heads_total - h0));
    const cudaStream_t s = c % 2 == 0 ? stream() : side;
    ds.at = static_cast<uint4*>(scratch) + (c % 2) * chunk_uint4;
    ds.bh0 = h0;
    dkdv<<<dim3(unsigned(ds.key_tiles), heads), kBackwardThreads, kDkdvSmem, s>>>(k_res, v_res, q_tile, do_tile, a, ds);
    HG_CUDA_CHECK_LAUNCH("attention_backward_dkdv_wgmma (ds stored)");
    dq<<<dim3(unsigned(ds.query_groups / 8), heads), kDqFromDsThreads, kDqSmem, s>>>(k_res, a, ds);
    HG_CUDA_CHECK_LAUNCH("attention_backward_dq_from_ds_wgmma");
  }
}

template <int DH>
void launch_backward(const Args& a, int64_t batch, cudaStream_t dq_stream) {
  if (a.mask != nullptr) launch_backward<DH, true>(a, batch, dq_stream);
  else launch_backward<DH, false>(a, batch, dq_stream);
}

template <int DH>
void launch_backward_stored_ds(const Args& a, int64_t batch, void* scratch, int64_t heads_per_chunk,
                               cudaStream_t side) {
  if (a.mask != nullptr) launch_backward_stored_ds<DH, true>(a, batch, scratch, heads_per_chunk, side);
  else launch_backward_stored_ds<DH, false>(a, batch, scratch, heads_per_chunk, side);
}

}  // namespace

bool wgmma_available() {
#if defined(HG_WGMMA_BUILT)
  static const bool ok = compute_capability() == 90 && tensor_map_encoder() != nullptr;
  return ok;
#else
  return false;
#endif
}

void forward_wgmma(const Args& a, int64_t batch, int dh) {
  HG_CHECK(dh == 64 || dh == 128, "attention_forward", "the wgmma forward has head dims 64 and 128, not ", dh);
  if (dh == 64) launch<64>(a, batch);
  else launch<128>(a, batch);
}

void backward_wgmma(const Args& a, int64_t batch, int dh, cudaStream_t dq_stream) {
  HG_CHECK(dh == 64 || dh == 128, "attention_backward", "the wgmma backward has head dims 64 and 128, not ", dh);
  if (dh == 64) launch_backward<64>(a, batch, dq_stream);
  else launch_backward<128>(a, batch, dq_stream);
}

void backward_wgmma_stored_ds(const Args& a, int64_t batch, int dh, void* scratch, int64_t heads_per_chunk,
                              cudaStream_t side) {
  HG_CHECK(dh == 64 || dh == 128, "attention_backward", "the wgmma backward has head dims 64 and 128, not ", dh);
  HG_CHECK(scratch != nullptr && heads_per_chunk >= 1, "attention_backward", "no scratch for the stored ds");
  if (dh == 64) launch_backward_stored_ds<64>(a, batch, scratch, heads_per_chunk, side);
  else launch_backward_stored_ds<128>(a, batch, scratch, heads_per_chunk, side);
}

}  // namespace hg::gpu::attn
