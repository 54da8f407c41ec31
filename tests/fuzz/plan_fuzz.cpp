// Fuzzes the plan builder: random small grids, masks, tiles and alignments; the
// plan must match a brute-force classification of every pair, or the input must
// be rejected with stsa::InvalidArgument. Some inputs plant one defect the library must refuse
// with InvalidArgument: a mask kind, band order, alignment or sparse kind outside its enum, or
// (on a built plan) a CSR row, mask id or position outside the plan.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "stsa/error.hpp"
#include "stsa/plan.hpp"
#include "fuzz_reader.hpp"

namespace {

enum class Plant { None, Kind, BandOrder, Alignment, SparseKind, Row, MaskId, Position, Count };

// Planted defects refused as they must be, per kind, printed at exit.
struct Tally {
  long planted[int(Plant::Count)] = {};
  ~Tally() {
    std::fprintf(stderr,
                 "plan_fuzz: planted defects refused: %ld mask kinds, %ld band orders, %ld alignments, %ld sparse "
                 "kinds outside their enums; %ld rows, %ld mask ids, %ld positions outside the plan\n",
                 planted[1], planted[2], planted[3], planted[4], planted[5], planted[6], planted[7]);
  }
} tally;

// Whether `f` throws InvalidArgument (anything else escapes and is a finding).
template <class F>
bool refused(F&& f) {
  try {
    f();
  } catch (const stsa::InvalidArgument&) {
    return true;
  }
  return false;
}

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
  auto alignment = in.next(0, 1) ? stsa::Alignment::Round : stsa::Alignment::Exact;
  // Drawn last, so that the seeds and short inputs (past the end: 0) plant nothing.
  const std::int64_t drawn = in.next(0, 2 * (int(Plant::Count) - 1));
  const Plant plant = drawn < int(Plant::Count) ? Plant(drawn) : Plant::None;
  const std::int64_t bad_enum = in.next(0, 252);  // a value past every enum's last
  if (plant == Plant::Kind) spec.kind = stsa::MaskKind(3 + bad_enum);
  if (plant == Plant::BandOrder) spec.band_order = stsa::TokenOrder(2 + bad_enum);
  if (plant == Plant::Alignment) alignment = stsa::Alignment(2 + bad_enum);
  if (plant == Plant::Kind || plant == Plant::BandOrder) {
    require(refused([&] { spec.validate(grid); }), "a mask outside its enums was validated");
    require(refused([&] { stsa::kept_pairs(grid, spec); }), "a mask outside its enums was counted");
  }
  if (plant == Plant::SparseKind) {
    require(refused([&] {
              stsa::mask_for_density(grid, stsa::SparseKind(3 + bad_enum), double(parameter & 7) / 7, anchor);
            }),
            "a sparse kind outside its enum gave a mask");
    ++tally.planted[int(plant)];
  }
  const bool planted_build = plant == Plant::Kind || plant == Plant::BandOrder || plant == Plant::Alignment;
  std::shared_ptr<const stsa::TilePlan> plan;
  try {
    plan = stsa::TilePlan::build(grid, spec, tile, alignment);
  } catch (const stsa::InvalidArgument&) {
    tally.planted[int(plant)] += planted_build;
    return 0;  // rejected input is fine; anything else escapes and is a finding
  }
  require(!planted_build, "a plan was built for a mask or alignment outside its enum");
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
  // The accessors refuse what lies outside the plan: below 0 or at/past the end.
  const std::int64_t past = in.next(0, 3), below = -1 - past;
  const bool low = in.next(0, 1) == 0;
  if (plant == Plant::Row) {
    const std::int64_t row = low ? below : plan->q_tiles() + past;
    const std::int64_t which = in.next(0, 2);
    require(refused([&] {
              if (which == 0) plan->full_tiles(row);
              else if (which == 1) plan->partial_tiles(row);
              else plan->partial_mask_ids(row);
            }),
            "a CSR row outside the plan was read");
    ++tally.planted[int(plant)];
  } else if (plant == Plant::MaskId) {
    const std::int64_t id = low ? below : s.distinct_masks + past;
    require(refused([&] { plan->mask(std::int32_t(id)); }), "a mask id outside the plan was read");
    ++tally.planted[int(plant)];
  } else if (plant == Plant::Position) {
    const std::int64_t bad = low ? below : n + past, good = n > 0 ? in.next(0, n - 1) : 0;
    require(refused([&] { in.next(0, 1) ? plan->computes(bad, good) : plan->computes(good, bad); }),
            "computes() answered for a position outside the plan");
    ++tally.planted[int(plant)];
  }
  return 0;
}
