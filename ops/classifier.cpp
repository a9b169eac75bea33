#include "ops/classifier.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/backend.hpp"
#include "core/bias_grad_sink.hpp"
#include "core/profiler.hpp"
#include "core/tensor_functions.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "ops/cpu/cross_entropy_cpu.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/dispatch_log.hpp"

namespace hg {
namespace {

constexpr const char* kOp = "classifier_loss_and_grads";

void check_args(const Tensor& h, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                const Tensor& weight_grad, const Tensor& bias_grad, const ClassifierOptions& options) {
  for (const Tensor* t : {&h, &weight, &targets, &weight_grad}) t->check_defined(kOp);
  const DType dt = h.dtype();
  const bool cuda = h.is_cuda();
  HG_CHECK(cuda ? (dt == DType::F32 || dt == DType::BF16) : (dt == DType::F32 || dt == DType::F64), kOp, "h is ",
           h.describe(), "; allowed: F32 or F64 on the CPU, F32 or BF16 on CUDA");
  HG_CHECK(h.ndim() == 2 && h.size(1) > 0, kOp, "h must be (rows, d) with d > 0, got ", h.shape());
  HG_CHECK(weight.ndim() == 2 && weight.size(0) > 0 && weight.size(1) == h.size(1), kOp, "weight ", weight.shape(),
           " must be (V, ", h.size(1), ") with V > 0 for h ", h.shape());
  const int64_t vocab = weight.size(0);
  check_same_dtype(kOp, h, weight);
  check_same_device(kOp, h, weight);
  HG_CHECK(targets.shape() == Shape{h.size(0)}, kOp, "targets ", targets.shape(), " must be (", h.size(0), ") for h ",
           h.shape());
  targets.check_dtype(DType::F32, kOp);
  check_same_device(kOp, h, targets);
  const DType grad_dtype = dt == DType::F64 ? DType::F64 : DType::F32;
  HG_CHECK(
      weight_grad.shape() == weight.shape() && weight_grad.dtype() == grad_dtype && weight_grad.device() == h.device(),
      kOp, "weight_grad is ", weight_grad.describe(), "; expected the weight's shape ", weight.shape(), " in ",
      dtype_name(grad_dtype), " on ", device_name(h.device()));
  HG_CHECK(bias.defined() == bias_grad.defined(), kOp, "bias and bias_grad must both be given or both be left out");
  if (bias.defined()) {
    HG_CHECK(bias.shape() == Shape{vocab} && bias.dtype() == dt && bias.device() == h.device(), kOp, "bias is ",
             bias.describe(), "; expected (", vocab, ") ", dtype_name(dt), " on ", device_name(h.device()));
    HG_CHECK(bias_grad.shape() == Shape{vocab} && bias_grad.dtype() == grad_dtype && bias_grad.device() == h.device(),
             kOp, "bias_grad is ", bias_grad.describe(), "; expected (", vocab, ") ", dtype_name(grad_dtype), " on ",
             device_name(h.device()));
  }
  HG_CHECK(options.chunk_rows >= 0, kOp, "chunk_rows must be >= 0 (0: the default), got ", options.chunk_rows);
  HG_CHECK(std::isfinite(options.dloss), kOp, "dloss ", options.dloss, " is not finite");
}

// The row pass of one device: the count before the first chunk, each
// chunk's rows (gradient written over its logits), the loss after the last.
class RowPass {
 public:
  // dloss scales the gradient rows only (the loss keeps 1 / n).
  RowPass(const Tensor& targets, int64_t vocab, int64_t ignore_index, DType dtype, bool targets_on_device, double dloss)
      : targets_(targets), ignore_index_(ignore_index), dtype_(dtype), dloss_(dloss) {
    if (!targets.is_cuda() || !targets_on_device) {
      int64_t n_valid = 0;
      host_targets_ = read_cross_entropy_targets(targets, vocab, ignore_index, kOp, &n_valid);
      inv_count_ = n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0;
    }
    if (targets.is_cuda()) {
      // Counted on the device in both forms, so both run the same arithmetic.
      inv_count_device_ = Tensor::empty({1}, DType::F32, Device::CUDA);
      row_loss_device_ = Tensor::empty({targets.numel()}, DType::F32, Device::CUDA);
      gpu::cross_entropy_count_targets(targets, ignore_index, inv_count_device_);
      // dloss 1 launches nothing more (the form a captured step runs).
      grad_scale_device_ = dloss == 1.0 ? inv_count_device_ : mul_scalar(inv_count_device_, dloss);
    } else {
      row_loss_.assign(host_targets_.size(), 0.0);
    }
  }

  void rows(Tensor& logits, int64_t first) {
    const int64_t n = logits.size(0);
    if (logits.is_cuda()) {
      Tensor row_loss = row_loss_device_.slice(first, first + n);
      gpu::cross_entropy_lse_rows_grad(logits, targets_.slice(first, first + n), ignore_index_, grad_scale_device_,
                                       row_loss);
    } else {
      cpu::cross_entropy_rows(logits, host_targets_.data() + first, ignore_index_, inv_count_ * dloss_, logits,
                              row_loss_.data() + first);
    }
  }

  Tensor loss() const {
    if (targets_.is_cuda()) {
      Tensor loss = Tensor::empty({}, DType::F32, Device::CUDA);
      gpu::cross_entropy_sum_row_losses(row_loss_device_, inv_count_device_, loss);
      return loss;
    }
    double total = 0;
    for (double l : row_loss_) total += l;  // row order: the same bits at any chunk size or thread count
    return Tensor::full({}, total * inv_count_, dtype_ == DType::F64 ? DType::F64 : DType::F32, Device::CPU);
  }

 private:
  Tensor targets_;
  int64_t ignore_index_;
  DType dtype_;
  double dloss_;
  std::vector<double> host_targets_, row_loss_;
  double inv_count_ = 0;
  Tensor inv_count_device_, grad_scale_device_, row_loss_device_;
};

}  // namespace

int64_t default_classifier_chunk_rows(int64_t vocab, DType dtype, Device device) {
  HG_CHECK(vocab > 0, "default_classifier_chunk_rows", "vocab must be positive, got ", vocab);
  const int64_t budget = device == Device::CUDA ? int64_t(256) << 20 : int64_t(64) << 20;
  int64_t rows = std::max<int64_t>(1, budget / (vocab * static_cast<int64_t>(dtype_size(dtype))));
  if (device == Device::CUDA && rows >= 128) rows -= rows % 128;
  return rows;
}

ClassifierResult classifier_loss_and_grads(const Tensor& h, const Tensor& weight, const Tensor& bias,
                                           const Tensor& targets, int64_t ignore_index, Tensor& weight_grad,
                                           Tensor& bias_grad, const ClassifierOptions& options) {
  HG_PROFILE("classifier", h.device());
  check_args(h, weight, bias, targets, weight_grad, bias_grad, options);
  const int64_t n = h.size(0), d = h.size(1), vocab = weight.size(0);
  const Device dev = h.device();
  const int64_t chunk =
      std::min(std::max<int64_t>(n, 1),
               options.chunk_rows > 0 ? options.chunk_rows : default_classifier_chunk_rows(vocab, h.dtype(), dev));
  log_dispatch(kOp, dev == Device::CUDA ? "CUDA chunked" : "CPU chunked", h);
  RowPass pass(targets, vocab, ignore_index, h.dtype(), options.targets_on_device, options.dloss);
  ClassifierResult r;
  r.dh = options.dh_over_h ? h : Tensor::empty({n, d}, h.dtype(), dev);
  Backend& be = backend_for(dev);
  Tensor buffer = Tensor::empty({n > 0 ? chunk : 0, vocab}, h.dtype(), dev);  // one chunk of logits, reused
  std::optional<BiasGradSink> db;  // the column sums of dlogits, into bias_grad
  if (bias.defined()) db.emplace(bias_grad, bias_grad.dtype());
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t rows = std::min(chunk, n - first);
    const Tensor h_c = h.slice(first, first + rows);
    Tensor logits = buffer.slice(0, rows);
    GemmArgs forward;
    forward.transpose_b = true;
    if (bias.defined()) {
      forward.epilogue = GemmEpilogue::Bias;
      forward.bias = &bias;
    }
    be.gemm(h_c, weight, logits, forward);
    pass.rows(logits, first);  // logits now hold d loss / d logits of these rows
    GemmArgs dw;
    dw.transpose_a = true;
    dw.accumulate = true;
    if (db) {
      dw.epilogue = GemmEpilogue::BiasGradA;  // db = column sums of dlogits, from the same pass
      db->attach(dw);
    }
    be.gemm(logits, h_c, weight_grad, dw);
    if (db) db->finish(be);
    Tensor dh_c = r.dh.slice(first, first + rows);
    be.gemm(logits, weight, dh_c, GemmArgs{});
  }
  r.loss = pass.loss();
  return r;
}

}  // namespace hg
