// Arguments of the CUDA API's helpers that are refused before any GPU is asked
// for: InvalidArgument with or without a device. Needs the CUDA backend's
// library, no GPU.
#include <gtest/gtest.h>

#ifdef STSA_HAS_CUDA
#include <string>
#include <vector>

#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/tensor.hpp"
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

// Grouped K/V with every head temporal: the gather would copy a K/V head per temporal head
// and hand the backend an ungrouped call, which passed its refusal. Refused first, by name,
// before any GPU is asked for (here there may be none); so is the router (the backend:
// GroupedQueryAttention.HeadCountsThatDoNotGroupAreRefused).
TEST(CudaApiChecks, GroupedQueryAttentionIsRefusedWhateverTheHeadsRoutes) {
  const VideoLayout layout{{3, 4, 4, 0, TextPlacement::After}, 1, 4, 64};
  Tensor q(DType::BF16, 1, layout.tokens(), 4, 64), o(DType::BF16, 1, layout.tokens(), 4, 64);
  Tensor k(DType::BF16, 1, layout.tokens(), 2, 64), v(DType::BF16, 1, layout.tokens(), 2, 64);
  const RoutedCall call{layout, q.view(), k.view(), v.view(), o.view(), LseView{}};
  RouterOptions router;
  router.temporal_density = 0.5;
  HeadRoute head;
  head.route = Route::Temporal;
  head.spec = route_spec(layout.grid, Route::Temporal, router);
  const std::vector<HeadRoute> temporal(4, head);
  const CudaBackend backend;
  PlanCache plans;
  const auto expect_refused = [](const auto& run, const std::string& who) {
    try {
      run();
      ADD_FAILURE() << who << ": not refused";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find(who + "no grouped-query attention on the GPU yet (k and v with 2 heads "
                                                 "for q's 4"),
                std::string::npos)
          << e.what();
    }
  };
  expect_refused([&] { cuda_run_routed(backend, plans, call, temporal); }, "cuda routed attention: ");
  expect_refused([&] { cuda_route(Router(router), layout, call.q, call.k, call.v, TokenOrder::FrameMajor); },
                 "cuda router: ");
}

#else

TEST(CudaApiChecks, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace stsa
