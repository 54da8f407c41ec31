#include "cli/options.hpp"

#include "stsa/error.hpp"

namespace stsa::cli {

VideoGrid GridArgs::grid() const {
  VideoGrid g;
  g.frames = frames;
  g.height = height;
  g.width = width;
  g.text_tokens = text;
  STSA_CHECK(text_placement == "before" || text_placement == "after", InvalidArgument,
             "--text-placement must be before or after, got '", text_placement, "'");
  g.text_placement = text_placement == "before" ? TextPlacement::Before : TextPlacement::After;
  g.validate();
  return g;
}

MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor) {
  if (name == "dense") return MaskSpec::dense();
  if (name == "spatial") return mask_for_density(grid, SparseKind::Spatial, density, anchor);
  if (name == "temporal") return mask_for_density(grid, SparseKind::Temporal, density, anchor);
  if (name == "frames") return mask_for_density(grid, SparseKind::FrameWindow, density, anchor);
  throw InvalidArgument(detail::concat("--mask must be dense, spatial, temporal or frames, got '", name, "'"));
}

}  // namespace stsa::cli
