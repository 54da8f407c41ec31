// TMA descriptors (CUtensorMap) for the sm90 kernel, built on the host through
// the driver entry point the CUDA runtime hands out (no link against libcuda).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/tensor_map_shape.hpp"

namespace stsa::cuda_detail {

// A [B, N, H, D] tensor of 2-byte elements with element strides (batch, token,
// head) and the head dim contiguous, read in boxes of `box_rows` tokens x 64
// elements of one (batch, head), 128-byte swizzled; rows past N read as zeros.
// Throws Unsupported when the driver has no TMA entry point or refuses the map.
CUtensorMap make_row_tensor_map(const void* data, bool bf16, int batch, int tokens, int heads, int head_dim,
                                const std::int64_t (&element_stride)[3], int box_rows);

}  // namespace stsa::cuda_detail
