// handgrad._torch_ext: handgrad.torch's drop-ins (LayerNorm, attention
// softmax, softmax, cross-entropy) as C++ torch::autograd::Functions, so no
// Python frame runs in their forward dispatch or in the backward. Outputs and
// the saved state are allocated by torch (its caching allocator, its current
// stream); handgrad's kernels are reached through handgrad._C's bridge
// (../torch_bridge.hpp), which checks every tensor as the Python drop-ins'
// crossing does. Same semantics, dtype rules and messages as the Python
// Functions in python/handgrad/torch.py, which stay as the fallback.
//
// Only torch's headers (and its pybind11) in this translation unit.
#include <ATen/ATen.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>
#ifdef HG_TORCH_EXT_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <new>
#include <stdexcept>
#include <string>

#include "torch_bridge.hpp"

namespace {

namespace py = pybind11;
namespace tb = hg::python::torch_bridge;
using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = c10::optional<Tensor>;

const tb::Api* bridge = nullptr;     // handgrad._C's table, set at import
PyObject* handgrad_error = nullptr;  // handgrad.Error, held for the life of the process

// Raised as handgrad.Error: by this module's functions, and by PyTorch when it
// rethrows a backward's exception in the caller's thread (it asks python_type()).
struct HandgradError : torch::PyTorchError {
  explicit HandgradError(const std::string& message) { msg = message; }  // PyTorchError's constructors vary by version
  PyObject* python_type() override { return handgrad_error; }
};

void check(const tb::Status& status) {
  switch (status.kind) {
    case tb::kOk: return;
    case tb::kHandgradError: throw HandgradError(status.message);
    case tb::kOutOfMemory: throw std::bad_alloc();
    default: throw std::runtime_error(status.message);
  }
}

// Python's spelling of a tensor attribute ("torch.int64", "meta"), for messages
// only. The backward runs without the GIL, so it is taken here.
std::string python_str(const Tensor& t, const char* attribute) {
  py::gil_scoped_acquire gil;
  return py::str(py::cast(t).attr(attribute));
}

// A shape as Python prints a tuple: "(2, 3)", "(5,)", "()".
std::string python_tuple(at::IntArrayRef shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

int32_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return tb::kFloat32;
    case at::kDouble: return tb::kFloat64;
    case at::kBFloat16: return tb::kBFloat16;
    case at::kHalf: return tb::kFloat16;
    default: return tb::kOtherDType;
  }
}

at::ScalarType scalar_type(int32_t code) {
  switch (code) {
    case tb::kFloat64: return at::kDouble;
    case tb::kBFloat16: return at::kBFloat16;
    case tb::kFloat16: return at::kHalf;
    default: return at::kFloat;
  }
}

// What the bridge reads of one tensor. The names of an unsupported dtype or
// device are looked up only then, for the message.
class Facts {
 public:
  explicit Facts(const Tensor& t) {
    f_.dtype = dtype_code(t.scalar_type());
    if (f_.dtype == tb::kOtherDType) f_.dtype_name = (dtype_name_ = python_str(t, "dtype")).c_str();
    const c10::Device device = t.device();
    if (device.is_cpu()) {
      f_.device = tb::kCPU;
    } else if (device.is_cuda()) {
      f_.device = tb::kCUDA;
      f_.cuda_index = device.index();
    } else {
      f_.device_name = (device_name_ = python_str(t, "device")).c_str();
    }
    f_.sizes = t.sizes().data();
    f_.ndim = t.dim();
    f_.contiguous = t.is_contiguous();
    if (f_.dtype != tb::kOtherDType && f_.device != tb::kOtherDevice) f_.data = t.data_ptr();
  }
  // Row `i` of a contiguous (rows, n) tensor, as a tensor of shape `row_shape` = (n,).
  Facts(const Tensor& t, int64_t i, const int64_t* row_shape) : Facts(t) {
    if (f_.data != nullptr) f_.data = static_cast<char*>(f_.data) + i * row_shape[0] * t.element_size();
    f_.sizes = row_shape;
    f_.ndim = 1;
  }
  Facts(const Facts&) = delete;
  Facts& operator=(const Facts&) = delete;
  const tb::TensorFacts& operator*() const { return f_; }

 private:
  tb::TensorFacts f_;
  std::string dtype_name_, device_name_;
};

// PyTorch's current stream on `t`'s device (its kernels go there, in PyTorch's order).
intptr_t current_stream(const Tensor& t) {
#ifdef HG_TORCH_EXT_CUDA
  if (t.is_cuda()) return reinterpret_cast<intptr_t>(c10::cuda::getCurrentCUDAStream(t.get_device()).stream());
  return 0;
#else
  (void)t;
  return tb::kNoStream;
#endif
}

// Memory handgrad allocated, as an at::Tensor that gives it back when PyTorch frees it.
Tensor adopt(const tb::OwnedTensor& owned, at::IntArrayRef shape, const Tensor& like) {
  void* owner = owned.owner;
  int64_t numel = 1;
  for (const int64_t n : shape) numel *= n;
  if (owned.numel != numel) {
    bridge->release(owner);
    throw std::logic_error("handgrad._torch_ext: handgrad returned " + std::to_string(owned.numel) +
                           " elements for shape " + python_tuple(shape));
  }
  // From here the deleter owns the memory (from_blob's own checks concern the device, and the
  // memory was just allocated on `like`'s).
  return at::from_blob(
      owned.data, shape, [owner](void*) { bridge->release(owner); }, like.options().dtype(scalar_type(owned.dtype)));
}

Tensor as_dtype(const Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

at::ScalarType math_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

bool present(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// ---- LayerNorm ---------------------------------------------------------------------

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const OptionalTensor& weight,
                        const OptionalTensor& bias, double eps) {
    const Tensor x = input.contiguous();  // the same tensor when it is contiguous already
    const at::ScalarType math = math_dtype(x.scalar_type());
    const at::IntArrayRef d_shape = x.dim() > 0 ? x.sizes().slice(x.dim() - 1) : at::IntArrayRef{};
    const Tensor w = present(weight) ? as_dtype(*weight, math) : at::ones(d_shape, x.options().dtype(math));
    const Tensor b = present(bias) ? as_dtype(*bias, math) : at::zeros(d_shape, x.options().dtype(math));
    Tensor y = at::empty_like(x);
    // One mean and one rstd per row, in one allocation (an x without rows is refused by the op).
    const int64_t D = x.dim() > 0 ? x.size(-1) : 0;
    const int64_t rows[1] = {D > 0 ? x.numel() / D : 0};
    Tensor stats = at::empty({2, rows[0]}, x.options().dtype(math));
    check(bridge->layernorm_forward(*Facts(x), *Facts(w), *Facts(b), eps, *Facts(y), *Facts(stats, 0, rows),
                                    *Facts(stats, 1, rows), current_stream(x)));
    ctx->save_for_backward({x, w, stats});
    // Which parameters were given (None gets no gradient). Their gradients are computed in the math
    // dtype; autograd casts each to its input's dtype, as the Python Function does by hand.
    ctx->saved_data["given"] = int64_t{present(weight)} | int64_t{present(bias)} << 1;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // raises after a backward without retain_graph
    const Tensor &x = saved[0], &w = saved[1], &stats = saved[2];
    const Tensor dy = as_dtype(grads[0], x.scalar_type()).contiguous();
    Tensor dx = at::empty_like(x), dw = at::empty_like(w), db = at::empty_like(w);
    const int64_t rows[1] = {stats.size(1)};
    check(bridge->layernorm_backward(*Facts(dy), *Facts(x), *Facts(w), *Facts(stats, 0, rows), *Facts(stats, 1, rows),
                                     *Facts(dx), *Facts(dw), *Facts(db), current_stream(x)));
    const int64_t given = ctx->saved_data["given"].toInt();
    return {dx, given & 1 ? dw : Tensor(), given & 2 ? db : Tensor(), Tensor()};
  }
};

// ---- softmax / attention softmax -------------------------------------------------

// handgrad takes an additive float mask (B, 1, 1, Tk) or (B, 1, Tq, Tk): a bool mask (True =
// attend) becomes 0 / -inf, other broadcastable shapes are expanded (a copy, by contiguous()).
Tensor additive_mask(const Tensor& given, const Tensor& scores) {
  const at::ScalarType math = math_dtype(scores.scalar_type());
  Tensor mask = given;
  if (mask.scalar_type() == at::kBool)
    mask = at::zeros(mask.sizes(), mask.options().dtype(math)).masked_fill(mask.logical_not(), -INFINITY);
  mask = as_dtype(mask, math);
  const int64_t B = scores.size(0), Tq = scores.size(2), Tk = scores.size(3);
  if (mask.dim() == 4 && mask.size(0) == B && mask.size(1) == 1 && (mask.size(2) == 1 || mask.size(2) == Tq) &&
      mask.size(3) == Tk)
    return mask;
  try {
    return mask.expand({B, 1, Tq, Tk});
  } catch (const c10::Error&) {
    throw HandgradError("attention_softmax: mask " + python_tuple(mask.sizes()) +
                        " does not broadcast to (B, 1, Tq, Tk) = " + python_tuple({B, 1, Tq, Tk}) + " for scores " +
                        python_tuple(scores.sizes()) + " (per-head masks are not supported)");
  }
}

struct SoftmaxFunction : torch::autograd::Function<SoftmaxFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const OptionalTensor& given_mask, bool causal,
                        double scale) {
    const Tensor scores = input.contiguous();
    Tensor mask;
    if (present(given_mask)) {
      if (scores.dim() != 4)
        throw HandgradError("attention_softmax: a mask needs scores (B, H, Tq, Tk), got " +
                            python_tuple(scores.sizes()));
      mask = additive_mask(*given_mask, scores).contiguous();
    }
    Tensor y = at::empty_like(scores);
    if (mask.defined()) {
      const Facts mask_facts(mask);
      check(bridge->softmax_forward(*Facts(scores), &*mask_facts, causal, scale, *Facts(y), current_stream(scores)));
    } else {
      check(bridge->softmax_forward(*Facts(scores), nullptr, causal, scale, *Facts(y), current_stream(scores)));
    }
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor y = ctx->get_saved_variables()[0];
    const Tensor dy = as_dtype(grads[0], y.scalar_type()).contiguous();
    Tensor dx = at::empty_like(y);
    check(bridge->softmax_backward(*Facts(dy), *Facts(y), ctx->saved_data["scale"].toDouble(), *Facts(dx),
                                   current_stream(y)));
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

// ---- cross-entropy ---------------------------------------------------------------

// handgrad's CrossEntropySaved, freed with the autograd node.
struct CrossEntropyState : torch::CustomClassHolder {
  explicit CrossEntropyState(void* s) : saved(s) {}
  ~CrossEntropyState() override { bridge->free_cross_entropy_saved(saved); }
  void* saved;
};

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& given_logits, const Tensor& given_target,
                        int64_t ignore_index) {
    if (c10::isFloatingType(given_target.scalar_type()))
      throw HandgradError("cross_entropy: target must hold integer class ids, got " +
                          python_str(given_target, "dtype"));
    if (given_logits.dim() > 0 && given_logits.size(-1) > (int64_t{1} << 24))
      throw HandgradError("cross_entropy: vocabulary " + std::to_string(given_logits.size(-1)) +
                          " exceeds 2^24, the largest whose ids float32 holds exactly");
    // float32 math on bfloat16 logits is handgrad's own on CUDA; elsewhere, and for float16,
    // the logits become float32 first, as torch.autocast does for cross_entropy.
    const at::ScalarType t = given_logits.scalar_type();
    Tensor logits = given_logits;
    if (t != at::kFloat && t != at::kDouble && !(logits.is_cuda() && t == at::kBFloat16))
      logits = logits.to(at::kFloat);
    logits = logits.contiguous();
    // handgrad keeps class ids as float32 (a small copy). On CUDA they are checked and counted
    // on the device (no host wait): a bad one makes the loss NaN.
    const Tensor target = given_target.to(at::kFloat).contiguous();
    tb::OwnedTensor loss;
    void* saved = nullptr;
    check(bridge->cross_entropy_forward(*Facts(logits), *Facts(target), ignore_index, current_stream(logits), &loss,
                                        &saved));
    ctx->saved_data["state"] = c10::IValue::make_capsule(c10::make_intrusive<CrossEntropyState>(saved));
    ctx->save_for_backward({logits, target});  // the state may view both: they must outlive it
    return adopt(loss, {}, logits);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // raises once PyTorch freed them
    const Tensor& logits = saved[0];
    const auto state = ctx->saved_data["state"].toCapsule();
    const void* ce = static_cast<const CrossEntropyState*>(state.get())->saved;
    const Tensor& dloss = grads[0];
    tb::OwnedTensor dlogits;
    if (logits.is_cuda()) {  // scale on the device: reading dloss on the host would block
      check(bridge->cross_entropy_backward(ce, *Facts(logits), 1.0, current_stream(logits), &dlogits));
      return {adopt(dlogits, logits.sizes(), logits) * dloss, Tensor(), Tensor()};
    }
    check(bridge->cross_entropy_backward(ce, *Facts(logits), dloss.item<double>(), current_stream(logits), &dlogits));
    return {adopt(dlogits, logits.sizes(), logits), Tensor(), Tensor()};
  }
};

// ---- the module --------------------------------------------------------------------

const tb::Api* find_bridge(const py::module_& c) {
  const py::object capsule = c.attr("_torch_bridge");
  auto* api = static_cast<const tb::Api*>(PyCapsule_GetPointer(capsule.ptr(), tb::kCapsuleName));
  if (api == nullptr) throw py::error_already_set();
  if (api->version != tb::kVersion || api->size != sizeof(tb::Api))
    throw py::import_error("handgrad._torch_ext: handgrad._C publishes bridge version " + std::to_string(api->version) +
                           " (" + std::to_string(api->size) + " bytes), this extension was built for version " +
                           std::to_string(tb::kVersion) + " (" + std::to_string(sizeof(tb::Api)) +
                           " bytes): rebuild both");
  return api;
}

}  // namespace

PYBIND11_MODULE(_torch_ext, m) {
  m.doc() = "handgrad.torch's drop-ins as C++ autograd functions (internal: use handgrad.torch)";
  const py::module_ c = py::module_::import("handgrad._C");
  bridge = find_bridge(c);
  handgrad_error = py::object(c.attr("Error")).release().ptr();
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const HandgradError& e) {
      PyErr_SetString(handgrad_error, e.what());
    }
  });

  m.def(
      "layer_norm",
      [](const Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias, double eps) {
        return LayerNormFunction::apply(x, weight, bias, eps);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps") = 1e-5,
      "LayerNorm over the last dim (F.layer_norm with normalized_shape (D,)).");
  m.def(
      "attention_softmax",
      [](const Tensor& scores, const OptionalTensor& mask, bool causal, double scale) {
        return SoftmaxFunction::apply(scores, mask, causal, scale);
      },
      py::arg("scores"), py::arg("mask") = py::none(), py::arg("causal") = false, py::arg("scale") = 1.0,
      "softmax(scale * scores + mask) over the last dim, optionally causal; the mask gets no gradient.");
  m.def(
      "softmax",
      [](const Tensor& x, int64_t dim) {
        if (dim != -1 && dim != x.dim() - 1)
          throw py::value_error("handgrad.torch.softmax runs over the last dim only, got dim=" + std::to_string(dim) +
                                " for " + std::to_string(x.dim()) + "-d input");
        return SoftmaxFunction::apply(x, OptionalTensor(), false, 1.0);
      },
      py::arg("x"), py::arg("dim") = -1, "torch.softmax over the last dim.");
  m.def(
      "cross_entropy",
      [](const Tensor& logits, const Tensor& target, const py::object& ignore_index, const py::object& reduction,
         double label_smoothing, const py::object& weight) {
        if (!py::str("mean").equal(reduction))
          throw py::value_error("handgrad.torch.cross_entropy supports reduction='mean' only, got " +
                                py::repr(reduction).cast<std::string>());
        // The same refusals, in the same words, as handgrad/torch.py's Python Function.
        if (label_smoothing != 0.0)
          throw py::value_error(
              "handgrad.torch.cross_entropy: label_smoothing=" +
              py::repr(py::float_(label_smoothing)).cast<std::string>() +
              " is not supported (only 0.0); use torch.nn.functional.cross_entropy for label smoothing");
        if (!weight.is_none())
          throw py::value_error("handgrad.torch.cross_entropy: class weights (weight=...) are not supported");
        return CrossEntropyFunction::apply(logits, target, py::int_(ignore_index).cast<int64_t>());
      },
      py::arg("logits"), py::arg("target"), py::arg("ignore_index") = -100, py::arg("reduction") = "mean",
      py::arg("label_smoothing") = 0.0, py::arg("weight") = py::none(),
      "Mean cross-entropy of logits (..., V) against integer targets (...); reduction 'mean' only; label_smoothing\n"
      "other than 0 and class weights are refused.");
}
