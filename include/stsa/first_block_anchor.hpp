// The mask as Sparse VideoGen and its ports lay it out, for comparison only.
//
// Those implementations permute a temporal head's video tokens so that all
// frames interleave (token (f, p) at p * F + f, frame 0 included) and take "the
// first frame-sized block of the current layout" as the anchor: every query may
// see keys at positions [0, P) of that order. In frame-major order (spatial
// heads) that block is frame 0; in the interleaved order it is the first P / F
// patches of every frame, not frame 0. Their anchor is keys only (frame-0 rows
// follow the band); text tokens stay dense both ways as in stsa.
//
// stsa's own layout (layout.hpp) keeps frame 0 as a block in front and makes
// the anchor symmetric. To compare at equal cost, the band here is chosen so the
// first-block mask keeps as many pairs as the stsa mask it replaces.
#pragma once

#include <cstdint>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"
#include "stsa/reference.hpp"
#include "stsa/router.hpp"

namespace stsa {

struct FirstBlockMask {
  bool dense = true;         // dense heads stay dense
  bool interleaved = false;  // temporal: band over p * F + f; otherwise over f * P + p
  std::int64_t band = -1;
  std::int64_t kept_pairs = 0;  // exact, text included
};

// Exact kept pairs of a first-block mask with `band` (O(N)).
std::int64_t first_block_kept_pairs(const VideoGrid& grid, std::int64_t band);

// The first-block counterpart of `spec` (Band specs only; Dense and FrameWindow map to dense/unchanged
// via `dense`), with its band matched to spec's kept pairs.
FirstBlockMask first_block_mask(const VideoGrid& grid, const MaskSpec& spec);

// Per-pair predicate (head, q, k positions in `tensor_order`) of the first-block masks of `heads`.
// Heads whose spec is a frame window keep their stsa mask.
PairPredicate first_block_predicate(const VideoGrid& grid, const std::vector<HeadRoute>& heads,
                                    TokenOrder tensor_order);

}  // namespace stsa
