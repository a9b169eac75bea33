#pragma once
// For cuda/attention.cu only: the BF16 attention forward and backward on
// Hopper's own instructions (cuda/attention_wgmma.cu; sm_90a wgmma + TMA).
// Which calls they take is decided in cuda/attention.cu (docs/attention.md,
// "Which kernel runs").
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_args.cuh"

namespace hg::gpu::attn {

// Whether this process can run them: the library holds its sm_90a code, the
// device is compute capability 9.0 and the driver has cuTensorMapEncodeTiled.
bool wgmma_available();

// o (a.out), lse and stats for a.heads heads of `batch` batches, head dim
// 64 or 128, without a mask, scale > 0; q, k, v addressed by 4-D tensor
// maps (dh, rows, heads, batch) over the Args strides: bases and strides
// multiples of 16 bytes. Encoded on the host per call, passed by value.
void forward_wgmma(const Args& a, int64_t batch, int dh);

// dq (a.dq at q's strides), dk, dv (at k/v's) for a.heads heads of
// `batch` batches after a.delta is written, from do (a.dout at o's
// strides), q, k, v and the forward's stats; the cases of forward_wgmma.
// Two kernels, no float atomics: bitwise repeatable. dk/dv runs on
// stream(), dq on dq_stream (the caller forks and joins a side stream, or
// passes stream()).
void backward_wgmma(const Args& a, int64_t batch, int dh, cudaStream_t dq_stream);

// The same gradients with the dk/dv kernel storing ds and
// dq computed from it (one product instead of three), heads_per_chunk
// heads at a time, the chunks alternating between stream() and `side`
// (the caller forks and joins it): `scratch` holds stored_ds_bytes_per_head
// (attention_dispatch.hpp) for that many heads twice (once where one chunk
// takes every head), 16-byte aligned.
void backward_wgmma_stored_ds(const Args& a, int64_t batch, int dh, void* scratch, int64_t heads_per_chunk,
                              cudaStream_t side);

}  // namespace hg::gpu::attn
