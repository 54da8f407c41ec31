#include "cli/options.hpp"

#include <charconv>
#include <cstdint>
#include <limits>
#include <system_error>

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

std::string check_integer_text(std::string& text, bool is_unsigned) {
  const bool minus = text.starts_with('-');
  if (text.size() == std::size_t(minus) || text.find_first_not_of("0123456789", minus) != std::string::npos)
    return detail::concat("'", text, "' is not a decimal integer");
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (is_unsigned) {
    using Limits = std::numeric_limits<std::uint64_t>;
    std::uint64_t value = 0;
    const bool zero = text.find_first_not_of("-0") == std::string::npos;  // "-0" is 0
    if ((minus && !zero) || std::from_chars(first + minus, last, value).ec != std::errc())
      return detail::concat(text, " is out of range: a 64-bit unsigned integer lies in [0, ", Limits::max(), "]");
    text = std::to_string(value);
  } else {
    using Limits = std::numeric_limits<std::int64_t>;
    std::int64_t value = 0;
    if (std::from_chars(first, last, value).ec != std::errc())
      return detail::concat(text, " is out of range: a 64-bit integer lies in [", Limits::min(), ", ", Limits::max(),
                            "]");
    text = std::to_string(value);
  }
  return "";
}

MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor) {
  // Checked for every kind, dense too (which keeps every pair whatever the density), so a
  // bad --density never runs nor lands in a record (NaN fails both comparisons).
  STSA_CHECK(density >= 0.0 && density <= 1.0, InvalidArgument, "--density must be in [0, 1], got ", density);
  if (name == "dense") {
    STSA_CHECK(anchor, InvalidArgument, "--no-anchor drops a sparse mask's frame-0 anchor; the dense mask keeps "
                                        "every pair, so it has none to drop");
    return MaskSpec::dense();
  }
  if (name == "spatial") return mask_for_density(grid, SparseKind::Spatial, density, anchor);
  if (name == "temporal") return mask_for_density(grid, SparseKind::Temporal, density, anchor);
  if (name == "frames") return mask_for_density(grid, SparseKind::FrameWindow, density, anchor);
  throw InvalidArgument(detail::concat("--mask must be dense, spatial, temporal or frames, got '", name, "'"));
}

}  // namespace stsa::cli
