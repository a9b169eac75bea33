// handgrad.torch's entry points: torch.Tensors in, handgrad's kernels writing
// into outputs PyTorch allocated (torch.empty: PyTorch's caching allocator and
// current stream). One C++ call per forward or backward, on PyTorch's current
// stream. What stays in ctx may be handgrad's (LayerNorm's mean and rstd,
// cross-entropy's saved state); cross-entropy's loss and gradient still come
// back by DLPack. Internal (names start with _torch_): the autograd.Functions
// in python/handgrad/torch.py call them.
#include "torch_ops.hpp"
#include "bindings.hpp"
#include "core/error.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "torch_view.hpp"

namespace hg::python {

void torch_softmax_forward(Tensor scores, const SoftmaxOptions& options, Tensor y, const char* op) {
  if (scores.ndim() != 4) {
    HG_CHECK(!options.mask.defined() && !options.causal, op, "a mask or causal=True needs scores (B, H, Tq, Tk), got ",
             scores.shape());
    HG_CHECK(scores.ndim() >= 1 && scores.numel() > 0, op, "scores must be non-empty, got shape ", scores.shape());
    HG_CHECK(y.shape() == scores.shape(), op, "y ", y.shape(), " must have the shape of scores ", scores.shape());
    scores = scores.reshape({1, 1, -1, scores.size(-1)});
    y = y.reshape(scores.shape());
  }
  attention_softmax_forward_into(scores, options, y);
}

namespace {

// The saved mean and rstd stay handgrad's (a LayerNormSaved in ctx): cheaper
// than a torch.empty from Python, and they never need to be torch tensors.
LayerNormSaved layernorm_forward(py::handle x_, py::handle w_, py::handle b_, double eps, py::handle y_) {
  const char* op = "handgrad.torch.layer_norm";
  const Tensor x = torch_view(x_, op, "x"), w = torch_view(w_, op, "weight"), b = torch_view(b_, op, "bias");
  Tensor y = torch_view(y_, op, "y");
  follow_torch_stream(x);
  // One mean and rstd per row (an x without rows is refused by the op before anything is written).
  const int64_t D = x.ndim() > 0 ? x.size(-1) : 0;
  const Shape rows{D > 0 ? x.numel() / D : 0};
  LayerNormSaved saved{Tensor::empty(rows, math_dtype(x.dtype()), x.device()),
                       Tensor::empty(rows, math_dtype(x.dtype()), x.device())};
  layernorm_forward_into(x, w, b, eps, y, saved);
  return saved;
}

void layernorm_backward(py::handle dy_, py::handle x_, py::handle w_, const LayerNormSaved& saved, py::handle dx_,
                        py::handle dw_, py::handle db_) {
  const char* op = "handgrad.torch.layer_norm backward";
  const Tensor dy = torch_view(dy_, op, "dy"), x = torch_view(x_, op, "x"), w = torch_view(w_, op, "weight");
  LayerNormGrads grads{torch_view(dx_, op, "dx"), torch_view(dw_, op, "dweight"), torch_view(db_, op, "dbias")};
  follow_torch_stream(x);
  layernorm_backward_into(dy, x, w, saved, grads);
}

void softmax_forward(py::handle scores_, py::handle mask_, bool causal, double scale, py::handle y_) {
  const char* op = "handgrad.torch.attention_softmax";
  const Tensor scores = torch_view(scores_, op, "scores"), y = torch_view(y_, op, "y");
  SoftmaxOptions o;
  o.mask = torch_view_or_none(mask_, op, "mask");
  o.causal = causal;
  o.scale = scale;
  follow_torch_stream(scores);
  torch_softmax_forward(scores, o, y, op);
}

void softmax_backward(py::handle dy_, py::handle y_, double scale, py::handle dx_) {
  const char* op = "handgrad.torch.attention_softmax backward";
  const Tensor dy = torch_view(dy_, op, "dy"), y = torch_view(y_, op, "y");
  Tensor dx = torch_view(dx_, op, "dx");
  follow_torch_stream(y);
  softmax_backward_into(dy, y, scale, dx);
}

// The saved state may view `logits` and `targets` without owning them: the
// caller keeps both in ctx.save_for_backward and reads ctx.saved_tensors (which
// fails once PyTorch has freed them) before every use of the saved state.
py::tuple cross_entropy_forward(py::handle logits_, py::handle targets_, int64_t ignore_index) {
  const char* op = "handgrad.torch.cross_entropy";
  const Tensor logits = torch_view(logits_, op, "logits"), targets = torch_view(targets_, op, "target");
  follow_torch_stream(logits);
  CrossEntropySaved saved;
  // On CUDA nothing is read back to the host (a bad target makes the loss NaN).
  Tensor loss = cross_entropy_forward_on_device(logits, targets, ignore_index, &saved);
  return py::make_tuple(std::move(loss), std::move(saved));
}

Tensor cross_entropy_backward(const CrossEntropySaved& saved, py::handle logits_, double dloss) {
  follow_torch_stream(torch_view(logits_, "handgrad.torch.cross_entropy backward", "logits"));
  return hg::cross_entropy_backward(saved, dloss);
}

}  // namespace

void bind_torch_ops(py::module_& m) {
  m.def("_torch_layernorm_forward", &layernorm_forward, "(x, weight, bias, eps, y) -> saved (internal)");
  m.def("_torch_layernorm_backward", &layernorm_backward, "(dy, x, weight, saved, dx, dweight, dbias) (internal)");
  m.def("_torch_softmax_forward", &softmax_forward, "(scores, mask or None, causal, scale, y) (internal)");
  m.def("_torch_softmax_backward", &softmax_backward, "(dy, y, scale, dx) (internal)");
  m.def("_torch_cross_entropy_forward", &cross_entropy_forward,
        "(logits, float32 targets, ignore_index) -> (handgrad loss, saved) (internal)");
  m.def("_torch_cross_entropy_backward", &cross_entropy_backward,
        "(saved, logits, dloss) -> handgrad dlogits, on PyTorch's current stream (internal)");
}

}  // namespace hg::python
