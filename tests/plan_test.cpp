#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "stsa/error.hpp"
#include "stsa/plan.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

struct Case {
  VideoGrid grid;
  MaskSpec spec;
  TileShape tile;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::vector<VideoGrid> grids = {{1, 1, 1, 0, TextPlacement::After},  {1, 7, 9, 0, TextPlacement::After},
                                        {5, 7, 9, 13, TextPlacement::Before}, {4, 5, 6, 70, TextPlacement::After},
                                        {9, 8, 8, 0, TextPlacement::After},   {3, 11, 3, 1, TextPlacement::Before}};
  const std::vector<TileShape> tiles = {{64, 64}, {48, 64}, {16, 128}, {128, 128}};
  for (const auto& g : grids)
    for (const auto& t : tiles)
      for (bool anchor : {true, false}) {
        const std::int64_t n = g.video_tokens();
        for (std::int64_t w : {std::int64_t(-1), std::int64_t(0), std::int64_t(3), n / 5, n / 2, n}) {
          out.push_back({g, MaskSpec::spatial(w, anchor), t});
          out.push_back({g, MaskSpec::temporal(w, anchor), t});
        }
        for (std::int64_t r : {-1, 0, 1, 3}) out.push_back({g, MaskSpec::frame_window(r, anchor), t});
        out.push_back({g, MaskSpec::dense(), t});
      }
  return out;
}

// Brute force over every pair of every tile: class, mask bits and counts.
void check_exact_plan(const Case& c) {
  const auto plan = TilePlan::build(c.grid, c.spec, c.tile, Alignment::Exact);
  ASSERT_NO_THROW(plan->self_check());
  const std::int64_t n = c.grid.tokens();
  const TokenOrder order = c.spec.natural_order();
  std::int64_t kept = 0, full = 0, partial = 0, area = 0;
  for (std::int64_t qt = 0; qt < plan->q_tiles(); ++qt)
    for (std::int64_t kt = 0; kt < plan->k_tiles(); ++kt) {
      std::int64_t allowed_here = 0, tile_area = 0;
      for (std::int64_t i = qt * c.tile.q; i < std::min(n, (qt + 1) * c.tile.q); ++i)
        for (std::int64_t j = kt * c.tile.k; j < std::min(n, (kt + 1) * c.tile.k); ++j) {
          const bool a = allowed_at(c.grid, c.spec, order, i, j);
          allowed_here += a;
          ++tile_area;
          ASSERT_EQ(plan->computes(i, j), a) << c.grid.describe() << " " << c.spec.describe() << " pair " << i << ","
                                             << j;
        }
      const TileClass expected = allowed_here == 0             ? TileClass::Empty
                                 : allowed_here == tile_area ? TileClass::Full
                                                             : TileClass::Partial;
      ASSERT_EQ(plan->classify(qt, kt), expected) << c.grid.describe() << " " << c.spec.describe() << " tile " << qt
                                                  << "," << kt;
      kept += allowed_here;
      full += expected == TileClass::Full;
      partial += expected == TileClass::Partial;
      if (expected != TileClass::Empty) area += tile_area;
    }
  const PlanStats& s = plan->stats();
  EXPECT_EQ(s.exact_kept_pairs, kept);
  EXPECT_EQ(s.kept_pairs, kept);
  EXPECT_EQ(s.changed_pairs, 0);
  EXPECT_EQ(s.tiles_full, full);
  EXPECT_EQ(s.tiles_partial, partial);
  EXPECT_EQ(s.tiles_empty, plan->q_tiles() * plan->k_tiles() - full - partial);
  EXPECT_EQ(s.kept_tile_area, area);
  EXPECT_EQ(s.total_pairs, n * n);
  EXPECT_LE(s.distinct_masks, s.tiles_partial);
}

TEST(Plan, ExactPlanMatchesBruteForceClassification) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.grid.describe() + " " + c.spec.describe() + " tile " + std::to_string(c.tile.q) + "x" +
                 std::to_string(c.tile.k));
    check_exact_plan(c);
    if (HasFatalFailure()) return;
  }
}

TEST(Plan, RoundingLeavesNoPartialTilesAndCountsEveryChangedPair) {
  for (const Case& c : cases()) {
    const auto plan = TilePlan::build(c.grid, c.spec, c.tile, Alignment::Round);
    const PlanStats& s = plan->stats();
    ASSERT_EQ(s.tiles_partial, 0);
    const std::int64_t n = c.grid.tokens();
    const TokenOrder order = c.spec.natural_order();
    std::int64_t changed = 0, kept = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const bool computed = plan->computes(i, j);
        changed += computed != allowed_at(c.grid, c.spec, order, i, j);
        kept += computed;
      }
    EXPECT_EQ(s.changed_pairs, changed) << c.spec.describe();
    EXPECT_EQ(s.kept_pairs, kept);
    EXPECT_EQ(s.added_pairs - s.removed_pairs, kept - s.exact_kept_pairs);
    // Balanced rounding: the kept count stays within one tile of exact.
    EXPECT_LE(std::abs(kept - s.exact_kept_pairs), std::int64_t(c.tile.q) * c.tile.k) << c.spec.describe();
  }
}

TEST(Plan, PartialMasksAreDeduplicated) {
  const VideoGrid g{21, 16, 16};
  const auto plan = TilePlan::build(g, mask_for_density(g, SparseKind::Spatial, 0.25));
  EXPECT_GT(plan->stats().tiles_partial, 40);
  EXPECT_LT(plan->stats().distinct_masks, plan->stats().tiles_partial / 4);
}

TEST(Plan, LargeLayoutStaysCompact) {
  const VideoGrid g{21, 90, 160};  // 1440p, 302,400 tokens
  const auto plan = TilePlan::build(g, mask_for_density(g, SparseKind::Spatial, 0.25));
  const PlanStats& s = plan->stats();
  EXPECT_EQ(s.tiles_full + s.tiles_partial + s.tiles_empty, plan->q_tiles() * plan->k_tiles());
  EXPECT_LT(s.plan_bytes, 64ll << 20);
  EXPECT_NEAR(s.kept_fraction(), 0.25, 1e-3);
  EXPECT_NO_THROW(plan->self_check());
}

TEST(Plan, CacheSharesPlansByValueAndChecksMatches) {
  PlanCache cache;
  const VideoGrid g{3, 4, 4};
  const auto a = cache.get(g, MaskSpec::spatial(5));
  const auto b = cache.get(g, MaskSpec::spatial(5));
  const auto c = cache.get(g, MaskSpec::temporal(5));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NO_THROW(a->check_matches(g, MaskSpec::spatial(5), TokenOrder::FrameMajor));
  EXPECT_THROW(a->check_matches(g, MaskSpec::spatial(6), TokenOrder::FrameMajor), InvalidArgument);
  EXPECT_THROW(a->check_matches(VideoGrid{3, 4, 5}, MaskSpec::spatial(5), TokenOrder::FrameMajor), InvalidArgument);
  EXPECT_THROW(c->check_matches(g, MaskSpec::temporal(5), TokenOrder::FrameMajor), InvalidArgument);
}

TEST(Plan, RejectsBadTiles) {
  const VideoGrid g{2, 2, 2};
  EXPECT_THROW(TilePlan::build(g, MaskSpec::dense(), {0, 64}), InvalidArgument);
  EXPECT_THROW(TilePlan::build(g, MaskSpec::dense(), {64, 100}), InvalidArgument);
  EXPECT_THROW(TilePlan::build(g, MaskSpec::dense(), {2048, 64}), InvalidArgument);
  EXPECT_THROW(parse_alignment("nearest"), InvalidArgument);
}

// A rounded plan is a plan like any other: CSR rows ascending (classify() and
// computes() binary-search them), and kept_tile_area is the area of the tiles it
// computes, the full ones here, rounded ones included.
TEST(Plan, RoundedPlansAreWellFormedAndCountTheAreaTheyCompute) {
  for (const Case& c : cases()) {
    const auto plan = TilePlan::build(c.grid, c.spec, c.tile, Alignment::Round);
    SCOPED_TRACE(c.grid.describe() + " " + c.spec.describe() + " tile " + std::to_string(c.tile.q) + "x" +
                 std::to_string(c.tile.k));
    ASSERT_NO_THROW(plan->self_check());
    const std::int64_t n = c.grid.tokens();
    std::int64_t area = 0;
    for (std::int64_t qt = 0; qt < plan->q_tiles(); ++qt) {
      const auto full = plan->full_tiles(qt);
      ASSERT_TRUE(std::is_sorted(full.begin(), full.end()));
      for (const std::int32_t kt : full)
        area += (std::min(n, (qt + 1) * c.tile.q) - qt * c.tile.q) * (std::min(n, (kt + 1) * std::int64_t(c.tile.k)) -
                                                                       kt * std::int64_t(c.tile.k));
    }
    EXPECT_EQ(plan->stats().kept_tile_area, area);
    EXPECT_EQ(plan->stats().kept_tile_area, plan->stats().kept_pairs);  // no partial tiles: every computed pair kept
  }
}

// The cache keys on every field of the key: a rounded plan is not an exact one,
// and a plan for one tile shape does not serve another.
TEST(Plan, CacheKeysOnTileShapeAndAlignment) {
  PlanCache cache;
  const VideoGrid g{3, 8, 12, 9, TextPlacement::Before};
  const MaskSpec spec = mask_for_density(g, SparseKind::Spatial, 0.2);
  const auto exact = cache.get(g, spec, {64, 64}, Alignment::Exact);
  const auto rounded = cache.get(g, spec, {64, 64}, Alignment::Round);
  const auto other_tile = cache.get(g, spec, {48, 64}, Alignment::Exact);
  EXPECT_EQ(rounded->alignment(), Alignment::Round);
  EXPECT_EQ(rounded->stats().tiles_partial, 0);
  EXPECT_GT(exact->stats().tiles_partial, 0);
  EXPECT_EQ(other_tile->tile(), (TileShape{48, 64}));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.get(g, spec, {64, 64}, Alignment::Round).get(), rounded.get());
}

// Band widths past the token count keep every pair (the builder clamps them so
// its position arithmetic cannot overflow): the widest band is a dense plan.
TEST(Plan, WidestBandsAreDense) {
  const VideoGrid g{3, 5, 7, 4, TextPlacement::After};
  const std::int64_t n = g.tokens();
  for (const std::int64_t band : {n, std::int64_t(1) << 40, std::numeric_limits<std::int64_t>::max()})
    for (const MaskSpec& spec : {MaskSpec::spatial(band, false), MaskSpec::temporal(band, false),
                                 MaskSpec::frame_window(band, false)}) {
      const auto plan = TilePlan::build(g, spec, {64, 64});
      EXPECT_EQ(kept_pairs(g, spec), n * n) << spec.describe();
      EXPECT_EQ(plan->stats().kept_pairs, n * n) << spec.describe();
      EXPECT_EQ(plan->stats().tiles_partial, 0) << spec.describe();
      EXPECT_EQ(plan->stats().tiles_full, plan->q_tiles() * plan->k_tiles()) << spec.describe();
    }
}

// A plan that cannot fit in memory is refused before it is built: a dense plan of a
// 2e9-token grid (2.4e14 tiles) ran for minutes before.
TEST(Plan, OneTooLargeForMemoryIsRefusedUpFront) {
  EXPECT_THROW(TilePlan::build(VideoGrid{1000, 1000, 2000, 0, TextPlacement::After}, MaskSpec::dense()),
               ResourceError);
}

// The accessors index the CSR arrays: a row, mask id or position outside the plan is an error.
// computes() took -1 into tile 0 (and read before the masks) and answered for positions in a
// ragged last tile past the matrix (true where that tile is full).
TEST(Plan, AccessorsRefuseRowsMasksAndPositionsOutsideThePlan) {
  const auto plan = TilePlan::build(VideoGrid{3, 4, 4}, MaskSpec::spatial(3, false), {16, 64});
  ASSERT_GT(plan->stats().distinct_masks, 0);
  const std::int64_t n = plan->tokens(), rows = plan->q_tiles();
  for (const auto& [q, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{{-1, 0}, {0, -1}, {n, 0}, {0, n}})
    EXPECT_THROW(plan->computes(q, k), InvalidArgument) << q << ", " << k;
  EXPECT_NO_THROW(plan->computes(n - 1, n - 1));
  for (const std::int64_t row : {std::int64_t(-1), rows}) {
    EXPECT_THROW(plan->full_tiles(row), InvalidArgument);
    EXPECT_THROW(plan->partial_tiles(row), InvalidArgument);
    EXPECT_THROW(plan->partial_mask_ids(row), InvalidArgument);
  }
  EXPECT_THROW(plan->mask(-1), InvalidArgument);
  EXPECT_THROW(plan->mask(std::int32_t(plan->stats().distinct_masks)), InvalidArgument);
  const auto dense = TilePlan::build(VideoGrid{1, 1, 50}, MaskSpec::dense(), {64, 64});  // one ragged full tile
  EXPECT_TRUE(dense->computes(49, 49));
  EXPECT_THROW(dense->computes(50, 0), InvalidArgument);
}

// An alignment outside the enum is refused: it built an exact plan that reported itself as rounded.
TEST(Plan, AlignmentOutsideTheEnumIsRefused) {
  EXPECT_THROW(TilePlan::build(VideoGrid{2, 2, 2}, MaskSpec::spatial(1), {64, 64}, Alignment(7)), InvalidArgument);
}

// A grid of 2^31 - 1 tokens in one-row tiles: the refusal comes before any of the plan's arrays
// are reserved. Its two row arrays (16 GiB each) were reserved before the size check, so where
// the address space is smaller (ulimit -v, or less memory than that) std::bad_alloc came first.
// The child caps its address space; a sanitizer's shadow memory cannot run under such a cap.
TEST(Plan, HugeGridIsRefusedBeforeItsRowsAreReserved) {
  if (testing::kSanitized) GTEST_SKIP() << "an address-space cap breaks the sanitizer's own mappings";
  const auto child = [] {
    std::ifstream statm("/proc/self/statm");
    long pages = 0;
    statm >> pages;
    const rlim_t cap = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(1) << 30);
    const rlimit limit{cap, cap};
    if (pages <= 0 || setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
    try {
      TilePlan::build(VideoGrid{1, 1, (std::int64_t(1) << 31) - 1, 0, TextPlacement::After}, MaskSpec::dense(),
                      {1, 1024});
    } catch (const ResourceError&) {
      std::_Exit(0);
    } catch (...) {
      std::_Exit(1);
    }
    std::_Exit(3);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace stsa
