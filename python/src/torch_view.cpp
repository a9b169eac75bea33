// Reading torch.Tensors through the Python C API: a handful of attribute
// calls per tensor, far cheaper than a DLPack capsule each way (see
// bench/python_overhead.py). Everything is checked before a view exists, so a
// bad argument raises handgrad.Error instead of reaching a kernel.
#include "torch_view.hpp"

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "stream_order.hpp"
#include "torch_memory.hpp"

namespace hg::python {
namespace {

// What handgrad.torch registered. Never freed: Python objects must not be
// released by a C++ static destructor after the interpreter has gone.
struct TorchObjects {
  PyTypeObject* tensor_type = nullptr;
  PyObject* dtypes[4] = {};                // torch.float32, float64, bfloat16, float16: kTorchDTypes' order
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
    if (d.ptr() == torch.dtypes[i]) return kTorchDTypes[i];
  fail_torch_dtype(op, name, py::str(d).cast<std::string>());
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
    if (!is_true(t, torch.s_is_cpu)) fail_torch_device(op, name, py::str(t.attr("device")).cast<std::string>());
    return Device::CPU;
  }
  const long index = PyLong_AsLong(call(t, torch.s_get_device).ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  check_torch_cuda_device(index, op, name);
  return Device::CUDA;
}

}  // namespace

Tensor torch_view(py::handle t, const char* op, const char* name) {
  const TorchObjects& torch = registered(op);
  HG_CHECK(PyObject_TypeCheck(t.ptr(), torch.tensor_type), op, name, " must be a torch.Tensor, got ", type_name(t));
  const DType dtype = dtype_of(torch, t, op, name);
  const Device device = device_of(torch, t, op, name);
  const Shape shape = shape_of(torch, t);
  check_torch_contiguous(PyObject_IsTrue(call(t, torch.s_is_contiguous).ptr()) == 1, shape, op, name);
  const uintptr_t ptr = PyLong_AsUnsignedLongLong(call(t, torch.s_data_ptr).ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return torch_memory_view(reinterpret_cast<void*>(ptr), shape, dtype, device, op, name);
}

Tensor torch_view_or_none(py::handle t, const char* op, const char* name) {
  return t.is_none() ? Tensor() : torch_view(t, op, name);
}

void follow_torch_stream(const Tensor& t) {
  if (!t.is_cuda()) return;
  const TorchObjects& torch = registered("handgrad.torch");
  HG_CHECK(torch.current_raw_stream != Py_None, "handgrad.torch", "this PyTorch has no CUDA streams");
  const py::object s = checked(PyObject_CallOneArg(torch.current_raw_stream, py::int_(cuda_current_device()).ptr()));
  follow_stream(t, s.cast<intptr_t>());
}

void bind_torch_view(py::module_& m) {
  m.def(
      "_register_torch",
      [](py::handle tensor_type, py::tuple dtypes, py::handle current_raw_stream) {
        HG_CHECK(PyType_Check(tensor_type.ptr()) && dtypes.size() == 4, "_register_torch",
                 "expects (torch.Tensor, (float32, float64, bfloat16, float16), _cuda_getCurrentRawStream or None)");
        auto* torch = torch_objects != nullptr ? torch_objects : new TorchObjects;
        torch->tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
        for (int i = 0; i < 4; ++i) torch->dtypes[i] = py::object(dtypes[i]).release().ptr();
        torch->current_raw_stream = current_raw_stream.inc_ref().ptr();
        torch_objects = torch;
      },
      "Called once by handgrad.torch at import (internal).");
}

}  // namespace hg::python
