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

TEST(CudaWorkItems, PersistentLaunchesFitTheKernelsCounters) {
  using cuda_detail::persistent_launch_fits;
  // 1440p, 12 heads, one block per H200 multiprocessor, and a single block.
  EXPECT_TRUE(persistent_launch_fits(2363LL * 12, 132, 2363));
  EXPECT_TRUE(persistent_launch_fits(2363LL * 12, 1, 2363));
  // A block's key tiles: ceil(items / blocks) * key_tiles, up to INT_MAX and not past it.
  EXPECT_TRUE(persistent_launch_fits(2, 1, 1073741823));   // 2 * (2^30 - 1) = 2^31 - 2
  EXPECT_FALSE(persistent_launch_fits(2, 1, 1073741824));  // 2^31
  EXPECT_TRUE(persistent_launch_fits(3, 2, 1073741823));   // ceil(3 / 2) = 2 items on the first block
  EXPECT_FALSE(persistent_launch_fits(3, 2, 1073741824));
  EXPECT_TRUE(persistent_launch_fits(4, 2, 1073741823));
  // A sequence that fits an H200 (2^20 tokens, 64 heads, D = 128: 68 GB of Q, K, V, O)
  // on 2 blocks: 2^18 items of 2^13 key tiles each is 2^31.
  EXPECT_FALSE(persistent_launch_fits(8192LL * 64, 2, 8192));
  EXPECT_TRUE(persistent_launch_fits(8192LL * 64, 3, 8192));
  EXPECT_TRUE(persistent_launch_fits(8192LL * 64, 132, 8192));
  // The item loop: item + gridDim.x stays in int.
  EXPECT_TRUE(persistent_launch_fits(2147483647LL - 132, 132, 1));
  EXPECT_FALSE(persistent_launch_fits(2147483647LL - 131, 132, 1));
  // Nothing to launch, or nonsense.
  EXPECT_FALSE(persistent_launch_fits(0, 1, 1));
  EXPECT_FALSE(persistent_launch_fits(1, 0, 1));
  EXPECT_FALSE(persistent_launch_fits(1, 1, 0));
}

}  // namespace
}  // namespace stsa
