// Grouped-query attention: K and V with fewer heads than Q, query head h reading
// K/V head h / (H / Hkv). By definition the call equals the one whose K and V
// repeat each head for its query heads (torch's repeat_interleave); every backend,
// the router and routed attention are checked against that copy and against the
// fp64 reference, on fresh random inputs and awkward shapes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/route_eval.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/cpu_isas.hpp"
#include "support/routed_cases.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

// What `f` throws as InvalidArgument ("(none)" when it throws nothing).
template <class F>
std::string invalid_message(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(none)";
}

// `p` with fresh K and V of `kv_heads` heads (in p's dtype and memory layout).
void group_kv(testing::Problem& p, std::int64_t kv_heads, std::uint64_t seed) {
  const VideoLayout& l = p.layout;
  p.k = Tensor(p.dtype, l.batch, l.tokens(), kv_heads, l.head_dim, p.memory);
  p.v = Tensor(p.dtype, l.batch, l.tokens(), kv_heads, l.head_dim, p.memory);
  testing::fill_normal(p.k.view(), seed * 7 + 1);
  testing::fill_normal(p.v.view(), seed * 7 + 2);
  p.label += " Hkv=" + std::to_string(kv_heads);
}

// The same problem with K and V repeated per query head, as the definition reads them:
// head h holds K/V head h / (H / Hkv). Copies values exactly (same dtype).
testing::Problem repeated_kv(const testing::Problem& grouped) {
  testing::Problem p = grouped;
  const VideoLayout& l = p.layout;
  const std::int64_t group = l.heads / grouped.k.view().heads();
  p.k = Tensor(p.dtype, l.batch, l.tokens(), l.heads, l.head_dim, p.memory);
  p.v = Tensor(p.dtype, l.batch, l.tokens(), l.heads, l.head_dim, p.memory);
  const TensorView k = grouped.k.view(), v = grouped.v.view(), k_out = p.k.view(), v_out = p.v.view();
  for (std::int64_t b = 0; b < l.batch; ++b)
    for (std::int64_t n = 0; n < l.tokens(); ++n)
      for (std::int64_t h = 0; h < l.heads; ++h)
        for (std::int64_t d = 0; d < l.head_dim; ++d) {
          k_out.store(b, n, h, d, k.load(b, n, h / group, d));
          v_out.store(b, n, h, d, v.load(b, n, h / group, d));
        }
  return p;
}

// O and LSE of two calls, bit for bit (NaN where the other has the same NaN).
void expect_same_outputs(const AttentionCall& a, const AttentionCall& b, const std::string& what) {
  const VideoLayout& l = a.layout;
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  std::int64_t compared = 0;
  for (std::int64_t bt = 0; bt < l.batch; ++bt)
    for (std::int64_t h = 0; h < l.heads; ++h)
      for (std::int64_t n = 0; n < l.tokens(); ++n) {
        ASSERT_EQ(bits(a.lse.at(bt, h, n)), bits(b.lse.at(bt, h, n)))
            << what << " lse (b, h, n) = " << bt << ", " << h << ", " << n;
        for (std::int64_t d = 0; d < l.head_dim; ++d, ++compared)
          ASSERT_EQ(bits(a.o.load(bt, n, h, d)), bits(b.o.load(bt, n, h, d)))
              << what << " o (b, n, h, d) = " << bt << ", " << n << ", " << h << ", " << d;
      }
  EXPECT_EQ(compared, l.batch * l.heads * l.tokens() * l.head_dim);
}

struct Case {
  VideoGrid grid;
  std::int64_t batch, heads, kv_heads, head_dim;
  DType in, out;
  MemoryLayout memory = MemoryLayout::BNHD;
  bool descales = false;
};

const Case kCases[] = {
    {{3, 5, 7, 0, TextPlacement::After}, 1, 4, 2, 64, DType::BF16, DType::BF16},
    {{1, 9, 11, 13, TextPlacement::Before}, 2, 6, 3, 128, DType::F16, DType::F32},  // one frame, text before
    {{4, 6, 10, 20, TextPlacement::After}, 1, 4, 1, 80, DType::F32, DType::F16},    // one K/V head for all
    {{2, 12, 16, 7, TextPlacement::Before}, 1, 8, 2, 128, DType::BF16, DType::F32, MemoryLayout::BHND},
    {{3, 4, 6, 5, TextPlacement::After}, 2, 6, 2, 64, DType::F8E4M3, DType::BF16, MemoryLayout::BNHD, true},
};

testing::Problem grouped_problem(const Case& c, PlanCache& plans, std::uint64_t seed) {
  const VideoLayout layout{c.grid, c.batch, c.heads, c.head_dim};
  testing::Problem p = testing::make_problem(layout, c.in, testing::mixed_heads(layout, 0.3, plans), seed, c.memory, c.out);
  group_kv(p, c.kv_heads, seed);
  if (c.descales) testing::give_descales(p, seed);
  return p;
}

// The definition on the reference itself: the grouped call is the repeated one.
TEST(GroupedQueryAttention, TheReferenceReadsEachQueryHeadsKvHead) {
  std::uint64_t seed = testing::fresh_seed();
  for (const Case& c : kCases) {
    PlanCache plans;
    testing::Problem grouped = grouped_problem(c, plans, ++seed);
    testing::Problem repeated = repeated_kv(grouped);
    SCOPED_TRACE(grouped.label);
    const Backend& reference = backend("reference");
    reference.run(grouped.call());
    reference.run(repeated.call());
    expect_same_outputs(grouped.call(), repeated.call(), "reference");
  }
}

// Every kernel of this machine: within the bound of the fp64 reference, and the bits of
// the call on repeated K and V (the same panels are packed, only read from another head).
TEST(GroupedQueryAttention, TheCpuBackendMatchesTheReferenceAndTheRepeatedCall) {
  std::uint64_t seed = testing::fresh_seed();
  for (const Case& c : kCases)
    for (Isa isa : testing::isas_of_this_machine()) {
      PlanCache plans;
      testing::Problem grouped = grouped_problem(c, plans, ++seed);
      testing::Problem repeated = repeated_kv(grouped);
      SCOPED_TRACE(grouped.label + " isa " + std::string(to_string(isa)));
      const auto cpu = make_cpu_backend({isa, 2});
      cpu->run(grouped.call());
      cpu->run(repeated.call());
      const testing::Comparison cmp = testing::compare_with_reference(grouped, testing::kMatrixRows);
      EXPECT_TRUE(cmp.ok()) << cmp.failure;
      expect_same_outputs(grouped.call(), repeated.call(), "cpu");
    }
}

// The CPU backend packs a K/V head once for the query heads of its group that use the
// same key tiles; here the group's heads differ in their tile shapes (only some share),
// one K/V head holds a NaN and the other a V value too small for bf16 products (the
// panels' flags, which pick each head's path, hold for every head that reads them).
TEST(GroupedQueryAttention, HeadsShareAKvHeadsPanelsOnlyWhereTheirKeyTilesMatch) {
  const VideoLayout layout{{5, 6, 9, 7, TextPlacement::After}, 2, 6, 64};
  std::uint64_t seed = testing::fresh_seed();
  for (DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (Isa isa : testing::isas_of_this_machine()) {
      PlanCache plans;
      const TileShape tiles[] = {{64, 64}, {64, 128}, {128, 64}, {64, 64}, {128, 128}, {64, 128}};
      const SparseKind kinds[] = {SparseKind::Spatial, SparseKind::Temporal, SparseKind::FrameWindow};
      std::vector<HeadMask> heads;
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        const MaskSpec spec = mask_for_density(layout.grid, kinds[h % 3], 0.4);
        heads.push_back(HeadMask{spec, spec.natural_order(), plans.get(layout.grid, spec, tiles[h]), true});
      }
      testing::Problem grouped =
          testing::make_problem(layout, dtype, heads, ++seed, MemoryLayout::BNHD, DType::F32);
      group_kv(grouped, 2, seed);
      const TensorView v = grouped.v.view();
      v.store(1, 17, 1, 5, std::numeric_limits<float>::quiet_NaN());
      v.store(0, 40, 0, 3, 0x1p-100f * (dtype == DType::F16 ? 0.f : 1.f));  // fp16 holds no such value
      testing::Problem repeated = repeated_kv(grouped);
      SCOPED_TRACE(grouped.label + " isa " + std::string(to_string(isa)));
      const auto cpu = make_cpu_backend({isa, 2});
      cpu->run(grouped.call());
      cpu->run(repeated.call());
      expect_same_outputs(grouped.call(), repeated.call(), "cpu");
      EXPECT_TRUE(std::isnan(grouped.call().o.load(1, 0, 3, 5)));  // a row of head 3 (K/V head 1) reads the NaN
    }
}

// The router samples each query head against its K/V head: the same errors, bit for bit,
// as on repeated K and V, and so the same decisions.
TEST(GroupedQueryAttention, TheRouterScoresEachQueryHeadAgainstItsKvHead) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::uint64_t seed = testing::fresh_seed();
    testing::SyntheticRoutedCase s = testing::synthetic_routed_case(dtype, seed);
    testing::Problem grouped = s.problem();
    group_kv(grouped, 2, seed);
    testing::Problem repeated = repeated_kv(grouped);
    SCOPED_TRACE(grouped.label);
    const VideoLayout& layout = grouped.layout;
    const RoutingReport a = s.router.route(layout, grouped.q.view(), grouped.k.view(), grouped.v.view());
    const RoutingReport b = s.router.route(layout, repeated.q.view(), repeated.k.view(), repeated.v.view());
    ASSERT_EQ(a.heads.size(), b.heads.size());
    for (std::size_t h = 0; h < a.heads.size(); ++h) {
      EXPECT_EQ(a.heads[h].route, b.heads[h].route) << "head " << h;
      ASSERT_EQ(a.heads[h].candidates.size(), b.heads[h].candidates.size());
      for (std::size_t c = 0; c < a.heads[h].candidates.size(); ++c)
        EXPECT_EQ(a.heads[h].candidates[c].mse, b.heads[h].candidates[c].mse) << "head " << h << " candidate " << c;
    }
    EXPECT_EQ(a.flops, b.flops);
  }
}

// Routed attention with temporal heads that share a K/V head (one K/V head for all
// eight, then pairs): the gather fused into the CPU kernel's loads, the gather as a
// pass (a K/V head copied for each of its temporal heads), and the reference backend
// (no fused step) all give the repeated call's bits, within the reference's bound.
TEST(GroupedQueryAttention, RoutedAttentionPermutesEachTemporalHeadsKvHead) {
  const VideoLayout layout{{5, 6, 7, 9, TextPlacement::Before}, 2, 8, 64};
  const testing::CyclingDecisions cycle = testing::cycling_decisions(layout);
  std::uint64_t seed = testing::fresh_seed();
  for (const std::int64_t kv_heads : {1, 4})
    for (const bool fuse_gather : {true, false})
      for (const char* name : {"cpu", "reference"}) {
        PlanCache plans;
        testing::Problem grouped = testing::make_problem(layout, DType::BF16, cycle.reference_masks, ++seed,
                                                         MemoryLayout::BNHD, DType::F32);
        group_kv(grouped, kv_heads, seed);
        testing::Problem repeated = repeated_kv(grouped);
        SCOPED_TRACE(grouped.label + " " + name + (fuse_gather ? " fused gather" : " gather pass"));
        const std::unique_ptr<Backend> cpu = make_cpu_backend({Isa::Auto, 2});
        const Backend& runs = std::string(name) == "cpu" ? *cpu : backend("reference");
        RoutedOptions options;
        options.fuse_gather = fuse_gather;
        options.tile = {64, 64};
        for (testing::Problem* p : {&grouped, &repeated}) {
          const AttentionCall call = p->call();
          const RoutedResult result = run_routed(
              runs, plans, RoutedCall{layout, call.q, call.k, call.v, call.o, call.lse}, cycle.decisions, options);
          EXPECT_EQ(result.temporal, (std::vector<std::int64_t>{0, 4}));
          EXPECT_EQ(result.gather_fused, fuse_gather && runs.runs_gathered());
        }
        const testing::Comparison cmp = testing::compare_with_reference(grouped, testing::kMatrixRows);
        EXPECT_TRUE(cmp.ok()) << cmp.failure;
        expect_same_outputs(grouped.call(), repeated.call(), name);
      }
}

// The routed output's evaluation against dense attention (stsa route --eval-rows) reads each
// head's K/V head: the errors of the repeated call, bit for bit (they were ~1: other heads' keys).
TEST(GroupedQueryAttention, TheRouteEvaluationReadsEachQueryHeadsKvHead) {
  const VideoLayout layout{{4, 5, 6, 3, TextPlacement::Before}, 1, 4, 64};
  const testing::CyclingDecisions cycle = testing::cycling_decisions(layout);
  PlanCache plans;
  const std::uint64_t seed = testing::fresh_seed();
  testing::Problem grouped = testing::make_problem(layout, DType::F32, cycle.reference_masks, seed);
  group_kv(grouped, 2, seed);
  testing::Problem repeated = repeated_kv(grouped);
  SCOPED_TRACE(grouped.label);
  std::vector<RouteEvaluation> evaluations;
  for (testing::Problem* p : {&grouped, &repeated}) {
    const AttentionCall call = p->call();
    run_routed(backend("reference"), plans, RoutedCall{layout, call.q, call.k, call.v, call.o, call.lse},
               cycle.decisions);
    evaluations.push_back(evaluate_routes(layout, call.q, call.k, call.v, call.o, cycle.decisions, 0, 1));
  }
  EXPECT_EQ(evaluations[0].routed_squared_error, evaluations[1].routed_squared_error);
  EXPECT_EQ(evaluations[0].first_block_squared_error, evaluations[1].first_block_squared_error);
  EXPECT_EQ(evaluations[0].reference_squared, evaluations[1].reference_squared);
  // The dense head's routed output is the dense reference's, up to its fp32 rounding.
  EXPECT_LT(evaluations[0].rel_l2(evaluations[0].routed_squared_error, cycle.decisions, {Route::Dense}), 1e-6);
}

// Head counts that do not group are named; backends that do not take grouping say so.
TEST(GroupedQueryAttention, HeadCountsThatDoNotGroupAreRefused) {
  const VideoLayout layout{{2, 3, 4, 0, TextPlacement::After}, 1, 4, 64};
  PlanCache plans;
  const auto expect_refused = [&](std::int64_t k_heads, std::int64_t v_heads, const std::string& pattern) {
    testing::Problem p = testing::make_problem(layout, DType::F32, testing::mixed_heads(layout, 0.5, plans), 1);
    p.k = Tensor(DType::F32, 1, layout.tokens(), k_heads, 64);
    p.v = Tensor(DType::F32, 1, layout.tokens(), v_heads, 64);
    const std::string what = invalid_message([&] { validate(p.call(), true); });
    EXPECT_NE(what.find(pattern), std::string::npos) << what;
    const std::string routing = invalid_message(
        [&] { Router(RouterOptions{}).route(layout, p.q.view(), p.k.view(), p.v.view()); });
    EXPECT_NE(routing.find("router: " + pattern), std::string::npos) << routing;
  };
  expect_refused(3, 3, "k and v hold 3 heads: grouped-query attention needs a count that divides q's 4");
  expect_refused(8, 8, "k and v hold 8 heads");
  expect_refused(2, 1, "k and v must hold as many heads, got 2 and 1");

  testing::Problem grouped = testing::make_problem(layout, DType::BF16, testing::mixed_heads(layout, 0.5, plans), 2);
  group_kv(grouped, 2, 2);
  bool saw_cuda = false;
  for (const Backend* b : backends()) {
    const Support s = b->supports(grouped.call());
    if (b->name() == "cuda") {
      saw_cuda = true;
      EXPECT_FALSE(s.ok);
      EXPECT_NE(s.why.find("the cuda backend: no grouped-query attention"), std::string::npos) << s.why;
    } else {
      EXPECT_TRUE(s.ok) << b->name() << ": " << s.why;
    }
  }
#ifdef STSA_HAS_CUDA
  EXPECT_TRUE(saw_cuda);  // its refusal is a host check: made here without a GPU
#else
  EXPECT_FALSE(saw_cuda);
#endif
}

}  // namespace
}  // namespace stsa
