// dist/world.hpp on MPI (built where CMake found MPI; dist/no_mpi.cpp otherwise).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_launcher.hpp"
#include "dist/watchdog.hpp"
#include "dist/world.hpp"

namespace hg::dist {
namespace {

World g_world;
bool g_started = false;
bool g_mpi = false;  // MPI initialised: only when an MPI launcher started this process

std::vector<MPI_Request> g_pending;  // started, not yet waited for (MPI_REQUEST_NULL once complete)
uint64_t g_first_ticket = 0;         // the ticket of g_pending[0]: tickets count every request ever started

uint64_t add_pending(MPI_Request r) {
  g_pending.push_back(r);
  return g_first_ticket + g_pending.size() - 1;
}

void clear_pending() {
  g_first_ticket += g_pending.size();
  g_pending.clear();
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(what, "MPI error: ", std::string(text, static_cast<size_t>(len)));
}

// MPI_Op for bf16 bit patterns: inout[i] = bf16(float(in[i]) + float(inout[i])).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16_t* a = static_cast<const bf16_t*>(in);
  bf16_t* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op o;
    check(MPI_Op_create(&bf16_sum, /*commute=*/1, &o), "MPI_Op_create (bf16 sum)");
    return o;
  }();
  return op;
}

int as_count(size_t n, const char* what) {
  HG_CHECK(n <= static_cast<size_t>(INT_MAX), what, n, " elements exceed MPI's int count; use smaller buckets");
  return static_cast<int>(n);
}

}  // namespace

bool built_with_mpi() { return true; }

std::string mpi_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  const size_t cut = s.find_first_of(",\n");
  return cut == std::string::npos ? s : s.substr(0, cut);
}

const World& init_world() {
  if (g_started) return g_world;
  g_started = true;
  // MPI_Init outside mpirun (a "singleton") costs about a second: a program
  // started directly runs as rank 0 of 1 without MPI.
  if (!launched_by_mpi()) return g_world;
  g_mpi = true;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    // SERIALIZED: only the main thread calls MPI (the watchdog never does).
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &g_world.size), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world.rank, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(local, &g_world.local_rank), "MPI_Comm_rank (local)");
  check(MPI_Comm_size(local, &g_world.local_size), "MPI_Comm_size (local)");
  MPI_Comm_free(&local);
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  g_world.host.assign(host, static_cast<size_t>(len));
  return g_world;
}

const World& world() { return g_world; }

void finalize_world() {
  if (!g_mpi) return;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

[[noreturn]] void abort_world(const std::string& program, const std::string& message, int code) {
  if (!message.empty())
    std::fprintf(stderr, "%s: error: rank %d of %d (%s): %s\n", program.c_str(), g_world.rank, g_world.size,
                 g_world.host.c_str(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (g_mpi && g_world.size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void barrier(const char* what) {
  if (!g_mpi) return;
  Watch w(what);
  check(MPI_Barrier(MPI_COMM_WORLD), what);
}

void all_reduce_sum(double* data, size_t count, const char* what) {
  if (!g_mpi) return;
  Watch w(what);
  check(MPI_Allreduce(MPI_IN_PLACE, data, as_count(count, what), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), what);
}

void broadcast(void* data, size_t bytes, int root, const char* what) {
  if (!g_mpi) return;
  Watch w(what);
  check(MPI_Bcast(data, as_count(bytes, what), MPI_BYTE, root, MPI_COMM_WORLD), what);
}

std::vector<uint64_t> all_gather(uint64_t value, const char* what) {
  if (!g_mpi) return {value};
  Watch w(what);
  std::vector<uint64_t> out(static_cast<size_t>(g_world.size));
  check(MPI_Allgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), what);
  return out;
}

std::vector<float> gather_to(int root, const float* data, size_t count, const char* what) {
  if (!g_mpi) return std::vector<float>(data, data + count);
  Watch w(what);
  std::vector<float> out(g_world.rank == root ? count * static_cast<size_t>(g_world.size) : 0);
  const int n = as_count(count, what);
  check(MPI_Gather(data, n, MPI_FLOAT, out.data(), n, MPI_FLOAT, root, MPI_COMM_WORLD), what);
  return out;
}

std::vector<int32_t> all_gather_v(const std::vector<int32_t>& mine, std::vector<size_t>& counts, const char* what) {
  if (!g_mpi) {
    counts = {mine.size()};
    return mine;
  }
  Watch w(what);
  const int n = as_count(mine.size(), what);
  std::vector<int> each(static_cast<size_t>(g_world.size)), at(static_cast<size_t>(g_world.size));
  check(MPI_Allgather(&n, 1, MPI_INT, each.data(), 1, MPI_INT, MPI_COMM_WORLD), what);
  size_t total = 0;
  for (size_t r = 0; r < each.size(); ++r) {
    at[r] = as_count(total, what);
    total += static_cast<size_t>(each[r]);
  }
  as_count(total, what);
  std::vector<int32_t> out(total);
  check(MPI_Allgatherv(mine.data(), n, MPI_INT32_T, out.data(), each.data(), at.data(), MPI_INT32_T, MPI_COMM_WORLD),
        what);
  counts.assign(each.begin(), each.end());
  return out;
}

void start_all_reduce_sum(float* data, size_t count) {
  if (!g_mpi) return;
  const char* what = "MPI_Iallreduce";
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, data, as_count(count, what), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r), what);
  add_pending(r);
}

void start_reduce_scatter_sum(const float* in, float* out, size_t out_count) {
  if (!g_mpi) {  // one rank: its part is the whole
    if (in != out) std::memmove(out, in, out_count * sizeof(float));
    return;
  }
  const char* what = "MPI_Ireduce_scatter_block";
  MPI_Request r;
  check(MPI_Ireduce_scatter_block(in, out, as_count(out_count, what), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r), what);
  add_pending(r);
}

uint64_t start_all_gather(float* buffer, size_t count) {
  if (!g_mpi) return 0;
  const char* what = "MPI_Iallgather";
  MPI_Request r;
  check(
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, as_count(count, what), MPI_FLOAT, MPI_COMM_WORLD, &r),
      what);
  return add_pending(r);
}

void start_all_reduce_sum(bf16_t* data, size_t count) {
  if (!g_mpi) return;
  const char* what = "MPI_Iallreduce (bf16)";
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, data, as_count(count, what), MPI_UINT16_T, bf16_sum_op(), MPI_COMM_WORLD, &r),
        what);
  add_pending(r);
}

void start_reduce_scatter_sum(const bf16_t* in, bf16_t* out, size_t out_count) {
  if (!g_mpi) {
    if (in != out) std::memmove(out, in, out_count * sizeof(bf16_t));
    return;
  }
  const char* what = "MPI_Ireduce_scatter_block (bf16)";
  MPI_Request r;
  check(MPI_Ireduce_scatter_block(in, out, as_count(out_count, what), MPI_UINT16_T, bf16_sum_op(), MPI_COMM_WORLD, &r),
        what);
  add_pending(r);
}

void progress() {
  if (g_pending.empty()) return;
  int done = 0;
  check(MPI_Testall(static_cast<int>(g_pending.size()), g_pending.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  if (done) clear_pending();
}

void wait_all(const char* what) {
  if (g_pending.empty()) return;
  Watch w(what);
  check(MPI_Waitall(static_cast<int>(g_pending.size()), g_pending.data(), MPI_STATUSES_IGNORE), what);
  clear_pending();
}

void wait_one(uint64_t ticket, const char* what) {
  if (!g_mpi || ticket < g_first_ticket) return;  // one process, or finished in an earlier wait_all or progress
  HG_CHECK(ticket - g_first_ticket < g_pending.size(), what, "no collective was started with ticket ", ticket);
  MPI_Request& r = g_pending[ticket - g_first_ticket];
  if (r == MPI_REQUEST_NULL) return;
  Watch w(what);
  check(MPI_Wait(&r, MPI_STATUS_IGNORE), what);
}

}  // namespace hg::dist
