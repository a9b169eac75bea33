// Backend::gemm through cuBLASLt: cached plans, one workspace, the epilogue
// mapping, and the deterministic bias-gradient sums that run after the GEMM
// (cuda/column_sum.cu). Row-major <-> column-major: docs/gemm.md.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <spdlog/spdlog.h>

#include "core/cuda_runtime.hpp"
#include "core/gemm_algorithms.hpp"
#include "core/math_mode.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cublas_handle.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_lt.hpp"
#include "cuda/gemm_lt_plan.hpp"
#include "cuda/storage_cast.cuh"

namespace hg::gpu {

namespace gemm_lt_detail {

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    HG_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

void* workspace() {
  static void* ws = allocate(kWorkspaceBytes);
  static void* beside_ws = nullptr;
  if (!beside_active()) return ws;
  if (!beside_ws) beside_ws = allocate(kWorkspaceBytes);  // never freed: safe on any stream
  return beside_ws;
}

}  // namespace gemm_lt_detail

namespace {

using namespace gemm_lt_detail;

constexpr int kMeasuredCandidates = 8;  // the heuristic offers at most 8 (bench/lab/gemm.md)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
  }
  fail("gemm", "unknown dtype ", static_cast<int>(t));
}

// ---- bias gradients, summed after the GEMM: out[i] (+)= sum_j x[i*si + j*sj] ----

// One warp per output (row sums, sj == 1: the lanes read adjacent terms);
// lanes take j = lane, lane + 32, ... and combine in a fixed shuffle tree, so
// the result does not depend on timing.
template <class T, class O>
__global__ void strided_sum_kernel(const T* __restrict__ x, O* __restrict__ out, int64_t count, int64_t len, int64_t si,
                                   int64_t sj, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; i < count; i += warps) {
    float acc = 0.f;
    for (int64_t j = lane; j < len; j += 32) acc += to_f(x[i * si + j * sj]);
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) out[i] = from_f<O>(accumulate ? to_f(out[i]) + acc : acc);
  }
}

template <class T>
void launch_strided_sum_to(const void* x, const Tensor& out, int64_t count, int64_t len, int64_t si, int64_t sj,
                           bool accumulate) {
  const int threads = 256;
  const int64_t blocks = (count + threads / 32 - 1) / (threads / 32);
  const auto grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  const T* xs = static_cast<const T*>(x);
  if (out.dtype() == DType::F32)
    strided_sum_kernel<T, float>
        <<<grid, threads, 0, stream()>>>(xs, static_cast<float*>(out.raw_data()), count, len, si, sj, accumulate);
  else
    strided_sum_kernel<T, __nv_bfloat16><<<grid, threads, 0, stream()>>>(
        xs, static_cast<__nv_bfloat16*>(out.raw_data()), count, len, si, sj, accumulate);
  HG_CUDA_CHECK_LAUNCH("strided_sum_kernel");
}

// Column sums (si == 1: outputs adjacent in memory, the terms of one output
// sj apart) go to cuda/column_sum.cu: the warp-per-output kernel would read
// one element per 32-byte sector there.
void strided_sum(const Tensor& x, const Tensor& out, int64_t count, int64_t len, int64_t si, int64_t sj,
                 bool accumulate) {
  if (si == 1 && sj != 1) return column_sum(x, len, count, sj, out, accumulate);
  if (x.dtype() == DType::F32) launch_strided_sum_to<float>(x.raw_data(), out, count, len, si, sj, accumulate);
  else launch_strided_sum_to<__nv_bfloat16>(x.raw_data(), out, count, len, si, sj, accumulate);
}

// ---- plans ----------------------------------------------------------------------

// Everything the descriptors and the algorithm's choice depend on.
using PlanKey = std::array<int64_t, 19>;

cublasComputeType_t compute_type(DType operands) {
  return operands == DType::F32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

PlanKey key_of(const Call& c) {
  return {int64_t(c.a.dtype()),
          int64_t(c.out.dtype()),
          c.vec ? int64_t(c.vec->dtype()) : -1,
          c.args.transpose_a,
          c.args.transpose_b,
          c.s.m,
          c.s.n,
          c.s.k,
          c.s.batch,
          c.s.b_shared,
          int64_t(c.epilogue),
          int64_t(compute_type(c.a.dtype())),
          alignment_of(c.a.raw_data()),
          alignment_of(c.b.raw_data()),
          alignment_of(c.out.raw_data()),
          c.vec ? alignment_of(c.vec->raw_data()) : 0,
          c.args.aux ? alignment_of(c.args.aux->raw_data()) : 0,
          int64_t(gemm_algorithms()),
          gemm_algorithm_file_generation()};
}

// Bias / aux pointers live on the descriptor; they are refreshed every call.
void set_pointers(const Plan& p, const Call& c) {
  if (c.vec) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.vec->raw_data());
  if (c.args.aux) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.args.aux->raw_data());
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  HG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    HG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    HG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                     sizeof batch_stride));
  }
  return layout;
}

// Row-major out (M x N) = op(a) op(b) is column-major out^T (N x M) =
// op(b)^T op(a)^T: our b is cuBLASLt's A and our a its B, each keeping its
// transpose flag; every leading dim is the stored row length.
Plan build_plan(const Call& c) {
  const int64_t m = c.s.m, n = c.s.n, k = c.s.k;
  const bool ta = c.args.transpose_a, tb = c.args.transpose_b;
  Plan p;
  HG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute_type(c.a.dtype()), CUDA_R_32F));
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue);
  if (c.vec) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(c.vec->dtype())));
  if (c.args.aux) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(n));
  set_pointers(p, c);

  const cudaDataType_t in = cuda_type(c.a.dtype()), out = cuda_type(c.out.dtype());
  p.lt_a = tb ? make_layout(in, k, n, k, c.s.batch, k * n) : make_layout(in, n, k, n, c.s.batch, k * n);
  p.lt_b = ta ? make_layout(in, m, k, m, c.s.batch, m * k) : make_layout(in, k, m, k, c.s.batch, m * k);
  p.lt_d = make_layout(out, n, m, n, c.s.batch, m * n);

  cublasLtMatmulPreference_t pref = nullptr;
  HG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  HG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t align_a = alignment_of(c.b.raw_data()), align_b = alignment_of(c.a.raw_data()),
                 align_d = alignment_of(c.out.raw_data());
  HG_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  HG_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  HG_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d));
  HG_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
  // Split-K partial sums stay in fp32: for an out narrower than fp32 only the
  // COMPUTE_TYPE reduction (or none). INPLACE and OUTPUT_TYPE add the partial
  // products in out's dtype, which for bf16 is not fp32 accumulation (on the
  // H100 the heuristic picked a 44-way OUTPUT_TYPE split at M 130 N 40 K 200,
  // and the BiasGelu result was off by 22x its single-rounding bound).
  const uint32_t reductions = c.out.dtype() == DType::F32 ? uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK)
                                                          : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  HG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                       sizeof reductions));
  const bool measure = gemm_algorithms() == GemmAlgorithms::Measured && !stream_capturing();
  std::array<cublasLtMatmulHeuristicResult_t, kMeasuredCandidates> results{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), p.desc, p.lt_a, p.lt_b, p.lt_d, p.lt_d, pref,
                                     measure ? kMeasuredCandidates : 1, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.has_algo = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.has_algo) p.algo = results[measure && found > 1 ? fastest_candidate(p, c, results.data(), found) : 0].algo;
  return p;
}

// Plans are built once per key and never destroyed (like the handle).
const Plan& plan_for(const Call& c) {
  static std::mutex mutex;
  static std::map<PlanKey, Plan> plans;
  std::lock_guard<std::mutex> lock(mutex);
  const PlanKey key = key_of(c);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, build_plan(c)).first;
  set_pointers(it->second, c);
  return it->second;
}

// Runs one cuBLASLt matmul; false when cuBLASLt has no algorithm for it.
bool try_run(const Call& c) {
  const Plan& p = plan_for(c);
  if (!p.has_algo) return false;
  const float alpha = 1.f, beta = c.args.accumulate ? 1.f : 0.f;
  const cublasStatus_t status = cublasLtMatmul(lt_handle(), p.desc, &alpha, c.b.raw_data(), p.lt_a, c.a.raw_data(),
                                               p.lt_b, &beta, c.out.raw_data(), p.lt_d, c.out.raw_data(), p.lt_d,
                                               &p.algo, workspace(), kWorkspaceBytes, stream());
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  HG_CUBLAS_CHECK(status);
  return true;
}

[[noreturn]] void no_algorithm(const Call& c) {
  fail("cuda gemm", "cuBLASLt offers no algorithm for ", dtype_name(c.a.dtype()), " a ", c.a.shape(),
       c.args.transpose_a ? " (transposed)" : "", " x b ", c.b.shape(), c.args.transpose_b ? " (transposed)" : "",
       " -> ", dtype_name(c.out.dtype()), " out with epilogue ", gemm_epilogue_name(c.args.epilogue),
       " (pointer alignments a ", alignment_of(c.a.raw_data()), ", b ", alignment_of(c.b.raw_data()), ", out ",
       alignment_of(c.out.raw_data()), " bytes)");
}

// Says once per kind of call (epilogue, dtypes, transposes) that a fallback
// runs, so a slow GEMM can be traced to it.
void note_fallback(const Call& c, const char* what) {
  static std::mutex mutex;
  static std::set<std::tuple<int, int, int, int, bool, bool>> seen;
  const Tensor* vec = c.args.bias ? c.args.bias : c.args.bias_grad;
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen.insert({int(c.args.epilogue), int(c.a.dtype()), int(c.out.dtype()), vec ? int(vec->dtype()) : -1,
                    c.args.transpose_a, c.args.transpose_b})
           .second)
    return;
  spdlog::warn("cuda gemm: cuBLASLt has no fused algorithm for epilogue {} with {} operands, {} out{}{}; {}",
               gemm_epilogue_name(c.args.epilogue), dtype_name(c.a.dtype()), dtype_name(c.out.dtype()),
               vec ? ", bias/bias_grad " : "", vec ? dtype_name(vec->dtype()) : "", what);
}

// Bias / BiasGelu / GeluBackward for a combination cuBLASLt has no fused
// algorithm for (e.g. an F32 bias with BF16 out, whose documented bias type
// is D's): the plain GEMM into an F32 buffer, then the epilogue on the CUDA
// backend's F32 passes (the same GELU as UnaryOp::Gelu), then one rounding
// to out's dtype.
void composed_epilogue(const Call& c) {
  note_fallback(c, "running the GEMM into F32, then the epilogue as separate passes");
  Backend& be = cuda_backend();
  const GemmArgs& args = c.args;
  Tensor acc = c.out.dtype() == DType::F32 ? c.out : Tensor::empty(c.out.shape(), DType::F32, Device::CUDA);
  if (args.accumulate && acc.raw_data() != c.out.raw_data()) be.cast(c.out, acc);
  GemmArgs plain;
  plain.transpose_a = args.transpose_a;
  plain.transpose_b = args.transpose_b;
  plain.accumulate = args.accumulate;
  const Call gemm_only{c.a, c.b, acc, plain, c.s, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
  if (!try_run(gemm_only)) no_algorithm(gemm_only);
  const auto as_f32 = [](const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); };
  switch (args.epilogue) {
    case GemmEpilogue::Bias: be.zip(BinaryOp::Add, acc, as_f32(*args.bias), acc); break;
    case GemmEpilogue::BiasGelu:
      be.zip(BinaryOp::Add, acc, as_f32(*args.bias), acc);
      be.cast(acc, *args.aux);
      be.map(UnaryOp::Gelu, acc, acc);
      break;
    case GemmEpilogue::GeluBackward: {
      Tensor slope = Tensor::empty(acc.shape(), DType::F32, Device::CUDA);
      be.map(UnaryOp::GeluGrad, as_f32(*args.aux), slope);
      be.zip(BinaryOp::Mul, acc, slope, acc);
      if (args.bias_grad) strided_sum(acc, *args.bias_grad, c.s.n, c.s.m, 1, c.s.n, args.bias_grad_accumulate);
      break;
    }
    default: fail("cuda gemm", "composed_epilogue called for epilogue ", gemm_epilogue_name(args.epilogue));
  }
  if (acc.raw_data() != c.out.raw_data()) be.cast(acc, c.out);
}

}  // namespace

void gemm_lt(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args, const MatmulShape& shape) {
  const char* op = "cuda gemm";
  // A 2-D b shared by every batch of an untransposed a: the batches are
  // consecutive rows of a and out, so one GEMM with batch * m rows does it all.
  MatmulShape s = shape;
  if (s.b_shared && !args.transpose_a && s.batch * s.m <= INT_MAX) {
    s.m *= s.batch;
    s.batch = 1;
    s.b_shared = false;
  } else if (s.b_shared) {
    // Transposed batches of a against one b: one GEMM per batch (rare; it
    // avoids relying on a zero batch stride, which cuBLASLt does not document).
    const Tensor a3 = a.reshape({s.batch, a.size(-2), a.size(-1)});
    Tensor out3 = out.reshape({s.batch, s.m, s.n});
    MatmulShape one = s;
    one.batch = 1;
    one.b_shared = false;
    for (int64_t i = 0; i < s.batch; ++i) {
      Tensor out_i = out3[i];
      gemm_lt(a3[i], b, out_i, args, one);
    }
    return;
  }
  HG_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16, op, "a has dtype ", dtype_name(a.dtype()),
           "; cuBLASLt GEMMs take f32 or bf16 operands");
  for (const auto& [what, v] : {std::pair<const char*, int64_t>{"m", s.m}, {"n", s.n}, {"k", s.k}, {"batch", s.batch}})
    HG_CHECK(v <= INT_MAX, op, what, " = ", v, " exceeds cuBLASLt's 32-bit limit (a ", a.shape(), ", b ", b.shape(),
             ")");
  const GemmEpilogue e = args.epilogue;
  if (e == GemmEpilogue::BiasGelu || e == GemmEpilogue::GeluBackward)
    HG_CHECK(s.n % 8 == 0, op, "epilogue ", gemm_epilogue_name(e),
             " needs N % 8 == 0 (cuBLASLt's GELU aux "
             "leading dimension), got N = ",
             s.n, " for out ", out.shape());
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // empty product (epilogues are refused on empty shapes by check_gemm)
    if (!args.accumulate) HG_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream()));
    return;
  }

  // Bias gradients are never cuBLASLt's epilogue: on the H200 (bench/lab/gemm.md)
  // DGELU_BGRAD took 3.3-5x the plain GEMM's time and BGRADA/B 14-67% more,
  // where the GEMM without them plus one column-sum pass (strided_sum, fixed
  // order) reads the gradient once more at copy speed.
  cublasLtEpilogue_t fused = CUBLASLT_EPILOGUE_DEFAULT;
  switch (e) {
    case GemmEpilogue::None:
    case GemmEpilogue::BiasGradA:
    case GemmEpilogue::BiasGradB: break;
    case GemmEpilogue::Bias: fused = CUBLASLT_EPILOGUE_BIAS; break;
    case GemmEpilogue::BiasGelu: fused = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    case GemmEpilogue::GeluBackward: fused = CUBLASLT_EPILOGUE_DGELU; break;
  }
  const Call call{a, b, out, args, s, fused, args.bias};
  if (!try_run(call)) {
    if (e == GemmEpilogue::None || e == GemmEpilogue::BiasGradA || e == GemmEpilogue::BiasGradB) no_algorithm(call);
    composed_epilogue(Call{a, b, out, args, s, CUBLASLT_EPILOGUE_DEFAULT, nullptr});
    return;
  }
  const int64_t m = s.m, n = s.n, k = s.k;
  const bool ta = args.transpose_a, tb = args.transpose_b;
  const bool add = args.bias_grad_accumulate;
  if (e == GemmEpilogue::BiasGradA) strided_sum(a, *args.bias_grad, m, k, ta ? 1 : k, ta ? m : 1, add);
  if (e == GemmEpilogue::BiasGradB) strided_sum(b, *args.bias_grad, n, k, tb ? k : 1, tb ? 1 : n, add);
  if (e == GemmEpilogue::GeluBackward && args.bias_grad) strided_sum(out, *args.bias_grad, n, m, 1, n, add);
}

}  // namespace hg::gpu
