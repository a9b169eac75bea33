#include "ops/layernorm_unfused.hpp"

#include "core/backend.hpp"
#include "core/tensor_functions.hpp"

// Each line below is one primitive call, i.e. one pass over memory (one
// kernel on CUDA); docs/layernorm.md counts them. x is viewed as (rows, D),
// per-row statistics as (rows, 1) so they broadcast over D, gamma/beta (D,)
// broadcast over rows.
namespace hg::unfused {
namespace {

// BF16 storage is computed in F32; F32/F64 are used as they are.
Tensor in_math_dtype(const Tensor& t) { return t.dtype() == DType::BF16 ? t.to(DType::F32) : t; }

Tensor as_rows(const Tensor& t) {
  const int64_t D = t.size(-1);
  return t.reshape({t.numel() / D, D});
}

// rstd = 0 means var + eps overflowed: a row's squares passed the largest
// float (|xc| past ~1e19 in float32, ~1e154 in float64). Then rstd is taken
// again of xc / a, a = max(max|xc|, 1) per row, whose squares are at most 1:
// rstd = rsqrt(mean((xc / a)^2) + eps / a^2) / a. Rows with max|xc| <= 1 get
// the formula above (a = 1). Five more passes, only then.
Tensor rstd_of_large_rows(const Tensor& xc, double eps) {
  const Tensor inv_a = map(UnaryOp::Reciprocal, maximum(max(map(UnaryOp::Abs, xc), 1, /*keepdim=*/true),
                                                        Tensor::ones({1}, xc.dtype(), xc.device())));  // 2 passes
  const Tensor xs = mul(xc, inv_a);                                                                    // pass
  const Tensor var_s = mean(mul(xs, xs), 1, /*keepdim=*/true);                                         // 2 passes
  return mul(rsqrt(add(var_s, mul_scalar(mul(inv_a, inv_a), eps))), inv_a);                            // O(rows)
}

}  // namespace

Tensor layernorm_forward(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, double eps, Tensor& mean_out,
                         Tensor& rstd_out) {
  const Tensor x = as_rows(in_math_dtype(x_in));
  // Corrected two-pass statistics: m1 may carry the rounding of a float32
  // reduction, so centre once more by the mean m2 of the residuals; the
  // variance is then a mean of squares of centred values (never E[x^2]-E[x]^2).
  const Tensor m1 = mean(x, 1, /*keepdim=*/true);                                        // pass: read x
  const Tensor x_shift = sub(x, m1);                                                     // pass: read x, write
  const Tensor m2 = mean(x_shift, 1, /*keepdim=*/true);                                  // pass: read
  const Tensor xc = sub(x_shift, m2);                                                    // pass: read, write
  const Tensor var = mean(mul(xc, xc), 1, /*keepdim=*/true);                             // 2 passes
  Tensor rstd = rsqrt(add_scalar(var, eps));                                             // O(rows)
  if (reduce(ReduceOp::Min, rstd, 0).item() == 0.0) rstd = rstd_of_large_rows(xc, eps);  // O(rows) check
  const Tensor xhat = mul(xc, rstd);                                                     // pass
  const Tensor y = add(mul(xhat, gamma), beta);                                          // 2 passes

  mean_out = add(m1, m2).reshape({x.size(0)});  // O(rows)
  rstd_out = rstd.reshape({x.size(0)});
  const Tensor y_shaped = y.reshape(x_in.shape());
  return x_in.dtype() == DType::BF16 ? y_shaped.to(DType::BF16) : y_shaped;
}

LayerNormGrads layernorm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& gamma,
                                  const Tensor& mean_saved, const Tensor& rstd_saved) {
  const Tensor x = as_rows(in_math_dtype(x_in));
  const Tensor dy = as_rows(in_math_dtype(dy_in));
  const int64_t rows = x.size(0);
  const Tensor mu = mean_saved.reshape({rows, 1});
  const Tensor rstd = rstd_saved.reshape({rows, 1});

  // xhat from the saved statistics (recomputed, not stored: O(rows) memory).
  // The saved mean was rounded to float32 for float input; that rounding
  // shifts every xhat of the row by the same amount, which the row mean of
  // xhat (exactly 0 in exact arithmetic) measures, so subtract it.
  const Tensor xhat_shifted = mul(sub(x, mu), rstd);                   // 2 passes
  const Tensor xhat = sub(xhat_shifted, mean(xhat_shifted, 1, true));  // 2 passes

  LayerNormGrads g;
  g.dbeta = sum(dy, 0);              // pass
  g.dgamma = sum(mul(dy, xhat), 0);  // 2 passes

  // dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat))
  const Tensor gdy = mul(dy, gamma);                                               // pass
  const Tensor mean_gdy = mean(gdy, 1, true);                                      // pass
  const Tensor mean_gdy_xhat = mean(mul(gdy, xhat), 1, true);                      // 2 passes
  const Tensor dx = mul(sub(sub(gdy, mean_gdy), mul(xhat, mean_gdy_xhat)), rstd);  // 4 passes

  const Tensor dx_shaped = dx.reshape(x_in.shape());
  g.dx = x_in.dtype() == DType::BF16 ? dx_shaped.to(DType::BF16) : dx_shaped;
  return g;
}

}  // namespace hg::unfused
