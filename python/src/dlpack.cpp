// DLPack exchange (zero-copy, CPU and CUDA). Export: Tensor.__dlpack__ hands
// out a capsule that keeps the tensor alive. Import: from_dlpack wraps the
// producer's memory in place and calls its deleter when the last view goes.
// Streams: the consumer's stream is ordered after handgrad's stream with an
// event (and back again when the memory is released), so nothing blocks the host.
#include <pybind11/stl.h>

#include <string>
#include <type_traits>
#include <vector>

#include "bindings.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "dlpack.hpp"
#include "stream_order.hpp"

namespace hg::python {
namespace {

constexpr const char* kExport = "Tensor.__dlpack__";
constexpr const char* kImport = "from_dlpack";
constexpr intptr_t kLegacyDefaultStream = 1;
constexpr intptr_t kNoSync = -1;

// ---- export -------------------------------------------------------------------

struct ExportContext {
  Tensor tensor;  // keeps the bytes alive while the consumer holds them
  std::vector<int64_t> shape;
  intptr_t consumer_stream = kNoSync;
};

dlpack::DataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return {dlpack::kFloat, 32, 1};
    case DType::F64: return {dlpack::kFloat, 64, 1};
    case DType::F16: return {dlpack::kFloat, 16, 1};
    case DType::BF16: return {dlpack::kBfloat, 16, 1};
  }
  return {dlpack::kFloat, 32, 1};
}

void release_export(ExportContext* ctx) {
  if (ctx == nullptr) return;
  try {  // handgrad may reuse the block at once: let it wait for the consumer's queued work
    if (ctx->tensor.is_cuda() && ctx->consumer_stream != kNoSync)
      order_streams(ctx->consumer_stream, handgrad_stream());
  } catch (...) {
  }
  delete ctx;
}

template <class Managed>
void fill_export(Managed* managed, ExportContext* ctx) {
  const Tensor& t = ctx->tensor;
  managed->manager_ctx = ctx;
  managed->deleter = [](Managed* self) {
    release_export(static_cast<ExportContext*>(self->manager_ctx));
    delete self;
  };
  dlpack::Tensor& dl = managed->dl_tensor;
  dl.data = t.raw_data();
  dl.device = t.is_cuda() ? dlpack::Device{dlpack::kCUDA, cuda_current_device()} : dlpack::Device{dlpack::kCPU, 0};
  dl.ndim = t.ndim();
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = nullptr;  // compact row-major
  dl.byte_offset = 0;
}

// Capsule destructor: frees the tensor only if no consumer took it (renamed the capsule).
template <class Managed>
void capsule_destructor(PyObject* capsule, const char* name) {
  if (!PyCapsule_IsValid(capsule, name)) return;
  auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

// A capsule named `name` owning `managed` (which takes `ctx`); its destructor
// frees them unless a consumer renamed the capsule and so took ownership.
template <class Managed>
py::object make_capsule(Managed* managed, ExportContext* ctx, const char* name) {
  fill_export(managed, ctx);
  PyObject* cap = PyCapsule_New(managed, name, [](PyObject* c) {
    const char* own_name = std::is_same_v<Managed, dlpack::ManagedTensor> ? "dltensor" : "dltensor_versioned";
    capsule_destructor<Managed>(c, own_name);
  });
  if (cap == nullptr) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

// DLPack stream argument -> the stream the consumer will use (kNoSync for "none").
intptr_t consumer_stream(const Tensor& t, const py::object& stream) {
  if (!t.is_cuda()) return kNoSync;  // host memory: nothing to order (the spec expects None here)
  if (stream.is_none()) return kLegacyDefaultStream;
  HG_CHECK(py::isinstance<py::int_>(stream), kExport, "stream must be an int or None, got ",
           py::str(py::type::of(stream)).cast<std::string>());
  const intptr_t s = stream.cast<intptr_t>();
  HG_CHECK(s != 0, kExport,
           "stream 0 is ambiguous for CUDA in DLPack; pass 1 (legacy default), "
           "2 (per-thread default), -1 (no synchronisation) or a stream handle");
  return s;
}

py::object dlpack_export(const Tensor& self, const py::object& stream, const py::object& max_version,
                         const py::object& dl_device, const py::object& copy) {
  self.check_defined(kExport);
  Tensor t = self;
  if (!dl_device.is_none()) {
    const auto dev = dl_device.cast<std::pair<int, int>>();
    const int own = t.is_cuda() ? dlpack::kCUDA : dlpack::kCPU;
    HG_CHECK(dev.first == own, kExport, "dl_device (", dev.first, ", ", dev.second, ") differs from the tensor's ",
             t.describe(), "; cross-device export is not supported (use Tensor.to first)");
  }
  const bool copied = !copy.is_none() && copy.cast<bool>();
  if (copied) t = t.clone();

  const intptr_t s = consumer_stream(t, stream);
  if (s != kNoSync) order_streams(handgrad_stream(), s);  // the consumer sees finished data

  auto* ctx = new ExportContext{t, std::vector<int64_t>(t.shape().begin(), t.shape().end()), s};
  const bool versioned = !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
  if (!versioned) return make_capsule(new dlpack::ManagedTensor{}, ctx, "dltensor");
  auto* managed = new dlpack::ManagedTensorVersioned{};
  managed->version = {1, 0};
  managed->flags = copied ? dlpack::kFlagIsCopied : 0;
  return make_capsule(managed, ctx, "dltensor_versioned");
}

// ---- import -------------------------------------------------------------------

std::string describe_dl_dtype(const dlpack::DataType& d) {
  const char* names[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string s = (d.code < 7 ? names[d.code] : "code" + std::to_string(d.code)) + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

DType import_dtype(const dlpack::DataType& d) {
  if (d.lanes == 1 && d.code == dlpack::kFloat && d.bits == 32) return DType::F32;
  if (d.lanes == 1 && d.code == dlpack::kFloat && d.bits == 64) return DType::F64;
  if (d.lanes == 1 && d.code == dlpack::kFloat && d.bits == 16) return DType::F16;
  if (d.lanes == 1 && d.code == dlpack::kBfloat && d.bits == 16) return DType::BF16;
  fail(kImport, "dtype ", describe_dl_dtype(d),
       " is not supported; handgrad tensors hold float32, float64, "
       "bfloat16 or float16 (cast first, e.g. torch's t.float())");
}

Device import_device(const dlpack::Device& dev) {
  if (dev.device_type == dlpack::kCPU || dev.device_type == dlpack::kCUDAHost) return Device::CPU;
  if (dev.device_type == dlpack::kCUDA) {
    HG_CHECK(cuda_available(), kImport, "a CUDA tensor, but handgrad was built without CUDA or sees no GPU");
    HG_CHECK(dev.device_id == cuda_current_device(), kImport, "the tensor is on CUDA device ", dev.device_id,
             " but handgrad runs on device ", cuda_current_device());
    return Device::CUDA;
  }
  fail(kImport, "DLPack device type ", dev.device_type,
       " is not supported; handgrad takes CPU (1) and CUDA (2) memory");
}

Shape import_shape(const dlpack::Tensor& dl) {
  HG_CHECK(dl.ndim >= 0, kImport, "negative ndim ", dl.ndim);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides == nullptr) return shape;
  int64_t expected = 1;  // row-major strides, in elements; size-1 dims may have any stride
  for (int i = dl.ndim; i-- > 0;) {
    if (shape[i] != 1 && dl.strides[i] != expected)
      fail(kImport, "the tensor of shape ", shape, " is not contiguous (stride ", dl.strides[i], " in dim ", i,
           ", row-major needs ", expected, "); handgrad tensors are contiguous: pass t.contiguous() (a copy)");
    expected *= shape[i];
  }
  return shape;
}

// Wraps an unconsumed DLPack tensor; on success the caller renames the capsule.
template <class Managed>
Tensor wrap_managed(Managed* managed, intptr_t release_stream) {
  const dlpack::Tensor& dl = managed->dl_tensor;
  const DType dtype = import_dtype(dl.dtype);
  const Device device = import_device(dl.device);
  const Shape shape = import_shape(dl);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  HG_CHECK(reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0, kImport, "the data is not aligned to its ",
           dtype_size(dtype), "-byte elements: pass a copy");
  return Tensor::from_blob(data, shape, dtype, device, [managed, device, release_stream] {
    // The producer may reuse the memory on its stream: order that after handgrad's queued work.
    try {
      if (device == Device::CUDA && release_stream != kNoSync) order_streams(handgrad_stream(), release_stream);
    } catch (...) {  // still hand the memory back
    }
    if (managed->deleter == nullptr) return;
    if (Py_IsInitialized()) {  // deleters of Python producers (NumPy) touch reference counts
      py::gil_scoped_acquire gil;
      managed->deleter(managed);
    }
  });
}

Tensor import_capsule(const py::capsule& cap, intptr_t release_stream) {
  PyObject* c = cap.ptr();
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* managed = static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    HG_CHECK(managed->version.major == 1, kImport, "DLPack major version ", managed->version.major,
             " is not supported (handgrad reads 1.x)");
    HG_CHECK(!(managed->flags & dlpack::kFlagReadOnly), kImport,
             "the tensor is read-only; handgrad tensors may be written in place: pass a copy");
    Tensor t = wrap_managed(managed, release_stream);
    PyCapsule_SetName(c, "used_dltensor_versioned");
    return t;
  }
  HG_CHECK(PyCapsule_IsValid(c, "dltensor"), kImport,
           "not a DLPack capsule, or one already consumed (a capsule can be imported once)");
  auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
  Tensor t = wrap_managed(managed, release_stream);
  PyCapsule_SetName(c, "used_dltensor");
  return t;
}

// `stream`: the producer's CUDA stream (a cudaStream_t as int; default: the legacy default stream).
Tensor dlpack_import(const py::object& obj, const py::object& stream_arg) {
  const intptr_t stream = stream_arg.is_none() ? kLegacyDefaultStream : stream_arg.cast<intptr_t>();
  if (py::isinstance<py::capsule>(obj)) {
    Tensor t = import_capsule(obj.cast<py::capsule>(), stream);
    if (t.is_cuda()) order_streams(stream, handgrad_stream());  // the producer's pending writes first
    return t;
  }
  HG_CHECK(py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__"), kImport,
           "expected an object with __dlpack__ and __dlpack_device__ (a torch.Tensor, NumPy array, ...) or a "
           "DLPack capsule, got ",
           py::str(py::type::of(obj)).cast<std::string>());
  const auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  // A CUDA producer makes its data ready on handgrad's stream (an event wait, no host block).
  // No max_version: every producer (NumPy, PyTorch 1.10+, ...) answers with an unversioned capsule.
  // DLPack names the legacy default stream 1 (0 is ambiguous there).
  py::object hg_stream = py::none();
  if (dev.first == dlpack::kCUDA)
    hg_stream = py::int_(handgrad_stream() == 0 ? kLegacyDefaultStream : handgrad_stream());
  return import_capsule(obj.attr("__dlpack__")(py::arg("stream") = hg_stream).cast<py::capsule>(), stream);
}

}  // namespace

void bind_dlpack(py::module_& m) {
  auto tensor = py::class_<Tensor>(py::reinterpret_borrow<py::object>(m.attr("Tensor")));
  tensor.def("__dlpack__", &dlpack_export, py::kw_only(), py::arg("stream") = py::none(),
             py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
             "DLPack export (no copy). CUDA: `stream` will see handgrad's finished work.");
  tensor.def("__dlpack_device__", [](const Tensor& t) {
    return t.is_cuda() ? py::make_tuple(static_cast<int>(dlpack::kCUDA), cuda_current_device())
                       : py::make_tuple(static_cast<int>(dlpack::kCPU), 0);
  });
  m.def("from_dlpack", &dlpack_import, py::arg("obj"), py::kw_only(), py::arg("stream") = py::none(),
        "Wraps a DLPack producer's tensor (torch.Tensor, NumPy array, or a capsule) without copying.\n"
        "CUDA: `stream` is the producer's stream (a cudaStream_t as int, e.g. torch's\n"
        "current_stream().cuda_stream; default: the legacy default stream). An object with __dlpack__\n"
        "orders its pending work before handgrad's stream itself; for a capsule handgrad orders `stream`\n"
        "first. When handgrad drops the memory, `stream` waits for handgrad's queued work, so the\n"
        "producer may reuse it there at once.");
  m.def("cuda_stream", &handgrad_stream, "handgrad's current CUDA stream handle as an int (0 without CUDA).");
  m.def(
      "set_cuda_stream",
      [](const py::object& handle) {
        if (handle.is_none()) return gpu::use_own_stream();
        HG_CHECK(py::isinstance<py::int_>(handle), "set_cuda_stream",
                 "expected a cudaStream_t as an int "
                 "(e.g. torch.cuda.current_stream().cuda_stream) or None, got ",
                 py::str(py::type::of(handle)).cast<std::string>());
        gpu::set_stream(handle.cast<intptr_t>());
      },
      py::arg("handle"),
      "Runs handgrad's CUDA work on `handle` (a cudaStream_t as an int; 0 is the legacy default\n"
      "stream) from now on; None: back to handgrad's own stream. The new stream first waits for\n"
      "everything queued on the old one. With handgrad on the consumer's or producer's stream,\n"
      "DLPack crossings need no events. handgrad.torch sets it to PyTorch's current stream.");
}

}  // namespace hg::python
