#pragma once
// For .cu files only: the handgrad stream and checked CUDA calls.
#include <cuda_runtime.h>

namespace hg::gpu {

// The one stream every handgrad kernel, copy and cuBLAS call runs on.
cudaStream_t stream();

// Throws hg::Error("<what> failed at file:line: <cuda error string>").
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

}  // namespace hg::gpu

#define HG_CUDA_CHECK(call)                                                                      \
  do {                                                                                           \
    cudaError_t hg_err_ = (call);                                                                \
    if (hg_err_ != cudaSuccess) ::hg::gpu::throw_cuda_error(hg_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>> launch: catches bad configurations at once.
#define HG_CUDA_CHECK_LAUNCH(kernel_name)                                                              \
  do {                                                                                                 \
    cudaError_t hg_err_ = cudaGetLastError();                                                          \
    if (hg_err_ != cudaSuccess) ::hg::gpu::throw_cuda_error(hg_err_, kernel_name, __FILE__, __LINE__); \
  } while (0)
