#pragma once
// handgrad.torch's crossing into C++: a torch.Tensor is read through its
// Python attributes (data_ptr(), shape, dtype, device, is_contiguous(); no
// PyTorch headers, no DLPack capsule) and wrapped as a handgrad view that does
// not own the memory. The caller keeps the torch tensor alive while the view
// and any kernel queued on it may still read it (docs/python.md, "Lifetimes").
#include "bindings.hpp"
#include "core/tensor.hpp"

namespace hg::python {

// The view of `t`, named `name` in the messages of `op`'s hg::Error: t must be
// a torch.Tensor, contiguous, float32/float64/bfloat16/float16, on the CPU or
// on the CUDA device handgrad runs on.
Tensor torch_view(py::handle t, const char* op, const char* name);

// `torch_view` for an argument that may be None (an undefined Tensor then).
Tensor torch_view_or_none(py::handle t, const char* op, const char* name);

// CUDA: moves handgrad's work onto PyTorch's current stream (a no-op when it
// is there already), so the views need no events. Nothing for CPU tensors.
void follow_torch_stream(const Tensor& t);

// handgrad.torch registers torch.Tensor, its four float dtypes and
// torch._C._cuda_getCurrentRawStream (or None) once, at import.
void bind_torch_view(py::module_& m);

}  // namespace hg::python
