// The extension module handgrad._C. hg::Error crosses as handgrad.Error, a
// subclass of both ValueError and RuntimeError, with handgrad's message.
#include "bindings.hpp"
#include "core/error.hpp"

namespace {

// Made once at import with the C API and kept for the life of the process
// (never released: the translator may run until the interpreter ends). Not
// py::register_exception: pybind11 3 builds that type lazily, on the first
// throw, from a base handle that would by then point at a freed tuple.
PyObject* g_error_type = nullptr;

void translate_error(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const hg::Error& e) {
    PyErr_SetString(g_error_type, e.what());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  m.doc() = "handgrad: hand-written forward and backward ops on the CPU (Eigen) and CUDA";
  const py::tuple bases = py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError));
  g_error_type = PyErr_NewException("handgrad._C.Error", bases.ptr(), nullptr);
  if (g_error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error_type);
  py::register_exception_translator(&translate_error);
  hg::python::bind_tensor(m);
  hg::python::bind_dlpack(m);
  hg::python::bind_ops(m);
  hg::python::bind_models(m);
  hg::python::bind_bench_hooks(m);
}
