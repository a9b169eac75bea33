#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/device.hpp"

// The CUDA runtime as plain C++ (no CUDA headers), so core/, ops/ and tests
// can allocate, copy and time on the GPU without being compiled by nvcc.
// Implemented in cuda/runtime.cu; when built without CUDA every call throws
// hg::Error ("... handgrad was built without CUDA").
namespace hg::gpu {

bool built_with_cuda();

// Caching allocator: freed blocks return to per-size free lists and are
// reused, so steady-state training never calls cudaMalloc.
void* allocate(size_t bytes);
void release(void* ptr);
struct MemoryStats {
  size_t in_use = 0;       // bytes of the blocks handed out to tensors now
  size_t peak_in_use = 0;  // max of in_use since the last reset
  // What the tensors asked for, each rounded up to 512 bytes, as PyTorch's
  // memory_allocated counts: in_use less what a reused larger block wastes.
  size_t requested = 0;
  size_t peak_requested = 0;   // max of requested since the last reset
  size_t reserved = 0;         // bytes held from cudaMalloc (in use + cached)
  int64_t device_mallocs = 0;  // cudaMalloc calls so far
};
MemoryStats memory_stats();
void reset_peak_memory();
void empty_cache();  // returns cached blocks to the driver
// At most `bytes` held from cudaMalloc (0: no limit, the default). A request
// that would go over it first returns the cache to the driver, then throws
// hg::OutOfMemory as a full GPU does: to share a GPU between processes, or to
// see how a program behaves with less memory. Blocks held already stay.
void set_memory_limit(size_t bytes);
size_t memory_limit();

// Copies between any two devices (host <-> device, device <-> device) on the
// one handgrad stream. A copy from or to the host has finished when it
// returns; a device-to-device copy is queued on the stream like a kernel.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void synchronize();

// The stream all of handgrad's GPU work runs on. By default handgrad's own
// non-blocking stream; set_stream(handle) moves it to another stream (a
// cudaStream_t as an integer, 0 the legacy default stream), e.g. PyTorch's
// current stream, so handgrad's kernels interleave with the caller's in issue
// order without events. The new stream first waits for everything queued on
// the old one, so handgrad's work stays one ordered sequence (what the caching
// allocator relies on). Refused while the current stream is being captured.
// use_own_stream() goes back to handgrad's own stream.
intptr_t current_stream();
void set_stream(intptr_t handle);
void use_own_stream();

// A CUDA graph of the work queued on the handgrad stream between
// begin_capture() and end_capture(); replay() launches it again in one call.
// Nothing runs during a capture. While capturing, the caching allocator
// serves this graph from its own pool (blocks no allocation outside the
// graph will get while the Graph lives), so tensors allocated and freed
// inside the captured work have the same addresses on every replay; inputs
// are copied into tensors allocated before the capture. Captured work must
// not synchronize with the host (a copy to the host, reading a value):
// end_capture() then throws hg::Error and abort_capture() leaves no trace.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin_capture();
  void end_capture();             // instantiates the graph; throws hg::Error if the capture failed
  void abort_capture() noexcept;  // after an exception inside the captured work
  void replay();
  bool ready() const { return exec_ != nullptr; }

 private:
  void reset() noexcept;
  void* graph_ = nullptr;
  void* exec_ = nullptr;
  int pool_ = 0;
  bool capturing_ = false;
};

// Work beside the handgrad stream. The constructor runs `work` (a function
// that queues GPU work through handgrad's calls) with its launches going to a
// second stream, which first waits for everything already queued; join()
// makes the handgrad stream wait for all of it (the destructor joins when
// join() was not called). For memory-bound work whose buffers nothing queued
// in between touches, so that it runs next to compute-bound kernels: the
// training step clears the gradients beside its forward. `work` must not
// allocate or free device memory (the caching allocator relies on one
// ordered stream). One Beside is open at a time. Legal inside a graph
// capture: the second stream joins the capture.
class Beside {
 public:
  explicit Beside(const std::function<void()>& work);
  ~Beside();
  Beside(const Beside&) = delete;
  Beside& operator=(const Beside&) = delete;
  void join();

 private:
  bool joined_ = false;
};

// Whether a Beside's work is being queued now (stream() is its stream):
// kernels with per-stream state (the GEMM workspace, the column sums'
// counters and scratch) take their second set.
bool beside_active();

// Times GPU work with CUDA events recorded on the handgrad stream.
class Timer {
 public:
  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start();
  float stop_ms();  // waits for the stop event

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

// Device facts for kernels' launch heuristics and for benchmark reports.
int sm_count();
const char* device_name();
int compute_capability();  // major * 10 + minor, e.g. 90 for an H100
// Peak DRAM bandwidth in GB/s (10^9 B/s) from the memory clock and bus width
// the driver reports: 4814 on the H200 of docs/benchmarks.md (HBM3e); an H100 SXM
// (HBM3, 2619 MHz x 5120 bits by its datasheet) would give about 3350.
double dram_peak_gbps();

}  // namespace hg::gpu

namespace hg::gpu {
int device_count();  // 0 when built without CUDA or no GPU is visible
// Makes `ordinal` this process's GPU. Call it before any other GPU work (the
// stream, allocator and handles are made on first use, on the current
// device): data-parallel ranks pick their GPU by local rank with it.
void set_device(int ordinal);
}  // namespace hg::gpu
