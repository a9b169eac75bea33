#include "ops/attention_unfused.hpp"

#include "core/backend.hpp"
#include "core/tensor_functions.hpp"
#include "ops/softmax_unfused.hpp"

namespace hg::unfused {
namespace {

Tensor math_copy(const Tensor& t) { return t.dtype() == DType::BF16 ? t.to(DType::F32) : t; }

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionSaved& saved) {
  const Tensor qm = math_copy(q), km = math_copy(k), vm = math_copy(v);
  const Tensor scores = matmul(qm, km, false, true);  // (B, H, Tq, Tk)
  Tensor lse;
  saved.probs = softmax_forward(scores, saved.mask, saved.causal, saved.scale, &lse);
  saved.lse = lse.reshape({q.size(0), q.size(1), q.size(2)});
  saved.o = matmul(saved.probs, vm).to(q.dtype());
}

// dv = p^T do, dp = do v^T, ds = scale * p * (dp - rowsum(dp * p)), dq = ds k, dk = ds^T q.
AttentionGrads attention_backward(const Tensor& dout, const AttentionSaved& saved) {
  const Tensor dom = math_copy(dout), qm = math_copy(saved.q), km = math_copy(saved.k), vm = math_copy(saved.v);
  const DType out = saved.q.dtype();
  const Tensor dv = matmul(saved.probs, dom, true, false);
  const Tensor dp = matmul(dom, vm, false, true);
  const Tensor ds = softmax_backward(dp, saved.probs, saved.scale);
  return {matmul(ds, km).to(out), matmul(ds, qm, true, false).to(out), dv.to(out)};
}

}  // namespace hg::unfused
