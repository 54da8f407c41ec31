// The device predicate's parameters (mask_predicate.hpp) from the library's
// VideoGrid and MaskSpec. Host code only (C++20 headers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/mask_predicate.hpp"
#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace stsa::cuda_detail {

// The grid must be valid (at most 2^31 - 1 tokens: VideoGrid::validate()).
inline PredicateGrid predicate_grid(const VideoGrid& grid, TokenOrder storage) {
  PredicateGrid g;
  g.frames = std::int32_t(grid.frames);
  g.per_frame = std::int32_t(grid.tokens_per_frame());
  g.text_tokens = std::int32_t(grid.text_tokens);
  g.text_before = grid.text_placement == TextPlacement::Before;
  g.spatial_major = storage == TokenOrder::SpatialMajor;
  return g;
}

// Widths beyond 2^31 - 1 keep every pair, as 2^31 - 1 does (codes differ by less).
inline PredicateMask predicate_mask(const MaskSpec& spec) {
  PredicateMask m;
  m.anchor = spec.anchor;
  const auto clamp = [](std::int64_t w) {
    return std::int32_t(std::clamp<std::int64_t>(w, -1, std::numeric_limits<std::int32_t>::max()));
  };
  switch (spec.kind) {
    case MaskKind::Dense: m.kind = PredicateKind::Dense; break;
    case MaskKind::Band:
      m.kind = PredicateKind::Band;
      m.band_spatial_major = spec.band_order == TokenOrder::SpatialMajor;
      m.width = clamp(spec.band);
      break;
    case MaskKind::FrameWindow:
      m.kind = PredicateKind::FrameWindow;
      m.width = clamp(spec.frame_radius);
      break;
  }
  return m;
}

}  // namespace stsa::cuda_detail
