#include "stsa/mask.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "stsa/error.hpp"

namespace stsa {
namespace {

// Pairs (i, j) of a run of `count` consecutive items with |i - j| <= reach.
std::int64_t band_pairs(std::int64_t count, std::int64_t reach) {
  if (reach < 0 || count <= 0) return 0;
  const std::int64_t w = std::min(reach, count - 1);
  return count * (2 * w + 1) - w * (w + 1);
}

// Video tokens that follow the band/window rule (not forced in by the anchor).
std::int64_t regular_video_tokens(const VideoGrid& grid, const MaskSpec& spec) {
  return grid.video_tokens() - (spec.anchor ? grid.tokens_per_frame() : 0);
}

std::int64_t parameter_limit(const VideoGrid& grid, SparseKind kind, bool anchor) {
  if (kind == SparseKind::FrameWindow) return grid.frames - (anchor ? 2 : 1);
  return grid.video_tokens() - (anchor ? grid.tokens_per_frame() : 0) - 1;
}

MaskSpec spec_of(SparseKind kind, std::int64_t parameter, bool anchor) {
  switch (kind) {
    case SparseKind::Spatial: return MaskSpec::spatial(parameter, anchor);
    case SparseKind::Temporal: return MaskSpec::temporal(parameter, anchor);
    case SparseKind::FrameWindow: return MaskSpec::frame_window(parameter, anchor);
  }
  return MaskSpec::dense();
}

}  // namespace

void MaskSpec::validate(const VideoGrid& grid) const {
  grid.validate();
  // A cast integer would pass: allowed() keeps no regular pair for an unknown kind while the
  // plan builder treats it as a band, and describe() prints nothing for it.
  STSA_CHECK(kind == MaskKind::Dense || kind == MaskKind::Band || kind == MaskKind::FrameWindow, InvalidArgument,
             "mask kind must be dense, band or frame window, got ", int(kind));
  STSA_CHECK(band_order == TokenOrder::FrameMajor || band_order == TokenOrder::SpatialMajor, InvalidArgument,
             "band order must be frame-major or spatial-major, got ", int(band_order));
  STSA_CHECK(band >= -1, InvalidArgument, "band width must be >= -1 (-1 keeps no band pair), got ", band);
  STSA_CHECK(frame_radius >= -1, InvalidArgument, "frame radius must be >= -1 (-1 keeps no frame), got ",
             frame_radius);
}

std::string MaskSpec::describe() const {
  std::string text;
  switch (kind) {
    case MaskKind::Dense: return "dense";
    case MaskKind::Band:  // band -1 keeps no band pair (the anchor alone exceeds the density): "none", as below
      text = detail::concat(band_order == TokenOrder::FrameMajor ? "spatial" : "temporal", " band ",
                            band < 0 ? std::string("none") : std::to_string(band));
      break;
    case MaskKind::FrameWindow:  // radius -1 keeps no frame: "+--1" would read as a typo
      text = frame_radius < 0 ? std::string("frame window none") : detail::concat("frame window +-", frame_radius);
      break;
  }
  return text + (anchor ? " +anchor" : "");
}

bool allowed(const VideoGrid& grid, const MaskSpec& spec, const TokenCoord& q, const TokenCoord& k) {
  if (q.is_text || k.is_text) return true;
  if (spec.anchor && (q.frame == 0 || k.frame == 0)) return true;
  switch (spec.kind) {
    case MaskKind::Dense: return true;
    case MaskKind::Band: {
      if (spec.band < 0) return false;
      const std::int64_t qp = grid.video_position(q.frame, q.patch, spec.band_order);
      const std::int64_t kp = grid.video_position(k.frame, k.patch, spec.band_order);
      return std::llabs(qp - kp) <= spec.band;
    }
    case MaskKind::FrameWindow:
      return spec.frame_radius >= 0 && std::llabs(q.frame - k.frame) <= spec.frame_radius;
  }
  return false;
}

bool allowed_at(const VideoGrid& grid, const MaskSpec& spec, TokenOrder order, std::int64_t q_pos,
                std::int64_t k_pos) {
  return allowed(grid, spec, grid.coord(q_pos, order), grid.coord(k_pos, order));
}

std::int64_t kept_pairs(const VideoGrid& grid, const MaskSpec& spec) {
  spec.validate(grid);
  const std::int64_t n = grid.tokens();
  if (spec.kind == MaskKind::Dense) return n * n;
  // Pairs touching text or the anchor are all kept; the rest follow the rule.
  const std::int64_t regular = regular_video_tokens(grid, spec);
  std::int64_t rule_pairs = 0;
  if (spec.kind == MaskKind::Band) {
    // In both orders the regular tokens are one contiguous run of positions.
    rule_pairs = band_pairs(regular, spec.band);
  } else {
    const std::int64_t per_frame = grid.tokens_per_frame();
    rule_pairs = band_pairs(regular / per_frame, spec.frame_radius) * per_frame * per_frame;
  }
  return n * n - regular * regular + rule_pairs;
}

MaskSpec mask_for_density(const VideoGrid& grid, SparseKind kind, double density, bool anchor) {
  grid.validate();
  STSA_CHECK(std::isfinite(density) && density >= 0.0 && density <= 1.0, InvalidArgument,
             "density must be in [0, 1], got ", density);
  // A cast integer would come back as a dense mask (spec_of's fallback), searched as a spatial one.
  STSA_CHECK(kind == SparseKind::Spatial || kind == SparseKind::Temporal || kind == SparseKind::FrameWindow,
             InvalidArgument, "sparse kind must be spatial, temporal or frame window, got ", int(kind));
  const double total = double(grid.tokens()) * double(grid.tokens());
  const double target = density * total;
  auto kept = [&](std::int64_t parameter) { return double(kept_pairs(grid, spec_of(kind, parameter, anchor))); };
  // kept() is non-decreasing in the parameter: find the first one reaching the target.
  std::int64_t lo = -1, hi = std::max<std::int64_t>(-1, parameter_limit(grid, kind, anchor));
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (kept(mid) >= target) hi = mid; else lo = mid + 1;
  }
  std::int64_t best = lo;
  if (best > -1 && std::abs(kept(best - 1) - target) < std::abs(kept(best) - target)) best -= 1;
  return spec_of(kind, best, anchor);
}

}  // namespace stsa
