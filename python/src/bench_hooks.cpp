// The C++ side of bench/python_overhead.py: the same op call timed in a C++
// loop, so Python's per-call cost can be measured as the difference.
#include <chrono>

#include "bindings.hpp"
#include "ops/layernorm.hpp"
#include "ops/softmax.hpp"
#include "torch_view.hpp"

namespace hg::python {

void bind_bench_hooks(py::module_& m) {
  m.def("_seconds_per_call_cpp",
        [](const std::string& op, const Tensor& x, const Tensor& gamma, const Tensor& beta, int calls) {
          HG_CHECK(calls > 0, "_seconds_per_call_cpp", "calls must be positive, got ", calls);
          HG_CHECK(op == "layernorm_forward" || op == "softmax_forward", "_seconds_per_call_cpp", "unknown op ", op);
          const bool layernorm = op == "layernorm_forward";
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < calls; ++i) {
            LayerNormSaved saved;
            Tensor y = layernorm ? layernorm_forward(x, gamma, beta, 1e-5, &saved) : softmax_forward(x);
          }
          return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
        });
  // handgrad.torch's crossing of one torch.Tensor (read, check, wrap), timed in C++.
  m.def("_seconds_per_torch_view", [](py::handle t, int calls) {
    HG_CHECK(calls > 0, "_seconds_per_torch_view", "calls must be positive, got ", calls);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) torch_view(t, "_seconds_per_torch_view", "t");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
  });
}

}  // namespace hg::python
