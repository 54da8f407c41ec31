// TMA descriptors: the driver's cuTensorMapEncodeTiled, fetched once through
// cudaGetDriverEntryPointByVersion so the library links only the CUDA runtime.
#include "cuda/tensor_map.hpp"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static const PFN_cuTensorMapEncodeTiled_v12000 function = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      pointer = nullptr;
      cudaGetLastError();  // cleared: it must not fail a later launch check
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pointer);
  }();
  STSA_CHECK(function != nullptr, Unsupported,
             "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0 or newer)");
  return function;
}

}  // namespace

CUtensorMap make_row_tensor_map(const void* data, bool bf16, int batch, int tokens, int heads, int head_dim,
                                const std::int64_t (&element_stride)[3], int box_rows) {
  const RowTensorMapShape shape = row_tensor_map_shape(batch, tokens, heads, head_dim, element_stride, box_rows);
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4];
  for (int i = 0; i < 4; ++i) dims[i] = shape.dims[i], box[i] = shape.box[i];
  for (int i = 0; i < 3; ++i) strides[i] = shape.strides_bytes[i];
  const cuuint32_t element_steps[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult result = encode_function()(
      &map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(data),
      dims, strides, box, element_steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  STSA_CHECK(result == CUDA_SUCCESS, Unsupported, "cuTensorMapEncodeTiled refused the tensor (CUresult ",
             int(result), "): ", batch, " x ", tokens, " x ", heads, " x ", head_dim);
  return map;
}

}  // namespace stsa::cuda_detail
