#pragma once
#include <cstdint>
#include <vector>

#include "core/indexing.hpp"
#include "core/tensor.hpp"

namespace hg {

// The primitive backend, miniTorch's TensorOps: every higher op that is not
// fused is written on these four kinds of pass. One implementation per device
// (cpu_backend.cpp on Eigen, cuda/cuda_backend.cu on CUDA kernels + cuBLAS).

enum class UnaryOp {
  Identity,
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Square,
  Abs,
  Relu,
  ReluGrad,
  Gelu,
  GeluGrad,
  Tanh,
  Sigmoid
};
enum class BinaryOp { Add, Sub, Mul, Div, Max, Min, Pow, Eq, Gt };
enum class ReduceOp { Sum, Max, Min, Mean };

// What a GEMM does after the product (cuBLASLt epilogues on CUDA). Shapes in
// row-major terms, out (M, N) = op(a) (M, K) * op(b) (K, N); docs/gemm.md.
enum class GemmEpilogue {
  None,          // out = product (+ out when accumulate)
  Bias,          // out = product + bias[n]
  BiasGelu,      // aux = product + bias[n] (pre-activation, saved); out = gelu(aux)
  GeluBackward,  // out = product * gelu'(aux[m, n]); bias_grad[n] = sum_m out[m, n] when given
  BiasGradA,     // out = product; bias_grad[m] = sum_k op(a)[m, k]   (dW = dy^T x: db from dy)
  BiasGradB,     // out = product; bias_grad[n] = sum_k op(b)[k, n]
};

const char* gemm_epilogue_name(GemmEpilogue e);

struct GemmArgs {
  bool transpose_a = false, transpose_b = false;
  bool accumulate = false;  // out += product (beta = 1) instead of out = product
  GemmEpilogue epilogue = GemmEpilogue::None;
  const Tensor* bias = nullptr;       // Bias, BiasGelu: (N,)
  Tensor* aux = nullptr;              // BiasGelu: written (M, N); GeluBackward: read (M, N)
  Tensor* bias_grad = nullptr;        // BiasGradA (M,), BiasGradB (N,), GeluBackward (N,) optional; overwritten, or:
  bool bias_grad_accumulate = false;  // bias_grad += the sums (one addition in bias_grad's dtype), not = the sums
};

// One multi-tensor AdamW step over many parameters (Backend::adamw_multi).
// Entry i of each list belongs to parameter i; all F32 (F64 too on the CPU),
// on one device. compute_copies[i] is a BF16 tensor of the parameter's shape
// to refresh with the new value, or undefined where there is none.
struct AdamWGroup {
  std::vector<Tensor> params, grads, m, v, compute_copies;
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 0.0;  // > 0: clip the global gradient norm to it; 0: no clipping
};

// The device-side state of adamw_multi: an F64 (kAdamWStateSize,) tensor on
// the parameters' device, so a step reads nothing from the host (a CUDA graph
// can replay it while lr changes between replays).
enum AdamWStateIndex : int {
  kAdamWStep = 0,       // t, incremented by every step (read and written on the device)
  kAdamWLr = 1,         // learning rate, written by the caller (fill of a 1-element slice)
  kAdamWGradNorm = 2,   // global L2 norm of the grads before clipping (written)
  kAdamWClipScale = 3,  // factor the grads were multiplied by (written; 1 when not clipped)
  kAdamWSkipped = 4,    // 1 when the norm was not finite and nothing was updated (written)
  kAdamWStateSize = 8,  // [5], [6]: bias corrections 1 - beta^t of this step
};

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);

class Backend {
 public:
  virtual ~Backend() = default;

  // out = op(x), elementwise. Same shape/dtype (F32 or F64), same device.
  // ReluGrad(x) = x > 0 ? 1 : 0 ; GeluGrad(x) = d gelu / dx (tanh approximation, as Gelu).
  virtual void map(UnaryOp op, const Tensor& x, Tensor& out) = 0;

  // out = op(a, b) with NumPy broadcasting: out.shape() == broadcast_shapes(a, b).
  // Eq/Gt produce 1.0 or 0.0. out may alias an operand of out's own shape
  // (in-place accumulate, e.g. grad += g); never a broadcast operand.
  virtual void zip(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // out = op over `dim` of x; out has x's shape with size 1 at `dim` (keepdim form).
  virtual void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out) = 0;

  // Batched matmul, out[..., m, n] = sum_k op(a)[..., m, k] * op(b)[..., k, n],
  // where op transposes the last two dims when the flag is set. a and b have
  // the same leading (batch) dims, or b is 2-D and shared by every batch.
  // When accumulate is true, out += product instead of out = product.
  virtual void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
                      bool accumulate = false) = 0;

  // out = value everywhere / out = src converted to out's dtype (same device, same numel).
  virtual void fill(Tensor& out, double value) = 0;
  virtual void cast(const Tensor& src, Tensor& out) = 0;
  // Every element of every tensor of `outs` (this device, any dtype) = 0,
  // e.g. all gradients before a step. The default fills each in turn; CUDA
  // clears the whole list in one launch, which a step of ~150 parameters
  // would otherwise spend ~150 launches on.
  virtual void zero_multi(const std::vector<Tensor>& outs);

  // Inverted-dropout mask: out[i] = keep if uniform(seed, counter + i) >= p
  // else 0, where uniform is hg::Generator's stream (core/random_stream.hpp)
  // and keep = 1 / (1 - p) converted to out's dtype as a fill would. Every
  // device draws the same mask from the same (seed, counter), bit for bit,
  // with no host work per element. p in [0, 1).
  virtual void dropout_mask(Tensor& out, uint64_t seed, uint64_t counter, double p) = 0;

  // out = x with dims dim0 and dim1 (already normalised) swapped, as a
  // contiguous copy. The default stages through the host so every backend has
  // it; a device backend overrides it with a kernel to avoid the round trip.
  virtual void transpose(const Tensor& x, int dim0, int dim1, Tensor& out);

  // ---- mixed precision ----

  // out = epilogue(op(a) * op(b)), shapes as matmul (epilogues other than None
  // need 2-D operands). a and b share a dtype; out may be wider: BF16 x BF16
  // -> BF16 or F32 (fp32 accumulation always; F32 out for weight gradients
  // accumulated with beta = 1). F32 x F32 -> F32 is exact FP32 unless
  // hg::set_allow_tf32(true). CPU: F32 / F64 only. Validation: core/gemm_check.hpp.
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args) = 0;

  // Embedding rows (core/indexing.hpp validates and calls these). ids holds
  // the row ids as F32 on this device; host_ids is the same list on the host,
  // every id already checked to be in [0, V). table / grad_table (V, D) and
  // out / grad (N, D), N = host_ids.size(), all F32 or all F64; on CUDA grad
  // may also be BF16 with an F32 grad_table (widened as it is read).
  // out[i, :] = table[ids[i], :].
  virtual void gather_rows(const Tensor& table, const Tensor& ids, const std::vector<int32_t>& host_ids,
                           Tensor& out) = 0;
  // grad_table[ids[i], :] += grad[i, :], summed in increasing i for each row
  // (deterministic, no float atomics).
  virtual void scatter_add_rows(const Tensor& grad, const std::vector<int32_t>& host_ids, Tensor& grad_table) = 0;
  // The same from ids on this device alone (nothing read back: a CUDA graph
  // can capture it); ids that name no row are left out.
  virtual void scatter_add_rows_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table) = 0;
  // For each set, how many of its ids (F32 on this device) are not integers
  // in [0, limit), values equal to `except` apart (NaN: none); only the
  // counts are read back, together.
  virtual std::vector<int64_t> count_bad_indices(const std::vector<IndexSet>& sets) = 0;

  // One AdamW step (decoupled weight decay, bias correction, as hg::AdamW)
  // over every tensor of the group, with optional global-norm clipping, in
  // at most 3 launches on CUDA whatever the number of tensors, and no host
  // synchronisation: the norm, clip scale and bias corrections are computed
  // on the device into `state` (see AdamWStateIndex), readable afterwards.
  // Grads are scaled as they are read (not written back). A non-finite norm
  // skips the update of every tensor (state[kAdamWSkipped] = 1).
  virtual void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state) = 0;

  // out (1,) F64 = sum over all tensors of sum(x^2), accumulated in double
  // in a fixed order (deterministic). F32 tensors (F64 too on the CPU).
  virtual void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out) = 0;

  // SGD on one tensor: g' = g + wd p ; v = momentum v + g' (v may be nullptr) ; p -= lr v.
  virtual void sgd_update(Tensor& p, const Tensor& g, Tensor* velocity, double lr, double momentum,
                          double weight_decay) = 0;
};

Backend& cpu_backend();
Backend& cuda_backend();  // throws hg::Error when built without CUDA
Backend& backend_for(Device device);

}  // namespace hg
