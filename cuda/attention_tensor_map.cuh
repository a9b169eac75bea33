#pragma once
// The TMA tensor maps through which the sm_90a attention kernels read q, k,
// v (cuda/attention_wgmma_kernel.cuh, and the attention lab's candidates in
// bench/lab/attention_lab_wgmma*.cuh): encoded on the host per call, passed
// to the kernel by value. The encoder comes from the driver through the
// runtime: the library and the lab link cudart, not libcuda.
#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hg::gpu::attn {

constexpr int kSwizzleBytes = 128;  // one row of a TMA box: 64 bf16
constexpr int kBoxCols = kSwizzleBytes / 2;

// cuTensorMapEncodeTiled; null where the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// The map of a bf16 operand [batch][heads][rows][dh] with element strides
// (row, head, batch): boxes of box_rows x 64 columns of one head, 128-byte
// swizzle, zeros where a box passes the rows. CUDA_ERROR_NOT_FOUND without
// the encoder, else the encoder's answer (it refuses a base address or a
// byte stride that is not a multiple of 16).
inline CUresult encode_map(CUtensorMap* map, const void* p, int dh, int rows, int heads, int64_t batch,
                           int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[4] = {cuuint64_t(dh), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * 2, cuuint64_t(head_stride) * 2, cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[4] = {cuuint32_t(kBoxCols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(p), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace hg::gpu::attn
