#pragma once
// One registration function per concept; module.cpp calls them in order.
#include <pybind11/pybind11.h>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/tensor.hpp"

namespace hg::python {

namespace py = pybind11;

void bind_tensor(py::module_& m);        // tensor.cpp: Tensor, factories, NumPy
void bind_dlpack(py::module_& m);        // dlpack.cpp: __dlpack__, from_dlpack
void bind_ops(py::module_& m);           // ops.cpp: layernorm, softmax, cross-entropy, kernel mode
void bind_models(py::module_& m);        // models.cpp: DecoderLM, optimizers
void bind_torch_view(py::module_& m);    // torch_view.cpp: handgrad.torch's registration of PyTorch
void bind_torch_ops(py::module_& m);     // torch_ops.cpp: handgrad.torch's entry points
void bind_torch_bridge(py::module_& m);  // torch_bridge.cpp: the function table handgrad._torch_ext calls
void bind_bench_hooks(py::module_& m);   // bench_hooks.cpp: C++-side timing for bench/python_overhead.py

// Python spellings: "float32", "float64", "bfloat16", "float16"; "cpu", "cuda".
DType parse_dtype(const std::string& name);
const char* dtype_py_name(DType dtype);
Device parse_device(const std::string& name);

// Token ids / class targets as handgrad takes them (float32, exact up to
// 2^24): a handgrad tensor as it is (the op checks its dtype); a NumPy array
// or nested list of integers or floats converted to a float32 CPU tensor.
// `what` names the op in errors.
Tensor as_ids(const py::object& ids, const char* what);

}  // namespace hg::python
