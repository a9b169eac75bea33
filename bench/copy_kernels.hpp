#pragma once
// Device-to-device copy kernels of our own (bench/copy_kernels.cu), the
// yardstick for "% of achievable bandwidth": the best of them (and of
// cudaMemcpyAsync) at a size is the copy rate the memory-bound kernels are
// measured against (bench_layernorm, bench_softmax, bench_copy). Bench-only:
// built into the benchmarks where CUDA is, absent elsewhere.
#include <cstddef>
#include <string>

namespace hg::bench {

// How many copy kernels there are, and the name of kernel k
// ("wave-t512-u4-nc" and the like: grid kind, threads per block, 16-byte
// loads in flight per thread, cache hints).
int copy_kernel_count();
std::string copy_kernel_name(int k);

// dst = src for `bytes` bytes with kernel k on the handgrad stream.
// Returns false (and launches nothing) unless both pointers are 16-byte
// aligned and bytes is a multiple of 16: every kernel moves 16-byte words.
bool launch_copy_kernel(int k, void* dst, const void* src, size_t bytes);

}  // namespace hg::bench
