// Cases for routed-attention tests (CPU and GPU alike): given decisions that
// cycle through temporal, spatial, dense and frame window, and synthetic heads
// of known kind routed by the CPU router. Each head's mask on the frame-major
// tensors is what the routed output must equal.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/testing.hpp"

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

// Synthetic spatial and temporal heads (582 tokens, 6 text tokens before the
// video), routed by the CPU router. 12 frames, because with 7 the frame-0 anchor
// alone keeps more than the target density and every head routes dense; here
// the router picks at least 3 temporal and 3 spatial heads of 6 (40 seeds checked).
struct SyntheticRoutedCase {
  synth::Data data;
  Router router;
  RoutingReport report;  // the CPU router's decisions

  // A fresh problem (outputs poisoned) on the synthetic inputs, each head with its decided mask.
  Problem problem() const {
    std::vector<HeadMask> masks;
    for (const auto& h : report.heads) masks.push_back(HeadMask{h.spec, TokenOrder::FrameMajor, nullptr, true});
    Problem p = make_problem(data.layout, data.q.view().dtype, masks, 1);
    std::memcpy(p.q.view().data, data.q.view().data, data.q.bytes());
    std::memcpy(p.k.view().data, data.k.view().data, data.k.bytes());
    std::memcpy(p.v.view().data, data.v.view().data, data.v.bytes());
    return p;
  }
};

inline SyntheticRoutedCase synthetic_routed_case(DType dtype, std::uint64_t seed) {
  const synth::Options o{.grid = {12, 6, 8, 6, TextPlacement::Before}, .heads = 6, .head_dim = 64, .dtype = dtype,
                         .seed = seed};
  synth::Data data = synth::make_video_tokens(o);
  RouterOptions ro;
  ro.samples = 32;
  Router router(ro);
  RoutingReport report = router.route(data.layout, data.q.view(), data.k.view(), data.v.view());
  return {std::move(data), std::move(router), std::move(report)};
}

inline std::int64_t count_routes(const std::vector<HeadRoute>& heads, Route route) {
  std::int64_t n = 0;
  for (const HeadRoute& h : heads) n += h.route == route;
  return n;
}

}  // namespace stsa::testing
