// The ops with their forward, saved state and hand-written backward, and the
// kernel mode. Thin: validation and messages are the C++ ops' own.
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "core/kernel_mode.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"

namespace hg::python {
namespace {

KernelMode parse_mode(const std::string& name) {
  if (name == "fused") return KernelMode::Fused;
  if (name == "unfused") return KernelMode::Unfused;
  fail("set_kernel_mode", "unknown mode '", name, "'; use fused or unfused");
}

}  // namespace

void bind_ops(py::module_& m) {
  m.def(
      "kernel_mode", [] { return kernel_mode_name(kernel_mode()); }, "'fused' or 'unfused'.");
  m.def(
      "set_kernel_mode", [](const std::string& mode) { set_kernel_mode(parse_mode(mode)); }, py::arg("mode"));

  py::class_<LayerNormSaved>(m, "LayerNormSaved", "Per-row mean and rstd kept by layernorm_forward.")
      .def_readonly("mean", &LayerNormSaved::mean)
      .def_readonly("rstd", &LayerNormSaved::rstd);
  m.def(
      "layernorm_forward",
      [](const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
        LayerNormSaved saved;
        Tensor y = layernorm_forward(x, gamma, beta, eps, &saved);
        return py::make_tuple(std::move(y), std::move(saved));
      },
      py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("eps") = 1e-5,
      "LayerNorm over the last dim -> (y, saved).");
  m.def(
      "layernorm_backward",
      [](const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& s) {
        LayerNormGrads g = layernorm_backward(dy, x, gamma, s);
        return py::make_tuple(std::move(g.dx), std::move(g.dgamma), std::move(g.dbeta));
      },
      py::arg("dy"), py::arg("x"), py::arg("gamma"), py::arg("saved"), "-> (dx, dgamma, dbeta).");

  m.def(
      "softmax_forward", [](const Tensor& x) { return softmax_forward(x); }, py::arg("x"),
      "Softmax over the last dim.");
  m.def(
      "attention_softmax_forward",
      [](const Tensor& scores, const py::object& mask, bool causal, double scale) {
        SoftmaxOptions o;
        if (!mask.is_none()) o.mask = mask.cast<Tensor>();
        o.causal = causal;
        o.scale = scale;
        return attention_softmax_forward(scores, o);
      },
      py::arg("scores"), py::arg("mask") = py::none(), py::arg("causal") = false, py::arg("scale") = 1.0,
      "softmax(scale * scores + mask) over the last dim of (B, H, Tq, Tk); mask (B,1,1,Tk) or (B,1,Tq,Tk).");
  m.def(
      "softmax_backward",
      [](const Tensor& dy, const Tensor& y, double scale) { return softmax_backward(dy, y, scale); }, py::arg("dy"),
      py::arg("y"), py::arg("scale") = 1.0, "d scores from dy and the forward's output y.");

  py::class_<CrossEntropySaved>(m, "CrossEntropySaved", "What cross_entropy_backward needs.")
      .def_readonly("n_valid", &CrossEntropySaved::n_valid);
  m.def(
      "cross_entropy_forward",
      [](const Tensor& logits, const py::object& target_ids, int64_t ignore_index, bool on_device) {
        Tensor targets = as_ids(target_ids, "cross_entropy_forward");
        if (!py::isinstance<Tensor>(target_ids)) targets = targets.to(logits.device());  // NumPy ids: to the logits
        CrossEntropySaved saved;
        Tensor loss = on_device ? cross_entropy_forward_on_device(logits, targets, ignore_index, &saved)
                                : cross_entropy_forward(logits, targets, ignore_index, &saved);
        return py::make_tuple(std::move(loss), std::move(saved));
      },
      py::arg("logits"), py::arg("targets"), py::arg("ignore_index") = -100, py::kw_only(),
      py::arg("on_device") = false,
      "Mean cross-entropy of logits (..., V) against class ids (...) -> (loss, saved); the ids are\n"
      "integers (a NumPy array or list) or a float32 Tensor.\n"
      "on_device=True: on CUDA in fused mode nothing is read back to the host (no wait): the targets\n"
      "are counted on the device, a bad target makes the loss NaN instead of raising, and\n"
      "saved.n_valid is -1. Elsewhere it changes nothing.");
  m.def(
      "cross_entropy_backward",
      [](const CrossEntropySaved& s, double dloss) { return cross_entropy_backward(s, dloss); }, py::arg("saved"),
      py::arg("dloss") = 1.0, "d loss / d logits.");
}

}  // namespace hg::python
