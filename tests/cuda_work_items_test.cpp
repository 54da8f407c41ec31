// The attention kernels' work-item orders (src/cuda/work_items.hpp): each is a
// bijection between items and (query-tile rank, batch, head slot), across heads
// walks ranks slowest, head by head walks (batch, head) slowest. Plain C++,
// runs in every build.
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

TEST(CudaWorkItems, BothOrdersVisitEveryTileOfEveryHeadOnce) {
  for (const LaunchShape s : {LaunchShape{1, 1, 1}, {5, 1, 3}, {7, 2, 4}, {3, 3, 1}, {1, 2, 5}})
    for (const int order : {cuda_detail::kWorkAcrossHeads, cuda_detail::kWorkHeadByHead}) {
      std::set<std::tuple<int, int, int>> seen;
      const int items = s.q_tiles * s.batch * s.heads;
      for (int item = 0; item < items; ++item) {
        const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, order);
        ASSERT_TRUE(w.rank >= 0 && w.rank < s.q_tiles && w.batch >= 0 && w.batch < s.batch && w.head_slot >= 0 &&
                    w.head_slot < s.heads)
            << "item " << item << " order " << order;
        seen.insert({w.rank, w.batch, w.head_slot});
      }
      EXPECT_EQ(int(seen.size()), items) << "order " << order;
    }
}

TEST(CudaWorkItems, AcrossHeadsTakesTheHeaviestTilesOfEveryHeadFirst) {
  const LaunchShape s{6, 2, 3};
  for (int item = 0; item < s.q_tiles * s.batch * s.heads; ++item) {
    const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkAcrossHeads);
    EXPECT_EQ(w.rank, item / (s.batch * s.heads));
    EXPECT_EQ(w.batch * s.heads + w.head_slot, item % (s.batch * s.heads));
  }
}

TEST(CudaWorkItems, HeadByHeadFinishesOneHeadBeforeTheNext) {
  const LaunchShape s{6, 2, 3};
  for (int item = 0; item < s.q_tiles * s.batch * s.heads; ++item) {
    const auto w = work_slot(item, s.q_tiles, s.batch, s.heads, cuda_detail::kWorkHeadByHead);
    EXPECT_EQ(w.rank, item % s.q_tiles);  // heaviest first within the head
    EXPECT_EQ(w.batch * s.heads + w.head_slot, item / s.q_tiles);
  }
}

}  // namespace
}  // namespace stsa
