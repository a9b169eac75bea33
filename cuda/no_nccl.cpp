// cuda/nccl_comm.hpp for builds without NCCL (cuda/CMakeLists.txt decides):
// queries say "no"; every collective throws, naming what is missing.
#include "core/error.hpp"
#include "cuda/nccl_comm.hpp"

namespace hg::gpu::nccl {
namespace {
[[noreturn]] void no_nccl(const char* fn) {
  fail(fn, "handgrad was built without NCCL (it needs CUDA, MPI, nccl.h and libnccl at configure time); "
           "CUDA training runs on one GPU: launch one rank, or train on the CPU");
}
}  // namespace

bool built_with_nccl() { return false; }
std::string version() { return ""; }
std::vector<uint8_t> make_unique_id() { no_nccl("nccl::make_unique_id"); }
void init(const std::vector<uint8_t>&, int, int) { no_nccl("nccl::init"); }
bool initialized() { return false; }
void abort() noexcept {}
void all_reduce_sum(float*, size_t, float) { no_nccl("nccl::all_reduce_sum"); }
void all_reduce_sum(double*, size_t) { no_nccl("nccl::all_reduce_sum"); }
void reduce_scatter_sum(const float*, float*, size_t, float) { no_nccl("nccl::reduce_scatter_sum"); }
void all_reduce_sum_bf16(float*, uint16_t*, size_t, float) { no_nccl("nccl::all_reduce_sum_bf16"); }
void reduce_scatter_sum_bf16(const float*, uint16_t*, uint16_t*, float*, size_t, float) {
  no_nccl("nccl::reduce_scatter_sum_bf16");
}
uint64_t all_gather(float*, size_t, int) { no_nccl("nccl::all_gather"); }
void join() { no_nccl("nccl::join"); }
void wait_for(uint64_t) { no_nccl("nccl::wait_for"); }
CommTiming take_timing() { return {}; }

}  // namespace hg::gpu::nccl
