// Host side of the one-kernel attention backward's dq order
// (cuda/attention_dq_order.cuh): its workspace.
#include "cuda/attention_dq_workspace.hpp"

#include "core/error.hpp"
#include "cuda/cuda_check.hpp"

namespace hg::gpu::attn {

namespace {
int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }
}  // namespace

DqWorkspace dq_workspace(const Args& a, int64_t heads_total, int key_rows, int flush_rows, int warps, int ring,
                         int dh) {
  DqWorkspace w;
  DqOrder& o = w.order;
  o.key_rows = key_rows;
  o.key_tiles = static_cast<int>(ceil_div(a.tk, key_rows));
  o.flush_rows = flush_rows;
  o.flush_tiles = static_cast<int>(ceil_div(a.tq, flush_rows));
  o.warps = warps;
  o.ring = ring > 0 ? ring : static_cast<int>(heads_total);  // 0: no head waits for another
  // In 4-byte words: the ticket (2), the counters, then the slots 16-byte aligned.
  const int64_t head_words = 2 + heads_total * o.flush_tiles;
  const int64_t slots_at = ceil_div(head_words, 4) * 4;
  const int64_t slot_words = ring > 0 ? int64_t(ring) * a.tq * dh : 0;
  w.memory = Tensor::empty({slots_at + slot_words}, DType::F32, Device::CUDA);
  auto* base = static_cast<int*>(w.memory.raw_data());
  HG_CUDA_CHECK(cudaMemsetAsync(base, 0, static_cast<size_t>(head_words) * 4, stream()));
  o.ticket = reinterpret_cast<unsigned long long*>(base);
  o.counters = base + 2;
  o.slots = ring > 0 ? reinterpret_cast<float*>(base + slots_at) : nullptr;
  return w;
}

}  // namespace hg::gpu::attn
