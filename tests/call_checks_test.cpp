// What validate() refuses for every backend before anything runs: enum fields that
// hold no enum value (a cast integer), and a finite scale whose product with the
// descales and log2(e) is past fp32's range (the kernels keep it in fp32).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

const VideoLayout kLayout{{2, 3, 4, 0, TextPlacement::After}, 2, 2, 64};

testing::Problem problem() {
  const MaskSpec dense = MaskSpec::dense();
  const HeadMask head{dense, dense.natural_order(), TilePlan::build(kLayout.grid, dense), true};
  return testing::make_problem(kLayout, DType::F32, std::vector<HeadMask>(2, head), 7);
}

// `call` is refused by validate() and by every backend's run() with a message
// holding `fragment`, and nothing is written to the output.
void expect_refused(const testing::Problem& p, const AttentionCall& call, const std::string& fragment) {
  for (const Backend* backend : backends()) {
    try {
      backend->run(call);
      ADD_FAILURE() << backend->name() << " ran; expected '" << fragment << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << backend->name() << ": " << e.what();
    } catch (const Unsupported&) {  // a backend that refuses the call for its own reasons first
    }
    EXPECT_TRUE(std::isnan(p.o.view().load(0, 0, 0, 0))) << backend->name();  // still the poison
  }
  EXPECT_THROW(validate(call, /*require_plans=*/true), InvalidArgument);
}

TEST(CallChecks, DTypesOutsideTheEnumAreRefused) {
  testing::Problem p = problem();
  p.o.poison();
  AttentionCall call = p.call();
  call.o.dtype = DType(4);  // once ran and wrote nothing
  expect_refused(p, call, "o has dtype 4, not a DType value");
  call = p.call();
  call.q.dtype = call.k.dtype = call.v.dtype = DType(5);  // once ran with made-up values
  expect_refused(p, call, "q has dtype 5, not a DType value");
}

TEST(CallChecks, TokenOrdersOutsideTheEnumAreRefused) {
  testing::Problem p = problem();
  p.o.poison();
  AttentionCall call = p.call();
  call.heads[1].order = TokenOrder(2);
  expect_refused(p, call, "head 1's token order 2 is not a TokenOrder value");
  // A skipped head's fields are not read.
  call.heads[1].compute = false;
  EXPECT_NO_THROW(validate(call, true));
}

TEST(CallChecks, ScaleAndDescalesPastFp32AreRefused) {
  testing::Problem p = problem();
  p.o.poison();
  // A finite scale whose product with log2(e) overflows fp32 (it once made every output NaN).
  p.softmax_scale = 3e38f;
  expect_refused(p, p.call(), "scale x q_descale x k_descale = 3");
  p.softmax_scale = -3e38f;  // the magnitude counts
  expect_refused(p, p.call(), "past fp32's range");
  // Per-head descales, each finite: the largest product is named with its (batch, head).
  p.softmax_scale = 1.f;
  p.q_descale = {1.f, 1.f, 1e20f, 1.f};
  p.k_descale = {1.f, 1.f, 1e19f, 1.f};
  expect_refused(p, p.call(), "for (batch, head) (1, 0)");
  // Just inside: accepted, and the output is finite.
  p.k_descale = {1.f, 1.f, 1e18f, 1.f};  // 1e38 x log2(e) < 3.4e38
  for (const Backend* backend : backends()) {
    if (!backend->supports(p.call()).ok) continue;  // e.g. the CUDA backend on fp32, or without a GPU
    p.o.poison();
    ASSERT_NO_THROW(backend->run(p.call())) << backend->name();
    EXPECT_TRUE(std::isfinite(p.o.view().load(1, 0, 0, 0))) << backend->name();
  }
}

TEST(CallChecks, ScatteredOutputOverDescalesIsRefused) {
  // One computed head stored to head 1 of a two-head o, with q's descale in that head's last
  // element: the narrowed o that validate() sees (head 0) ends before it, so only the full
  // o's check can see the store over a factor the backend reads.
  const VideoLayout layout{kLayout.grid, 1, 1, 64};
  const MaskSpec dense = MaskSpec::dense();
  const HeadMask head{dense, dense.natural_order(), TilePlan::build(layout.grid, dense), true};
  const testing::Problem p = testing::make_problem(layout, DType::F32, {head}, 7);
  Tensor full(DType::F32, 1, layout.tokens(), 2, 64);
  const TensorView o = full.view();
  const std::int64_t last = o.offset(0, layout.tokens() - 1, 1, 63);
  o.store(0, layout.tokens() - 1, 1, 63, 1.f);
  AttentionCall call = p.call();
  call.o = {};
  call.lse = {};
  call.descales.q = std::span<const float>(static_cast<const float*>(o.data) + last, 1);
  const std::int64_t target[] = {1};
  const ScatteredOutput out{layout.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, target, o, {}};
  try {
    validate(scattered_call_for_checks(call, out), /*require_plans=*/true);
    ADD_FAILURE() << "a scattered o over q_descale was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("scattered output: o overlaps an input tensor (q_descale)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(backend("cpu").run_scattered(call, out), InvalidArgument);
}

}  // namespace
}  // namespace stsa
