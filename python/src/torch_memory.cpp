// The checks that turn a torch tensor's memory into a handgrad view; see torch_memory.hpp.
#include "torch_memory.hpp"

#include "core/cuda_runtime.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "stream_order.hpp"

namespace hg::python {

void fail_torch_dtype(const char* op, const char* name, const std::string& dtype) {
  fail(op, name, " has dtype ", dtype, "; handgrad takes torch.float32, float64, bfloat16 or float16");
}

void fail_torch_device(const char* op, const char* name, const std::string& device) {
  fail(op, name, " is on ", device, "; handgrad takes CPU and CUDA tensors");
}

void check_torch_cuda_device(long index, const char* op, const char* name) {
  static const bool has_cuda = cuda_available();  // a driver call; the answer cannot change
  HG_CHECK(has_cuda, op, name, " is a CUDA tensor, but handgrad was built without CUDA or sees no GPU");
  HG_CHECK(index == cuda_current_device(), op, name, " is on cuda:", index,
           " but handgrad runs on cuda:", cuda_current_device());
}

void check_torch_contiguous(bool contiguous, const Shape& shape, const char* op, const char* name) {
  HG_CHECK(contiguous, op, name, " of shape ", shape, " is not contiguous; pass t.contiguous()");
}

Tensor torch_memory_view(void* data, const Shape& shape, DType dtype, Device device, const char* op, const char* name) {
  const auto ptr = reinterpret_cast<uintptr_t>(data);
  HG_CHECK(ptr != 0 || shape_numel(shape) == 0, op, name, " of shape ", shape, " has no data");
  HG_CHECK(ptr % dtype_size(dtype) == 0, op, name, " is not aligned to its ", dtype_size(dtype), "-byte elements");
  return Tensor::from_blob(data, shape, dtype, device, [] {});
}

void follow_stream(const Tensor& t, intptr_t stream) {
  if (t.is_cuda()) gpu::set_stream(stream);  // no-op when handgrad is on that stream already
}

}  // namespace hg::python
