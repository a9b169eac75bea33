#pragma once
// For cuda/attention.cu only: the BF16 attention forward on Hopper's own
// instructions (cuda/attention_wgmma.cu; sm_90a wgmma + TMA). Which calls
// it takes is decided in cuda/attention.cu (docs/attention.md, "Which
// forward kernel runs").
#include <cstdint>

#include "cuda/attention_args.cuh"

namespace hg::gpu::attn {

// Whether this process can run it: the library holds its sm_90a code, the
// device is compute capability 9.0 and the driver has cuTensorMapEncodeTiled.
bool wgmma_forward_available();

// o (a.out), lse and stats for a.heads heads of `batch` batches, head dim
// 64 or 128, without a mask, scale > 0; q, k, v addressed by 4-D tensor
// maps (dh, rows, heads, batch) over the Args strides: bases and strides
// multiples of 16 bytes. Encoded on the host per call, passed by value.
void forward_wgmma(const Args& a, int64_t batch, int dh);

}  // namespace hg::gpu::attn
