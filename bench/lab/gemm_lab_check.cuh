#pragma once
// gemm_lab's inputs and checks. Every input element is a function of
// (matrix, index), computed the same way on the host and the device, so the
// float64 reference of a sampled output reads no device memory.
//
// Check inputs are small multiples of powers of two (a: k/8, b: k/64 with
// |k| <= 8): every product and every partial sum is exact in fp32, so any
// deviation from the float64 value is a bf16 rounding the bound names, or a
// bug. Timing inputs are uniform with full mantissas (realistic bit toggling).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "bench/lab/gemm_lab_cases.cuh"
#include "bench/lab/lab_util.cuh"

namespace gemm_lab {

using bf16 = __nv_bfloat16;

// ---- inputs ----------------------------------------------------------------------

// Values k * unit, |k| <= steps (check data), or uniform in +-steps * unit.
struct Fill {
  uint64_t seed;
  int steps;
  float unit;
};
constexpr Fill kFillA{11, 8, 1.0f / 8}, kFillB{12, 8, 1.0f / 64}, kFillBias{13, 8, 1.0f / 8},
    kFillAux{14, 32, 1.0f / 8},  // the GELU pre-activation DGELU reads: [-4, 4]
    kFillC{15, 64, 1.0f / 16};   // the fp32 dW a weight gradient accumulates into

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of a matrix: `variant` 0 is the check data (exact), 1.. the timing sets.
__host__ __device__ inline float input_value(const Fill& f, int variant, int64_t i) {
  const uint64_t h = splitmix64((f.seed + 1000 * uint64_t(variant)) << 40 ^ uint64_t(i));
  if (variant == 0) {
    const int64_t k = int64_t(((h >> 32) * uint64_t(2 * f.steps + 1)) >> 32) - f.steps;  // uniform in [-steps, steps]
    return float(k) * f.unit;
  }
  return f.unit * float(f.steps) * (float(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

__device__ inline void store_value(float* p, float v) { *p = v; }
__device__ inline void store_value(bf16* p, float v) { *p = __float2bfloat16(v); }

template <class T>
__global__ void fill_kernel(T* p, int64_t n, Fill f, int variant) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_value(p + i, input_value(f, variant, i));
}

template <class T>
void fill(T* p, int64_t n, const Fill& f, int variant) {
  fill_kernel<<<1024, 256>>>(p, n, f, variant);
  CHECK_CUDA(cudaGetLastError());
}

// op(a)[m, k] and op(b)[k, n] of the check data, as Backend::gemm reads them.
inline double op_a(const Case& c, int64_t m, int64_t k) {
  return input_value(kFillA, 0, c.ta ? k * c.m + m : m * c.k + k);
}
inline double op_b(const Case& c, int64_t k, int64_t n) {
  return input_value(kFillB, 0, c.tb ? n * c.k + k : k * c.n + n);
}

// ---- bounds ----------------------------------------------------------------------

constexpr double kBf16 = 1.0 / 256;            // bf16 unit roundoff (8 significant bits)
constexpr double kAcc = 1.0 / (1 << 20);       // fp32 accumulation, x sum |a_k b_k|: 16 fp32 ulps of slack
constexpr double kTanh = 1.0 / 1024;           // tanh of the GELU epilogues (docs/gemm.md: hardware tanh 2^-10.99)
constexpr double kLongSum = 1.0 / 4096;        // an fp32 sum of M inexact terms (DGELU_BGRAD), x sum |terms|
constexpr double kGeluSlope = 1.13;            // max |gelu'| of the tanh form (1.1289)
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)

inline double gelu(double x) { return 0.5 * x * (1 + std::tanh(kGeluC * (x + 0.044715 * x * x * x))); }
inline double gelu_u_slope(double x) { return kGeluC * (1 + 3 * 0.044715 * x * x); }
inline double gelu_grad(double x) {
  const double t = std::tanh(kGeluC * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * gelu_u_slope(x);
}
// |d gelu'(x) / d tanh| * kTanh: what a tanh error of kTanh does to gelu'.
inline double gelu_grad_tanh_error(double x) { return kTanh * (0.5 + std::abs(x) * gelu_u_slope(x)); }

// The expected value of one output element and how far it may be off.
// p = the exact product, s = sum_k |a_k b_k|. bf16 out may be rounded twice
// (the product to bf16 before the epilogue, then the result: docs/gemm.md,
// "What cuBLASLt does with a bf16 D"), hence the kBf16 |p| terms.
struct Expect {
  double out, out_bound;
  double aux = 0, aux_bound = 0;  // GELU_AUX_BIAS's pre-activation
};

inline Expect expect(const Case& c, double p, double s, int64_t m, int64_t n) {
  if (c.f32_out) {  // a weight gradient: the product added to the dW it accumulates into (BGRADB's vector apart)
    const double out = input_value(kFillC, 0, m * c.n + n) + p;
    return {out, kAcc * (s + std::abs(out))};
  }
  switch (c.epi) {
    case Epi::Bias: {
      const double out = p + input_value(kFillBias, 0, n);
      return {out, kBf16 * (std::abs(out) + std::abs(p)) + kAcc * s};
    }
    case Epi::BiasGelu: {
      const double pre = p + input_value(kFillBias, 0, n), pre_bound = kBf16 * (std::abs(pre) + std::abs(p)) + kAcc * s;
      const double out = gelu(pre);
      return {out, kBf16 * std::abs(out) + kGeluSlope * pre_bound + 0.5 * kTanh * std::abs(pre), pre, pre_bound};
    }
    case Epi::DGeluBGrad:
    case Epi::DGelu: {
      const double pre = input_value(kFillAux, 0, m * c.n + n), g = gelu_grad(pre), out = p * g;
      return {out, kBf16 * std::abs(out) + std::abs(g) * (kBf16 * std::abs(p) + kAcc * s) +
                       std::abs(p) * gelu_grad_tanh_error(pre)};
    }
    default: return {p, kBf16 * std::abs(p) + kAcc * s};  // plain bf16 out: one rounding
  }
}

// The float64 reference of output (m, n).
inline Expect reference(const Case& c, int64_t m, int64_t n) {
  double p = 0, s = 0;
  for (int64_t k = 0; k < c.k; ++k) {
    const double t = op_a(c, m, k) * op_b(c, k, n);
    p += t;
    s += std::abs(t);
  }
  return expect(c, p, s, m, n);
}

// The bias-gradient vector's entry i: BGRADB sums row i of op(a) (exact
// terms, fp32-exact sum); DGELU_BGRAD sums column i of the dgelu output over
// all M rows (one pass over op(a) for all the sampled columns at once).
inline void reference_vec(const Case& c, const std::vector<int64_t>& at, std::vector<double>& ref,
                          std::vector<double>& bound) {
  ref.assign(at.size(), 0.0);
  bound.assign(at.size(), 0.0);
  if (c.epi == Epi::BGradB) {
    for (size_t j = 0; j < at.size(); ++j) {
      double sum_abs = 0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double v = op_a(c, at[j], k);
        ref[j] += v;
        sum_abs += std::abs(v);
      }
      bound[j] = kAcc * sum_abs;
    }
    return;
  }
  std::vector<std::vector<double>> cols(at.size(), std::vector<double>(size_t(c.k)));
  for (size_t j = 0; j < at.size(); ++j)
    for (int64_t k = 0; k < c.k; ++k) cols[j][size_t(k)] = op_b(c, k, at[j]);
  std::vector<double> row(size_t(c.k)), sum_abs(at.size(), 0.0);
  for (int64_t m = 0; m < c.m; ++m) {
    for (int64_t k = 0; k < c.k; ++k) row[size_t(k)] = op_a(c, m, k);
    for (size_t j = 0; j < at.size(); ++j) {
      double p = 0, s = 0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double t = row[size_t(k)] * cols[j][size_t(k)];
        p += t;
        s += std::abs(t);
      }
      const Expect e = expect(c, p, s, m, at[j]);
      ref[j] += e.out;
      bound[j] += e.out_bound;  // each term may carry its element's whole error
      sum_abs[j] += std::abs(e.out);
    }
  }
  for (size_t j = 0; j < at.size(); ++j) bound[j] += kLongSum * sum_abs[j] + kBf16 * std::abs(ref[j]);
}

// ---- device-side agreement with the first algorithm's result ------------------------

// A gross-error check over every element (missed tiles, wrong indices,
// NaN): |x - y| <= 2^-6 (|x| + |y| + scale), scale = the mean |y| of the
// sampled outputs. The sampled float64 check above is the tight one.
constexpr float kAgree = 1.0f / 64;

__device__ inline float as_float(float v) { return v; }
__device__ inline float as_float(bf16 v) { return __bfloat162float(v); }

template <class T>
__global__ void disagree_kernel(const T* got, const T* ref, int64_t n, float scale, unsigned long long* bad) {
  unsigned long long count = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = as_float(got[i]), y = as_float(ref[i]);
    if (!(std::fabs(x - y) <= kAgree * (std::fabs(x) + std::fabs(y) + scale))) ++count;  // NaN counts
  }
  if (count) atomicAdd(bad, count);
}

template <class T>
__global__ void gather_kernel(const T* src, const int64_t* at, int n, float* dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = as_float(src[at[i]]);
}

}  // namespace gemm_lab
