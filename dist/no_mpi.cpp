// dist/world.hpp without MPI (dist/CMakeLists.txt decides): one process,
// rank 0 of 1. The collectives of a world of one are identities; a launch by
// mpirun with several ranks is refused, since each rank would train alone.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_launcher.hpp"
#include "dist/world.hpp"

namespace hg::dist {
namespace {
World g_world;

}  // namespace

bool built_with_mpi() { return false; }
std::string mpi_version() { return ""; }

const World& init_world() {
  const int n = launched_ranks();
  if (n > 1)
    fail("dist::init_world", "started by an MPI launcher as one of ", n,
         " ranks, but handgrad was built without MPI (apt-get install openmpi-bin libopenmpi-dev, then reconfigure); "
         "each rank would train alone");
  return g_world;
}

const World& world() { return g_world; }
void finalize_world() {}

[[noreturn]] void abort_world(const std::string& program, const std::string& message, int code) {
  std::fprintf(stderr, "%s: error: %s\n", program.c_str(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(code);
}

void barrier(const char*) {}
void all_reduce_sum(double*, size_t, const char*) {}
void broadcast(void*, size_t, int, const char*) {}
std::vector<uint64_t> all_gather(uint64_t value, const char*) { return {value}; }
std::vector<float> gather_to(int, const float* data, size_t count, const char*) {
  return std::vector<float>(data, data + count);
}
std::vector<int32_t> all_gather_v(const std::vector<int32_t>& mine, std::vector<size_t>& counts, const char*) {
  counts = {mine.size()};
  return mine;
}
void start_all_reduce_sum(float*, size_t) {}
void start_reduce_scatter_sum(const float* in, float* out, size_t out_count) {
  if (in != out) std::memmove(out, in, out_count * sizeof(float));
}
uint64_t start_all_gather(float*, size_t) { return 0; }
void start_all_reduce_sum(bf16_t*, size_t) {}
void start_reduce_scatter_sum(const bf16_t* in, bf16_t* out, size_t out_count) {
  if (in != out) std::memmove(out, in, out_count * sizeof(bf16_t));
}
void progress() {}
void wait_all(const char*) {}
void wait_one(uint64_t, const char*) {}

}  // namespace hg::dist
