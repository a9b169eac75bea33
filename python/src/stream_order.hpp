#pragma once
// CUDA stream ordering for DLPack exchanges, as plain C++ (the only file of
// the module that sees CUDA headers is stream_order.cpp). Streams are the
// integers DLPack uses: 1 = legacy default stream, 2 = per-thread default
// stream, anything else a cudaStream_t. In CPU-only builds every call is a no-op
// (there is no CUDA memory to order) except handgrad_stream(), which returns 0.
#include <cstdint>

namespace hg::python {

// The stream handgrad queues its CUDA work on now (its own unless
// set_cuda_stream chose another; 0 is the legacy default stream).
intptr_t handgrad_stream();

// Work queued later on `to` waits for everything queued so far on `from`
// (an event recorded on `from`; the host does not block). No-op if equal
// (0 and 1 both name the legacy default stream).
void order_streams(intptr_t from, intptr_t to);

// The CUDA device handgrad allocates on (the current device), -1 without CUDA.
int cuda_current_device();

}  // namespace hg::python
