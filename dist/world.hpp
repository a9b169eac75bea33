#pragma once
// The ranks of a data-parallel run: MPI when handgrad was built with it
// (dist/mpi_world.cpp), else one process (dist/no_mpi.cpp). Host-side
// collectives only; tensors go through dist/collectives.hpp.
//
// Failure policy: every MPI call returns its error (MPI_ERRORS_RETURN), which
// becomes hg::Error; a program that fails on one rank calls abort_world(),
// which prints the message and takes every rank down (MPI_Abort), so no rank
// waits forever in a collective its peer will never join. Blocking calls run
// under a Watchdog (dist/watchdog.hpp) that does the same after a timeout.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace hg::dist {

struct World {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks of this host: picks the GPU
  std::string host;
  bool distributed() const { return size > 1; }
};

bool built_with_mpi();
std::string mpi_version();  // "Open MPI v4.1.4, ..."; "" without MPI

// Starts MPI once (later calls return the same world). Without MPI: rank 0
// of 1, unless the environment says an MPI launcher started several ranks,
// which is an error (each would train alone).
const World& init_world();
const World& world();  // init_world() must have run; else rank 0 of 1
// MPI_Finalize once every rank is done (a no-op in one process).
void finalize_world();
// Prints "<program>: error: rank R (host): message" to stderr and stops
// every rank (MPI_Abort with `code`); in one process, std::_Exit(code).
[[noreturn]] void abort_world(const std::string& program, const std::string& message, int code);

// Blocking host collectives over every rank, under the watchdog.
void barrier(const char* what);
void all_reduce_sum(double* data, size_t count, const char* what);
void broadcast(void* data, size_t bytes, int root, const char* what);
std::vector<uint64_t> all_gather(uint64_t value, const char* what);
// Gathers `count` floats of every rank, in rank order, to root (elsewhere: empty).
std::vector<float> gather_to(int root, const float* data, size_t count, const char* what);
// Every rank's values, concatenated in rank order; the ranks may hand in
// different counts, and counts[r] is rank r's.
std::vector<int32_t> all_gather_v(const std::vector<int32_t>& mine, std::vector<size_t>& counts, const char* what);

// Nonblocking CPU collectives on float buffers that stay alive and untouched
// until wait_all(): started at once, driven forward by progress() (MPI moves
// a nonblocking collective only inside MPI calls) and finished by wait_all().
void start_all_reduce_sum(float* data, size_t count);
void start_reduce_scatter_sum(const float* in, float* out, size_t out_count);
// In place, rank r's part at r * count. Returns a ticket for wait_one.
uint64_t start_all_gather(float* buffer, size_t count);
// bf16 sums (MPI has no bf16 type: a user-defined sum over the 16-bit
// patterns adds each pair in float and rounds to nearest even).
void start_all_reduce_sum(bf16_t* data, size_t count);
void start_reduce_scatter_sum(const bf16_t* in, bf16_t* out, size_t out_count);
void progress();
void wait_all(const char* what);
// Waits for the one collective of that ticket (finished ones return at once),
// leaving the others running.
void wait_one(uint64_t ticket, const char* what);

}  // namespace hg::dist
