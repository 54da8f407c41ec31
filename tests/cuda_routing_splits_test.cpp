// The GPU router's key splits (src/cuda/routing_splits.hpp): every key in
// exactly one non-empty split, splits at least four tiles long, and the shape
// GpuRouter.OneNonFiniteKeyInOneSplitKeepsTheHeadDense relies on (its poisoned
// key in a split other than the first) on any GPU size it may run on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/routing_splits.hpp"

namespace stsa::cuda_detail {
namespace {

TEST(CudaRoutingSplits, CoverEveryKeyWithoutEmptyOrShortSplits) {
  for (const std::int64_t tokens : {1, 63, 64, 65, 255, 1260, 75600, 302400})
    for (const std::int64_t sms : {1, 16, 108, 132})
      for (const std::int64_t pairs : {1, 3, 12, 24, 500}) {
        const RoutingSplits s = routing_splits(tokens, sms, pairs);
        const std::int64_t tiles = (tokens + kRoutingKeys - 1) / kRoutingKeys;
        SCOPED_TRACE(::testing::Message() << tokens << " tokens, " << sms << " SMs, " << pairs << " pairs");
        ASSERT_GE(s.splits, 1);
        ASSERT_LE(s.splits, kMaxRoutingSplits);
        EXPECT_GE(s.splits * s.tiles_per_split, tiles);       // every tile in a split
        EXPECT_LT((s.splits - 1) * s.tiles_per_split, tiles);  // the last split holds a tile
        EXPECT_GE(s.tiles_per_split, std::min<std::int64_t>(4, tiles));
      }
}

// 9 x 10 x 14 = 1,260 tokens (20 key tiles), 3 heads, 40 samples (one row block).
TEST(CudaRoutingSplits, TheNonFiniteKeyTestPoisonsALaterSplit) {
  const std::int64_t poisoned_tile = 1100 / kRoutingKeys;
  for (const std::int64_t sms : {16, 46, 78, 108, 114, 132, 144}) {
    const RoutingSplits s = routing_splits(1260, sms, 3);
    EXPECT_GE(s.splits, 2) << sms << " SMs";
    EXPECT_GT(poisoned_tile / s.tiles_per_split, 0) << sms << " SMs";
  }
  const RoutingSplits h200 = routing_splits(1260, 132, 3);
  EXPECT_EQ(h200.splits, 5);
  EXPECT_EQ(h200.tiles_per_split, 4);
}

// Worked by hand from the rule: ceil(4 SMs / pairs) splits wanted, at most a
// quarter of the tiles (and 1024), then tiles per split rounded up and the count
// of splits that leaves. 302,400 tokens are 4,725 tiles.
TEST(CudaRoutingSplits, HandWorkedSplits) {
  // 16 SMs, 3 pairs: ceil(64 / 3) = 22 wanted (21 if rounded down); ceil(4725 / 22) = 215 tiles each; 22 splits.
  RoutingSplits s = routing_splits(302400, 16, 3);
  EXPECT_EQ(s.splits, 22);
  EXPECT_EQ(s.tiles_per_split, 215);
  // 132 SMs, 1 pair: 528 wanted; ceil(4725 / 528) = 9 tiles each; ceil(4725 / 9) = 525 splits.
  s = routing_splits(302400, 132, 1);
  EXPECT_EQ(s.splits, 525);
  EXPECT_EQ(s.tiles_per_split, 9);
  // 500 pairs already fill 4 x 108 SMs: one split of all 4725 tiles.
  s = routing_splits(302400, 108, 500);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.tiles_per_split, 4725);
}

}  // namespace
}  // namespace stsa::cuda_detail
