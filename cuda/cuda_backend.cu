// The primitive backend on the GPU (the unfused path): one small kernel per
// map / zip / reduce op, cuBLASLt for matmul (cuda/gemm_lt.cu; cublasDgemm for
// F64). Arithmetic runs on F32, F64 or BF16 storage; BF16 is widened to float
// for the math (reductions accumulate in float, GEMMs accumulate in float on
// the tensor cores). fill, cast and transpose also handle F16 storage. Every
// kernel runs on the handgrad stream and nothing here synchronises with the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/gemm_check.hpp"
#include "core/matmul_shape.hpp"
#include "core/optimizer_ops.hpp"
#include "core/random_stream.hpp"
#include "core/transpose_plan.hpp"
#include "cuda/cublas_handle.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gelu.cuh"
#include "cuda/gemm_lt.hpp"
#include "cuda/indexing_kernels.hpp"
#include "cuda/optim_kernels.hpp"

namespace hg {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU; grid-stride loops cover the rest.
unsigned int grid_for(int64_t work_items, int64_t items_per_block = kThreads) {
  const int64_t wanted = (work_items + items_per_block - 1) / items_per_block;
  const int64_t cap = static_cast<int64_t>(gpu::sm_count()) * 16;
  return static_cast<unsigned int>(wanted < cap ? wanted : cap);
}

// ---- validation ---------------------------------------------------------------

void check_on_gpu(const char* op, const Tensor& t) {
  t.check_defined(op);
  t.check_device(Device::CUDA, op);
}

bool is_arithmetic(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16; }

void check_arithmetic_dtype(const char* op, const char* what, const Tensor& t) {
  if (!is_arithmetic(t.dtype()))
    fail(op, what, " has dtype ", dtype_name(t.dtype()),
         ", but the CUDA backend computes on f32, f64 or bf16 (f32 math) only (shape ", t.shape(), ")");
}

// Calls f(S{}) with S = float, double or __nv_bfloat16 according to `dtype` (already checked).
template <class F>
void with_arith_type(DType dtype, F&& f) {
  if (dtype == DType::F32) f(float{});
  else if (dtype == DType::F64) f(double{});
  else f(__nv_bfloat16{});
}

// The type the math runs in for a storage type: float for bf16, else itself.
template <class S>
struct MathOf {
  using type = S;
};
template <>
struct MathOf<__nv_bfloat16> {
  using type = float;
};
template <class S>
using math_t = typename MathOf<S>::type;

// Conversions go through float (or double between F32 / F64), the same route
// the CPU takes, so CUDA and CPU casts agree bit for bit. Rounding is to
// nearest even everywhere.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }

template <class D, class W>
__device__ __forceinline__ D narrow(W x) {
  if constexpr (std::is_same_v<D, float> || std::is_same_v<D, double>) return static_cast<D>(x);
  else if constexpr (std::is_same_v<D, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(x));
  else return __float2half_rn(static_cast<float>(x));
}

// ---- math that has separate float / double spellings on the device ----------

__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float d_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double d_abs(double x) { return fabs(x); }
__device__ __forceinline__ float d_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double d_pow(double a, double b) { return pow(a, b); }

// ---- map ------------------------------------------------------------------------

template <UnaryOp OP, class T>
__device__ __forceinline__ T apply_unary(T x) {
  if constexpr (OP == UnaryOp::Identity) return x;
  else if constexpr (OP == UnaryOp::Neg) return -x;
  else if constexpr (OP == UnaryOp::Exp) return d_exp(x);
  else if constexpr (OP == UnaryOp::Log) return d_log(x);
  else if constexpr (OP == UnaryOp::Sqrt) return d_sqrt(x);
  else if constexpr (OP == UnaryOp::Rsqrt) return T(1) / d_sqrt(x);  // correctly rounded steps, not rsqrtf
  else if constexpr (OP == UnaryOp::Reciprocal) return T(1) / x;
  else if constexpr (OP == UnaryOp::Square) return x * x;
  else if constexpr (OP == UnaryOp::Abs) return d_abs(x);
  else if constexpr (OP == UnaryOp::Relu) return x > T(0) ? x : T(0);
  else if constexpr (OP == UnaryOp::ReluGrad) return x > T(0) ? T(1) : T(0);
  else if constexpr (OP == UnaryOp::Gelu) return gpu::gelu_value(x);  // tanh form: cuda/gelu.cuh
  else if constexpr (OP == UnaryOp::GeluGrad) return gpu::gelu_slope(x);
  else if constexpr (OP == UnaryOp::Tanh) return d_tanh(x);
  else {
    static_assert(OP == UnaryOp::Sigmoid, "unhandled UnaryOp");
    // Never exponentiates a large positive number, so no inf / inf.
    if (x >= T(0)) return T(1) / (T(1) + d_exp(-x));
    const T e = d_exp(x);
    return e / (T(1) + e);
  }
}

// x and y may alias (in-place map): each element is read before it is written.
template <UnaryOp OP, class S>
__global__ void map_kernel(const S* x, S* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = narrow<S>(apply_unary<OP>(widen(x[i])));
}

// float4 loads and stores when both pointers are 16-byte aligned and n % 4 == 0.
template <UnaryOp OP>
__global__ void map_kernel_vec4(const float4* x, float4* y, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 v = x[i];
    v.x = apply_unary<OP>(v.x);
    v.y = apply_unary<OP>(v.y);
    v.z = apply_unary<OP>(v.z);
    v.w = apply_unary<OP>(v.w);
    y[i] = v;
  }
}

// bf16: eight values per 16-byte load and store (the scalar kernel's 2-byte
// accesses reach about half the copy rate on the H200).
template <UnaryOp OP>
__global__ void map_kernel_bf16x8(const uint4* x, uint4* y, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    uint4 v = x[i];
    auto* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = narrow<__nv_bfloat16>(apply_unary<OP>(widen(h[j])));
    y[i] = v;
  }
}

bool vec4_ok(const void* p, const void* q, int64_t n) {
  return n % 4 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

template <UnaryOp OP>
void launch_map(const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  with_arith_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* xs = static_cast<const T*>(x.raw_data());
    T* ys = static_cast<T*>(out.raw_data());
    if constexpr (std::is_same_v<T, float>) {
      if (vec4_ok(xs, ys, n)) {
        map_kernel_vec4<OP><<<grid_for(n / 4), kThreads, 0, gpu::stream()>>>(reinterpret_cast<const float4*>(xs),
                                                                             reinterpret_cast<float4*>(ys), n / 4);
        HG_CUDA_CHECK_LAUNCH("map_kernel_vec4");
        return;
      }
    }
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (n % 8 == 0 && reinterpret_cast<uintptr_t>(xs) % 16 == 0 && reinterpret_cast<uintptr_t>(ys) % 16 == 0) {
        map_kernel_bf16x8<OP><<<grid_for(n / 8), kThreads, 0, gpu::stream()>>>(reinterpret_cast<const uint4*>(xs),
                                                                               reinterpret_cast<uint4*>(ys), n / 8);
        HG_CUDA_CHECK_LAUNCH("map_kernel_bf16x8");
        return;
      }
    }
    map_kernel<OP, T><<<grid_for(n), kThreads, 0, gpu::stream()>>>(xs, ys, n);
    HG_CUDA_CHECK_LAUNCH("map_kernel");
  });
}

// ---- zip --------------------------------------------------------------------------

template <BinaryOp OP, class T>
__device__ __forceinline__ T apply_binary(T a, T b) {
  if constexpr (OP == BinaryOp::Add) return a + b;
  else if constexpr (OP == BinaryOp::Sub) return a - b;
  else if constexpr (OP == BinaryOp::Mul) return a * b;
  else if constexpr (OP == BinaryOp::Div) return a / b;
  // Max / Min propagate NaN (a NaN in either input gives NaN), as torch.maximum does.
  else if constexpr (OP == BinaryOp::Max) return (a != a || a > b) ? a : b;
  else if constexpr (OP == BinaryOp::Min) return (a != a || a < b) ? a : b;
  else if constexpr (OP == BinaryOp::Pow) return d_pow(a, b);
  else if constexpr (OP == BinaryOp::Eq) return a == b ? T(1) : T(0);
  else {
    static_assert(OP == BinaryOp::Gt, "unhandled BinaryOp");
    return a > b ? T(1) : T(0);
  }
}

// Equal shapes: one flat pass (out may alias a or b).
template <BinaryOp OP, class S>
__global__ void zip_same_shape_kernel(const S* a, const S* b, S* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = narrow<S>(apply_binary<OP>(widen(a[i]), widen(b[i])));
}

// Broadcasting: out's index is split into coordinates, innermost dim first;
// a stride of 0 repeats an input along a broadcast dim. Adjacent dims that
// step through memory together are merged on the host first, so the usual
// cases (bias add, row scale, scalar) need one or two dims.
constexpr int kMaxZipDims = 8;

template <class I>
struct ZipGeometry {
  int ndim;
  I size[kMaxZipDims];  // [0] is the innermost dim
  I a_stride[kMaxZipDims];
  I b_stride[kMaxZipDims];
};

template <BinaryOp OP, class S, class I>
__global__ void zip_broadcast_kernel(const S* a, const S* b, S* out, int64_t n, ZipGeometry<I> g) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    I rest = static_cast<I>(i), a_off = 0, b_off = 0;
#pragma unroll
    for (int d = 0; d < kMaxZipDims; ++d) {
      if (d == g.ndim) break;
      const I coord = rest % g.size[d];
      rest /= g.size[d];
      a_off += coord * g.a_stride[d];
      b_off += coord * g.b_stride[d];
    }
    out[i] = narrow<S>(apply_binary<OP>(widen(a[a_off]), widen(b[b_off])));
  }
}

struct MergedDim {
  int64_t size, a_stride, b_stride;
};

// Right-aligns a and b to out, gives broadcast dims stride 0, drops size-1
// dims and merges neighbours that are contiguous in both inputs.
std::vector<MergedDim> merge_broadcast_dims(const Shape& a, const Shape& b, const Shape& out) {
  const int n = static_cast<int>(out.size());
  auto padded_strides = [n](const Shape& s) {
    std::vector<int64_t> strides(n, 0);
    int64_t step = 1;
    for (int k = static_cast<int>(s.size()) - 1, d = n - 1; k >= 0; --k, --d) {
      strides[d] = s[k] == 1 ? 0 : step;
      step *= s[k];
    }
    return strides;
  };
  const auto as = padded_strides(a), bs = padded_strides(b);
  std::vector<MergedDim> dims;  // innermost first
  for (int d = n - 1; d >= 0; --d) {
    if (out[d] == 1) continue;
    if (!dims.empty()) {
      MergedDim& inner = dims.back();
      if (as[d] == inner.a_stride * inner.size && bs[d] == inner.b_stride * inner.size) {
        inner.size *= out[d];
        continue;
      }
    }
    dims.push_back({out[d], as[d], bs[d]});
  }
  return dims;
}

template <BinaryOp OP, class T, class I>
void launch_zip_broadcast(const T* a, const T* b, T* out, int64_t n, const std::vector<MergedDim>& dims) {
  ZipGeometry<I> g{};
  g.ndim = static_cast<int>(dims.size());
  for (int d = 0; d < g.ndim; ++d) {
    g.size[d] = static_cast<I>(dims[d].size);
    g.a_stride[d] = static_cast<I>(dims[d].a_stride);
    g.b_stride[d] = static_cast<I>(dims[d].b_stride);
  }
  zip_broadcast_kernel<OP, T, I><<<grid_for(n), kThreads, 0, gpu::stream()>>>(a, b, out, n, g);
  HG_CUDA_CHECK_LAUNCH("zip_broadcast_kernel");
}

template <BinaryOp OP>
void launch_zip(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  with_arith_type(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* as = static_cast<const T*>(a.raw_data());
    const T* bs = static_cast<const T*>(b.raw_data());
    T* os = static_cast<T*>(out.raw_data());
    if (a.numel() == n && b.numel() == n) {  // equal shapes up to size-1 dims
      zip_same_shape_kernel<OP, T><<<grid_for(n), kThreads, 0, gpu::stream()>>>(as, bs, os, n);
      HG_CUDA_CHECK_LAUNCH("zip_same_shape_kernel");
      return;
    }
    const auto dims = merge_broadcast_dims(a.shape(), b.shape(), out.shape());
    if (dims.size() > kMaxZipDims)
      fail("cuda zip", binary_op_name(OP), ": broadcasting ", a.shape(), " with ", b.shape(), " needs ", dims.size(),
           " dims after merging; the CUDA kernel handles up to ", kMaxZipDims);
    // 32-bit index arithmetic (much cheaper division) whenever offsets fit.
    if (n <= int64_t(UINT32_MAX) && a.numel() <= int64_t(UINT32_MAX) && b.numel() <= int64_t(UINT32_MAX))
      launch_zip_broadcast<OP, T, uint32_t>(as, bs, os, n, dims);
    else launch_zip_broadcast<OP, T, int64_t>(as, bs, os, n, dims);
  });
}

// ---- reduce -------------------------------------------------------------------------
//
// x is viewed as (outer, R, inner) with R the reduced dim; out is (outer, inner).
// Each output is reduced by one fixed set of threads in a fixed order, so
// results are deterministic run to run. S is the input storage type, O the
// output's (bf16 input may write f32 output), T = math_t<S> the accumulator.

template <ReduceOp OP, class T>
struct Reducer {
  static __device__ __forceinline__ T identity() {
    if constexpr (OP == ReduceOp::Max) return -T(INFINITY);
    else if constexpr (OP == ReduceOp::Min) return T(INFINITY);
    else return T(0);
  }
  // Max / Min propagate NaN, like zip's Max / Min.
  static __device__ __forceinline__ T combine(T acc, T v) {
    if constexpr (OP == ReduceOp::Max) return (acc != acc || acc > v) ? acc : v;
    else if constexpr (OP == ReduceOp::Min) return (acc != acc || acc < v) ? acc : v;
    else return acc + v;
  }
  static __device__ __forceinline__ T finish(T acc, T count) {
    if constexpr (OP == ReduceOp::Mean) return acc / count;
    else return acc;
  }
  static __device__ __forceinline__ T warp_reduce(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
  }
};

// inner == 1, short rows: one warp per contiguous row.
template <ReduceOp OP, class S, class O>
__global__ void reduce_rows_warp_kernel(const S* __restrict__ x, O* __restrict__ out, int64_t rows, int64_t len) {
  using T = math_t<S>;
  using R = Reducer<OP, T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x / 32;
  // `row` is the same for all lanes of a warp, so the full-mask shuffles are safe.
  for (int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows; row += gridDim.x * warps_per_block) {
    const S* xr = x + row * len;
    T acc = R::identity();
    for (int64_t j = lane; j < len; j += 32) acc = R::combine(acc, widen(xr[j]));
    acc = R::warp_reduce(acc);
    if (lane == 0) out[row] = narrow<O>(R::finish(acc, T(len)));
  }
}

// inner == 1, long rows: one block per contiguous row.
template <ReduceOp OP, class S, class O>
__global__ void reduce_rows_block_kernel(const S* __restrict__ x, O* __restrict__ out, int64_t rows, int64_t len) {
  using T = math_t<S>;
  using R = Reducer<OP, T>;
  __shared__ T warp_results[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * len;
    T acc = R::identity();
    for (int64_t j = threadIdx.x; j < len; j += kThreads) acc = R::combine(acc, widen(xr[j]));
    acc = R::warp_reduce(acc);
    __syncthreads();  // the previous row's warp 0 may still read warp_results
    if (lane == 0) warp_results[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < kThreads / 32 ? warp_results[lane] : R::identity();
      acc = R::warp_reduce(acc);
      if (lane == 0) out[row] = narrow<O>(R::finish(acc, T(len)));
    }
  }
}

// inner > 1: a block of 32 x 8 threads owns 32 neighbouring columns of one
// outer index (coalesced loads along inner); its 8 thread rows split the
// reduced dim, then thread row 0 combines the 8 partials in order.
constexpr int kColTileX = 32, kColTileY = 8;

template <ReduceOp OP, class S, class O>
__global__ void reduce_cols_kernel(const S* __restrict__ x, O* __restrict__ out, int64_t outer, int64_t len,
                                   int64_t inner) {
  using T = math_t<S>;
  using R = Reducer<OP, T>;
  __shared__ T partial[kColTileY][kColTileX];
  const int64_t tiles_per_outer = (inner + kColTileX - 1) / kColTileX;
  const int64_t tiles = outer * tiles_per_outer;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * kColTileX + threadIdx.x;
    T acc = R::identity();
    if (col < inner) {
      const S* xc = x + o * len * inner + col;
      for (int64_t r = threadIdx.y; r < len; r += kColTileY) acc = R::combine(acc, widen(xc[r * inner]));
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
      T total = partial[0][threadIdx.x];
#pragma unroll
      for (int k = 1; k < kColTileY; ++k) total = R::combine(total, partial[k][threadIdx.x]);
      out[o * inner + col] = narrow<O>(R::finish(total, T(len)));
    }
    __syncthreads();  // partial is rewritten by the next tile
  }
}

template <ReduceOp OP>
void launch_reduce(const Tensor& x, int dim, Tensor& out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= x.shape()[d];
  for (int d = dim + 1; d < x.ndim(); ++d) inner *= x.shape()[d];
  const int64_t len = x.shape()[dim];
  auto launch = [&](auto in_zero, auto out_zero) {
    using S = decltype(in_zero);
    using O = decltype(out_zero);
    const S* xs = static_cast<const S*>(x.raw_data());
    O* os = static_cast<O*>(out.raw_data());
    cudaStream_t s = gpu::stream();
    if (inner == 1 && len > 1024) {
      reduce_rows_block_kernel<OP, S, O><<<grid_for(outer, 1), kThreads, 0, s>>>(xs, os, outer, len);
      HG_CUDA_CHECK_LAUNCH("reduce_rows_block_kernel");
    } else if (inner == 1) {
      reduce_rows_warp_kernel<OP, S, O><<<grid_for(outer, kThreads / 32), kThreads, 0, s>>>(xs, os, outer, len);
      HG_CUDA_CHECK_LAUNCH("reduce_rows_warp_kernel");
    } else {
      const int64_t tiles = outer * ((inner + kColTileX - 1) / kColTileX);
      reduce_cols_kernel<OP, S, O><<<grid_for(tiles, 1), dim3(kColTileX, kColTileY), 0, s>>>(xs, os, outer, len, inner);
      HG_CUDA_CHECK_LAUNCH("reduce_cols_kernel");
    }
  };
  // bf16 input may reduce into an f32 output (e.g. a bias gradient); else out has x's dtype.
  if (x.dtype() == DType::BF16 && out.dtype() == DType::F32) return launch(__nv_bfloat16{}, float{});
  with_arith_type(x.dtype(), [&](auto zero) { launch(zero, zero); });
}

// ---- fill and cast -------------------------------------------------------------

// Fills with a bit pattern of the element's width, so one kernel per width
// serves every dtype (the value is converted once, on the host).
template <class Bits>
__global__ void fill_kernel(Bits* out, int64_t n, Bits value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

template <class Bits>
void launch_fill(void* out, int64_t n, Bits value) {
  fill_kernel<Bits><<<grid_for(n), kThreads, 0, gpu::stream()>>>(static_cast<Bits*>(out), n, value);
  HG_CUDA_CHECK_LAUNCH("fill_kernel");
}

// Inverted-dropout mask from hg::Generator's stream (core/random_stream.hpp):
// element i keeps (`keep`, the dtype's bits of 1 / (1 - p)) when the
// (counter + i)-th uniform of the seed's stream is >= p, as on the host.
template <class Bits>
__global__ void dropout_mask_kernel(Bits* out, int64_t n, uint64_t key, uint64_t counter, double p, Bits keep) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = random_stream::uniform_at(key, counter + static_cast<uint64_t>(i)) >= p ? keep : Bits(0);
}

template <class Bits>
void launch_dropout_mask(void* out, int64_t n, uint64_t seed, uint64_t counter, double p, Bits keep) {
  dropout_mask_kernel<Bits><<<grid_for(n), kThreads, 0, gpu::stream()>>>(static_cast<Bits*>(out), n,
                                                                         random_stream::key(seed), counter, p, keep);
  HG_CUDA_CHECK_LAUNCH("dropout_mask_kernel");
}

template <class Half>
uint16_t half_bits(Half h) {
  static_assert(sizeof(Half) == sizeof(uint16_t), "16-bit type expected");
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = narrow<D>(widen(src[i]));
}

// Calls f(T{}) with the device element type of `dtype`.
template <class F>
void with_storage_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
  }
  fail("cuda cast", "unknown dtype ", static_cast<int>(dtype));
}

// ---- transpose ----------------------------------------------------------------------
//
// x viewed as (A, n0, M, n1, B) becomes out (A, n1, M, n0, B). Each thread
// writes one output element (coalesced writes; reads are coalesced along B,
// which is the head dim in attention's (batch, T, heads, D) <-> (batch, heads, T, D)).
template <class Elem, class I>
__global__ void transpose_kernel(const Elem* __restrict__ x, Elem* __restrict__ out, int64_t total, I n0, I M, I n1,
                                 I B) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    I t = static_cast<I>(o);
    const I b = t % B;
    t /= B;
    const I i0 = t % n0;
    t /= n0;
    const I m = t % M;
    t /= M;
    const I i1 = t % n1;
    const I a = t / n1;
    out[o] = x[(((a * n0 + i0) * M + m) * n1 + i1) * B + b];
  }
}

template <class Elem>
void launch_transpose(const void* x, void* out, int64_t total, int64_t n0, int64_t M, int64_t n1, int64_t B) {
  const auto* xs = static_cast<const Elem*>(x);
  auto* os = static_cast<Elem*>(out);
  if (total <= int64_t(UINT32_MAX))
    transpose_kernel<Elem, uint32_t><<<grid_for(total), kThreads, 0, gpu::stream()>>>(
        xs, os, total, uint32_t(n0), uint32_t(M), uint32_t(n1), uint32_t(B));
  else transpose_kernel<Elem, int64_t><<<grid_for(total), kThreads, 0, gpu::stream()>>>(xs, os, total, n0, M, n1, B);
  HG_CUDA_CHECK_LAUNCH("transpose_kernel");
}

// ---- matmul -----------------------------------------------------------------------

void check_fits_int(const char* op, const char* what, int64_t v, const Tensor& a, const Tensor& b) {
  if (v > INT_MAX) fail(op, what, " = ", v, " exceeds cuBLAS's 32-bit limit (a ", a.shape(), ", b ", b.shape(), ")");
}

// Row-major C (m x n) = op(A) (m x k) * op(B) (k x n). cuBLAS is column-major,
// and a row-major matrix read column-major is its transpose, so we ask cuBLAS
// for C^T = op(B)^T op(A)^T (n x m, ldc = n): B goes first, each operand
// keeps its own transpose flag, and the leading dims are the stored row lengths.
void dgemm_strided_batched(bool ta, bool tb, int m, int n, int k, const double* a, long long stride_a, const double* b,
                           long long stride_b, double* c, long long stride_c, int batch, double beta) {
  const double alpha = 1.0;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = ta ? m : k;  // stored A is (k x m) when transposed, else (m x k)
  const int ldb = tb ? k : n;  // stored B is (n x k) when transposed, else (k x n)
  HG_CUBLAS_CHECK(cublasDgemmStridedBatched(gpu::cublas_handle(), op_b, op_a, n, m, k, &alpha, b, ldb, stride_b, a, lda,
                                            stride_a, &beta, c, n, stride_c, batch));
}

// bf16 input may reduce into an f32 output (a bias gradient); otherwise out has x's dtype.
void check_output_dtype(const char* op, const Tensor& in, const Tensor& out) {
  if (in.dtype() == DType::BF16 && out.dtype() == DType::F32) return;
  if (in.dtype() != out.dtype())
    fail(op, "out ", out.shape(), " has dtype ", dtype_name(out.dtype()), " but the input ", in.shape(), " is ",
         dtype_name(in.dtype()), " (only bf16 input may write an f32 output)");
}

// ---- the backend ------------------------------------------------------------------

#define HG_UNARY_CASE(NAME)            \
  case UnaryOp::NAME:                  \
    launch_map<UnaryOp::NAME>(x, out); \
    return;
#define HG_BINARY_CASE(NAME)               \
  case BinaryOp::NAME:                     \
    launch_zip<BinaryOp::NAME>(a, b, out); \
    return;
#define HG_REDUCE_CASE(NAME) \
  case ReduceOp::NAME: launch_reduce<ReduceOp::NAME>(x, d, out); return;

class CudaBackend final : public Backend {
 public:
  void map(UnaryOp op, const Tensor& x, Tensor& out) override {
    const char* name = "cuda map";
    check_on_gpu(name, x);
    check_on_gpu(name, out);
    check_arithmetic_dtype(name, unary_op_name(op), x);
    check_same_dtype(name, x, out);
    check_same_shape(name, x, out);
    if (x.numel() == 0) return;
    switch (op) {
      HG_UNARY_CASE(Identity)
      HG_UNARY_CASE(Neg)
      HG_UNARY_CASE(Exp)
      HG_UNARY_CASE(Log)
      HG_UNARY_CASE(Sqrt)
      HG_UNARY_CASE(Rsqrt)
      HG_UNARY_CASE(Reciprocal)
      HG_UNARY_CASE(Square)
      HG_UNARY_CASE(Abs)
      HG_UNARY_CASE(Relu)
      HG_UNARY_CASE(ReluGrad)
      HG_UNARY_CASE(Gelu)
      HG_UNARY_CASE(GeluGrad)
      HG_UNARY_CASE(Tanh)
      HG_UNARY_CASE(Sigmoid)
    }
    fail(name, "unknown UnaryOp ", static_cast<int>(op));
  }

  void zip(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    const char* name = "cuda zip";
    check_on_gpu(name, a);
    check_on_gpu(name, b);
    check_on_gpu(name, out);
    check_arithmetic_dtype(name, binary_op_name(op), a);
    check_same_dtype(name, a, b);
    check_same_dtype(name, a, out);
    const Shape expected = broadcast_shapes(a.shape(), b.shape(), name);
    if (out.shape() != expected)
      fail(name, binary_op_name(op), ": out has shape ", out.shape(), " but ", a.shape(), " and ", b.shape(),
           " broadcast to ", expected);
    if (out.numel() == 0) return;
    switch (op) {
      HG_BINARY_CASE(Add)
      HG_BINARY_CASE(Sub)
      HG_BINARY_CASE(Mul)
      HG_BINARY_CASE(Div)
      HG_BINARY_CASE(Max)
      HG_BINARY_CASE(Min)
      HG_BINARY_CASE(Pow)
      HG_BINARY_CASE(Eq)
      HG_BINARY_CASE(Gt)
    }
    fail(name, "unknown BinaryOp ", static_cast<int>(op));
  }

  void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out) override {
    const char* name = "cuda reduce";
    check_on_gpu(name, x);
    check_on_gpu(name, out);
    check_arithmetic_dtype(name, reduce_op_name(op), x);
    check_output_dtype(name, x, out);
    const int d = normalize_dim(dim, x.ndim(), name);
    Shape expected = x.shape();
    expected[d] = 1;
    if (out.shape() != expected)
      fail(name, reduce_op_name(op), " over dim ", dim, " of ", x.shape(), ": out has shape ", out.shape(),
           ", expected ", expected);
    if (out.numel() == 0) return;
    if (x.shape()[d] == 0) {
      // The empty sum is 0; max, min and mean of nothing have no value.
      if (op == ReduceOp::Sum) return fill(out, 0.0);
      fail(name, reduce_op_name(op), " over dim ", dim, " of ", x.shape(), ": the reduced dim is empty");
    }
    switch (op) { HG_REDUCE_CASE(Sum) HG_REDUCE_CASE(Max) HG_REDUCE_CASE(Min) HG_REDUCE_CASE(Mean) }
    fail(name, "unknown ReduceOp ", static_cast<int>(op));
  }

  // F32 and BF16 go through cuBLASLt (Backend::gemm without an epilogue);
  // F64 keeps cublasDgemm.
  void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
              bool accumulate) override {
    const char* name = "cuda matmul";
    check_on_gpu(name, a);
    check_on_gpu(name, b);
    check_on_gpu(name, out);
    check_arithmetic_dtype(name, "a", a);
    check_same_dtype(name, a, b);
    check_same_dtype(name, a, out);
    if (a.dtype() != DType::F64) {
      GemmArgs args;
      args.transpose_a = transpose_a;
      args.transpose_b = transpose_b;
      args.accumulate = accumulate;
      return gemm(a, b, out, args);
    }
    const MatmulShape shape = matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b, name);
    if (out.shape() != shape.out)
      fail(name, "out has shape ", out.shape(), ", expected ", shape.out, " for a ", a.shape(), " b ", b.shape());
    const int64_t batch = shape.batch, m = shape.m, n = shape.n, k = shape.k;
    const bool shared_b = b.ndim() == 2;  // one b for every batch: stride 0
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {  // empty product: out = 0 (or unchanged when accumulating)
      if (!accumulate) fill(out, 0.0);
      return;
    }
    for (auto [what, v] : {std::pair<const char*, int64_t>{"m", m}, {"n", n}, {"k", k}, {"batch", batch}})
      check_fits_int(name, what, v, a, b);
    dgemm_strided_batched(transpose_a, transpose_b, int(m), int(n), int(k), static_cast<const double*>(a.raw_data()),
                          m * k, static_cast<const double*>(b.raw_data()), shared_b ? 0 : k * n,
                          static_cast<double*>(out.raw_data()), m * n, int(batch), accumulate ? 1.0 : 0.0);
  }

  void fill(Tensor& out, double value) override {
    check_on_gpu("cuda fill", out);
    const int64_t n = out.numel();
    if (n == 0) return;
    switch (out.dtype()) {
      case DType::F32: return launch_fill<float>(out.raw_data(), n, static_cast<float>(value));
      case DType::F64: return launch_fill<double>(out.raw_data(), n, value);
      case DType::BF16:
        return launch_fill<uint16_t>(out.raw_data(), n, half_bits(__float2bfloat16_rn(static_cast<float>(value))));
      case DType::F16:
        return launch_fill<uint16_t>(out.raw_data(), n, half_bits(__float2half_rn(static_cast<float>(value))));
    }
    fail("cuda fill", "unknown dtype ", static_cast<int>(out.dtype()));
  }

  void zero_multi(const std::vector<Tensor>& outs) override {
    for (const Tensor& t : outs) check_on_gpu("cuda zero_multi", t);
    gpu::zero_multi(outs);
  }

  void dropout_mask(Tensor& out, uint64_t seed, uint64_t counter, double p) override {
    check_on_gpu("cuda dropout_mask", out);
    HG_CHECK(p >= 0.0 && p < 1.0, "cuda dropout_mask", "p must be in [0, 1), got ", p);
    const int64_t n = out.numel();
    if (n == 0) return;
    const double keep = 1.0 / (1.0 - p);  // converted as fill converts
    void* o = out.raw_data();
    switch (out.dtype()) {
      case DType::F32: return launch_dropout_mask<float>(o, n, seed, counter, p, static_cast<float>(keep));
      case DType::F64: return launch_dropout_mask<double>(o, n, seed, counter, p, keep);
      case DType::BF16:
        return launch_dropout_mask<uint16_t>(o, n, seed, counter, p,
                                             half_bits(__float2bfloat16_rn(static_cast<float>(keep))));
      case DType::F16:
        return launch_dropout_mask<uint16_t>(o, n, seed, counter, p,
                                             half_bits(__float2half_rn(static_cast<float>(keep))));
    }
    fail("cuda dropout_mask", "unknown dtype ", static_cast<int>(out.dtype()));
  }

  void cast(const Tensor& src, Tensor& out) override {
    const char* name = "cuda cast";
    check_on_gpu(name, src);
    check_on_gpu(name, out);
    if (src.numel() != out.numel())
      fail(name, "src ", src.shape(), " and out ", out.shape(), " have different element counts");
    const int64_t n = src.numel();
    if (n == 0) return;
    if (src.dtype() == out.dtype()) {
      if (src.raw_data() != out.raw_data())
        HG_CUDA_CHECK(
            cudaMemcpyAsync(out.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice, gpu::stream()));
      return;
    }
    with_storage_type(src.dtype(), [&](auto src_zero) {
      using S = decltype(src_zero);
      with_storage_type(out.dtype(), [&](auto out_zero) {
        using D = decltype(out_zero);
        cast_kernel<S, D><<<grid_for(n), kThreads, 0, gpu::stream()>>>(static_cast<const S*>(src.raw_data()),
                                                                       static_cast<D*>(out.raw_data()), n);
        HG_CUDA_CHECK_LAUNCH("cast_kernel");
      });
    });
  }
  void transpose(const Tensor& x, int dim0, int dim1, Tensor& out) override {
    const char* name = "cuda transpose";
    check_on_gpu(name, x);
    check_on_gpu(name, out);
    check_same_dtype(name, x, out);
    const TransposePlan p = transpose_plan(x.shape(), out.shape(), dim0, dim1, name);
    const int64_t total = x.numel();
    if (total == 0) return;
    if (p.plain_copy) {  // same memory order
      if (x.raw_data() != out.raw_data())
        HG_CUDA_CHECK(
            cudaMemcpyAsync(out.raw_data(), x.raw_data(), x.nbytes(), cudaMemcpyDeviceToDevice, gpu::stream()));
      return;
    }
    switch (dtype_size(x.dtype())) {
      case 2: return launch_transpose<uint16_t>(x.raw_data(), out.raw_data(), total, p.n0, p.M, p.n1, p.B);
      case 4: return launch_transpose<uint32_t>(x.raw_data(), out.raw_data(), total, p.n0, p.M, p.n1, p.B);
      case 8: return launch_transpose<uint64_t>(x.raw_data(), out.raw_data(), total, p.n0, p.M, p.n1, p.B);
    }
    fail(name, "unsupported element size for dtype ", dtype_name(x.dtype()));
  }

  void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmArgs& args) override {
    const char* name = "cuda gemm";
    check_on_gpu(name, a);
    const MatmulShape shape = check_gemm(a, b, out, args, name);
    if (a.dtype() == DType::F64 && args.epilogue == GemmEpilogue::None)
      return matmul(a, b, out, args.transpose_a, args.transpose_b, args.accumulate);
    gpu::gemm_lt(a, b, out, args, shape);
  }

  void gather_rows(const Tensor& table, const Tensor& ids, const std::vector<int32_t>&, Tensor& out) override {
    gpu::gather_rows_cuda(table, ids, ids.numel(), out);  // reads the ids already on the GPU
  }

  void scatter_add_rows_device_ids(const Tensor& grad, const Tensor& ids, Tensor& grad_table) override {
    gpu::scatter_add_rows_cuda_device_ids(grad, ids, grad_table);
  }

  std::vector<int64_t> count_bad_indices(const std::vector<IndexSet>& sets) override {
    return gpu::count_bad_indices_cuda(sets);
  }

  void scatter_add_rows(const Tensor& grad, const std::vector<int32_t>& host_ids, Tensor& grad_table) override {
    gpu::scatter_add_rows_cuda(grad, host_ids, grad_table);
  }

  void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state) override {
    check_adamw_group(group, config, state, /*allow_f64=*/false, "cuda adamw_multi");
    check_on_gpu("cuda adamw_multi", state);
    gpu::adamw_multi(group, config, state);
  }

  void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out) override {
    check_sum_of_squares(xs, out, /*allow_f64=*/false, "cuda sum_of_squares");
    check_on_gpu("cuda sum_of_squares", out);
    gpu::sum_of_squares_multi(xs, out);
  }

  void sgd_update(Tensor& p, const Tensor& g, Tensor* velocity, double lr, double momentum,
                  double weight_decay) override {
    check_sgd_update(p, g, velocity, /*allow_f64=*/false, "cuda sgd_update");
    check_on_gpu("cuda sgd_update", p);
    gpu::sgd_step(p.data<float>(), g.data<float>(), velocity ? velocity->data<float>() : nullptr, p.numel(),
                  static_cast<float>(lr), static_cast<float>(momentum), static_cast<float>(weight_decay));
  }
};

#undef HG_UNARY_CASE
#undef HG_BINARY_CASE
#undef HG_REDUCE_CASE

}  // namespace

Backend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

}  // namespace hg
