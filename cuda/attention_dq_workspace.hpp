#pragma once
// For the fused attention .cu files only: the memory of one launch of the
// one-kernel backward's dq order (cuda/attention_dq_order.cuh), allocated
// by cuda/attention_dq_order.cu.
#include <cstdint>

#include "core/tensor.hpp"
#include "cuda/attention_args.cuh"
#include "cuda/attention_dq_order.cuh"

namespace hg::gpu::attn {

// Counters and ticket zeroed on the stream, then `ring` slots of Tq x dh
// fp32 (ring 0 for none).
struct DqWorkspace {
  Tensor memory;
  DqOrder order;
};
DqWorkspace dq_workspace(const Args& a, int64_t heads_total, int key_rows, int flush_rows, int warps, int ring, int dh);

}  // namespace hg::gpu::attn
