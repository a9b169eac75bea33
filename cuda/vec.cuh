#pragma once
// Row access for the fused kernels (layernorm.cu, softmax.cu): W elements of
// float32 or bf16 per access, converted to and from float32. W is
// VecWidth<T>::value (16 bytes: one float4, or 8 bf16 as one uint4) when every
// row start is 16-byte aligned (aligned16 on the host), else 1 (scalar).
// bf16 also comes 4 wide (8 bytes, one uint2): LayerNorm variants 6 and 7.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace hg::gpu {

template <class T>
struct VecWidth;
template <>
struct VecWidth<float> {
  static constexpr int value = 4;
};
template <>
struct VecWidth<__nv_bfloat16> {
  static constexpr int value = 8;
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Loads: Plain lets the compiler pick the cache path (kernels taking
// `const T* __restrict__` get the read-only one where it can prove it);
// ReadOnly asks for it (ld.global.nc) where the pointer comes in an argument
// struct. Stores: Streaming (st.global.cs, evict-first) for outputs nothing
// reads again in the kernel; scalar stores stay plain.
enum class Load { Plain, ReadOnly };
enum class Store { Plain, Streaming };

template <Load L, class V>
__device__ __forceinline__ V load_one(const V* p) {
  if constexpr (L == Load::ReadOnly) return __ldg(p);
  else return *p;
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// v rounded to the storage type T (nearest even) and widened back: the value
// a store of v as T leaves in memory.
template <class T>
__device__ __forceinline__ float round_to_storage(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(__float2bfloat16_rn(v));
  else return v;
}

template <int W, Load L = Load::Plain>
__device__ __forceinline__ void load_vec(const float* p, float (&out)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int q = 0; q < W / 4; ++q) {
      const float4 f = load_one<L>(reinterpret_cast<const float4*>(p) + q);
      out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = load_one<L>(p + k);
  }
}

// Eight bf16 of one 16-byte word widened by a shift (even element, the low
// half) or a mask (odd element): one integer instruction each, where the
// pair intrinsic takes a PRMT and a shift for the high half. Exact, as every
// bf16 -> float32 widening is. Used by load_vec_lean (the lean softmax and
// LayerNorm variants) and the residual LayerNorm backward's held bf16 dh_in.
__device__ __forceinline__ void widen_bf16x8(const uint4& raw, float (&out)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    out[2 * h] = __uint_as_float(w[h] << 16);
    out[2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
  }
}

// Four bf16 of one 8-byte word, widened as widen_bf16x8 does (every 4-wide
// bf16 load: LayerNorm variants 6 and 7, the bf16 backward's default past
// D 1024).
__device__ __forceinline__ void widen_bf16x4(const uint2& raw, float (&out)[4]) {
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    out[2 * h] = __uint_as_float(w[h] << 16);
    out[2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
  }
}

template <int W, Load L = Load::Plain>
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float (&out)[W]) {
  static_assert(W == 1 || W == 4 || W == 8, "bf16 access is 1, 4 or 8 wide");
  if constexpr (W == 8) {
    const uint4 raw = load_one<L>(reinterpret_cast<const uint4*>(p));
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float2 f = __bfloat1622float2(pairs[h]);  // exact: a bf16 is the top half of a float32
      out[2 * h] = f.x, out[2 * h + 1] = f.y;
    }
  } else if constexpr (W == 4) {
    widen_bf16x4(load_one<L>(reinterpret_cast<const uint2*>(p)), out);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = __bfloat162float(load_one<L>(p + k));
  }
}

// load_vec through the read-only path, bf16 widened by widen_bf16x8 (x4).
template <int W>
__device__ __forceinline__ void load_vec_lean(const float* p, float (&out)[W]) {
  load_vec<W, Load::ReadOnly>(p, out);
}
template <int W>
__device__ __forceinline__ void load_vec_lean(const __nv_bfloat16* p, float (&out)[W]) {
  if constexpr (W == 8) widen_bf16x8(__ldg(reinterpret_cast<const uint4*>(p)), out);
  else if constexpr (W == 4) widen_bf16x4(__ldg(reinterpret_cast<const uint2*>(p)), out);
  else load_vec<W, Load::ReadOnly>(p, out);
}

template <int W, Store S = Store::Plain>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int q = 0; q < W / 4; ++q) {
      const float4 f = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      if constexpr (S == Store::Streaming) __stcs(reinterpret_cast<float4*>(p) + q, f);
      else reinterpret_cast<float4*>(p)[q] = f;
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = v[k];
  }
}

template <int W, Store S = Store::Plain>
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&v)[W]) {
  static_assert(W == 1 || W == 4 || W == 8, "bf16 access is 1, 4 or 8 wide");
  if constexpr (W == 8) {
    alignas(16) __nv_bfloat162 pairs[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) pairs[h] = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);  // nearest even
    const uint4 raw = *reinterpret_cast<const uint4*>(pairs);
    if constexpr (S == Store::Streaming) __stcs(reinterpret_cast<uint4*>(p), raw);
    else *reinterpret_cast<uint4*>(p) = raw;
  } else if constexpr (W == 4) {
    alignas(8) __nv_bfloat162 pairs[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) pairs[h] = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);  // nearest even
    const uint2 raw = *reinterpret_cast<const uint2*>(pairs);
    if constexpr (S == Store::Streaming) __stcs(reinterpret_cast<uint2*>(p), raw);
    else *reinterpret_cast<uint2*>(p) = raw;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = __float2bfloat16_rn(v[k]);
  }
}

}  // namespace hg::gpu
