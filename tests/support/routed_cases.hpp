// Given routing decisions for routed-attention tests (CPU and GPU alike): the
// heads cycle through temporal, spatial, dense and frame window, and each head's
// mask on the frame-major tensors is what the routed output must equal.
#pragma once

#include <cstdint>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/router.hpp"

namespace stsa::testing {

struct CyclingDecisions {
  RouterOptions options;
  std::vector<HeadRoute> decisions;
  std::vector<HeadMask> reference_masks;  // frame-major, for make_problem / the reference
};

inline CyclingDecisions cycling_decisions(const VideoLayout& layout) {
  const Route cycle[] = {Route::Temporal, Route::Spatial, Route::Dense, Route::FrameWindow};
  CyclingDecisions c;
  c.options.spatial_density = 0.3;
  c.options.temporal_density = 0.2;
  c.options.frame_window_density = 0.5;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    HeadRoute d;
    d.route = cycle[h % 4];
    d.spec = route_spec(layout.grid, d.route, c.options);
    c.decisions.push_back(d);
    c.reference_masks.push_back(HeadMask{d.spec, TokenOrder::FrameMajor, nullptr, true});
  }
  return c;
}

}  // namespace stsa::testing
