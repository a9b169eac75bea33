// The extension module handgrad._C. hg::Error crosses as handgrad.Error, a
// subclass of both ValueError and RuntimeError, with handgrad's message.
#include "bindings.hpp"
#include "core/error.hpp"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  m.doc() = "handgrad: hand-written forward and backward ops on the CPU (Eigen) and CUDA";
  py::register_exception<hg::Error>(m, "Error",
                                    py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError)));
  py::register_exception<hg::OutOfMemory>(m, "OutOfMemoryError",
                                          py::make_tuple(m.attr("Error"), py::handle(PyExc_MemoryError)));
  hg::python::bind_tensor(m);
  hg::python::bind_dlpack(m);
  hg::python::bind_ops(m);
  hg::python::bind_models(m);
  hg::python::bind_torch_view(m);
  hg::python::bind_torch_ops(m);
  hg::python::bind_torch_bridge(m);
  hg::python::bind_bench_hooks(m);
}
