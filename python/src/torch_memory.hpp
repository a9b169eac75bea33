#pragma once
// A torch tensor's memory as a handgrad view that does not own it: the checks
// both crossings make, in the same order and with the same messages.
// handgrad._C reads a torch.Tensor through its Python attributes
// (torch_view.cpp); handgrad._torch_ext reads an at::Tensor in C++ and sends
// what it read over the bridge (torch_bridge.cpp). No Python or PyTorch here.
#include <cstdint>
#include <string>

#include "core/tensor.hpp"

namespace hg::python {

// The dtypes handgrad.torch takes, in the order torch.float32, float64, bfloat16, float16.
inline constexpr DType kTorchDTypes[4] = {DType::F32, DType::F64, DType::BF16, DType::F16};

// Each check throws hg::Error naming `op` and the argument `name`.
[[noreturn]] void fail_torch_dtype(const char* op, const char* name, const std::string& dtype);    // "torch.int64"
[[noreturn]] void fail_torch_device(const char* op, const char* name, const std::string& device);  // "meta"
// A CUDA tensor on device `index`: handgrad must have CUDA and run on that device.
void check_torch_cuda_device(long index, const char* op, const char* name);
void check_torch_contiguous(bool contiguous, const Shape& shape, const char* op, const char* name);

// The view of checked memory (data present unless empty, aligned to its elements).
// Not owned: the caller keeps the torch tensor alive past every use (docs/python.md, "Lifetimes").
Tensor torch_memory_view(void* data, const Shape& shape, DType dtype, Device device, const char* op, const char* name);

// CUDA: handgrad's work moves onto `stream`, PyTorch's current stream (a
// no-op when it is there already), so the views need no events. Nothing for CPU tensors.
void follow_stream(const Tensor& t, intptr_t stream);

}  // namespace hg::python
