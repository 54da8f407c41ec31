// Routed attention on every backend against the fp64 reference with the masks
// the heads were routed to: temporal heads run gathered in spatial-major order
// and come back in place; shapes are awkward on purpose.
#include <gtest/gtest.h>

#include "stsa/error.hpp"
#include "stsa/routed.hpp"
#include "stsa/synth.hpp"
#include "support/routed_cases.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

RoutedCall routed_call(const testing::Problem& p) {
  const AttentionCall c = p.call();
  return RoutedCall{c.layout, c.q, c.k, c.v, c.o, c.lse, c.softmax_scale};
}

// Decisions cycling through every route, checked on every backend that supports the call.
void check_given_decisions(const VideoLayout& layout, DType dtype, std::uint64_t seed) {
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  const std::vector<HeadRoute>& decisions = given.decisions;
  for (const Backend* backend : backends()) {
    testing::Problem p = testing::make_problem(layout, dtype, given.reference_masks, seed);
    SCOPED_TRACE(std::string(backend->name()) + " " + p.label);
    AttentionCall probe = p.call();
    if (!backend->supports(probe).ok) continue;
    PlanCache plans;
    const RoutedResult r = run_routed(*backend, plans, routed_call(p), decisions);
    const testing::Comparison cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
    std::int64_t temporal = 0;
    for (const auto& d : decisions) temporal += d.route == Route::Temporal;
    EXPECT_EQ(std::int64_t(r.temporal.size()), temporal);
    EXPECT_GT(r.kept_tile_flops, 0.0);
    if (temporal > 0) {
      EXPECT_GT(r.permutation_bytes, 0.0);
    }
  }
}

TEST(RoutedAttention, GivenDecisionsMatchTheReferenceOnAwkwardShapes) {
  const std::uint64_t seed = testing::fresh_seed();
  check_given_decisions({{1, 7, 9, 0, TextPlacement::After}, 1, 4, 64}, DType::F32, seed);        // one frame
  check_given_decisions({{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 80}, DType::BF16, seed + 1);  // text before
  check_given_decisions({{4, 5, 6, 70, TextPlacement::After}, 1, 4, 128}, DType::F32, seed + 2);   // text after
  check_given_decisions({{6, 11, 13, 0, TextPlacement::After}, 1, 4, 64}, DType::BF16, seed + 3);  // 858 tokens
}

TEST(RoutedAttention, RoutesSyntheticHeadsAndMatchesTheReference) {
  const testing::SyntheticRoutedCase c = testing::synthetic_routed_case(DType::F32, testing::fresh_seed());
  const RoutingReport& report = c.report;
  // Both sparse routes, so the permuted path runs too.
  ASSERT_GT(testing::count_routes(report.heads, Route::Temporal), 0);
  ASSERT_GT(testing::count_routes(report.heads, Route::Spatial), 0);
  for (const Backend* backend : backends()) {
    testing::Problem p = c.problem();
    if (!backend->supports(p.call()).ok) continue;
    SCOPED_TRACE(std::string(backend->name()));
    PlanCache plans;
    const RoutedResult r = routed_attention(*backend, plans, routed_call(p), c.router);
    ASSERT_EQ(r.heads.size(), report.heads.size());
    for (std::size_t h = 0; h < r.heads.size(); ++h) EXPECT_EQ(r.heads[h].route, report.heads[h].route);
    EXPECT_GT(r.routing_ms, 0.0);
    const testing::Comparison cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
  }
}

TEST(RoutedAttention, RejectsMismatchedDecisionsAndTensors) {
  const VideoLayout layout{{3, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  PlanCache plans;
  const Backend& ref = backend("reference");
  EXPECT_THROW(run_routed(ref, plans, routed_call(p), std::vector<HeadRoute>(1)), InvalidArgument);
  RoutedCall bad = routed_call(p);
  bad.layout.grid.frames = 4;  // layout does not match the tensors
  EXPECT_THROW(run_routed(ref, plans, bad, std::vector<HeadRoute>(2)), InvalidArgument);
  bad = routed_call(p);
  bad.o = bad.q;  // output aliases an input
  EXPECT_THROW(run_routed(ref, plans, bad, std::vector<HeadRoute>(2)), InvalidArgument);
  RouterOptions ro;
  ro.samples = 8;
  EXPECT_THROW(routed_attention(ref, plans, bad, Router(ro)), InvalidArgument);
}

}  // namespace
}  // namespace stsa
