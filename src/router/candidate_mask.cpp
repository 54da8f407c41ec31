#include "router/candidate_mask.hpp"

#include <algorithm>
#include <limits>

namespace stsa::router_detail {

CandidateMask make_candidate_mask(const VideoGrid& grid, const MaskSpec& spec, TokenOrder tensor_order) {
  spec.validate(grid);
  const std::int64_t n = grid.tokens();
  CandidateMask mask;
  mask.spec = spec;
  mask.code.assign(std::size_t(n), 0);
  mask.forced.assign(std::size_t(n), 0);
  switch (spec.kind) {
    case MaskKind::Dense: mask.width = -1; break;
    case MaskKind::Band: mask.width = spec.band; break;
    case MaskKind::FrameWindow: mask.width = spec.frame_radius; break;
  }
  for (std::int64_t pos = 0; pos < n; ++pos) {
    const TokenCoord c = grid.coord(pos, tensor_order);
    const auto i = std::size_t(pos);
    if (c.is_text || spec.kind == MaskKind::Dense || (spec.anchor && c.frame == 0)) {
      mask.forced[i] = 1;
      continue;
    }
    mask.code[i] = std::int32_t(spec.kind == MaskKind::Band ? grid.video_position(c.frame, c.patch, spec.band_order)
                                                            : c.frame);
  }
  const std::int64_t blocks = (n + CandidateMask::kBlock - 1) / CandidateMask::kBlock;
  mask.block_lo.assign(std::size_t(blocks), std::numeric_limits<std::int32_t>::max());
  mask.block_hi.assign(std::size_t(blocks), std::numeric_limits<std::int32_t>::min());
  mask.block_forced.assign(std::size_t(blocks), 0);
  for (std::int64_t pos = 0; pos < n; ++pos) {
    const auto i = std::size_t(pos), b = std::size_t(pos / CandidateMask::kBlock);
    if (mask.forced[i]) {
      mask.block_forced[b] = 1;
      continue;
    }
    mask.block_lo[b] = std::min(mask.block_lo[b], mask.code[i]);
    mask.block_hi[b] = std::max(mask.block_hi[b], mask.code[i]);
  }
  return mask;
}

}  // namespace stsa::router_detail
