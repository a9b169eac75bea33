// NCCL behind cuda/nccl_comm.hpp: one communicator, one communication stream
// (high priority, so a ready bucket's all-reduce is scheduled ahead of the
// backward kernels queued after it), events to order it after the handgrad
// stream and to time it.
#include <cuda_bf16.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/nccl_comm.hpp"

namespace hg::gpu::nccl {
namespace {

struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;               // ordering only (no timing)
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timers;  // start/stop of each collective since take_timing()
  size_t used = 0;
  uint64_t first_ticket = 0;  // the ticket of timers[0]: tickets count every collective ever queued
  // Each wait since take_timing() (join, wait_for): where the handgrad stream
  // was, and the collective it waited for (a join: the last one before it).
  std::vector<cudaEvent_t> join_marks;
  std::vector<size_t> join_last;
  size_t joins = 0;
  int rank = 0, world = 1;
};

State& state() {
  static State s;  // never destroyed: the driver reclaims it at exit (as cuda/runtime.cu)
  return s;
}

void check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const char* last = state().comm ? ncclGetLastError(state().comm) : "";
  fail(what, "NCCL error ", ncclGetErrorString(r), (last && *last) ? std::string(": ") + last : std::string(),
       " (set NCCL_DEBUG=INFO for NCCL's own account)");
}

ncclComm_t comm(const char* what) {
  if (!state().comm) fail(what, "the NCCL communicator is not initialised (nccl::init first)");
  return state().comm;
}

// Queues the comm stream after everything on the handgrad stream, and a start timer.
cudaEvent_t begin(const char* what) {
  State& s = state();
  comm(what);
  HG_CUDA_CHECK(cudaEventRecord(s.fork, stream()));
  HG_CUDA_CHECK(cudaStreamWaitEvent(s.comm_stream, s.fork, 0));
  if (s.used == s.timers.size()) {
    std::pair<cudaEvent_t, cudaEvent_t> t;
    HG_CUDA_CHECK(cudaEventCreate(&t.first));
    HG_CUDA_CHECK(cudaEventCreate(&t.second));
    s.timers.push_back(t);
  }
  HG_CUDA_CHECK(cudaEventRecord(s.timers[s.used].first, s.comm_stream));
  return s.timers[s.used].second;
}

// Records the stop timer; returns the collective's ticket.
uint64_t end(cudaEvent_t stop) {
  State& s = state();
  HG_CUDA_CHECK(cudaEventRecord(stop, s.comm_stream));
  return s.first_ticket + s.used++;
}

// Makes the handgrad stream wait for timer `index`'s stop event, marking
// where it waited (for the exposed time).
void wait_on_timer(size_t index) {
  State& s = state();
  if (s.joins == s.join_marks.size()) {
    cudaEvent_t e;
    HG_CUDA_CHECK(cudaEventCreate(&e));
    s.join_marks.push_back(e);
    s.join_last.push_back(0);
  }
  HG_CUDA_CHECK(cudaEventRecord(s.join_marks[s.joins], stream()));
  s.join_last[s.joins++] = index;
  HG_CUDA_CHECK(cudaStreamWaitEvent(stream(), s.timers[index].second, 0));
}

// A sum that pre-multiplies this rank's input (1: plain ncclSum).
struct PreMulSum {
  ncclRedOp_t op = ncclSum;
  bool custom = false;
  PreMulSum(float premul, const char* what) {
    if (premul == 1.0f) return;
    check(ncclRedOpCreatePreMulSum(&op, &premul, ncclFloat32, ncclScalarHostImmediate, comm(what)), what);
    custom = true;
  }
  // NCCL allows destroying the op as soon as the call that used it returned.
  ~PreMulSum() {
    if (custom) ncclRedOpDestroy(op, state().comm);
  }
};

// The bf16 wire format of a bucket: out = bf16(premul * in), rounded to nearest even.
__global__ void narrow_to_bf16(const float* in, float premul, __nv_bfloat16* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(premul * in[i]);
}

__global__ void widen_from_bf16(const __nv_bfloat16* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

// A grid-stride launch shape: enough blocks to fill the GPU, no more (these
// run beside the backward's kernels).
constexpr int kConvertThreads = 256;
unsigned convert_blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kConvertThreads - 1) / kConvertThreads, 1024));
}

void narrow(const float* in, float premul, uint16_t* out, size_t n) {
  if (n == 0) return;
  narrow_to_bf16<<<convert_blocks(n), kConvertThreads, 0, state().comm_stream>>>(
      in, premul, reinterpret_cast<__nv_bfloat16*>(out), n);
  HG_CUDA_CHECK_LAUNCH("narrow_to_bf16");
}

void widen(const uint16_t* in, float* out, size_t n) {
  if (n == 0) return;
  widen_from_bf16<<<convert_blocks(n), kConvertThreads, 0, state().comm_stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(in), out, n);
  HG_CUDA_CHECK_LAUNCH("widen_from_bf16");
}

}  // namespace

bool built_with_nccl() { return true; }

std::string version() {
  int v = 0;
  ncclGetVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::vector<uint8_t> make_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "nccl::make_unique_id");
  static_assert(sizeof(id.internal) == kUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");
  return std::vector<uint8_t>(id.internal, id.internal + kUniqueIdBytes);
}

void init(const std::vector<uint8_t>& id_bytes, int rank, int world) {
  State& s = state();
  HG_CHECK(!s.comm, "nccl::init", "already initialised");
  HG_CHECK(id_bytes.size() == kUniqueIdBytes, "nccl::init", "unique id of ", id_bytes.size(), " bytes, expected ",
           kUniqueIdBytes);
  HG_CHECK(world >= 1 && rank >= 0 && rank < world, "nccl::init", "rank ", rank, " of world ", world);
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), kUniqueIdBytes);
  int least = 0, greatest = 0;
  HG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  HG_CUDA_CHECK(cudaStreamCreateWithPriority(&s.comm_stream, cudaStreamNonBlocking, greatest));
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  check(ncclCommInitRank(&s.comm, world, id, rank), "nccl::init (ncclCommInitRank)");
  s.rank = rank;
  s.world = world;
}

bool initialized() { return state().comm != nullptr; }

void abort() noexcept {
  State& s = state();
  if (s.comm) ncclCommAbort(s.comm);
  s.comm = nullptr;
}

void all_reduce_sum(float* data, size_t count, float premul) {
  const char* what = "nccl::all_reduce_sum";
  const cudaEvent_t stop = begin(what);
  const PreMulSum op(premul, what);
  check(ncclAllReduce(data, data, count, ncclFloat32, op.op, comm(what), state().comm_stream), what);
  end(stop);
}

void all_reduce_sum(double* data, size_t count) {
  const char* what = "nccl::all_reduce_sum (f64)";
  const cudaEvent_t stop = begin(what);
  check(ncclAllReduce(data, data, count, ncclFloat64, ncclSum, comm(what), state().comm_stream), what);
  end(stop);
}

void reduce_scatter_sum(const float* in, float* out, size_t out_count, float premul) {
  const char* what = "nccl::reduce_scatter_sum";
  const cudaEvent_t stop = begin(what);
  const PreMulSum op(premul, what);
  check(ncclReduceScatter(in, out, out_count, ncclFloat32, op.op, comm(what), state().comm_stream), what);
  end(stop);
}

void all_reduce_sum_bf16(float* data, uint16_t* wire, size_t count, float premul) {
  const char* what = "nccl::all_reduce_sum_bf16";
  const cudaEvent_t stop = begin(what);
  narrow(data, premul, wire, count);
  check(ncclAllReduce(wire, wire, count, ncclBfloat16, ncclSum, comm(what), state().comm_stream), what);
  widen(wire, data, count);
  end(stop);
}

void reduce_scatter_sum_bf16(const float* in, uint16_t* wire_in, uint16_t* wire_out, float* out, size_t out_count,
                             float premul) {
  const char* what = "nccl::reduce_scatter_sum_bf16";
  const cudaEvent_t stop = begin(what);
  narrow(in, premul, wire_in, out_count * static_cast<size_t>(state().world));
  check(ncclReduceScatter(wire_in, wire_out, out_count, ncclBfloat16, ncclSum, comm(what), state().comm_stream), what);
  widen(wire_out, out, out_count);
  end(stop);
}

uint64_t all_gather(float* buffer, size_t count, int rank) {
  const char* what = "nccl::all_gather";
  const cudaEvent_t stop = begin(what);
  check(ncclAllGather(buffer + static_cast<size_t>(rank) * count, buffer, count, ncclFloat32, comm(what),
                      state().comm_stream),
        what);
  return end(stop);
}

void join() {
  State& s = state();
  comm("nccl::join");
  if (s.used > 0) {  // the last collective's stop event: the comm stream's work so far
    wait_on_timer(s.used - 1);
    return;
  }
  HG_CUDA_CHECK(cudaEventRecord(s.done, s.comm_stream));
  HG_CUDA_CHECK(cudaStreamWaitEvent(stream(), s.done, 0));
}

void wait_for(uint64_t ticket) {
  State& s = state();
  comm("nccl::wait_for");
  // An earlier ticket: take_timing() has waited for it on the host (and reuses its timers).
  if (ticket < s.first_ticket) return;
  HG_CHECK(ticket - s.first_ticket < s.used, "nccl::wait_for", "no collective was queued with ticket ", ticket);
  wait_on_timer(static_cast<size_t>(ticket - s.first_ticket));
}

CommTiming take_timing() {
  State& s = state();
  CommTiming t;
  if (!s.comm) return t;
  for (size_t i = 0; i < s.used; ++i) {
    HG_CUDA_CHECK(cudaEventSynchronize(s.timers[i].second));
    float ms = 0;
    HG_CUDA_CHECK(cudaEventElapsedTime(&ms, s.timers[i].first, s.timers[i].second));
    t.busy_ms += ms;
  }
  for (size_t j = 0; j < s.joins; ++j) {  // each wait: how far its collectives ran past the compute
    HG_CUDA_CHECK(cudaEventSynchronize(s.join_marks[j]));
    float ms = 0;
    HG_CUDA_CHECK(cudaEventElapsedTime(&ms, s.join_marks[j], s.timers[s.join_last[j]].second));
    if (ms > 0) t.exposed_ms += ms;
  }
  t.collectives = static_cast<int64_t>(s.used);
  s.first_ticket += s.used;
  s.used = 0;
  s.joins = 0;
  return t;
}

}  // namespace hg::gpu::nccl
