// handgrad._C's side of the bridge to handgrad._torch_ext (torch_bridge.hpp):
// each function turns what the extension read from its at::Tensors into
// checked views (torch_memory.hpp, as the Python crossing does), runs the
// same op as the matching _torch_* entry point and reports hg::Error as a
// Status instead of throwing across the modules.
#include <memory>
#include <new>
#include <string>

#include "bindings.hpp"
#include "core/error.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "stream_order.hpp"
#include "torch_bridge.hpp"
#include "torch_memory.hpp"
#include "torch_ops.hpp"

namespace hg::python {
namespace {

namespace tb = torch_bridge;

tb::Status failed(tb::StatusKind kind, const char* message) {
  thread_local std::string kept;  // read by the extension right after the call, on this thread
  kept = message;
  return {kind, kept.c_str()};
}

// Runs `body`; every exception becomes a Status (nothing may unwind into the extension).
template <class Body>
tb::Status guarded(Body&& body) noexcept {
  try {
    body();
    return {};
  } catch (const Error& e) {
    return failed(tb::kHandgradError, e.what());
  } catch (const std::bad_alloc&) {
    return failed(tb::kOutOfMemory, "out of host memory");
  } catch (const std::exception& e) {
    return failed(tb::kOtherError, e.what());
  } catch (...) {
    return failed(tb::kOtherError, "unknown C++ exception");
  }
}

Tensor view(const tb::TensorFacts& f, const char* op, const char* name) {
  if (f.dtype < tb::kFloat32 || f.dtype > tb::kFloat16) fail_torch_dtype(op, name, f.dtype_name ? f.dtype_name : "?");
  Device device = Device::CPU;
  if (f.device == tb::kCUDA) {
    check_torch_cuda_device(static_cast<long>(f.cuda_index), op, name);
    device = Device::CUDA;
  } else if (f.device != tb::kCPU) {
    fail_torch_device(op, name, f.device_name ? f.device_name : "?");
  }
  const Shape shape(f.sizes, f.sizes + f.ndim);
  check_torch_contiguous(f.contiguous, shape, op, name);
  return torch_memory_view(f.data, shape, kTorchDTypes[f.dtype], device, op, name);
}

void follow(const Tensor& t, intptr_t stream, const char* op) {
  HG_CHECK(!t.is_cuda() || stream != tb::kNoStream, op,
           "a CUDA tensor, but handgrad._torch_ext was built without CUDA; rebuild it, or set HG_TORCH_EXT=0");
  follow_stream(t, stream);
}

// Memory handgrad allocated, handed to PyTorch on `stream`: before handgrad's
// caching allocator may hand the block out again, its stream waits for what
// PyTorch queued there (a no-op on the same stream), as a DLPack export does.
struct HandedOver {
  Tensor tensor;
  intptr_t stream;
};

tb::OwnedTensor hand_over(const Tensor& t, intptr_t stream) {
  tb::OwnedTensor out;
  out.data = t.raw_data();
  out.numel = t.numel();
  out.dtype = t.dtype() == DType::F32    ? tb::kFloat32
              : t.dtype() == DType::F64  ? tb::kFloat64
              : t.dtype() == DType::BF16 ? tb::kBFloat16
                                         : tb::kFloat16;
  out.owner = new HandedOver{t, stream};
  return out;
}

void release(void* owner) {
  auto* handed = static_cast<HandedOver*>(owner);
  try {
    if (handed->tensor.is_cuda()) order_streams(handed->stream, handgrad_stream());
  } catch (...) {  // a failed event call must not leak the block or throw into PyTorch's deleter
  }
  delete handed;
}

tb::Status layernorm_forward(const tb::TensorFacts& x_, const tb::TensorFacts& w_, const tb::TensorFacts& b_,
                             double eps, const tb::TensorFacts& y_, const tb::TensorFacts& mean_,
                             const tb::TensorFacts& rstd_, intptr_t stream) {
  return guarded([&] {
    const char* op = "handgrad.torch.layer_norm";
    const Tensor x = view(x_, op, "x"), w = view(w_, op, "weight"), b = view(b_, op, "bias");
    Tensor y = view(y_, op, "y");
    LayerNormSaved saved{view(mean_, op, "mean"), view(rstd_, op, "rstd")};
    follow(x, stream, op);
    layernorm_forward_into(x, w, b, eps, y, saved);
  });
}

tb::Status layernorm_backward(const tb::TensorFacts& dy_, const tb::TensorFacts& x_, const tb::TensorFacts& w_,
                              const tb::TensorFacts& mean_, const tb::TensorFacts& rstd_, const tb::TensorFacts& dx_,
                              const tb::TensorFacts& dw_, const tb::TensorFacts& db_, intptr_t stream) {
  return guarded([&] {
    const char* op = "handgrad.torch.layer_norm backward";
    const Tensor dy = view(dy_, op, "dy"), x = view(x_, op, "x"), w = view(w_, op, "weight");
    const LayerNormSaved saved{view(mean_, op, "mean"), view(rstd_, op, "rstd")};
    LayerNormGrads grads{view(dx_, op, "dx"), view(dw_, op, "dweight"), view(db_, op, "dbias")};
    follow(x, stream, op);
    layernorm_backward_into(dy, x, w, saved, grads);
  });
}

tb::Status softmax_forward(const tb::TensorFacts& scores_, const tb::TensorFacts* mask_, bool causal, double scale,
                           const tb::TensorFacts& y_, intptr_t stream) {
  return guarded([&] {
    const char* op = "handgrad.torch.attention_softmax";
    const Tensor scores = view(scores_, op, "scores"), y = view(y_, op, "y");
    SoftmaxOptions o;
    if (mask_ != nullptr) o.mask = view(*mask_, op, "mask");
    o.causal = causal;
    o.scale = scale;
    follow(scores, stream, op);
    torch_softmax_forward(scores, o, y, op);
  });
}

tb::Status softmax_backward(const tb::TensorFacts& dy_, const tb::TensorFacts& y_, double scale,
                            const tb::TensorFacts& dx_, intptr_t stream) {
  return guarded([&] {
    const char* op = "handgrad.torch.attention_softmax backward";
    const Tensor dy = view(dy_, op, "dy"), y = view(y_, op, "y");
    Tensor dx = view(dx_, op, "dx");
    follow(y, stream, op);
    softmax_backward_into(dy, y, scale, dx);
  });
}

tb::Status cross_entropy_forward(const tb::TensorFacts& logits_, const tb::TensorFacts& targets_, int64_t ignore_index,
                                 intptr_t stream, tb::OwnedTensor* loss, void** saved) {
  return guarded([&] {
    const char* op = "handgrad.torch.cross_entropy";
    const Tensor logits = view(logits_, op, "logits"), targets = view(targets_, op, "target");
    follow(logits, stream, op);
    auto state = std::make_unique<CrossEntropySaved>();
    // On CUDA nothing is read back to the host (a bad target makes the loss NaN).
    const Tensor value = cross_entropy_forward_on_device(logits, targets, ignore_index, state.get());
    *loss = hand_over(value, stream);
    *saved = state.release();
  });
}

tb::Status cross_entropy_backward(const void* saved, const tb::TensorFacts& logits_, double dloss, intptr_t stream,
                                  tb::OwnedTensor* dlogits) {
  return guarded([&] {
    const char* op = "handgrad.torch.cross_entropy backward";
    follow(view(logits_, op, "logits"), stream, op);
    *dlogits = hand_over(hg::cross_entropy_backward(*static_cast<const CrossEntropySaved*>(saved), dloss), stream);
  });
}

void free_cross_entropy_saved(void* saved) { delete static_cast<CrossEntropySaved*>(saved); }

const tb::Api kApi = {
    tb::kVersion,      sizeof(tb::Api),        &layernorm_forward,      &layernorm_backward,       &softmax_forward,
    &softmax_backward, &cross_entropy_forward, &cross_entropy_backward, &free_cross_entropy_saved, &release};

}  // namespace

void bind_torch_bridge(py::module_& m) { m.attr("_torch_bridge") = py::capsule(&kApi, tb::kCapsuleName); }

}  // namespace hg::python
