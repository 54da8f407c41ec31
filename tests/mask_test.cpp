#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa {
namespace {

std::int64_t brute_kept(const VideoGrid& g, const MaskSpec& spec) {
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < g.tokens(); ++i)
    for (std::int64_t j = 0; j < g.tokens(); ++j) kept += allowed_at(g, spec, TokenOrder::FrameMajor, i, j);
  return kept;
}

std::vector<VideoGrid> grids() {
  return {{1, 1, 1, 0, TextPlacement::After}, {1, 3, 5, 0, TextPlacement::After}, {4, 3, 5, 7, TextPlacement::Before},
          {5, 2, 3, 4, TextPlacement::After}, {3, 1, 1, 0, TextPlacement::After}, {6, 2, 2, 0, TextPlacement::After}};
}

TEST(Mask, ClosedFormCountMatchesBruteForce) {
  for (const VideoGrid& g : grids())
    for (bool anchor : {true, false})
      for (std::int64_t w : {-1, 0, 1, 2, 5, 17, 1000}) {
        for (const MaskSpec& spec : {MaskSpec::spatial(w, anchor), MaskSpec::temporal(w, anchor),
                                     MaskSpec::frame_window(std::min<std::int64_t>(w, 7), anchor), MaskSpec::dense()})
          EXPECT_EQ(kept_pairs(g, spec), brute_kept(g, spec)) << g.describe() << " " << spec.describe();
      }
}

TEST(Mask, PredicateFollowsTheDefinition) {
  const VideoGrid g{3, 2, 2, 2, TextPlacement::Before};  // P = 4, text at 0..1
  const auto at = [&](std::int64_t f, std::int64_t p) { return TokenCoord{false, -1, f, p}; };
  const TokenCoord text{true, 0, -1, -1};
  const MaskSpec spatial = MaskSpec::spatial(1);
  EXPECT_TRUE(allowed(g, spatial, text, at(2, 3)));
  EXPECT_TRUE(allowed(g, spatial, at(2, 3), text));
  EXPECT_TRUE(allowed(g, spatial, at(2, 3), at(0, 0))) << "every query sees frame 0";
  EXPECT_TRUE(allowed(g, spatial, at(0, 0), at(2, 3))) << "frame 0 sees every key";
  EXPECT_TRUE(allowed(g, spatial, at(1, 1), at(1, 2)));   // positions 5 and 6
  EXPECT_FALSE(allowed(g, spatial, at(1, 1), at(1, 3)));  // positions 5 and 7
  EXPECT_FALSE(allowed(g, MaskSpec::spatial(1, false), at(0, 0), at(2, 3)));
  // Temporal: (1, p) and (2, p) are neighbours in spatial-major order.
  const MaskSpec temporal = MaskSpec::temporal(1);
  EXPECT_TRUE(allowed(g, temporal, at(1, 3), at(2, 3)));
  EXPECT_FALSE(allowed(g, temporal, at(1, 1), at(1, 2)));
  EXPECT_FALSE(allowed(g, MaskSpec::spatial(-1), at(1, 1), at(1, 1))) << "band -1 keeps no band pair";
  EXPECT_TRUE(allowed(g, MaskSpec::frame_window(1), at(1, 0), at(2, 3)));
  EXPECT_FALSE(allowed(g, MaskSpec::frame_window(0), at(1, 0), at(2, 3)));
}

TEST(Mask, DensityMapsToTheClosestMask) {
  const VideoGrid g{21, 45, 80};
  for (SparseKind kind : {SparseKind::Spatial, SparseKind::Temporal, SparseKind::FrameWindow})
    for (double s : {0.0, 0.02, 0.1, 0.25, 0.5, 0.9, 1.0}) {
      const MaskSpec spec = mask_for_density(g, kind, s);
      const double got = kept_fraction(g, spec);
      // What the anchor alone keeps (no text here): every pair with a frame-0 query or key.
      const double n = double(g.tokens()), p = double(g.tokens_per_frame());
      const double anchor_floor = (n * n - (n - p) * (n - p)) / (n * n);
      if (s <= anchor_floor) {
        EXPECT_NEAR(got, anchor_floor, 1e-12);
        continue;
      }
      // Band steps are one token wide; frame steps one frame.
      const double step = kind == SparseKind::FrameWindow ? 2.5 / 21.0 : 1e-4;
      EXPECT_NEAR(got, s, step) << spec.describe();
    }
  EXPECT_EQ(kept_fraction(g, mask_for_density(g, SparseKind::Spatial, 1.0)), 1.0);
  EXPECT_EQ(kept_fraction(g, mask_for_density(g, SparseKind::Temporal, 1.0, false)), 1.0);
  EXPECT_EQ(kept_pairs(g, mask_for_density(g, SparseKind::Spatial, 0.0, false)), 0);
}

TEST(Mask, RejectsBadDensityAndWidths) {
  const VideoGrid g{2, 2, 2};
  EXPECT_THROW(mask_for_density(g, SparseKind::Spatial, -0.1), InvalidArgument);
  EXPECT_THROW(mask_for_density(g, SparseKind::Spatial, 1.5), InvalidArgument);
  EXPECT_THROW(mask_for_density(g, SparseKind::Spatial, std::nan("")), InvalidArgument);
  EXPECT_THROW(MaskSpec::spatial(-2).validate(g), InvalidArgument);
  EXPECT_THROW(MaskSpec::frame_window(-5).validate(g), InvalidArgument);
}

// mask_for_density picks the closest kept count, and on an exact tie the larger
// mask (mask.hpp). Grids of 2^k tokens make every midpoint density exact, so the
// targets below are exactly halfway between neighbouring counts, or a quarter
// pair to either side.
TEST(Mask, DensityPicksTheClosestCountAndTiesGoToTheLargerMask) {
  const std::vector<VideoGrid> grids = {{4, 2, 2, 0, TextPlacement::After},  // 16 tokens
                                        {2, 4, 4, 0, TextPlacement::After},  // 32
                                        {3, 2, 2, 4, TextPlacement::Before},  // 16, text
                                        {8, 2, 4, 0, TextPlacement::After}};  // 64
  for (const VideoGrid& g : grids)
    for (SparseKind kind : {SparseKind::Spatial, SparseKind::Temporal, SparseKind::FrameWindow})
      for (bool anchor : {true, false}) {
        const double total = double(g.tokens()) * double(g.tokens());
        // Every count the kind can reach, by brute force over its parameter.
        std::vector<std::int64_t> counts;
        const std::int64_t limit = kind == SparseKind::FrameWindow ? g.frames : g.video_tokens();
        for (std::int64_t p = -1; p <= limit; ++p) {
          const MaskSpec spec = kind == SparseKind::Spatial    ? MaskSpec::spatial(p, anchor)
                                : kind == SparseKind::Temporal ? MaskSpec::temporal(p, anchor)
                                                               : MaskSpec::frame_window(p, anchor);
          counts.push_back(brute_kept(g, spec));
        }
        counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
        for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
          const double lo = double(counts[i]), hi = double(counts[i + 1]), mid = (lo + hi) / 2;
          const auto kept_at = [&](double target) { return kept_pairs(g, mask_for_density(g, kind, target / total, anchor)); };
          SCOPED_TRACE(g.describe() + " counts " + std::to_string(counts[i]) + "/" + std::to_string(counts[i + 1]) +
                       (anchor ? " +anchor" : " -anchor") + " kind " + std::to_string(int(kind)));
          EXPECT_EQ(kept_at(mid), counts[i + 1]) << "a tie goes to the larger mask";
          EXPECT_EQ(kept_at(mid - (hi - lo) / 4), counts[i]) << "closer to the smaller count";
          EXPECT_EQ(kept_at(mid + (hi - lo) / 4), counts[i + 1]) << "closer to the larger count";
        }
      }
}

TEST(Mask, DescriptionsNameEveryKindAndTheEmptyBandAndWindow) {
  EXPECT_EQ(MaskSpec::dense().describe(), "dense");
  EXPECT_EQ(MaskSpec::spatial(12).describe(), "spatial band 12 +anchor");
  EXPECT_EQ(MaskSpec::temporal(3, false).describe(), "temporal band 3");
  EXPECT_EQ(MaskSpec::spatial(-1).describe(), "spatial band none +anchor");  // no band pair; was "band -1"
  EXPECT_EQ(MaskSpec::frame_window(2, false).describe(), "frame window +-2");
  EXPECT_EQ(MaskSpec::frame_window(-1).describe(), "frame window none +anchor");
}

// Kinds and orders outside their enums are refused: a cast MaskKind passed validate(), and then
// allowed() kept no regular pair, kept_pairs() counted it as a frame window and the plan builder
// as a band, three different masks; a cast SparseKind came back from mask_for_density as dense.
TEST(Mask, KindsAndOrdersOutsideTheEnumsAreRefused) {
  const VideoGrid g{3, 4, 4};
  MaskSpec kind = MaskSpec::spatial(3, false);
  kind.kind = MaskKind(7);
  MaskSpec order = MaskSpec::spatial(3, false);
  order.band_order = TokenOrder(5);
  for (const MaskSpec& spec : {kind, order}) {
    EXPECT_THROW(spec.validate(g), InvalidArgument);
    EXPECT_THROW(kept_pairs(g, spec), InvalidArgument);
    EXPECT_THROW(TilePlan::build(g, spec), InvalidArgument);
  }
  EXPECT_THROW(mask_for_density(g, SparseKind(9), 0.5), InvalidArgument);
}

}  // namespace
}  // namespace stsa
