// TMA descriptors: the driver's cuTensorMapEncodeTiled, fetched once through
// cudaGetDriverEntryPointByVersion so the library links only the CUDA runtime.
#include "cuda/tensor_map.hpp"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <iterator>

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

RowTensorMapShape row_tensor_map_shape(int batch, int tokens, int heads, int head_dim,
                                       const std::int64_t (&element_stride)[3], int box_rows) {
  constexpr std::int64_t kElement = 2;
  RowTensorMapShape shape;
  const std::uint64_t dims[4] = {std::uint64_t(head_dim), std::uint64_t(tokens), std::uint64_t(heads),
                                 std::uint64_t(batch)};
  std::copy(std::begin(dims), std::end(dims), shape.dims);
  // A dimension of extent 1 is never stepped over, so its stride only has to be
  // valid (TMA wants multiples of 16 bytes).
  const std::int64_t extents[3] = {tokens, heads, batch};
  const int stride_index[3] = {1, 2, 0};  // token, head, batch in element_stride's (batch, token, head) order
  for (int i = 0; i < 3; ++i) {
    const std::int64_t bytes = element_stride[stride_index[i]] * kElement;
    STSA_CHECK(extents[i] == 1 || (bytes > 0 && bytes % 16 == 0 && bytes < (std::int64_t(1) << 40)), Unsupported,
               "TMA needs positive strides that are multiples of 16 bytes below 2^40; got ", bytes, " bytes");
    shape.strides_bytes[i] = extents[i] == 1 ? 16 : std::uint64_t(bytes);
  }
  const std::uint32_t box[4] = {64, std::uint32_t(box_rows), 1, 1};  // 64 elements = one 128-byte swizzle span
  std::copy(std::begin(box), std::end(box), shape.box);
  return shape;
}

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
