// Enough of the models and optimizers to train from Python, one op at a time:
// logits = model.forward(ids); loss, s = cross_entropy_forward(...);
// model.zero_grad(); model.backward(cross_entropy_backward(s)); opt.step();
// or as one call, the library's step (models/train_step.hpp, CUDA graph
// included): TrainStep(model, opt).run(ids, targets). Text generation with
// a key/value cache: model.generate(ids, max_new_tokens, temperature=...).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "core/optim.hpp"
#include "models/decoder_lm.hpp"
#include "models/generation.hpp"
#include "models/train_step.hpp"

namespace hg::python {

void bind_models(py::module_& m) {
  py::class_<Parameter>(m, "Parameter", "A trainable tensor and its gradient (views, no copies).")
      .def_readonly("value", &Parameter::value)
      .def_readonly("grad", &Parameter::grad);

  py::class_<Module>(m, "Module")
      .def("parameters", &Module::parameters, py::return_value_policy::reference_internal)
      .def("named_parameters", &Module::named_parameters, py::return_value_policy::reference_internal)
      .def("num_parameters", &Module::num_parameters)
      .def("zero_grad", &Module::zero_grad)
      .def(
          "to", [](Module& mod, const std::string& device) { mod.to(parse_device(device)); }, py::arg("device"))
      .def("train", &Module::train, py::arg("on") = true)
      .def("eval", &Module::eval)
      .def("save", &Module::save, py::arg("path"), py::arg("step") = -1)
      .def("load", &Module::load, py::arg("path"));

  py::class_<DecoderLM, Module>(m, "DecoderLM", "GPT-style pre-LN decoder LM with hand-written backward.")
      .def(py::init([](int64_t vocab_size, int64_t max_seq_len, int64_t d_model, int64_t n_heads, int64_t n_layers,
                       int64_t ffn_hidden, double dropout, double ln_eps, uint64_t seed, const std::string& dtype) {
             DecoderLMConfig c;
             c.vocab_size = vocab_size;
             c.max_seq_len = max_seq_len;
             c.d_model = d_model;
             c.n_heads = n_heads;
             c.n_layers = n_layers;
             c.ffn_hidden = ffn_hidden;
             c.dropout = dropout;
             c.ln_eps = ln_eps;
             c.seed = seed;
             c.dtype = parse_dtype(dtype);
             return new DecoderLM(c);
           }),
           py::kw_only(), py::arg("vocab_size") = 256, py::arg("max_seq_len") = 128, py::arg("d_model") = 128,
           py::arg("n_heads") = 4, py::arg("n_layers") = 2, py::arg("ffn_hidden") = 0, py::arg("dropout") = 0.0,
           py::arg("ln_eps") = 1e-5, py::arg("seed") = 0, py::arg("dtype") = "float32")
      .def(
          "forward",
          [](DecoderLM& lm, const py::object& ids, const py::object& mask) {
            Tensor t = as_ids(ids, "DecoderLM.forward");
            if (!py::isinstance<Tensor>(ids)) t = t.to(lm.embed.token.value.device());  // NumPy ids: to the model
            return lm.forward(t, mask.is_none() ? Tensor() : mask.cast<Tensor>());
          },
          py::arg("ids"), py::arg("key_padding_mask") = py::none(),
          "ids (B, T) token ids (integers: a NumPy array or list, or a float32 Tensor) -> logits (B, T, V).")
      .def("backward", &DecoderLM::backward, py::arg("dlogits"),
           "Accumulates every parameter gradient; returns d loss / d embedding output.")
      .def(
          "generate",
          [](DecoderLM& lm, const py::object& ids, int64_t max_new_tokens, double temperature, int64_t top_k,
             double top_p, uint64_t seed, bool kv_cache) {
            Tensor prompt = as_ids(ids, "DecoderLM.generate");
            const bool one = prompt.ndim() == 1;  // a single prompt (T,): the answer is (T + n,) too
            if (one) prompt = prompt.reshape({1, prompt.numel()});
            GenerateOptions o;
            o.max_new_tokens = max_new_tokens;
            o.sampling.temperature = temperature;
            o.sampling.top_k = top_k;
            o.sampling.top_p = top_p;
            o.seed = seed;
            o.kv_cache = kv_cache;
            const Tensor out = generate(lm, prompt, o);
            py::array_t<int64_t> a(one ? std::vector<py::ssize_t>{out.size(1)}
                                       : std::vector<py::ssize_t>{out.size(0), out.size(1)});
            const std::vector<double> v = out.to_vector();
            std::copy(v.begin(), v.end(), a.mutable_data());
            return a;
          },
          py::arg("ids"), py::arg("max_new_tokens"), py::kw_only(), py::arg("temperature") = 1.0, py::arg("top_k") = 0,
          py::arg("top_p") = 1.0, py::arg("seed") = 0, py::arg("kv_cache") = true,
          "Continues the prompts ids (B, T), or one prompt (T,), by max_new_tokens tokens; returns the ids, prompt "
          "first, as an int64 NumPy array. temperature 0: greedy; top_k 0 and top_p 1: no cut; same seed, same "
          "tokens. kv_cache=False recomputes the whole context each token (the same tokens, slower). "
          "docs/generation.md.");

  py::class_<Optimizer>(m, "Optimizer")
      .def("step", &Optimizer::step)
      .def("zero_grad", &Optimizer::zero_grad)
      .def_property("lr", &Optimizer::lr, &Optimizer::set_lr)
      .def_property_readonly("steps", &Optimizer::steps)
      .def_property_readonly("last_grad_norm", &Optimizer::last_grad_norm,
                             "Global gradient norm of the last step before clipping (nan where not computed: SGD).")
      .def("save_state", &Optimizer::save_state, py::arg("path"))
      .def("load_state", &Optimizer::load_state, py::arg("path"));

  py::class_<AdamW, Optimizer>(m, "AdamW")
      .def(py::init([](Module& module, double lr, std::pair<double, double> betas, double eps, double weight_decay,
                       double max_grad_norm) {
             AdamWOptions o;
             o.lr = lr;
             o.beta1 = betas.first;
             o.beta2 = betas.second;
             o.eps = eps;
             o.weight_decay = weight_decay;
             o.max_grad_norm = max_grad_norm;
             return new AdamW(module.parameters(), o);
           }),
           py::arg("module"), py::kw_only(), py::arg("lr") = 1e-3, py::arg("betas") = std::make_pair(0.9, 0.999),
           py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.01, py::arg("max_grad_norm") = 0.0,
           py::keep_alive<1, 2>(),  // the optimizer points at the module's parameters
           "max_grad_norm > 0 clips the global gradient norm inside step() (0: no clipping).");

  py::class_<SGD, Optimizer>(m, "SGD").def(
      py::init([](Module& module, double lr, double momentum, double weight_decay) {
        return new SGD(module.parameters(), SGDOptions{lr, momentum, weight_decay});
      }),
      py::arg("module"), py::kw_only(), py::arg("lr") = 1e-2, py::arg("momentum") = 0.0, py::arg("weight_decay") = 0.0,
      py::keep_alive<1, 2>());

  py::register_exception<NonFiniteError>(m, "NonFiniteError", m.attr("Error"));
  py::class_<StepResult>(m, "StepResult", "What TrainStep.run measured: step, loss, grad_norm.")
      .def_readonly("step", &StepResult::step)
      .def_readonly("loss", &StepResult::loss)
      .def_readonly("grad_norm", &StepResult::grad_norm)
      .def("__repr__", [](const StepResult& r) {
        return "StepResult(step=" + std::to_string(r.step) + ", loss=" + std::to_string(r.loss) +
               ", grad_norm=" + std::to_string(r.grad_norm) + ")";
      });
  py::class_<TrainStep>(m, "TrainStep",
                        "One training step as one call: zero_grad, forward, cross-entropy, backward, the optimizer "
                        "(clipping is AdamW's max_grad_norm), a CUDA graph replayed where the step can be captured.")
      .def(py::init(
               [](DecoderLM& model, Optimizer& optimizer, int64_t ignore_index, bool use_graph, int64_t grad_accum) {
                 TrainStepOptions o;
                 o.ignore_index = ignore_index;
                 o.use_graph = use_graph;
                 o.grad_accum = grad_accum;
                 return new TrainStep(model, optimizer, o);
               }),
           py::arg("model"), py::arg("optimizer"), py::kw_only(), py::arg("ignore_index") = -100,
           py::arg("use_graph") = true, py::arg("grad_accum") = 1, py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
           "grad_accum N: run() splits its batch into N micro-batches, accumulates their gradients (each weighted "
           "by its share of the counted targets) and steps the optimizer once.")
      .def(
          "run",
          [](TrainStep& step, const py::object& ids, const py::object& targets) {
            return step.run(as_ids(ids, "TrainStep.run"), as_ids(targets, "TrainStep.run"));
          },
          py::arg("ids"), py::arg("targets"),
          "ids, targets (B, T): integers (a NumPy array or list) or float32 Tensors on the host or the model's "
          "device -> StepResult. Raises NonFiniteError "
          "(parameters unchanged) when the loss or gradient norm is not finite.")
      .def_property_readonly("graph_active", &TrainStep::graph_active)
      .def_property_readonly("graph_note", &TrainStep::graph_note);

  m.def(
      "clip_grad_norm", [](Module& module, double max_norm) { return clip_grad_norm(module.parameters(), max_norm); },
      py::arg("module"), py::arg("max_norm"), "Clips the global L2 grad norm; returns the norm before clipping.");
}

}  // namespace hg::python
