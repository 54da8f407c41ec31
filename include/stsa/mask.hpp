// Mask specifications: what a head may attend to, as a value (never an N x N matrix).
//
// The predicate allowed() is the single source of truth; the tile plan is
// derived from it analytically and the reference backend evaluates it per pair.
// It is defined on token coordinates, so it does not depend on the order the
// tokens are stored in:
//   - text tokens attend to everything and are attended by everything;
//   - with the anchor on, every query attends to every key of frame 0 and every
//     query of frame 0 attends to all keys (the symmetric global anchor);
//   - Dense: every pair;
//   - Band: |pos(q) - pos(k)| <= band, pos = video position in band_order
//     (FrameMajor: a spatial head, SpatialMajor: a temporal head); band = -1 keeps
//     no band pair;
//   - FrameWindow: |frame(q) - frame(k)| <= frame_radius (frame_radius = -1: none).
#pragma once

#include <cstdint>
#include <string>

#include "stsa/layout.hpp"

namespace stsa {

enum class MaskKind : std::uint8_t { Dense, Band, FrameWindow };

struct MaskSpec {
  MaskKind kind = MaskKind::Dense;
  TokenOrder band_order = TokenOrder::FrameMajor;
  std::int64_t band = -1;
  std::int64_t frame_radius = -1;
  bool anchor = true;

  static MaskSpec dense() { return {}; }
  static MaskSpec spatial(std::int64_t band, bool anchor = true) {
    return {MaskKind::Band, TokenOrder::FrameMajor, band, -1, anchor};
  }
  static MaskSpec temporal(std::int64_t band, bool anchor = true) {
    return {MaskKind::Band, TokenOrder::SpatialMajor, band, -1, anchor};
  }
  static MaskSpec frame_window(std::int64_t radius, bool anchor = true) {
    return {MaskKind::FrameWindow, TokenOrder::FrameMajor, -1, radius, anchor};
  }

  // The token order in which this mask is tile-contiguous (what its plan is built for).
  TokenOrder natural_order() const { return kind == MaskKind::Band ? band_order : TokenOrder::FrameMajor; }
  // Throws InvalidArgument for an invalid grid, a kind or band order outside its enum, or a band
  // or radius below -1 (one past the grid keeps what the grid holds: the masks clamp to it).
  void validate(const VideoGrid& grid) const;
  std::string describe() const;  // e.g. "spatial band 1234 +anchor"
  bool operator==(const MaskSpec&) const = default;
};

// The predicate, straight from the definition above.
bool allowed(const VideoGrid& grid, const MaskSpec& spec, const TokenCoord& q, const TokenCoord& k);
// Same, for positions of a sequence stored in `order`.
bool allowed_at(const VideoGrid& grid, const MaskSpec& spec, TokenOrder order, std::int64_t q_pos,
                std::int64_t k_pos);

// Exact number of allowed (query, key) pairs of one sequence, in closed form (no N x N work).
std::int64_t kept_pairs(const VideoGrid& grid, const MaskSpec& spec);
inline double kept_fraction(const VideoGrid& grid, const MaskSpec& spec) {
  const double n = double(grid.tokens());
  return double(kept_pairs(grid, spec)) / (n * n);
}

enum class SparseKind : std::uint8_t { Spatial, Temporal, FrameWindow };
// The mask of `kind` whose exact kept fraction is closest to `density` in [0, 1]
// (ties go to the larger mask). density 1 keeps every pair; density 0 keeps only
// what the anchor and text force. Throws InvalidArgument outside [0, 1], for NaN, or for a kind
// outside the enum.
MaskSpec mask_for_density(const VideoGrid& grid, SparseKind kind, double density, bool anchor = true);

}  // namespace stsa
