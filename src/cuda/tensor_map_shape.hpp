// The shape of the TMA descriptors the sm90 kernel uses, as plain arithmetic
// (no CUDA header), so it is tested without a GPU (tensor_map_shape.cpp);
// tensor_map.cpp encodes it.
#pragma once

#include <cstdint>

namespace stsa::cuda_detail {

// What cuTensorMapEncodeTiled is given for a [B, N, H, D] tensor of 2-byte
// elements read in boxes of `box_rows` tokens x 64 elements of one (batch,
// head): dimensions innermost first (head dim, token, head, batch).
struct RowTensorMapShape {
  std::uint64_t dims[4] = {};
  std::uint64_t strides_bytes[3] = {};  // of dims 1..3 (dim 0 is contiguous)
  std::uint32_t box[4] = {};
};
// Throws Unsupported for strides TMA cannot take (not multiples of 16 bytes, >= 2^40).
RowTensorMapShape row_tensor_map_shape(int batch, int tokens, int heads, int head_dim,
                                       const std::int64_t (&element_stride)[3], int box_rows);

}  // namespace stsa::cuda_detail
