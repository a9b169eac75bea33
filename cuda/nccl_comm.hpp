#pragma once
// NCCL collectives for data-parallel training, as plain C++ (no CUDA or NCCL
// headers). Implemented in cuda/nccl_comm.cu where CMake found NCCL; else
// cuda/no_nccl.cpp, whose calls throw hg::Error. One communicator per
// process, on the GPU that was current at init(); MPI bootstraps it
// (dist/collectives.cpp broadcasts the unique id).
//
// Every collective runs on a communication stream of its own, after all work
// queued so far on the handgrad stream (an event: the host does not wait),
// so a bucket's all-reduce overlaps with the backward kernels queued after
// it. join() makes the handgrad stream wait for the communication stream.
// The buffers must outlive the collectives (dist/ passes persistent buckets:
// the caching allocator's reuse argument covers the handgrad stream only).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hg::gpu::nccl {

bool built_with_nccl();
std::string version();  // "2.28.9"; "" without NCCL

constexpr size_t kUniqueIdBytes = 128;
std::vector<uint8_t> make_unique_id();  // on one rank; the others receive it
void init(const std::vector<uint8_t>& id, int rank, int world);
bool initialized();
// Tears the communicator down (ncclCommAbort: never waits for peers). For
// the failure path: a dead peer leaves a collective spinning forever.
void abort() noexcept;

// data <- sum over ranks of premul_r * data_r (fp32 in, fp32 sums), in place.
void all_reduce_sum(float* data, size_t count, float premul);
// An f64 sum in place (scalars such as a gradient's sum of squares).
void all_reduce_sum(double* data, size_t count);
// out (out_count) <- rank's part of sum over ranks of premul_r * in_r, where
// in holds world * out_count elements.
void reduce_scatter_sum(const float* in, float* out, size_t out_count, float premul);
// The same two in bf16 (NCCL's ncclBfloat16), all on the communication
// stream: premul * data rounded to bf16 into `wire` (count elements), summed
// in bf16, widened back into data / out. The F32 buffers hold the result.
void all_reduce_sum_bf16(float* data, uint16_t* wire, size_t count, float premul);
// wire_in: world * out_count elements; wire_out: out_count.
void reduce_scatter_sum_bf16(const float* in, uint16_t* wire_in, uint16_t* wire_out, float* out, size_t out_count,
                             float premul);
// In place: rank r's part is buffer[r * count, (r + 1) * count); afterwards
// every rank holds every part. Returns a ticket for wait_for.
uint64_t all_gather(float* buffer, size_t count, int rank);

// The handgrad stream waits for every collective queued so far.
void join();
// The handgrad stream waits for the one collective of that ticket (an
// event: the host does not wait); the collectives after it keep running.
void wait_for(uint64_t ticket);

// Timing of the communication stream since the last call (it waits for the
// work timed): busy_ms sums the collectives' durations; exposed_ms sums, over
// the join()s and wait_for()s, how far the collective waited for (a join: the
// last one before it) ended after the handgrad stream reached the wait (the
// communication the compute did not hide).
struct CommTiming {
  double busy_ms = 0, exposed_ms = 0;
  int64_t collectives = 0;
};
CommTiming take_timing();

}  // namespace hg::gpu::nccl
