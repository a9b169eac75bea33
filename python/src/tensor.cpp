// Tensor for Python: metadata, factories, and zero-copy exchange with NumPy
// (NumPy arrays are wrapped in place; numpy() views the tensor's bytes).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"

namespace hg::python {

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "float64") return DType::F64;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  fail("handgrad", "unknown dtype '", name, "'; use float32, float64, bfloat16 or float16");
}

const char* dtype_py_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
  }
  return "?";
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda" || name == "cuda:0") return Device::CUDA;
  fail("handgrad", "unknown device '", name, "'; use cpu or cuda");
}

namespace {

py::tuple shape_tuple(const Shape& shape) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = shape[i];
  return t;
}

// NumPy's type string for a dtype it can hold ("<f4"); bfloat16 has none.
const char* numpy_typestr(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::F16: return "<f2";
    case DType::BF16: break;
  }
  fail(op, t.describe(), ": NumPy has no bfloat16; convert first with t.to('float32')");
}

void check_host(const Tensor& t, const char* op) {
  HG_CHECK(!t.is_cuda(), op, t.describe(),
           " lives on the GPU; NumPy sees host memory only: use t.to('cpu') "
           "(a copy) or DLPack (handgrad.from_dlpack / torch.from_dlpack) for zero-copy GPU exchange");
}

std::vector<py::ssize_t> row_major_strides(const Shape& shape, size_t item) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t s = static_cast<py::ssize_t>(item);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= static_cast<py::ssize_t>(shape[i]);
  }
  return strides;
}

// Zero-copy view of a host tensor; `owner` (the Python Tensor) keeps the bytes alive.
py::array to_numpy(const Tensor& t, py::handle owner) {
  check_host(t, "Tensor.numpy");
  const py::dtype dt(std::string(numpy_typestr(t, "Tensor.numpy")));
  const std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  return py::array(dt, shape, row_major_strides(t.shape(), dtype_size(t.dtype())), t.raw_data(), owner);
}

DType numpy_dtype(const py::array& a) {
  const py::dtype dt = a.dtype();
  HG_CHECK(dt.attr("isnative").cast<bool>(), "from_numpy", "dtype ", py::repr(dt).cast<std::string>(),
           " is not in native byte order: pass a.astype(a.dtype.newbyteorder('='))");
  if (dt.kind() == 'f' && dt.itemsize() == 4) return DType::F32;
  if (dt.kind() == 'f' && dt.itemsize() == 8) return DType::F64;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return DType::F16;
  fail("from_numpy", "dtype ", py::str(static_cast<const py::handle&>(dt)).cast<std::string>(),
       " is not supported; handgrad tensors hold float32, float64 or float16 from NumPy "
       "(convert with a.astype(numpy.float32))");
}

// Wraps the array's bytes in place; the tensor holds a reference to the array.
Tensor from_numpy(const py::array& a) {
  const DType dtype = numpy_dtype(a);
  HG_CHECK(a.flags() & py::array::c_style, "from_numpy",
           "the array is not C-contiguous (strided or transposed view); handgrad tensors are contiguous "
           "row-major: pass numpy.ascontiguousarray(a) (a copy)");
  HG_CHECK(a.writeable(), "from_numpy",
           "the array is read-only; handgrad tensors may be written in place: pass a.copy()");
  HG_CHECK(reinterpret_cast<uintptr_t>(a.data()) % dtype_size(dtype) == 0, "from_numpy",
           "the array's data is not aligned to its ", dtype_size(dtype), "-byte elements: pass a.copy()");
  Shape shape(a.shape(), a.shape() + a.ndim());
  auto* keep = new py::object(a);
  return Tensor::from_blob(const_cast<void*>(a.data()), shape, dtype, Device::CPU, [keep] {
    if (!Py_IsInitialized()) return;  // interpreter gone: the array went with it
    py::gil_scoped_acquire gil;
    delete keep;
  });
}

// repr(): the values of a small tensor, as PyTorch prints them
// ("Tensor(2.3026, dtype=float32)", "Tensor([[1., 2.], [3., 4.]], ...)"),
// so print(loss) shows the loss; a large one by its shape only.
constexpr int64_t kReprMaxValues = 100;

void write_values(std::ostringstream& os, const std::vector<double>& v, const Shape& shape, size_t dim, size_t& at) {
  if (dim == shape.size()) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4g", v[at++]);
    os << text;
    return;
  }
  os << '[';
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i > 0) os << ", ";
    write_values(os, v, shape, dim + 1, at);
  }
  os << ']';
}

std::string tensor_repr(const Tensor& t) {
  if (!t.defined() || t.numel() > kReprMaxValues) return t.describe();
  std::ostringstream os;
  os << "Tensor(";
  size_t at = 0;
  write_values(os, t.to_vector(), t.shape(), 0, at);
  os << ", dtype=" << dtype_py_name(t.dtype());
  if (t.is_cuda()) os << ", device=cuda";
  os << ')';
  return os.str();
}

Shape to_shape(const py::object& obj) {
  if (py::isinstance<py::int_>(obj)) return Shape{obj.cast<int64_t>()};
  return obj.cast<Shape>();
}

}  // namespace

Tensor as_ids(const py::object& ids, const char* what) {
  if (py::isinstance<Tensor>(ids)) return ids.cast<Tensor>();  // as it is: the op checks its dtype
  const py::module_ np = py::module_::import("numpy");
  const py::object a = np.attr("asarray")(ids);
  const std::string kind = a.attr("dtype").attr("kind").cast<std::string>();
  HG_CHECK(kind == "i" || kind == "u" || kind == "f", what, "ids must be integers (or float32), got a NumPy array of ",
           py::str(a.attr("dtype")).cast<std::string>());
  if (kind != "f" && a.attr("size").cast<int64_t>() > 0) {
    const int64_t hi = a.attr("max")().cast<int64_t>(), lo = a.attr("min")().cast<int64_t>();
    constexpr int64_t kExact = int64_t{1} << 24;  // float32 holds every integer up to here
    HG_CHECK(hi < kExact && lo > -kExact, what, "ids from ", lo, " to ", hi, " are not exact in float32 (|id| < 2^24)");
  }
  return from_numpy(np.attr("ascontiguousarray")(a, py::arg("dtype") = "float32").cast<py::array>());
}

void bind_tensor(py::module_& m) {
  py::class_<Generator>(m, "Generator", "Seeded random source; tensors are drawn on the host from it.")
      .def(py::init<uint64_t>(), py::arg("seed") = 0);

  py::class_<Tensor>(m, "Tensor",
                     "A dense, contiguous, row-major array on the CPU or a CUDA GPU.\n"
                     "Zero-copy: numpy(), __array_interface__, __dlpack__; handgrad.from_numpy / from_dlpack.")
      .def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("dtype", [](const Tensor& t) { return dtype_py_name(t.dtype()); })
      .def_property_readonly("device", [](const Tensor& t) { return device_name(t.device()); })
      .def_property_readonly("ndim", &Tensor::ndim)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("numel", &Tensor::numel)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()); })
      .def("__repr__", &tensor_repr)
      .def(
          "numpy", [](py::object self) { return to_numpy(self.cast<const Tensor&>(), self); },
          "A NumPy array viewing this tensor's host memory (no copy).")
      .def_property_readonly("__array_interface__",
                             [](const Tensor& t) {
                               check_host(t, "__array_interface__");
                               py::dict d;
                               d["shape"] = shape_tuple(t.shape());
                               d["typestr"] = numpy_typestr(t, "__array_interface__");
                               d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(t.raw_data()), false);
                               d["version"] = 3;
                               return d;
                             })
      .def(
          "to",
          [](const Tensor& t, const std::string& where) {
            if (where == "cpu" || where == "cuda" || where == "cuda:0") return t.to(parse_device(where));
            return t.to(parse_dtype(where));
          },
          py::arg("device_or_dtype"), "A copy on another device or in another dtype (self if nothing changes).")
      .def("clone", &Tensor::clone)
      .def("copy_",
           [](Tensor& t, const Tensor& src) -> Tensor& {
             t.copy_(src);
             return t;
           })
      .def("fill_", [](Tensor& t, double v) -> Tensor& { return t.fill_(v); })
      .def("reshape",
           [](const Tensor& t, const py::args& args) {
             return t.reshape(args.size() == 1 ? to_shape(args[0]) : args.cast<Shape>());
           })
      .def("item", &Tensor::item)
      .def("tolist_flat", &Tensor::to_vector, "All elements as floats, row-major.");

  m.def("from_numpy", &from_numpy, py::arg("array"),
        "Wraps a C-contiguous, writable float32/float64/float16 NumPy array without copying.");
  m.def(
      "zeros",
      [](const py::object& s, const std::string& dt, const std::string& dev) {
        return Tensor::zeros(to_shape(s), parse_dtype(dt), parse_device(dev));
      },
      py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def(
      "ones",
      [](const py::object& s, const std::string& dt, const std::string& dev) {
        return Tensor::ones(to_shape(s), parse_dtype(dt), parse_device(dev));
      },
      py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def(
      "full",
      [](const py::object& s, double v, const std::string& dt, const std::string& dev) {
        return Tensor::full(to_shape(s), v, parse_dtype(dt), parse_device(dev));
      },
      py::arg("shape"), py::arg("value"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def(
      "randn",
      [](const py::object& s, Generator& gen, const std::string& dt, const std::string& dev) {
        return Tensor::randn(to_shape(s), gen, parse_dtype(dt), parse_device(dev));
      },
      py::arg("shape"), py::arg("generator"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("cuda_available", &cuda_available, "True when built with CUDA and a GPU is visible.");
  m.def(
      "cuda_memory_stats",
      [] {
        const gpu::MemoryStats s = gpu::memory_stats();
        py::dict d;
        d["in_use"] = s.in_use;
        d["peak_in_use"] = s.peak_in_use;
        d["requested"] = s.requested;
        d["peak_requested"] = s.peak_requested;
        d["reserved"] = s.reserved;
        d["device_mallocs"] = s.device_mallocs;
        return d;
      },
      "handgrad's CUDA caching allocator, in bytes (PyTorch's allocator does not see these blocks).");
  m.def("cuda_reset_peak_memory", &gpu::reset_peak_memory);
  m.def("cuda_empty_cache", &gpu::empty_cache, "Returns handgrad's cached CUDA blocks to the driver.");
  m.def("cuda_set_memory_limit", &gpu::set_memory_limit, py::arg("bytes"),
        "At most `bytes` held by handgrad's CUDA allocator (0: no limit); a request over it raises "
        "OutOfMemoryError after the cache is given back.");
  m.def("cuda_memory_limit", &gpu::memory_limit, "The limit cuda_set_memory_limit set, in bytes (0: none).");
}

}  // namespace hg::python
