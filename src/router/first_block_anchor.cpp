#include "stsa/first_block_anchor.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "stsa/error.hpp"

namespace stsa {
namespace {

// Position of a video token in the first-block layout (relative to the first video token).
std::int64_t first_block_position(const VideoGrid& grid, const TokenCoord& c, bool interleaved) {
  return interleaved ? c.patch * grid.frames + c.frame : c.frame * grid.tokens_per_frame() + c.patch;
}

}  // namespace

std::int64_t first_block_kept_pairs(const VideoGrid& grid, std::int64_t band) {
  grid.validate();
  const std::int64_t n = grid.tokens(), video = grid.video_tokens(), anchor = grid.tokens_per_frame();
  std::int64_t kept = n * n - video * video;  // pairs touching text
  for (std::int64_t q = 0; q < video; ++q) {
    // Band keys [lo, hi] plus anchor keys [0, anchor) outside the band.
    if (band < 0) {
      kept += anchor;
      continue;
    }
    const std::int64_t lo = std::max<std::int64_t>(0, q - band), hi = std::min(video - 1, q + band);
    const std::int64_t overlap = std::max<std::int64_t>(0, std::min(hi, anchor - 1) - lo + 1);
    kept += (hi - lo + 1) + anchor - overlap;
  }
  return kept;
}

FirstBlockMask first_block_mask(const VideoGrid& grid, const MaskSpec& spec) {
  spec.validate(grid);
  FirstBlockMask mask;
  if (spec.kind != MaskKind::Band) return mask;  // dense stays dense; frame windows are handled by the caller
  mask.dense = false;
  mask.interleaved = spec.band_order == TokenOrder::SpatialMajor;
  const std::int64_t target = kept_pairs(grid, spec);
  // kept pairs grow with the band: find the band whose count is closest to the target.
  std::int64_t lo = -1, hi = grid.video_tokens() - 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (first_block_kept_pairs(grid, mid) >= target) hi = mid; else lo = mid + 1;
  }
  if (lo > -1 && std::llabs(first_block_kept_pairs(grid, lo - 1) - target) < std::llabs(first_block_kept_pairs(grid, lo) - target))
    lo -= 1;
  mask.band = lo;
  mask.kept_pairs = first_block_kept_pairs(grid, lo);
  return mask;
}

PairPredicate first_block_predicate(const VideoGrid& grid, const std::vector<HeadRoute>& heads,
                                    TokenOrder tensor_order) {
  grid.validate();
  struct State {
    VideoGrid grid;
    TokenOrder order;
    std::vector<MaskSpec> specs;
    std::vector<FirstBlockMask> masks;
    std::vector<TokenCoord> coords;  // per tensor position
  };
  auto state = std::make_shared<State>();
  state->grid = grid;
  state->order = tensor_order;
  for (const auto& h : heads) {
    state->specs.push_back(h.spec);
    state->masks.push_back(first_block_mask(grid, h.spec));
  }
  for (std::int64_t pos = 0; pos < grid.tokens(); ++pos) state->coords.push_back(grid.coord(pos, tensor_order));
  return [state](std::int64_t head, std::int64_t q_pos, std::int64_t k_pos) {
    const State& s = *state;
    const TokenCoord& q = s.coords[std::size_t(q_pos)];
    const TokenCoord& k = s.coords[std::size_t(k_pos)];
    const MaskSpec& spec = s.specs[std::size_t(head)];
    if (spec.kind == MaskKind::FrameWindow) return allowed(s.grid, spec, q, k);
    const FirstBlockMask& m = s.masks[std::size_t(head)];
    if (m.dense || q.is_text || k.is_text) return true;
    const std::int64_t qp = first_block_position(s.grid, q, m.interleaved);
    const std::int64_t kp = first_block_position(s.grid, k, m.interleaved);
    return kp < s.grid.tokens_per_frame() || (m.band >= 0 && std::llabs(qp - kp) <= m.band);
  };
}

}  // namespace stsa
