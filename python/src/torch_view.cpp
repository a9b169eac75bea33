// Reading torch.Tensors through the Python C API: a handful of attribute
// calls per tensor, far cheaper than a DLPack capsule each way (see
// bench/python_overhead.py). Everything is checked before a view exists, so a
// bad argument raises handgrad.Error instead of reaching a kernel.
#include "torch_view.hpp"

#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "core/error.hpp"
#include "core/cuda_runtime.hpp"
#include "stream_order.hpp"

namespace hg::python {
namespace {

// What handgrad.torch registered. Never freed: Python objects must not be
// released by a C++ static destructor after the interpreter has gone.
struct TorchObjects {
  PyTypeObject* tensor_type = nullptr;
  PyObject* dtypes[4] = {};  // torch.float32, float64, bfloat16, float16, in DType order
  PyObject* current_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream or None
  PyObject* s_dtype = PyUnicode_InternFromString("dtype");
  PyObject* s_shape = PyUnicode_InternFromString("shape");
  PyObject* s_data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* s_get_device = PyUnicode_InternFromString("get_device");
  PyObject* s_is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* s_is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
};
TorchObjects* torch_objects = nullptr;

const DType kDTypes[4] = {DType::F32, DType::F64, DType::BF16, DType::F16};

const TorchObjects& registered(const char* op) {
  HG_CHECK(torch_objects != nullptr, op, "PyTorch is not registered: import handgrad.torch first");
  return *torch_objects;
}

// A new reference from the C API, or the pending Python error thrown as such.
py::object checked(PyObject* result) {
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

py::object call(py::handle t, PyObject* method) { return checked(PyObject_CallMethodNoArgs(t.ptr(), method)); }

bool is_true(py::handle t, PyObject* attribute) {
  return PyObject_IsTrue(checked(PyObject_GetAttr(t.ptr(), attribute)).ptr()) == 1;
}

std::string type_name(py::handle t) { return Py_TYPE(t.ptr())->tp_name; }

DType dtype_of(const TorchObjects& torch, py::handle t, const char* op, const char* name) {
  const py::object d = checked(PyObject_GetAttr(t.ptr(), torch.s_dtype));
  for (int i = 0; i < 4; ++i)
    if (d.ptr() == torch.dtypes[i]) return kDTypes[i];
  fail(op, name, " has dtype ", py::str(d).cast<std::string>(),
       "; handgrad takes torch.float32, float64, bfloat16 or float16");
}

Shape shape_of(const TorchObjects& torch, py::handle t) {
  const py::object s = checked(PyObject_GetAttr(t.ptr(), torch.s_shape));  // torch.Size, a tuple
  const Py_ssize_t n = PyTuple_GET_SIZE(s.ptr());
  Shape shape(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(s.ptr(), i));
  if (PyErr_Occurred()) throw py::error_already_set();
  return shape;
}

Device device_of(const TorchObjects& torch, py::handle t, const char* op, const char* name) {
  if (!is_true(t, torch.s_is_cuda)) {  // attributes, cheaper than t.device (which builds an object)
    HG_CHECK(is_true(t, torch.s_is_cpu), op, name, " is on ", py::str(t.attr("device")).cast<std::string>(),
             "; handgrad takes CPU and CUDA tensors");
    return Device::CPU;
  }
  const long index = PyLong_AsLong(call(t, torch.s_get_device).ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  static const bool has_cuda = cuda_available();  // a driver call; the answer cannot change
  HG_CHECK(has_cuda, op, name, " is a CUDA tensor, but handgrad was built without CUDA or sees no GPU");
  HG_CHECK(index == cuda_current_device(), op, name, " is on cuda:", index, " but handgrad runs on cuda:",
           cuda_current_device());
  return Device::CUDA;
}

}  // namespace

Tensor torch_view(py::handle t, const char* op, const char* name) {
  const TorchObjects& torch = registered(op);
  HG_CHECK(PyObject_TypeCheck(t.ptr(), torch.tensor_type), op, name, " must be a torch.Tensor, got ", type_name(t));
  const DType dtype = dtype_of(torch, t, op, name);
  const Device device = device_of(torch, t, op, name);
  const Shape shape = shape_of(torch, t);
  HG_CHECK(PyObject_IsTrue(call(t, torch.s_is_contiguous).ptr()) == 1, op, name, " of shape ", shape,
           " is not contiguous; pass t.contiguous()");
  const uintptr_t ptr = PyLong_AsUnsignedLongLong(call(t, torch.s_data_ptr).ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  HG_CHECK(ptr != 0 || shape_numel(shape) == 0, op, name, " of shape ", shape, " has no data");
  HG_CHECK(ptr % dtype_size(dtype) == 0, op, name, " is not aligned to its ", dtype_size(dtype), "-byte elements");
  // Not owned: PyTorch frees the memory, and the caller holds the tensor past every use.
  return Tensor::from_blob(reinterpret_cast<void*>(ptr), shape, dtype, device, [] {});
}

Tensor torch_view_or_none(py::handle t, const char* op, const char* name) {
  return t.is_none() ? Tensor() : torch_view(t, op, name);
}

void follow_torch_stream(const Tensor& t) {
  if (!t.is_cuda()) return;
  const TorchObjects& torch = registered("handgrad.torch");
  HG_CHECK(torch.current_raw_stream != Py_None, "handgrad.torch", "this PyTorch has no CUDA streams");
  const py::object s = checked(PyObject_CallOneArg(torch.current_raw_stream, py::int_(cuda_current_device()).ptr()));
  gpu::set_stream(s.cast<intptr_t>());  // no-op when handgrad is on that stream already
}

void bind_torch_view(py::module_& m) {
  m.def("_register_torch", [](py::handle tensor_type, py::tuple dtypes, py::handle current_raw_stream) {
    HG_CHECK(PyType_Check(tensor_type.ptr()) && dtypes.size() == 4, "_register_torch",
             "expects (torch.Tensor, (float32, float64, bfloat16, float16), _cuda_getCurrentRawStream or None)");
    auto* torch = torch_objects != nullptr ? torch_objects : new TorchObjects;
    torch->tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
    for (int i = 0; i < 4; ++i) torch->dtypes[i] = py::object(dtypes[i]).release().ptr();
    torch->current_raw_stream = current_raw_stream.inc_ref().ptr();
    torch_objects = torch;
  }, "Called once by handgrad.torch at import (internal).");
}

}  // namespace hg::python
