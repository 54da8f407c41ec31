// The output order of a launch whose stores do ScatteredOutput's scatter.
// Host only: output_order.hpp is compiled by nvcc, stsa/layout.hpp (C++20
// defaulted comparisons) is not.
#pragma once

#include "cuda/output_order.hpp"
#include "stsa/layout.hpp"

namespace stsa::cuda_detail {

// The order of a launch whose rows (tokens in `from` order) are stored into
// outputs in `to` order (ScatteredOutput::from / to), as scatter_heads moves them.
inline OutputOrder output_order(const VideoGrid& grid, TokenOrder from, TokenOrder to) {
  OutputOrder order;
  order.video_begin = int(grid.video_begin());
  order.frames = int(grid.frames);
  order.per_frame = int(grid.tokens_per_frame());
  order.tokens_spatial_major = from == TokenOrder::SpatialMajor;
  order.out_spatial_major = to == TokenOrder::SpatialMajor;
  return order;
}

}  // namespace stsa::cuda_detail
