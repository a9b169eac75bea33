#include "ops/layernorm.hpp"

#include <cmath>

#include "core/backend.hpp"
#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "ops/cpu/layernorm_cpu.hpp"
#include "ops/dispatch_log.hpp"
#include "ops/layernorm_unfused.hpp"

// Validation and dispatch: CPU fused (Eigen), unfused (primitive backend, any
// device), CUDA fused. The math of each path lives in its own file.
namespace hg {
namespace {

constexpr const char* kForward = "layernorm_forward";
constexpr const char* kBackward = "layernorm_backward";
constexpr const char* kAccumulate = "layernorm_backward_accumulate";

int64_t rows_of(const Tensor& x) { return x.numel() / x.size(-1); }

void check_x(const Tensor& x, const char* name, const char* op) {
  HG_CHECK(x.defined(), op, name, " is undefined");
  HG_CHECK(x.ndim() >= 1, op, name, " must have at least one dim (..., D), got shape ", x.shape());
  HG_CHECK(x.numel() > 0, op, name, " is empty, shape ", x.shape());
  const DType t = x.dtype();
  HG_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16, op, name, " ", x.shape(), " has dtype ",
           dtype_name(t), "; layernorm takes F32, F64, or BF16 on CUDA");
  HG_CHECK(t != DType::BF16 || x.is_cuda(), op, name, " ", x.shape(),
           " is BF16 on the CPU; BF16 layernorm runs only on CUDA (F32 math)");
  HG_CHECK(!(t == DType::F64 && x.is_cuda() && kernel_mode() == KernelMode::Fused), op, name, " ", x.shape(),
           " is F64 on CUDA; the fused CUDA kernels take F32/BF16 (use the unfused mode or the CPU for F64)");
}

// A (D,) vector in the math dtype of x, on x's device.
void check_feature_vector(const Tensor& v, const char* name, const Tensor& x, const char* op) {
  HG_CHECK(v.defined(), op, name, " is undefined");
  const int64_t D = x.size(-1);
  HG_CHECK(v.shape() == Shape{D}, op, name, " shape ", v.shape(), " does not match (D,) = (", D, ") for x ", x.shape());
  const DType want = math_dtype(x.dtype());
  HG_CHECK(v.dtype() == want, op, name, " ", v.shape(), " has dtype ", dtype_name(v.dtype()), "; x ", x.shape(),
           " of dtype ", dtype_name(x.dtype()), " needs ", dtype_name(want));
  HG_CHECK(v.device() == x.device(), op, name, " ", v.shape(), " is on ", device_name(v.device()), " but x ", x.shape(),
           " is on ", device_name(x.device()));
}

// A saved per-row statistic: (rows,) in the math dtype of x, on x's device.
void check_row_stat(const Tensor& s, const char* name, const Tensor& x) {
  HG_CHECK(s.defined(), kBackward, "saved ", name, " is undefined (was forward called with saved?)");
  const int64_t rows = rows_of(x);
  HG_CHECK(s.shape() == Shape{rows}, kBackward, "saved ", name, " shape ", s.shape(), " does not match (rows,) = (",
           rows, ") for x ", x.shape());
  const DType want = math_dtype(x.dtype());
  HG_CHECK(s.dtype() == want, kBackward, "saved ", name, " ", s.shape(), " has dtype ", dtype_name(s.dtype()),
           "; x of dtype ", dtype_name(x.dtype()), " needs ", dtype_name(want));
  HG_CHECK(s.device() == x.device(), kBackward, "saved ", name, " ", s.shape(), " is on ", device_name(s.device()),
           " but x ", x.shape(), " is on ", device_name(x.device()));
}

}  // namespace

void check_layernorm_eps(double eps, DType x_dtype, const char* op) {
  HG_CHECK(std::isfinite(eps) && eps > 0, op, "eps must be finite and > 0, got ", eps);
  // The float32 paths use eps as a float: it must stay positive and finite there too.
  if (x_dtype != DType::F64) {
    const float e = static_cast<float>(eps);
    HG_CHECK(std::isfinite(e) && e > 0, op, "eps ", eps, " is not a finite positive float32 (needed for ",
             dtype_name(x_dtype), " input)");
  }
}

namespace {

void check_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check_x(x, "x", kForward);
  check_feature_vector(gamma, "gamma", x, kForward);
  check_feature_vector(beta, "beta", x, kForward);
  check_layernorm_eps(eps, x.dtype(), kForward);
}

void check_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved) {
  check_x(x, "x", kBackward);
  HG_CHECK(dy.defined(), kBackward, "dy is undefined");
  HG_CHECK(dy.shape() == x.shape(), kBackward, "dy shape ", dy.shape(), " does not match x ", x.shape());
  HG_CHECK(dy.dtype() == x.dtype(), kBackward, "dy ", dy.shape(), " has dtype ", dtype_name(dy.dtype()), " but x ",
           x.shape(), " has ", dtype_name(x.dtype()));
  HG_CHECK(dy.device() == x.device(), kBackward, "dy ", dy.shape(), " is on ", device_name(dy.device()), " but x ",
           x.shape(), " is on ", device_name(x.device()));
  check_feature_vector(gamma, "gamma", x, kBackward);
  check_row_stat(saved.mean, "mean", x);
  check_row_stat(saved.rstd, "rstd", x);
}

// The fused kernels write into y, mean, rstd (checked, allocated by the caller).
void fused_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                   Tensor& rstd) {
  const int64_t D = x.size(-1), rows = rows_of(x);
  if (x.is_cuda()) {
    Tensor y_rows = y.reshape({rows, D});
    gpu::layernorm_forward_fused(x.reshape({rows, D}), gamma, beta, static_cast<float>(eps), y_rows, mean, rstd);
  } else {
    cpu::layernorm_forward(x, gamma, beta, eps, rows, D, y, mean, rstd);
  }
}

// `write` applies to the CUDA kernels (the CPU overwrites).
void fused_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved,
                    LayerNormGrads& g, gpu::ParamGradWrite write = gpu::ParamGradWrite::Overwrite) {
  const int64_t D = x.size(-1), rows = rows_of(x);
  if (x.is_cuda()) {
    Tensor dx_rows = g.dx.reshape({rows, D});
    gpu::layernorm_backward_fused(dy.reshape({rows, D}), x.reshape({rows, D}), gamma, saved.mean, saved.rstd, dx_rows,
                                  g.dgamma, g.dbeta, write);
  } else {
    cpu::layernorm_backward(dy, x, gamma, saved.mean, saved.rstd, rows, D, g.dx, g.dgamma, g.dbeta);
  }
}

// Logs the path taken; true for the unfused (primitive) one.
bool dispatch_unfused(const char* op, const Tensor& x) {
  const bool unfused = kernel_mode() == KernelMode::Unfused;
  log_dispatch(op, dispatch_path(x, unfused), x);
  return unfused;
}

}  // namespace

Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, LayerNormSaved* saved) {
  HG_PROFILE("layernorm", x.device());
  check_forward(x, gamma, beta, eps);
  Tensor y, mean, rstd;
  if (dispatch_unfused(kForward, x)) {
    y = unfused::layernorm_forward(x, gamma, beta, eps, mean, rstd);
  } else {
    const DType stat_dtype = math_dtype(x.dtype());
    y = Tensor::empty(x.shape(), x.dtype(), x.device());
    mean = Tensor::empty({rows_of(x)}, stat_dtype, x.device());
    rstd = Tensor::empty({rows_of(x)}, stat_dtype, x.device());
    fused_forward(x, gamma, beta, eps, y, mean, rstd);
  }
  if (saved) {
    saved->mean = mean;
    saved->rstd = rstd;
  }
  return y;
}

void layernorm_forward_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                            LayerNormSaved& saved) {
  HG_PROFILE("layernorm", x.device());
  check_forward(x, gamma, beta, eps);
  check_output(kForward, "y", y, x.shape(), x.dtype(), x.device());
  check_output(kForward, "mean", saved.mean, {rows_of(x)}, math_dtype(x.dtype()), x.device());
  check_output(kForward, "rstd", saved.rstd, {rows_of(x)}, math_dtype(x.dtype()), x.device());
  if (!dispatch_unfused(kForward, x)) return fused_forward(x, gamma, beta, eps, y, saved.mean, saved.rstd);
  Tensor mean, rstd;
  y.copy_(unfused::layernorm_forward(x, gamma, beta, eps, mean, rstd));
  saved.mean.copy_(mean);
  saved.rstd.copy_(rstd);
}

namespace {

// layernorm_backward after its checks and its dispatch log.
LayerNormGrads backward_grads(bool unfused, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const LayerNormSaved& saved) {
  if (unfused) return unfused::layernorm_backward(dy, x, gamma, saved.mean, saved.rstd);
  const int64_t D = x.size(-1);
  LayerNormGrads g;
  g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  g.dgamma = Tensor::empty({D}, gamma.dtype(), x.device());
  g.dbeta = Tensor::empty({D}, gamma.dtype(), x.device());
  fused_backward(dy, x, gamma, saved, g);
  return g;
}

}  // namespace

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved) {
  HG_PROFILE("layernorm", x.device());
  check_backward(dy, x, gamma, saved);
  return backward_grads(dispatch_unfused(kBackward, x), dy, x, gamma, saved);
}

Tensor layernorm_backward_accumulate(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const LayerNormSaved& saved, const LayerNormParamGrads& into) {
  HG_PROFILE("layernorm", x.device());
  check_backward(dy, x, gamma, saved);
  const Shape d_shape{x.size(-1)};
  check_output(kAccumulate, "gamma grad", into.gamma, d_shape, gamma.dtype(), x.device());
  check_output(kAccumulate, "beta grad", into.beta, d_shape, gamma.dtype(), x.device());
  // The CUDA fused kernels add F32 grads themselves (checked F32 here, though
  // the fused mode's gamma already is); elsewhere the temporaries are added.
  const bool unfused = dispatch_unfused(kAccumulate, x);
  if (unfused || !x.is_cuda() || into.gamma.dtype() != DType::F32) {
    const LayerNormGrads g = backward_grads(unfused, dy, x, gamma, saved);
    Backend& be = backend_for(x.device());
    Tensor gamma_grad = into.gamma, beta_grad = into.beta;  // handles on the same storage
    be.zip(BinaryOp::Add, gamma_grad, g.dgamma, gamma_grad);
    be.zip(BinaryOp::Add, beta_grad, g.dbeta, beta_grad);
    return g.dx;
  }
  LayerNormGrads g{Tensor::empty(x.shape(), x.dtype(), x.device()), into.gamma, into.beta};
  fused_backward(dy, x, gamma, saved, g, gpu::ParamGradWrite::Accumulate);
  return g.dx;
}

void layernorm_backward_into(const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved,
                             LayerNormGrads& grads) {
  HG_PROFILE("layernorm", x.device());
  check_backward(dy, x, gamma, saved);
  const Shape d_shape{x.size(-1)};
  check_output(kBackward, "dx", grads.dx, x.shape(), x.dtype(), x.device());
  check_output(kBackward, "dgamma", grads.dgamma, d_shape, gamma.dtype(), x.device());
  check_output(kBackward, "dbeta", grads.dbeta, d_shape, gamma.dtype(), x.device());
  if (!dispatch_unfused(kBackward, x)) return fused_backward(dy, x, gamma, saved, grads);
  const LayerNormGrads g = unfused::layernorm_backward(dy, x, gamma, saved.mean, saved.rstd);
  grads.dx.copy_(g.dx);
  grads.dgamma.copy_(g.dgamma);
  grads.dbeta.copy_(g.dbeta);
}

}  // namespace hg
