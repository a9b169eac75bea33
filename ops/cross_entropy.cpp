#include "ops/cross_entropy.hpp"

#include <cmath>
#include <vector>

#include "core/indexing.hpp"
#include "core/kernel_mode.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/cross_entropy_kernels.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "ops/cpu/cross_entropy_cpu.hpp"
#include "ops/dispatch_log.hpp"

namespace hg {
namespace {

constexpr const char* kOp = "cross_entropy_forward";

// log-softmax and the NLL pick written on map/zip/reduce, like miniTorch.
Tensor unfused(const Tensor& x, const Tensor& targets, int64_t n_rows, int64_t vocab, int64_t ignore_index,
               double inv_count, CrossEntropySaved* saved) {
  const Tensor z = sub(x, max(x, -1, true));
  const Tensor log_probs = sub(z, log(sum(exp(z), -1, true)));
  const Tensor t = targets.reshape({n_rows, 1}).to(x.dtype());
  const Tensor classes = Tensor::arange(vocab, x.dtype(), x.device()).reshape({1, vocab});
  const Tensor ignored =
      zip(BinaryOp::Eq, t, Tensor::full({1, 1}, static_cast<double>(ignore_index), x.dtype(), x.device()));
  const Tensor valid = add_scalar(neg(ignored), 1.0);
  const Tensor onehot = mul(zip(BinaryOp::Eq, t, classes), valid);
  const Tensor loss = mul_scalar(sum_all(mul(onehot, log_probs)), -inv_count);
  if (saved) {
    saved->log_probs = log_probs;
    saved->onehot = onehot;
    saved->valid = valid;
  }
  return loss;
}

void check_shapes(const Tensor& logits, const Tensor& targets) {
  logits.check_defined(kOp);
  targets.check_defined(kOp);
  const DType t = logits.dtype();
  HG_CHECK(t == DType::F32 || t == DType::F64 || (t == DType::BF16 && logits.is_cuda()), kOp,
           "logits must be F32 or F64 (or BF16 on CUDA), got ", dtype_name(t), " on ", device_name(logits.device()));
  targets.check_dtype(DType::F32, kOp);
  check_same_device(kOp, logits, targets);
  HG_CHECK(logits.ndim() >= 1, kOp, "logits must have a class dim, got ", logits.shape());
  Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  HG_CHECK(targets.shape() == expected, kOp, "targets ", targets.shape(), " must be logits ", logits.shape(),
           " without its last dim");
  HG_CHECK(logits.size(-1) > 0, kOp, "empty class dim in logits ", logits.shape());
}

// CUDA, fused mode, F32 / BF16 logits: the kernels that keep two floats per row.
bool use_lse_kernels(const Tensor& logits) {
  return logits.is_cuda() && kernel_mode() == KernelMode::Fused &&
         (logits.dtype() == DType::BF16 || logits.dtype() == DType::F32);
}

#if HG_WITH_CUDA
Tensor lse_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, CrossEntropySaved* saved) {
  const int64_t vocab = logits.size(-1), n_rows = targets.numel();
  const Tensor x = logits.reshape({n_rows, vocab}), t = targets.reshape({n_rows});
  Tensor loss = Tensor::empty({}, DType::F32, Device::CUDA);
  Tensor row_stats = Tensor::empty({n_rows, 2}, DType::F32, Device::CUDA);
  Tensor inv_count = Tensor::empty({1}, DType::F32, Device::CUDA);
  gpu::cross_entropy_lse_forward(x, t, ignore_index, row_stats, loss, inv_count);
  if (saved) {
    saved->logits = x;
    saved->targets = t;
    saved->row_stats = row_stats;
    saved->inv_count_device = inv_count;
    saved->ignore_index = ignore_index;
  }
  return loss;
}
#else
// Unreachable: without CUDA no tensor is on CUDA.
Tensor lse_forward(const Tensor&, const Tensor&, int64_t, CrossEntropySaved*) {
  fail(kOp, "logits are on CUDA but handgrad was built without CUDA");
}
#endif

}  // namespace

std::vector<double> read_cross_entropy_targets(const Tensor& targets, int64_t vocab, int64_t ignore_index,
                                               const char* op, int64_t* n_valid) {
  std::vector<double> t = targets.to_vector();
  int64_t counted = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == static_cast<double>(ignore_index)) continue;
    if (!is_index(t[i], vocab))
      fail(op, "target ", t[i], " at flat position ", i, " is neither a class in [0, ", vocab, ") nor ignore_index ",
           ignore_index);
    ++counted;
  }
  if (n_valid) *n_valid = counted;
  return t;
}

Tensor cross_entropy_forward_on_device(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                       CrossEntropySaved* saved) {
  HG_PROFILE("cross_entropy", logits.device());
  check_shapes(logits, targets);
  if (!use_lse_kernels(logits)) return cross_entropy_forward(logits, targets, ignore_index, saved);
  if (saved) {
    *saved = CrossEntropySaved{};
    saved->logits_shape = logits.shape();
    saved->n_valid = -1;
    saved->grad_dtype = logits.dtype();
  }
  return lse_forward(logits, targets, ignore_index, saved);
}

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             CrossEntropySaved* saved) {
  HG_PROFILE("cross_entropy", logits.device());
  check_shapes(logits, targets);
  const int64_t vocab = logits.size(-1);
  const int64_t n_rows = targets.numel();
  int64_t n_valid = 0;
  const std::vector<double> host_targets = read_cross_entropy_targets(targets, vocab, ignore_index, kOp, &n_valid);
  const double inv_count = n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0;
  if (saved) {
    *saved = CrossEntropySaved{};
    saved->inv_count = inv_count;
    saved->logits_shape = logits.shape();
    saved->n_valid = n_valid;
    saved->grad_dtype = logits.dtype();
  }
  // BF16 logits: fused mode keeps no probabilities (the gradient is written in
  // BF16 by the backward); unfused mode computes in F32.
  if (logits.dtype() == DType::BF16 && use_lse_kernels(logits) && n_rows > 0) {
    log_dispatch("cross_entropy_forward", "CUDA fused (log-sum-exp, no probabilities kept)", logits);
    return lse_forward(logits, targets, ignore_index, saved);
  }
  const Tensor x =
      logits.dtype() == DType::BF16 ? logits.reshape({n_rows, vocab}).to(DType::F32) : logits.reshape({n_rows, vocab});
  if (n_rows == 0) {
    if (saved) saved->dlogits = Tensor::zeros(logits.shape(), logits.dtype(), logits.device());
    return Tensor::zeros({}, math_dtype(logits.dtype()), logits.device());
  }

  const bool fused = kernel_mode() == KernelMode::Fused;
  const bool fused_kernel = fused && (!logits.is_cuda() || logits.dtype() == DType::F32);
  log_dispatch("cross_entropy_forward", dispatch_path(logits, !fused_kernel), logits);
  if (fused && !logits.is_cuda()) {
    Tensor dlogits = Tensor::empty({n_rows, vocab}, x.dtype(), Device::CPU);
    const double loss = cpu::cross_entropy_forward(x, host_targets, vocab, ignore_index, inv_count, dlogits);
    if (saved) saved->dlogits = dlogits.reshape(logits.shape());
    return Tensor::full({}, loss, x.dtype(), Device::CPU);
  }
  // The CUDA kernel is float32; float64 on the GPU takes the primitive path.
  if (fused && logits.is_cuda() && logits.dtype() == DType::F32) {
    Tensor dlogits = Tensor::empty({n_rows, vocab}, DType::F32, Device::CUDA);
    Tensor loss = Tensor::empty({}, DType::F32, Device::CUDA);
    gpu::cross_entropy_fused(x, targets, n_rows, vocab, ignore_index, static_cast<float>(inv_count), dlogits, loss);
    if (saved) saved->dlogits = dlogits.reshape(logits.shape());
    return loss;
  }
  return unfused(x, targets, n_rows, vocab, ignore_index, inv_count, saved);
}

namespace {

Tensor backward(const CrossEntropySaved& saved, double dloss, [[maybe_unused]] bool over_logits) {
  HG_PROFILE("cross_entropy", saved.row_stats.defined() ? saved.row_stats.device()
                              : saved.dlogits.defined() ? saved.dlogits.device()
                                                        : saved.log_probs.device());
  const char* op = "cross_entropy_backward";
  HG_CHECK(std::isfinite(dloss), op, "upstream gradient ", dloss, " is not finite");
  if (saved.row_stats.defined()) {
#if HG_WITH_CUDA
    Tensor dlogits =
        over_logits ? saved.logits : Tensor::empty(saved.logits.shape(), saved.logits.dtype(), Device::CUDA);
    gpu::cross_entropy_lse_backward(saved.logits, saved.targets, saved.ignore_index, saved.row_stats,
                                    saved.inv_count_device, static_cast<float>(dloss), dlogits);
    return dlogits.reshape(saved.logits_shape);
#endif
  }
  if (saved.dlogits.defined()) return dloss == 1.0 ? saved.dlogits : mul_scalar(saved.dlogits, dloss);
  HG_CHECK(saved.log_probs.defined(), op, "nothing saved: call cross_entropy_forward with a saved struct first");
  // d/dlogits of -(1/n) sum onehot * log_softmax = (softmax * valid - onehot) / n
  const Tensor g = sub(mul(exp(saved.log_probs), saved.valid), saved.onehot);
  const Tensor dlogits = mul_scalar(g, dloss * saved.inv_count).reshape(saved.logits_shape);
  return saved.grad_dtype == DType::BF16 ? dlogits.to(DType::BF16) : dlogits;
}

}  // namespace

Tensor cross_entropy_backward(const CrossEntropySaved& saved, double dloss) { return backward(saved, dloss, false); }

Tensor cross_entropy_backward_over_logits(const CrossEntropySaved& saved, double dloss) {
  return backward(saved, dloss, true);
}

}  // namespace hg
