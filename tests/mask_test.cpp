#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "stsa/error.hpp"
#include "stsa/mask.hpp"

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
      const double anchor_floor = kept_fraction(g, mask_for_density(g, kind, 0.0));
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

}  // namespace
}  // namespace stsa
