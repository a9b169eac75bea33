#include "core/gemm_check.hpp"

namespace hg {
namespace {

void check_vector(const char* op, const char* what, const Tensor* v, int64_t len, const Tensor& out) {
  v->check_defined(op);
  HG_CHECK(v->shape() == Shape{len}, op, what, " has shape ", v->shape(), ", expected (", len, ") for out ",
           out.shape());
  HG_CHECK(v->dtype() == out.dtype() || (out.dtype() == DType::BF16 && v->dtype() == DType::F32), op, what,
           " has dtype ", dtype_name(v->dtype()), "; it must be out's dtype (", dtype_name(out.dtype()),
           "), or f32 when out is bf16");
  HG_CHECK(v->device() == out.device(), op, what, " is on ", device_name(v->device()), " but out is on ",
           device_name(out.device()));
}

bool needs_bias(GemmEpilogue e) { return e == GemmEpilogue::Bias || e == GemmEpilogue::BiasGelu; }
bool needs_aux(GemmEpilogue e) { return e == GemmEpilogue::BiasGelu || e == GemmEpilogue::GeluBackward; }
bool takes_bias_grad(GemmEpilogue e) {
  return e == GemmEpilogue::BiasGradA || e == GemmEpilogue::BiasGradB || e == GemmEpilogue::GeluBackward;
}

}  // namespace

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return "None";
    case GemmEpilogue::Bias: return "Bias";
    case GemmEpilogue::BiasGelu: return "BiasGelu";
    case GemmEpilogue::GeluBackward: return "GeluBackward";
    case GemmEpilogue::BiasGradA: return "BiasGradA";
    case GemmEpilogue::BiasGradB: return "BiasGradB";
  }
  return "unknown";
}

MatmulShape check_gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& args, const char* op) {
  a.check_defined(op);
  b.check_defined(op);
  out.check_defined(op);
  check_same_device(op, a, b);
  check_same_device(op, a, out);
  check_same_dtype(op, a, b);
  HG_CHECK(out.dtype() == a.dtype() || (a.dtype() == DType::BF16 && out.dtype() == DType::F32), op, "out has dtype ",
           dtype_name(out.dtype()), " for ", dtype_name(a.dtype()),
           " operands; allowed: out of "
           "the operands' dtype, or f32 for bf16 operands");
  const MatmulShape s = matmul_shape(a.shape(), b.shape(), args.transpose_a, args.transpose_b, op);
  HG_CHECK(out.shape() == s.out, op, "out has shape ", out.shape(), ", expected ", s.out, " for a ", a.shape(), " b ",
           b.shape());

  const GemmEpilogue e = args.epilogue;
  const char* name = gemm_epilogue_name(e);
  HG_CHECK(e == GemmEpilogue::None || (a.ndim() == 2 && b.ndim() == 2), op, "epilogue ", name,
           " needs 2-D operands (fold leading dims into rows first), got a ", a.shape(), " b ", b.shape());
  HG_CHECK(e == GemmEpilogue::None || (s.m > 0 && s.n > 0 && s.k > 0), op, "epilogue ", name,
           " needs non-empty M, N, K, got ", s.m, ", ", s.n, ", ", s.k);
  HG_CHECK(needs_bias(e) == (args.bias != nullptr), op, "epilogue ", name,
           needs_bias(e) ? " needs a bias" : " takes no bias, but one was given");
  HG_CHECK(needs_aux(e) == (args.aux != nullptr), op, "epilogue ", name,
           needs_aux(e) ? " needs aux (the GELU pre-activation)" : " takes no aux, but one was given");
  HG_CHECK(takes_bias_grad(e) || args.bias_grad == nullptr, op, "epilogue ", name,
           " takes no bias_grad, but one was given");
  HG_CHECK(e == GemmEpilogue::GeluBackward || !takes_bias_grad(e) || args.bias_grad != nullptr, op, "epilogue ", name,
           " needs bias_grad");
  HG_CHECK(args.bias_grad != nullptr || !args.bias_grad_accumulate, op, "bias_grad_accumulate is set but epilogue ",
           name, " was given no bias_grad to add to");
  HG_CHECK(!(e == GemmEpilogue::GeluBackward && args.accumulate), op,
           "epilogue GeluBackward cannot accumulate (the GELU derivative would scale the old out too)");
  if (args.bias) check_vector(op, "bias", args.bias, s.n, out);
  if (args.aux) {
    args.aux->check_defined(op);
    HG_CHECK(args.aux->shape() == out.shape() && args.aux->dtype() == out.dtype() && args.aux->device() == out.device(),
             op, "aux is ", args.aux->describe(), ", expected the shape, dtype and device of out ", out.describe());
    HG_CHECK(args.aux->raw_data() != out.raw_data(), op, "aux and out must be different tensors");
  }
  if (args.bias_grad) check_vector(op, "bias_grad", args.bias_grad, e == GemmEpilogue::BiasGradA ? s.m : s.n, out);
  return s;
}

}  // namespace hg
