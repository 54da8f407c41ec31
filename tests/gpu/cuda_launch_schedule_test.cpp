// The per-launch schedule of a device plan (src/cuda/launch_schedule.hpp)
// before anything reaches the device: what the kernel cannot count is refused
// before any upload, and an sm80 launch gets its work order only. Needs the
// CUDA backend's library, no GPU: runs in CI.
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
    launch_schedule(plan, options, /*persistent=*/true, /*pairs=*/1, /*persistent_blocks=*/1);
    ADD_FAILURE() << "no ResourceError";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("use more persistent blocks"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(plan.schedules.empty());
  for (const CudaWorkOrder order : {CudaWorkOrder::Auto, CudaWorkOrder::AcrossHeads, CudaWorkOrder::HeadByHead}) {
    options.work_order = order;
    const LaunchSchedule sm80 = launch_schedule(plan, options, /*persistent=*/false, 1, 1);
    EXPECT_EQ(sm80.work_order, order == CudaWorkOrder::HeadByHead ? kWorkHeadByHead : kWorkAcrossHeads);
    EXPECT_EQ(sm80.blocks, 0);
    EXPECT_EQ(sm80.block_items, nullptr);
  }
  EXPECT_TRUE(plan.schedules.empty());
}

}  // namespace
}  // namespace stsa::cuda_detail
