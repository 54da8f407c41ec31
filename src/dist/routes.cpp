// Given masks as run_routed() decisions.
#include "stsa/dist.hpp"

namespace stsa::dist {
namespace {

Route route_of(const MaskSpec& spec) {
  switch (spec.kind) {
    case MaskKind::Dense: return Route::Dense;
    case MaskKind::FrameWindow: return Route::FrameWindow;
    case MaskKind::Band: return spec.band_order == TokenOrder::SpatialMajor ? Route::Temporal : Route::Spatial;
  }
  return Route::Dense;
}

}  // namespace

std::vector<HeadRoute> routes_for_masks(std::span<const MaskSpec> masks, std::int64_t heads) {
  STSA_CHECK(heads >= 1, InvalidArgument, "head count must be >= 1, got ", heads);
  STSA_CHECK(masks.size() == 1 || std::int64_t(masks.size()) == heads, InvalidArgument, "got ", masks.size(),
             " masks for ", heads, " heads (give one per head, or one for all)");
  std::vector<HeadRoute> routes(static_cast<std::size_t>(heads));
  for (std::int64_t h = 0; h < heads; ++h) {
    routes[std::size_t(h)].spec = masks.size() == 1 ? masks[0] : masks[std::size_t(h)];
    routes[std::size_t(h)].route = route_of(routes[std::size_t(h)].spec);
  }
  return routes;
}

}  // namespace stsa::dist
