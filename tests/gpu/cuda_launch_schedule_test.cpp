// The per-launch schedule of a device plan (src/cuda/launch_schedule.hpp)
// before anything reaches the device: what the kernel cannot count, and a new
// shape during graph capture, are refused before any upload, and an sm80
// launch gets its work order only. Needs the CUDA backend's library but no
// GPU: runs in CI wherever CUDA is built.
#include <gtest/gtest.h>

#include <string>

#include "cuda/device_plan_arrays.hpp"
#include "cuda/launch_schedule.hpp"
#include "cuda/work_items.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

// The launch's schedule is checked before anything is uploaded, and an sm80
// launch (not persistent) gets its order only: neither touches a GPU.
TEST(LaunchSchedule, RefusesWhatTheKernelCannotCountBeforeAnyUpload) {
  DevicePlan::Arrays plan;
  plan.rank_costs = {1073741824, 1073741824};
  CudaBackendOptions options;
  try {
    launch_schedule(plan, options, /*persistent=*/true, /*pairs=*/1, /*persistent_blocks=*/1, /*may_upload=*/true);
    ADD_FAILURE() << "no ResourceError";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("use more persistent blocks"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(plan.schedules.empty());
  for (const CudaWorkOrder order :
       {CudaWorkOrder::Auto, CudaWorkOrder::AcrossHeads, CudaWorkOrder::HeadByHead, CudaWorkOrder::HeavyFirst}) {
    options.work_order = order;
    const LaunchSchedule sm80 = launch_schedule(plan, options, /*persistent=*/false, 1, 1, /*may_upload=*/false);
    EXPECT_EQ(sm80.work_order, order == CudaWorkOrder::HeadByHead   ? kWorkHeadByHead
                               : order == CudaWorkOrder::HeavyFirst ? kWorkHeavyFirst
                                                                    : kWorkAcrossHeads);
    EXPECT_EQ(sm80.heavy_ranks, 0);  // equal costs: no rank is heavy
    EXPECT_EQ(sm80.blocks, 0);
    EXPECT_EQ(sm80.block_items, nullptr);
  }
  EXPECT_TRUE(plan.schedules.empty());
}

// A persistent launch shape whose balanced lists are not on the device yet, on
// a stream being captured: refused, saying what to warm up, with nothing
// uploaded. Round-robin and snake upload nothing (the kernel walks them by
// arithmetic): a new shape is fine during a capture, and its launch carries no lists.
TEST(LaunchSchedule, ANewShapeDuringGraphCaptureIsRefusedBeforeAnyUpload) {
  DevicePlan::Arrays plan;
  plan.rank_costs = {5, 3, 1};
  CudaBackendOptions balanced;
  balanced.block_schedule = CudaBlockSchedule::Balanced;
  try {
    launch_schedule(plan, balanced, /*persistent=*/true, /*pairs=*/4, /*persistent_blocks=*/2,
                    /*may_upload=*/false);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("captured into a CUDA graph"), std::string::npos) << what;
    EXPECT_NE(what.find("4 batch x heads, 2 persistent blocks"), std::string::npos) << what;
  }
  EXPECT_TRUE(plan.schedules.empty());

  const LaunchSchedule round_robin = launch_schedule(plan, CudaBackendOptions{}, /*persistent=*/true, /*pairs=*/4,
                                                     /*persistent_blocks=*/2, /*may_upload=*/false);
  EXPECT_EQ(round_robin.blocks, 2);
  EXPECT_EQ(round_robin.block_item_begin, nullptr);
  EXPECT_EQ(round_robin.block_items, nullptr);
  EXPECT_FALSE(round_robin.snake);
  ASSERT_EQ(plan.schedules.size(), 1u);
  EXPECT_EQ(plan.schedules[0].storage, nullptr);
  EXPECT_EQ(plan.schedules[0].bytes, 0u);

  // Snake uploads nothing either; heavy first carries its heavy ranks (rank 0
  // keeps 20 key tiles, above 1.5x the median's 3) to the kernel.
  plan.rank_costs = {20, 3, 3, 1};
  CudaBackendOptions snake;
  snake.work_order = CudaWorkOrder::HeavyFirst;
  snake.block_schedule = CudaBlockSchedule::Snake;
  const LaunchSchedule launch =
      launch_schedule(plan, snake, /*persistent=*/true, /*pairs=*/4, /*persistent_blocks=*/3, /*may_upload=*/false);
  EXPECT_TRUE(launch.snake);
  EXPECT_EQ(launch.work_order, kWorkHeavyFirst);
  EXPECT_EQ(launch.heavy_ranks, 1);
  EXPECT_EQ(launch.blocks, 3);
  EXPECT_EQ(launch.block_items, nullptr);
}

}  // namespace
}  // namespace stsa::cuda_detail
