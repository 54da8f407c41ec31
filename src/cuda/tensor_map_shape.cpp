// The TMA descriptor shapes (tensor_map_shape.hpp): plain arithmetic, built
// with or without CUDA (stsa_cuda_host), so its tests run in every build.
#include "cuda/tensor_map_shape.hpp"

#include <algorithm>
#include <iterator>

#include "stsa/error.hpp"

namespace stsa::cuda_detail {

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

}  // namespace stsa::cuda_detail
