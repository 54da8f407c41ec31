// The failure summary the GPU tests print (tests/support/error_pattern.hpp):
// outputs equal to the reference give no pattern, and a known corruption is
// located by head, query tile, row slice and channel group.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "stsa/mask.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"
#include "stsa/reference.hpp"
#include "support/error_pattern.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

using testing::ReferenceRows;

constexpr double kBound = 1e-3;

// 3 frames of 6x8 and 10 text tokens: 154 tokens, three 64-row query tiles, the last ragged.
struct PatternCase {
  VideoLayout layout{{3, 6, 8, 10, TextPlacement::After}, 1, 2, 64};
  testing::Problem problem;
  ReferenceRows reference;

  PatternCase()
      : problem(testing::make_problem(layout, DType::F32, heads(layout), testing::fresh_seed())) {
    make_reference_backend()->run(problem.call());  // O and LSE as the reference has them (rounded to fp32)
    for (std::int64_t i = 0; i < layout.tokens(); ++i) reference.rows.push_back(i);
    reference_rows(problem.call(), reference.rows, reference.o, reference.lse);
  }

  static std::vector<HeadMask> heads(const VideoLayout& layout) {
    const MaskSpec spec = mask_for_density(layout.grid, SparseKind::Spatial, 0.5);
    const auto plan = TilePlan::build(layout.grid, spec, TileShape{64, 64}, Alignment::Exact);
    return std::vector<HeadMask>(2, HeadMask{spec, spec.natural_order(), plan, true});
  }

  std::string pattern() const { return testing::error_pattern(problem.call(), reference, kBound, kBound); }
  void add(std::int64_t row, std::int64_t head, std::int64_t dim, float delta) const {
    const TensorView o = problem.o.view();
    o.store(0, row, head, dim, o.load(0, row, head, dim) + delta);
  }
};

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in:\n" << text;
}

TEST(ErrorPattern, NothingWrongGivesNoPattern) {
  const PatternCase c;
  EXPECT_EQ(c.pattern(), "");
}

TEST(ErrorPattern, LocatesABlockOfWrongValues) {
  const PatternCase c;
  // Head 1, rows 80-95 (query tile 1, its rows 16-31), channels 8-15.
  for (std::int64_t row = 80; row < 96; ++row)
    for (std::int64_t d = 8; d < 16; ++d) c.add(row, 1, d, 0.5f);
  const std::string p = c.pattern();
  expect_has(p, "wrong: 128 of 19712 O values (0 NaN");
  expect_has(p, "LSE wrong in 0 of 308; 16 of 308 (batch, row, head) rows have either");
  expect_has(p, "rows by head: h0 0 of 154, h1 16 of 154");
  expect_has(p, "query tiles: 1 of 6 (head, tile) pairs have wrong rows");
  expect_has(p, "the ragged last tile: 0 of the wrong, 2 of all");
  expect_has(p, "h1 tile 1 (rows 64-127): 16 of 64 checked rows wrong; its plan row: ");
  expect_has(p, "0-15: 0, 16-31: 16, 32-47: 0, 48-63: 0");
  expect_has(p, "0-7: 0, 8-15: 128, 16-23: 0");
  expect_has(p, "first wrong: O[b=0, i=80, h=1, d=8]");
}

TEST(ErrorPattern, CountsNaNAndTheRaggedTileAndLse) {
  const PatternCase c;
  const TensorView o = c.problem.o.view();
  o.store(0, 150, 0, 63, std::numeric_limits<float>::quiet_NaN());  // never written, as a poisoned output reads
  c.problem.lse.view().at(0, 1, 3) += 1.0f;
  const std::string p = c.pattern();
  expect_has(p, "wrong: 1 of 19712 O values (1 NaN");
  expect_has(p, "LSE wrong in 1 of 308; 2 of 308 (batch, row, head) rows have either");
  expect_has(p, "query tiles: 2 of 6 (head, tile) pairs have wrong rows");  // the LSE fault's tile counts too
  expect_has(p, "the ragged last tile: 1 of the wrong, 2 of all");
  expect_has(p, "h0 tile 2 (rows 128-153, the ragged last tile): 1 of 26 checked rows wrong");
  expect_has(p, "0-15: 1, 16-31: 1");  // row 3 of tile 0 (the LSE), row 150 = row 22 of its tile
  expect_has(p, "56-63: 1");
  expect_has(p, "first wrong LSE: LSE[b=0, h=1, i=3]");
}

TEST(ErrorPattern, SkippedHeadsAreNotLookedAt) {
  PatternCase c;
  c.add(5, 1, 0, 1.0f);
  EXPECT_NE(c.pattern(), "");
  c.problem.heads[1].compute = false;
  EXPECT_EQ(c.pattern(), "");
}

TEST(ErrorPattern, AFailedComparisonSaysWhere) {
  const PatternCase c;
  c.add(70, 0, 40, 0.25f);
  const testing::Comparison comparison = testing::compare_with_reference(c.problem);
  ASSERT_FALSE(comparison.ok());
  expect_has(comparison.failure, "h0 tile 1 (rows 64-127): 1 of 64 checked rows wrong");
  EXPECT_EQ(comparison.reference.rows.size(), std::size_t(c.layout.tokens()));
}

TEST(RowMismatch, SaysWhichSourceRowsTheWrongRowsHold) {
  const VideoGrid grid{3, 2, 4, 5, TextPlacement::Before};
  Tensor full(DType::BF16, 2, grid.tokens(), 3, 8);
  testing::fill_normal(full.view(), testing::fresh_seed());
  Tensor expected(DType::BF16, 2, grid.tokens(), 2, 8), got(DType::BF16, 2, grid.tokens(), 2, 8);
  const std::vector<std::int64_t> heads{2, 0};
  const TensorView sources[] = {full.view()}, packed[] = {expected.view()};
  gather_heads(grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed);
  std::memcpy(got.view().data, expected.view().data, expected.bytes());
  EXPECT_EQ(testing::row_mismatch(expected.view(), got.view(), full.view()), "");

  // A row of head 1, which is not packed at all, where packed head 0 belongs.
  for (std::int64_t d = 0; d < 8; ++d) got.view().store(1, 7, 0, d, full.view().load(1, 7, 1, d));
  const std::string order_ignored = testing::row_mismatch(expected.view(), got.view(), full.view());
  EXPECT_NE(order_ignored.find("1 of 116 rows differ; the first, (batch 1, token 7, head 0), holds source row "
                               "(batch 1, token 7, head 1)"),
            std::string::npos)
      << order_ignored;
  got.view().store(0, 3, 1, 5, 1e9f);  // a value from nowhere
  const std::string garbage = testing::row_mismatch(expected.view(), got.view(), full.view());
  EXPECT_NE(garbage.find("2 of 116 rows differ; the first, (batch 0, token 3, head 1), holds no source row"),
            std::string::npos)
      << garbage;
}

}  // namespace
}  // namespace stsa
