// Route names, router option checks and the mask each route runs with.
#include <cmath>

#include "stsa/error.hpp"
#include "stsa/router.hpp"

namespace stsa {

std::string_view to_string(Route route) {
  switch (route) {
    case Route::Dense: return "dense";
    case Route::Spatial: return "spatial";
    case Route::Temporal: return "temporal";
    case Route::FrameWindow: return "frames";
  }
  return "?";
}

Route parse_route(std::string_view name) {
  if (name == "dense") return Route::Dense;
  if (name == "spatial") return Route::Spatial;
  if (name == "temporal") return Route::Temporal;
  if (name == "frames") return Route::FrameWindow;
  throw InvalidArgument(detail::concat("unknown route '", name, "' (valid: dense, spatial, temporal, frames)"));
}

void RouterOptions::validate() const {
  STSA_CHECK(samples >= 1, InvalidArgument, "router samples must be >= 1, got ", samples);
  for (const auto& [name, value] : {std::pair{"spatial density", spatial_density},
                                    std::pair{"temporal density", temporal_density},
                                    std::pair{"frame-window density", frame_window_density}})
    STSA_CHECK(std::isfinite(value) && value >= 0.0 && value <= 1.0, InvalidArgument, "router ", name,
               " must be in [0, 1], got ", value);
  STSA_CHECK(std::isfinite(max_rel_l2) && max_rel_l2 >= 0.0, InvalidArgument,
             "router max relative L2 error must be finite and >= 0, got ", max_rel_l2);
  STSA_CHECK(threads >= 0, InvalidArgument, "router threads must be >= 0 (0: all), got ", threads);
  STSA_CHECK(isa <= Isa::Amx, InvalidArgument, "router isa must be auto, scalar, avx2, avx512 or amx, got value ",
             int(isa));
}

MaskSpec route_spec(const VideoGrid& grid, Route route, const RouterOptions& options) {
  switch (route) {
    case Route::Dense: return MaskSpec::dense();
    case Route::Spatial: return mask_for_density(grid, SparseKind::Spatial, options.spatial_density, options.anchor);
    case Route::Temporal: return mask_for_density(grid, SparseKind::Temporal, options.temporal_density, options.anchor);
    case Route::FrameWindow:
      return mask_for_density(grid, SparseKind::FrameWindow, options.frame_window_density, options.anchor);
  }
  throw InvalidArgument(detail::concat("route ", int(route), " is not a Route value"));  // a cast integer
}

}  // namespace stsa
