// The launch sizes the CUDA backend refuses before the first launch of a call
// (src/cuda/launch_schedule.hpp): a call of several launches (more than 64
// heads, or heads with different plans) runs whole or not at all. Needs the
// CUDA backend's library, no GPU.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#ifdef STSA_HAS_CUDA
#include "cuda/device_plan_arrays.hpp"
#include "cuda/launch_schedule.hpp"
#include "stsa/error.hpp"
#endif

namespace stsa {
namespace {

#ifdef STSA_HAS_CUDA

// The sm80 kernel runs one block per (query tile, batch x head) and counts them
// in 32 bits: a grid past that is a ResourceError from the schedule, which the
// backend asks for every launch of a call before it launches any.
TEST(CudaLaunchChecks, AnSm80GridPastTheKernelsCountIsRefusedBeforeAnyLaunch) {
  DevicePlan::Arrays plan;
  plan.q_tiles = 2363;  // 302,400 tokens in 128-row tiles
  plan.rank_costs.assign(std::size_t(plan.q_tiles), 1);
  const CudaBackendOptions options;
  const std::int64_t largest = INT_MAX / plan.q_tiles;
  EXPECT_NO_THROW(cuda_detail::launch_schedule(plan, options, /*persistent=*/false, 2 * 64, 0, false));
  EXPECT_NO_THROW(cuda_detail::launch_schedule(plan, options, /*persistent=*/false, largest, 0, false));
  EXPECT_THROW(cuda_detail::launch_schedule(plan, options, /*persistent=*/false, largest + 1, 0, false),
               ResourceError);
  // A batch past int (the launch's own parameters hold it as int) is caught too.
  EXPECT_THROW(cuda_detail::launch_schedule(plan, options, /*persistent=*/false, (std::int64_t(1) << 32) + 1, 0, false),
               ResourceError);
}

#else

TEST(CudaLaunchChecks, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace stsa
