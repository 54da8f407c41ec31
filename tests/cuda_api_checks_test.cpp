// Arguments of the CUDA API's helpers that are refused before any GPU is asked
// for: InvalidArgument with or without a device. Needs the CUDA backend's
// library, no GPU.
#include <gtest/gtest.h>

#ifdef STSA_HAS_CUDA
#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"
#include "stsa/routed.hpp"
#endif

namespace stsa {
namespace {

#ifdef STSA_HAS_CUDA

// -1 is the current device; -2 was taken as the current one too.
TEST(CudaApiChecks, ADeviceIndexBelowMinusOneIsInvalid) {
  EXPECT_THROW(cuda_device_info(-2), InvalidArgument);
  EXPECT_THROW(cuda_device_info(-1000), InvalidArgument);
}

// -1 means every head; -5 was taken as every head too, and [0, heads] stays as it was.
TEST(CudaApiChecks, AWorkspaceForANegativeHeadCountOtherThanMinusOneIsInvalid) {
  RoutedCall call;
  call.layout = {{2, 4, 4, 0, TextPlacement::After}, 1, 3, 64};
  EXPECT_THROW(CudaRoutedWorkspace(call, -5), InvalidArgument);
  EXPECT_THROW(CudaRoutedWorkspace(call, 4), InvalidArgument);
  EXPECT_GT(CudaRoutedWorkspace::bytes_needed(call, 3, false), 0u);
}

#else

TEST(CudaApiChecks, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace stsa
