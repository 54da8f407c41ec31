// The model behind CudaWorkOrder::Auto (src/cuda/work_order_model.hpp): the
// slowest block of a block schedule in either order, and the choice it makes
// for the plans the H200 runs measured. Host only: runs in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/work_order_model.hpp"
#include "support/measured_wan21_plans.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr std::int64_t kItem = kItemOverheadTiles;

std::int64_t makespan(const std::vector<std::int32_t>& costs, std::int64_t pairs, std::int64_t blocks,
                      WorkOrder order, CudaBlockSchedule policy = CudaBlockSchedule::RoundRobin) {
  return make_block_schedule(costs, pairs, blocks, order, policy).makespan;
}

TEST(WorkOrderModel, EqualCostsBalanceInBothOrders) {
  const std::vector<std::int32_t> costs(10, 5);
  // 30 items over 7 blocks: at most 5 items (5 x (5 + overhead)) on one block, in either order.
  for (const WorkOrder order : {kWorkAcrossHeads, kWorkHeadByHead})
    EXPECT_EQ(makespan(costs, 3, 7, order), 5 * (5 + kItem));
  for (const CudaBlockSchedule policy : {CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Balanced})
    EXPECT_EQ(choose_work_order(costs, 3, 7, policy).order, kWorkHeadByHead);
}

TEST(WorkOrderModel, HeadByHeadCanPileTheHeavyRowsOnOneBlock) {
  // Ranks {heavy, light}, two heads, two blocks. Across heads: each block gets one
  // heavy and one light item. Head by head, round-robin: items 0 and 2 (both
  // heavy) land on block 0. The balanced schedule moves item 2 to block 1.
  const std::vector<std::int32_t> costs{10, 1};
  EXPECT_EQ(makespan(costs, 2, 2, kWorkAcrossHeads), 10 + 1 + 2 * kItem);
  EXPECT_EQ(makespan(costs, 2, 2, kWorkHeadByHead), 2 * (10 + kItem));
  EXPECT_EQ(choose_work_order(costs, 2, 2, CudaBlockSchedule::RoundRobin).order, kWorkAcrossHeads);
  const OrderChoice balanced = choose_work_order(costs, 2, 2, CudaBlockSchedule::Balanced);
  EXPECT_EQ(balanced.order, kWorkHeadByHead);
  EXPECT_EQ(balanced.schedule.makespan, 10 + 1 + 2 * kItem);
}

TEST(WorkOrderModel, FewerItemsThanBlocksUseOneBlockEach) {
  const std::vector<std::int32_t> costs{7, 3};
  EXPECT_EQ(makespan(costs, 1, 132, kWorkHeadByHead), 7 + kItem);
  EXPECT_EQ(choose_work_order(costs, 1, 132, CudaBlockSchedule::Balanced).schedule.blocks(), 2);
}

// The run of 2026-11-30 (bench/gpu/RESULTS.md) timed sm90-overlap in both orders
// at 15 Wan2.1 cases (12 heads, 132 persistent blocks on an H200, round-robin):
// across heads was faster at 720p with s = 0.1 and 0.2 only. The model must
// pick the faster order at each of them, from the same plans.
TEST(WorkOrderModel, PicksTheFasterOrderOfEveryMeasuredWan21Case) {
  for (const MeasuredPlan& plan : measured_wan21_plans()) {
    SCOPED_TRACE(::testing::Message() << plan.shape << " s = " << plan.density);
    const bool across_was_faster = plan.shape == "720p" && plan.density < 0.25;
    EXPECT_EQ(choose_work_order(plan.rank_costs, 12, 132, CudaBlockSchedule::RoundRobin).order,
              across_was_faster ? kWorkAcrossHeads : kWorkHeadByHead);
    // Balanced (heavy items first where that evens the blocks out), head by
    // head stays within the bound of across heads everywhere: 480p s = 0.1 was
    // the exception in walk order (1.22x against 1.01x), 1.008x heavy first.
    EXPECT_EQ(choose_work_order(plan.rank_costs, 12, 132, CudaBlockSchedule::Balanced).order, kWorkHeadByHead);
  }
}

}  // namespace
}  // namespace stsa::cuda_detail
