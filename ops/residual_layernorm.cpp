#include "ops/residual_layernorm.hpp"

#include <cmath>

#include "core/kernel_mode.hpp"
#include "core/tensor_functions.hpp"
#ifdef HG_WITH_CUDA
#include "cuda/residual_layernorm_kernels.hpp"
#endif

namespace hg {
namespace {

constexpr const char* kForward = "residual_layernorm_forward";
constexpr const char* kBackward = "residual_layernorm_backward";
constexpr const char* kOutput = "residual_layernorm_output";
constexpr const char* kAccumulate = "residual_layernorm_backward_accumulate";

void check_twin(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, const char* op) {
  HG_CHECK(t.defined(), op, name, " is undefined");
  HG_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype() && t.device() == ref.device(), op, name, " is ",
           t.describe(), " but ", ref_name, " is ", ref.describe(), "; they must match in shape, dtype and device");
}

// The one kernel runs for F32 / BF16 rows on CUDA in fused mode; everything
// else composes the add with layernorm_forward / layernorm_backward.
bool use_fused_kernel(const Tensor& t) {
  return t.is_cuda() && kernel_mode() == KernelMode::Fused && (t.dtype() == DType::F32 || t.dtype() == DType::BF16);
}

// a + b, computed in F32 for BF16 storage (the primitive passes compute in F32 / F64).
Tensor add_in_math_dtype(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::BF16) return add(a, b);
  return add(a.to(DType::F32), b.to(DType::F32)).to(DType::BF16);
}

#ifdef HG_WITH_CUDA
// The checks layernorm_forward / _backward would make, for the path that does not call them.
void check_fused_vectors(const Tensor& x, const Tensor& gamma, const Tensor* beta, const char* op) {
  const int64_t D = x.size(-1);
  for (const auto& [name, v] : {std::pair<const char*, const Tensor*>{"gamma", &gamma}, {"beta", beta}}) {
    if (v == nullptr) continue;
    HG_CHECK(v->defined(), op, name, " is undefined");
    HG_CHECK(v->shape() == Shape{D} && v->dtype() == DType::F32 && v->is_cuda(), op, name, " is ", v->describe(),
             ", expected f32 (", D, ",) on cuda for x ", x.describe());
  }
}

// The fused forward's checks of its input `name` (x, or h for the output
// again), gamma, beta and eps; returns eps as the kernels take it.
float check_fused_forward(const Tensor& x, const char* name, const Tensor& gamma, const Tensor& beta, double eps,
                          const char* op) {
  HG_CHECK(x.ndim() >= 1 && x.numel() > 0, op, name, " must be a non-empty (..., D) tensor, got ", x.describe());
  check_fused_vectors(x, gamma, &beta, op);
  const float e = static_cast<float>(eps);
  HG_CHECK(std::isfinite(eps) && eps > 0 && std::isfinite(e) && e > 0, op,
           "eps must be a finite positive float32, got ", eps);
  return e;
}

// The fused backward's checks (after the twins'); dh = dh_in + LN_backward(dy)
// and dgamma / dbeta written as `write` says.
Tensor fused_backward(const Tensor& dy, const Tensor& dh_in, const Tensor& h, const Tensor& gamma,
                      const LayerNormSaved& saved, Tensor& dgamma, Tensor& dbeta, gpu::ParamGradWrite write) {
  check_fused_vectors(h, gamma, nullptr, kBackward);
  const int64_t D = h.size(-1), rows = h.numel() / D;
  for (const auto& [name, s] : {std::pair<const char*, const Tensor*>{"mean", &saved.mean}, {"rstd", &saved.rstd}})
    HG_CHECK(s->defined() && s->shape() == Shape{rows} && s->dtype() == DType::F32 && s->is_cuda(), kBackward, "saved ",
             name, " is ", s->defined() ? s->describe() : std::string("undefined"), ", expected f32 (", rows,
             ",) on cuda (from residual_layernorm_forward with saved)");
  Tensor dh = Tensor::empty(h.shape(), h.dtype(), h.device());
  Tensor dh_rows = dh.reshape({rows, D});
  const Tensor dh_in_rows = dh_in.defined() ? dh_in.reshape({rows, D}) : Tensor();
  gpu::residual_layernorm_backward_fused(dy.reshape({rows, D}), dh_in.defined() ? &dh_in_rows : nullptr,
                                         h.reshape({rows, D}), gamma, saved.mean, saved.rstd, dh_rows, dgamma, dbeta,
                                         write);
  return dh;
}
#endif

// The checks of both backwards before they pick a path.
void check_backward_inputs(const Tensor& dy, const Tensor& dh_in, const Tensor& h) {
  HG_CHECK(h.defined(), kBackward, "h is undefined");
  check_twin(dy, "dy", h, "h", kBackward);
  if (dh_in.defined()) check_twin(dh_in, "dh_in", h, "h", kBackward);
}

}  // namespace

ResidualLayerNormOutput residual_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma,
                                                   const Tensor& beta, double eps, LayerNormSaved* saved) {
  HG_CHECK(x.defined(), kForward, "x is undefined");
  check_twin(r, "r", x, "x", kForward);
  ResidualLayerNormOutput out;
  if (!use_fused_kernel(x)) {
    out.h = add_in_math_dtype(x, r);
    out.y = layernorm_forward(out.h, gamma, beta, eps, saved);
    return out;
  }
#ifdef HG_WITH_CUDA
  const float e = check_fused_forward(x, "x", gamma, beta, eps, kForward);
  const int64_t D = x.size(-1), rows = x.numel() / D;
  out.h = Tensor::empty(x.shape(), x.dtype(), x.device());
  out.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, DType::F32, x.device()), rstd = Tensor::empty({rows}, DType::F32, x.device());
  Tensor h_rows = out.h.reshape({rows, D}), y_rows = out.y.reshape({rows, D});
  gpu::residual_layernorm_forward_fused(x.reshape({rows, D}), r.reshape({rows, D}), gamma, beta, e, h_rows, y_rows,
                                        mean, rstd);
  if (saved) {
    saved->mean = mean;
    saved->rstd = rstd;
  }
#else
  fail(kForward, "x is on CUDA but handgrad was built without CUDA");
#endif
  return out;
}

Tensor residual_layernorm_output(const Tensor& h, const Tensor& gamma, const Tensor& beta, double eps) {
  HG_CHECK(h.defined(), kOutput, "h is undefined");
  if (!use_fused_kernel(h)) return layernorm_forward(h, gamma, beta, eps, nullptr);
  Tensor y;
#ifdef HG_WITH_CUDA
  const float e = check_fused_forward(h, "h", gamma, beta, eps, kOutput);
  const int64_t D = h.size(-1), rows = h.numel() / D;
  y = Tensor::empty(h.shape(), h.dtype(), h.device());
  // The kernels write the statistics too: row-sized scratch, dropped here.
  Tensor mean = Tensor::empty({rows}, DType::F32, h.device()), rstd = Tensor::empty({rows}, DType::F32, h.device());
  Tensor y_rows = y.reshape({rows, D});
  gpu::residual_layernorm_output_fused(h.reshape({rows, D}), gamma, beta, e, y_rows, mean, rstd);
#else
  fail(kOutput, "h is on CUDA but handgrad was built without CUDA");
#endif
  return y;
}

LayerNormGrads residual_layernorm_backward(const Tensor& dy, const Tensor& dh_in, const Tensor& h, const Tensor& gamma,
                                           const LayerNormSaved& saved) {
  check_backward_inputs(dy, dh_in, h);
  if (!use_fused_kernel(h)) {
    LayerNormGrads g = layernorm_backward(dy, h, gamma, saved);
    if (dh_in.defined()) g.dx = add_in_math_dtype(g.dx, dh_in);
    return g;
  }
  LayerNormGrads g;
#ifdef HG_WITH_CUDA
  g.dgamma = Tensor::empty({h.size(-1)}, DType::F32, h.device());
  g.dbeta = Tensor::empty({h.size(-1)}, DType::F32, h.device());
  g.dx = fused_backward(dy, dh_in, h, gamma, saved, g.dgamma, g.dbeta, gpu::ParamGradWrite::Overwrite);
#else
  fail(kBackward, "h is on CUDA but handgrad was built without CUDA");
#endif
  return g;
}

Tensor residual_layernorm_backward_accumulate(const Tensor& dy, const Tensor& dh_in, const Tensor& h,
                                              const Tensor& gamma, const LayerNormSaved& saved,
                                              const LayerNormParamGrads& into) {
  check_backward_inputs(dy, dh_in, h);
  if (!use_fused_kernel(h)) {  // the composition residual_layernorm_backward runs, accumulating
    Tensor dh = layernorm_backward_accumulate(dy, h, gamma, saved, into);
    return dh_in.defined() ? add_in_math_dtype(dh, dh_in) : dh;
  }
  Tensor dh;
#ifdef HG_WITH_CUDA
  // The fused kernels take F32 gamma (checked with the saved statistics), so F32 grads.
  const Shape d_shape{h.size(-1)};
  check_output(kAccumulate, "gamma grad", into.gamma, d_shape, DType::F32, h.device());
  check_output(kAccumulate, "beta grad", into.beta, d_shape, DType::F32, h.device());
  Tensor dgamma = into.gamma, dbeta = into.beta;
  dh = fused_backward(dy, dh_in, h, gamma, saved, dgamma, dbeta, gpu::ParamGradWrite::Accumulate);
#else
  fail(kAccumulate, "h is on CUDA but handgrad was built without CUDA");
#endif
  return dh;
}

}  // namespace hg
