// The attention kernels' work-item orders (src/cuda/work_items.hpp): each is a
// bijection between items and (query-tile rank, batch, head slot), across heads
// walks ranks slowest, head by head walks (batch, head) slowest, heavy first
// walks its heavy ranks across heads and then the rest head by head. Plain
// C++, runs in every build.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "cuda/work_items.hpp"

namespace stsa {
namespace {

using cuda_detail::work_slot;

struct LaunchShape {
  int q_tiles, batch, heads;
};

TEST(CudaWorkItems, EveryOrderVisitsEveryTileOfEveryHeadOnce) {
  for (const LaunchShape s : {LaunchShape{1, 1, 1}, {5, 1, 3}, {7, 2, 4}, {3, 3, 1}, {1, 2, 5}})
    for (const int order : {cuda_detail::kWorkAcrossHeads, cuda_detail::kWorkHeadByHead, cuda_detail::kWorkHeavyFirst})
      for (int heavy_ranks = 0; heavy_ranks <= s.q_tiles; ++heavy_ranks) {
        std::set<std::tuple<int, int, int>> seen;
        const int items = s.q_tiles * s.batch * s.heads;
        for (int item = 0; item < items; ++item) {
          const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, order, heavy_ranks);
          ASSERT_TRUE(w.rank >= 0 && w.rank < s.q_tiles && w.batch >= 0 && w.batch < s.batch && w.head_slot >= 0 &&
                      w.head_slot < s.heads)
              << "item " << item << " order " << order << " heavy ranks " << heavy_ranks;
          seen.insert({w.rank, w.batch, w.head_slot});
        }
        EXPECT_EQ(int(seen.size()), items) << "order " << order << " heavy ranks " << heavy_ranks;
      }
}

TEST(CudaWorkItems, AcrossHeadsTakesTheHeaviestTilesOfEveryHeadFirst) {
  const LaunchShape s{6, 2, 3};
  for (int item = 0; item < s.q_tiles * s.batch * s.heads; ++item) {
    const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkAcrossHeads, 0);
    EXPECT_EQ(w.rank, item / (s.batch * s.heads));
    EXPECT_EQ(w.batch * s.heads + w.head_slot, item % (s.batch * s.heads));
  }
}

TEST(CudaWorkItems, HeadByHeadFinishesOneHeadBeforeTheNext) {
  const LaunchShape s{6, 2, 3};
  for (int item = 0; item < s.q_tiles * s.batch * s.heads; ++item) {
    const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeadByHead, 0);
    EXPECT_EQ(w.rank, item % s.q_tiles);  // heaviest first within the head
    EXPECT_EQ(w.batch * s.heads + w.head_slot, item / s.q_tiles);
  }
}

TEST(CudaWorkItems, HeavyFirstTakesTheHeavyRanksAcrossHeadsThenTheRestHeadByHead) {
  const LaunchShape s{6, 2, 3};
  const int pairs = s.batch * s.heads, heavy = 2, light = s.q_tiles - heavy;
  for (int item = 0; item < s.q_tiles * pairs; ++item) {
    const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeavyFirst, heavy);
    const int pair = w.batch * s.heads + w.head_slot;
    if (item < heavy * pairs) {
      EXPECT_EQ(w.rank, item / pairs) << item;
      EXPECT_EQ(pair, item % pairs) << item;
    } else {
      EXPECT_EQ(w.rank, heavy + (item - heavy * pairs) % light) << item;
      EXPECT_EQ(pair, (item - heavy * pairs) / light) << item;
    }
  }
  // No heavy rank: head by head; every rank heavy: across heads.
  for (int item = 0; item < s.q_tiles * pairs; ++item) {
    const auto none = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeavyFirst, 0);
    const auto hbh = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeadByHead, 0);
    EXPECT_EQ(std::tie(none.rank, none.batch, none.head_slot), std::tie(hbh.rank, hbh.batch, hbh.head_slot));
    const auto all = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeavyFirst, s.q_tiles);
    const auto across = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkAcrossHeads, 0);
    EXPECT_EQ(std::tie(all.rank, all.batch, all.head_slot), std::tie(across.rank, across.batch, across.head_slot));
  }
}

}  // namespace
}  // namespace stsa
