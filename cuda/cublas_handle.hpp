#pragma once
// For .cu files only: the one cuBLAS handle, bound to the handgrad stream.
#include <cublas_v2.h>

namespace hg::gpu {

// Created on first use with CUBLAS_DEFAULT_MATH (plain FP32, no TF32), so
// GPU matmuls agree with the CPU to float32 precision.
cublasHandle_t cublas_handle();

// Throws hg::Error("<what> failed at file:line: CUBLAS_STATUS_...: <description>").
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line);

}  // namespace hg::gpu

#define HG_CUBLAS_CHECK(call)                                                                                      \
  do {                                                                                                             \
    cublasStatus_t hg_status_ = (call);                                                                            \
    if (hg_status_ != CUBLAS_STATUS_SUCCESS) ::hg::gpu::throw_cublas_error(hg_status_, #call, __FILE__, __LINE__); \
  } while (0)
