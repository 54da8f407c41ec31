// Fuzzes the plan builder: random small grids, masks, tiles and alignments; the
// plan must match a brute-force classification of every pair, or the input must
// be rejected with stsa::InvalidArgument.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "stsa/error.hpp"
#include "stsa/plan.hpp"
#include "fuzz_reader.hpp"

namespace {

using stsa::fuzz::Reader;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "plan invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in{data, size};
  stsa::VideoGrid grid;
  grid.frames = in.next(-1, 6);
  grid.height = in.next(-1, 9);
  grid.width = in.next(0, 9);
  grid.text_tokens = in.next(-2, 70);
  grid.text_placement = in.next(0, 1) ? stsa::TextPlacement::Before : stsa::TextPlacement::After;
  const std::int64_t kind = in.next(0, 3), parameter = in.next(-3, 400);
  const bool anchor = in.next(0, 1);
  stsa::MaskSpec spec = kind == 0   ? stsa::MaskSpec::dense()
                        : kind == 1 ? stsa::MaskSpec::spatial(parameter, anchor)
                        : kind == 2 ? stsa::MaskSpec::temporal(parameter, anchor)
                                    : stsa::MaskSpec::frame_window(parameter / 50, anchor);
  const stsa::TileShape tile{std::int32_t(in.next(0, 130)), std::int32_t(64 * in.next(0, 3))};
  const auto alignment = in.next(0, 1) ? stsa::Alignment::Round : stsa::Alignment::Exact;
  std::shared_ptr<const stsa::TilePlan> plan;
  try {
    plan = stsa::TilePlan::build(grid, spec, tile, alignment);
  } catch (const stsa::InvalidArgument&) {
    return 0;  // rejected input is fine; anything else escapes and is a finding
  }
  plan->self_check();
  const std::int64_t n = grid.tokens();
  const auto order = spec.natural_order();
  std::int64_t allowed_pairs = 0, computed_pairs = 0, changed = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const bool allowed = stsa::allowed_at(grid, spec, order, i, j);
      const bool computed = plan->computes(i, j);
      allowed_pairs += allowed;
      computed_pairs += computed;
      changed += allowed != computed;
    }
  const auto& s = plan->stats();
  require(allowed_pairs == s.exact_kept_pairs, "exact kept pairs");
  require(computed_pairs == s.kept_pairs, "kept pairs");
  require(changed == s.changed_pairs, "changed pairs");
  require(alignment == stsa::Alignment::Round || changed == 0, "exact plan changed a pair");
  require(alignment == stsa::Alignment::Exact || s.tiles_partial == 0, "rounded plan kept a partial tile");
  require(std::abs(computed_pairs - allowed_pairs) <= std::int64_t(tile.q) * tile.k, "rounding drifted");
  require(s.tiles_full + s.tiles_partial + s.tiles_empty == plan->q_tiles() * plan->k_tiles(), "tile count");
  require(s.exact_kept_pairs == stsa::kept_pairs(grid, spec), "closed-form count");
  return 0;
}
