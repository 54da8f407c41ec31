// The model behind CudaWorkOrder::Auto (src/cuda/work_order_model.hpp): the
// slowest block of a static round-robin schedule, and the choice it makes for
// the plans the first H200 run measured. Host only: runs in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/device_plan_image.hpp"
#include "cuda/work_order_model.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr double kItem = kItemOverheadTiles;

TEST(WorkOrderModel, EqualCostsBalanceInBothOrders) {
  const std::vector<std::int32_t> costs(10, 5);
  // 30 items over 7 blocks: at most 5 items (5 x (5 + overhead)) on one block, in either order.
  for (const WorkOrder order : {kWorkAcrossHeads, kWorkHeadByHead})
    EXPECT_DOUBLE_EQ(round_robin_makespan(costs, 3, 7, order), 5 * (5 + kItem));
  EXPECT_EQ(choose_work_order(costs, 3, 7), kWorkHeadByHead);
}

TEST(WorkOrderModel, HeadByHeadCanPileTheHeavyRowsOnOneBlock) {
  // Ranks {heavy, light}, two heads, two blocks. Across heads: each block gets one
  // heavy and one light item. Head by head: items 0 and 2 (both heavy) land on block 0.
  const std::vector<std::int32_t> costs{10, 1};
  EXPECT_DOUBLE_EQ(round_robin_makespan(costs, 2, 2, kWorkAcrossHeads), 10 + 1 + 2 * kItem);
  EXPECT_DOUBLE_EQ(round_robin_makespan(costs, 2, 2, kWorkHeadByHead), 2 * (10 + kItem));
  EXPECT_EQ(choose_work_order(costs, 2, 2), kWorkAcrossHeads);
}

TEST(WorkOrderModel, FewerItemsThanBlocksUseOneBlockEach) {
  const std::vector<std::int32_t> costs{7, 3};
  EXPECT_DOUBLE_EQ(round_robin_makespan(costs, 1, 132, kWorkHeadByHead), 7 + kItem);
  EXPECT_EQ(choose_work_order({}, 12, 132), kWorkHeadByHead);
}

// The run of 2026-11-30 (bench/gpu/RESULTS.md) timed sm90-overlap in both orders
// at 15 Wan2.1 cases (12 heads, 132 persistent blocks on an H200): across heads
// was faster at 720p with s = 0.1 and 0.2 only. The model must pick the faster
// order at each of them, from the same plans.
TEST(WorkOrderModel, PicksTheFasterOrderOfEveryMeasuredWan21Case) {
  struct Shape {
    const char* name;
    std::int64_t height, width;
  };
  for (const Shape shape : {Shape{"480p", 30, 52}, Shape{"720p", 45, 80}, Shape{"1440p", 90, 160}}) {
    const VideoGrid grid{21, shape.height, shape.width, 0, TextPlacement::After};
    for (const double density : {0.1, 0.2, 0.3, 0.5, 1.0}) {
      const MaskSpec spec = density < 1.0 ? mask_for_density(grid, SparseKind::Spatial, density) : MaskSpec::dense();
      const DevicePlanImage image = make_device_plan_image(*TilePlan::build(grid, spec));
      const bool across_was_faster = std::string(shape.name) == "720p" && density < 0.25;
      EXPECT_EQ(choose_work_order(image.rank_costs, 12, 132), across_was_faster ? kWorkAcrossHeads : kWorkHeadByHead)
          << shape.name << " s = " << density;
    }
  }
}

}  // namespace
}  // namespace stsa::cuda_detail
