// Routed attention on every backend against the fp64 reference with the masks
// the heads were routed to: temporal heads run gathered in spatial-major order
// and come back in place; shapes are awkward on purpose.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/permute.hpp"
#include "stsa/routed.hpp"
#include "stsa/synth.hpp"
#include "support/routed_cases.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

RoutedCall routed_call(const testing::Problem& p) {
  const AttentionCall c = p.call();
  return RoutedCall{c.layout, c.q, c.k, c.v, c.o, c.lse, c.softmax_scale, c.descales};
}

// Decisions cycling through every route, checked on every backend that supports the call.
// With descales, the temporal heads' (gathered, packed) calls must carry their own heads' factors.
void check_given_decisions(const VideoLayout& layout, DType dtype, std::uint64_t seed, bool descales = false) {
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  const std::vector<HeadRoute>& decisions = given.decisions;
  for (const Backend* backend : backends()) {
    testing::Problem p = testing::make_problem(layout, dtype, given.reference_masks, seed);
    if (descales) testing::give_descales(p, seed);
    SCOPED_TRACE(std::string(backend->name()) + " " + p.label);
    AttentionCall probe = p.call();
    if (!backend->supports(probe).ok) continue;
    PlanCache plans;
    const RoutedResult r = run_routed(*backend, plans, routed_call(p), decisions);
    const testing::Comparison cmp = testing::compare_with_reference(p, testing::kMatrixRows, seed);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
    std::int64_t temporal = 0;
    for (const auto& d : decisions) temporal += d.route == Route::Temporal;
    EXPECT_EQ(std::int64_t(r.temporal.size()), temporal);
    EXPECT_GT(r.kept_tile_flops, 0.0);
    // The CPU backend reads and stores the temporal heads in place: no permutation pass.
    EXPECT_EQ(r.gather_fused, temporal > 0 && backend->runs_gathered() && backend->runs_scattered());
    if (temporal > 0) {
      EXPECT_EQ(r.permutation_bytes > 0.0, !r.gather_fused);
    }
  }
}

TEST(RoutedAttention, GivenDecisionsMatchTheReferenceOnAwkwardShapes) {
  const std::uint64_t seed = testing::fresh_seed();
  check_given_decisions({{1, 7, 9, 0, TextPlacement::After}, 1, 4, 64}, DType::F32, seed);        // one frame
  check_given_decisions({{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 80}, DType::BF16, seed + 1);  // text before
  check_given_decisions({{4, 5, 6, 70, TextPlacement::After}, 1, 4, 128}, DType::F32, seed + 2);   // text after
  check_given_decisions({{6, 11, 13, 0, TextPlacement::After}, 1, 4, 64}, DType::BF16, seed + 3);  // 858 tokens
  check_given_decisions({{3, 5, 7, 6, TextPlacement::After}, 1, 4, 128}, DType::F8E4M3, seed + 4);  // fp8 inputs
  check_given_decisions({{3, 5, 7, 6, TextPlacement::After}, 2, 5, 64}, DType::F8E4M3, seed + 5, /*descales=*/true);
  check_given_decisions({{4, 6, 5, 9, TextPlacement::Before}, 1, 6, 80}, DType::F32, seed + 6, /*descales=*/true);
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

// A host executor that offers the fused scatter (as the CUDA one does), doing
// it as attention into its own packed output and scatter_heads, and noting
// what run_routed() asked of it.
class FusingHostExecutor final : public RoutedExecutor {
 public:
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override {
    asked_for_output = with_output;
    return host_.allocate(call, count, with_output);
  }
  void gather(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
              std::span<const TensorView> sources, std::span<const TensorView> packed) override {
    host_.gather(grid, from, to, heads, sources, packed);
  }
  void scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
               std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse,
               const LseView& lse) override {
    ++scatters;
    host_.scatter(grid, from, to, heads, packed, dests, packed_lse, lse);
  }
  void attend(const Backend& backend, const AttentionCall& call) override { host_.attend(backend, call); }
  bool fuses_scatter(const Backend&) const override { return true; }
  void attend_scattered(const Backend& backend, const AttentionCall& packed, const ScatteredOutput& out) override {
    ++fused_calls;
    EXPECT_EQ(packed.o.data, nullptr);  // no packed output was allocated
    AttentionCall with_output = packed;
    Tensor o(out.o.dtype, packed.layout.batch, packed.layout.tokens(), packed.layout.heads, packed.layout.head_dim);
    LseBuffer lse;
    if (out.lse.data != nullptr) lse = LseBuffer(packed.layout.batch, packed.layout.heads, packed.layout.tokens());
    with_output.o = o.view();
    with_output.lse = lse.view();
    backend.run(with_output);
    const TensorView packed_o[] = {with_output.o};
    const TensorView full_o[] = {out.o};
    scatter_heads(out.grid, out.from, out.to, out.heads, packed_o, full_o, with_output.lse, out.lse);
  }
  int mark() override { return host_.mark(); }
  double elapsed_ms(int from, int to) override { return host_.elapsed_ms(from, to); }

  bool asked_for_output = true;
  int scatters = 0, fused_calls = 0;

 private:
  HostRoutedExecutor host_;
};

// The host executor on the CPU backend reads the temporal heads' Q, K, V in
// place and stores their O, LSE in place: nothing allocated, no permutation
// pass, and the same bytes as with the gather as a pass (fuse_gather off) and
// with both passes (fuse_scatter off).
TEST(RoutedAttention, AFusedGatherReadsInPlaceAndMatchesThePasses) {
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 64};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  const std::uint64_t seed = testing::fresh_seed();
  const Backend& cpu = backend("cpu");
  PlanCache plans;
  std::vector<testing::Problem> problems;
  std::vector<RoutedResult> results;
  for (const int mode : {0, 1, 2}) {  // both fused, the gather as a pass, both as passes
    RoutedOptions options;
    options.fuse_gather = mode == 0;
    options.fuse_scatter = mode < 2;
    problems.push_back(testing::make_problem(layout, DType::BF16, given.reference_masks, seed));
    results.push_back(run_routed(cpu, plans, routed_call(problems.back()), given.decisions, options));
  }
  ASSERT_FALSE(results[0].temporal.empty());
  EXPECT_TRUE(results[0].gather_fused && results[0].scatter_fused);
  EXPECT_EQ(results[0].permutation_bytes, 0.0);
  EXPECT_TRUE(!results[1].gather_fused && results[1].scatter_fused);
  EXPECT_TRUE(!results[2].gather_fused && !results[2].scatter_fused);
  const testing::Comparison cmp = testing::compare_with_reference(problems[0]);
  EXPECT_TRUE(cmp.ok()) << cmp.failure;
  for (const int other : {1, 2}) {
    SCOPED_TRACE(other);
    const TensorView a = problems[0].o.view(), b = problems[std::size_t(other)].o.view();
    EXPECT_EQ(std::memcmp(a.data, b.data, std::size_t(a.numel()) * element_size(a.dtype)), 0);
    const LseView la = problems[0].lse.view(), lb = problems[std::size_t(other)].lse.view();
    for (std::int64_t batch = 0; batch < layout.batch; ++batch)
      for (std::int64_t h = 0; h < layout.heads; ++h)
        for (std::int64_t n = 0; n < layout.tokens(); ++n)
          ASSERT_EQ(std::memcmp(&la.at(batch, h, n), &lb.at(batch, h, n), sizeof(float)), 0) << h << " " << n;
  }
}

// run_routed() with an executor that fuses the scatter: no packed output, no
// scatter pass, the gather alone counted as permutation, and the same answer
// (to the bit) as the two steps; with fuse_scatter off, the two steps.
TEST(RoutedAttention, AFusedScatterSkipsThePackedOutputAndTheScatterPass) {
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 64};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  const std::uint64_t seed = testing::fresh_seed();
  const Backend& cpu = backend("cpu");
  testing::Problem fused = testing::make_problem(layout, DType::F32, given.reference_masks, seed);
  testing::Problem two_step = testing::make_problem(layout, DType::F32, given.reference_masks, seed);
  PlanCache plans;
  FusingHostExecutor fusing;
  const RoutedResult a = run_routed(fusing, cpu, plans, routed_call(fused), given.decisions);
  ASSERT_FALSE(a.temporal.empty());
  EXPECT_TRUE(a.scatter_fused);
  EXPECT_FALSE(fusing.asked_for_output);
  EXPECT_EQ(fusing.fused_calls, 1);
  EXPECT_EQ(fusing.scatters, 0);
  const testing::Comparison cmp = testing::compare_with_reference(fused);
  EXPECT_TRUE(cmp.ok()) << cmp.failure;

  FusingHostExecutor declined;
  RoutedOptions options;
  options.fuse_scatter = false;
  const RoutedResult b = run_routed(declined, cpu, plans, routed_call(two_step), given.decisions, options);
  EXPECT_FALSE(b.scatter_fused);
  EXPECT_TRUE(declined.asked_for_output);
  EXPECT_EQ(declined.fused_calls, 0);
  EXPECT_EQ(declined.scatters, 1);
  // The gather moves 3 tensors, the scatter 1 and the LSE: bytes counted only for passes that ran.
  EXPECT_GT(b.permutation_bytes, a.permutation_bytes);
  EXPECT_EQ(std::memcmp(fused.o.view().data, two_step.o.view().data,
                        std::size_t(fused.o.view().numel()) * element_size(fused.o.view().dtype)),
            0);
  const LseView la = fused.lse.view(), lb = two_step.lse.view();
  for (std::int64_t batch = 0; batch < layout.batch; ++batch)
    for (std::int64_t h = 0; h < layout.heads; ++h)
      for (std::int64_t n = 0; n < layout.tokens(); ++n)
        ASSERT_EQ(std::memcmp(&la.at(batch, h, n), &lb.at(batch, h, n), sizeof(float)), 0) << h << " " << n;
}

// The host executor on the CPU backend stores the temporal heads' O and LSE
// in place (Backend::run_scattered); on the reference backend, which does not,
// it scatters them in a pass of its own. Either way the answer is the
// reference's, and on the CPU the fused and two-step outputs agree bit for bit.
TEST(RoutedAttention, TheCpuBackendStoresTheTemporalHeadsInPlace) {
  // Six heads: temporal heads 0 and 4, so packed head 1 goes to head 4 (the head map matters).
  const VideoLayout layout{{4, 6, 7, 9, TextPlacement::After}, 1, 6, 80};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  const std::uint64_t seed = testing::fresh_seed();
  PlanCache plans;
  testing::Problem fused = testing::make_problem(layout, DType::BF16, given.reference_masks, seed);
  testing::Problem two_step = testing::make_problem(layout, DType::BF16, given.reference_masks, seed);
  testing::Problem on_reference = testing::make_problem(layout, DType::BF16, given.reference_masks, seed);
  const RoutedResult a = run_routed(backend("cpu"), plans, routed_call(fused), given.decisions);
  ASSERT_EQ(a.temporal, (std::vector<std::int64_t>{0, 4}));
  EXPECT_TRUE(a.scatter_fused);
  RoutedOptions options;
  options.fuse_scatter = false;
  const RoutedResult b = run_routed(backend("cpu"), plans, routed_call(two_step), given.decisions, options);
  EXPECT_FALSE(b.scatter_fused);
  const RoutedResult c = run_routed(backend("reference"), plans, routed_call(on_reference), given.decisions);
  EXPECT_FALSE(c.scatter_fused);
  for (const testing::Problem* p : {&fused, &on_reference}) {
    const testing::Comparison cmp = testing::compare_with_reference(*p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
  }
  EXPECT_EQ(std::memcmp(fused.o.view().data, two_step.o.view().data,
                        std::size_t(fused.o.view().numel()) * element_size(fused.o.view().dtype)),
            0);
  for (std::int64_t h = 0; h < layout.heads; ++h)
    for (std::int64_t n = 0; n < layout.tokens(); ++n)
      ASSERT_EQ(std::memcmp(&fused.lse.view().at(0, h, n), &two_step.lse.view().at(0, h, n), sizeof(float)), 0)
          << h << " " << n;
}

// Runs every step on a HostRoutedExecutor and logs the steps' names; the
// executors below change only what their tests are about. (It never fuses the
// scatter: fuses_scatter() keeps the base class's false.)
class LoggingHostExecutor : public RoutedExecutor {
 public:
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override {
    return host_.allocate(call, count, with_output);
  }
  void gather(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
              std::span<const TensorView> sources, std::span<const TensorView> packed) override {
    log.push_back("gather");
    host_.gather(grid, from, to, heads, sources, packed);
  }
  void scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
               std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse,
               const LseView& lse) override {
    log.push_back("scatter");
    host_.scatter(grid, from, to, heads, packed, dests, packed_lse, lse);
  }
  void attend(const Backend& backend, const AttentionCall& call) override {
    log.push_back("attend");
    host_.attend(backend, call);
  }
  int mark() override {
    log.push_back("mark");
    return host_.mark();
  }
  double elapsed_ms(int from, int to) override { return host_.elapsed_ms(from, to); }

  std::vector<std::string> log;

 private:
  HostRoutedExecutor host_;
};

// An executor that records rather than runs (as the CUDA one does during a
// graph capture) is asked for its buffers and to prepare both backend calls
// before any step is enqueued, is never asked to time, and the result says the
// call was not timed; the steps themselves run here, so the output is checked.
class RecordingHostExecutor final : public LoggingHostExecutor {
 public:
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override {
    log.push_back("allocate");
    return LoggingHostExecutor::allocate(call, count, with_output);
  }
  void prepare(const Backend&, const AttentionCall& call, const ScatteredOutput* out) override {
    log.push_back(out ? "prepare scattered" : "prepare");
    prepared_heads.push_back(call.layout.heads);
  }
  bool timed() const override { return false; }
  int mark() override {
    log.push_back("mark");
    return 0;
  }
  double elapsed_ms(int, int) override {
    log.push_back("elapsed");
    return 1.0;
  }

  std::vector<std::int64_t> prepared_heads;
};

TEST(RoutedAttention, AnUntimedExecutorPreparesBothCallsBeforeAnyStep) {
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 1, 5, 64};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);  // 2 of 5 heads temporal
  testing::Problem p = testing::make_problem(layout, DType::F32, given.reference_masks, testing::fresh_seed());
  PlanCache plans;
  RecordingHostExecutor recording;
  const RoutedResult r = run_routed(recording, backend("cpu"), plans, routed_call(p), given.decisions);
  const std::vector<std::string> expected{"allocate", "prepare", "prepare", "attend", "gather", "attend", "scatter"};
  EXPECT_EQ(recording.log, expected);
  EXPECT_EQ(recording.prepared_heads, (std::vector<std::int64_t>{5, 2}));  // the direct call, then the packed one
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.attention_ms, 0.0);
  EXPECT_EQ(r.permutation_ms, 0.0);
  EXPECT_GT(r.permutation_bytes, 0.0);  // what the passes move, known without timing them
  const testing::Comparison cmp = testing::compare_with_reference(p);
  EXPECT_TRUE(cmp.ok()) << cmp.failure;

  HostRoutedExecutor host;  // timed, for contrast
  testing::Problem q = testing::make_problem(layout, DType::F32, given.reference_masks, 1);
  EXPECT_TRUE(run_routed(host, backend("cpu"), plans, routed_call(q), given.decisions).timed);
}

// RoutedOptions::timed off: a timing executor is never asked to mark or wait, and
// the call still computes what it should.
TEST(RoutedAttention, AnUntimedCallNeverMarksTheExecutorsTimeline) {
  const VideoLayout layout{{4, 5, 7, 9, TextPlacement::After}, 2, 5, 64};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  testing::Problem p = testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed());
  PlanCache plans;
  RoutedOptions options;
  options.timed = false;
  options.fuse_scatter = false;  // the scatter pass too
  LoggingHostExecutor executor;
  const RoutedResult r = run_routed(executor, backend("cpu"), plans, routed_call(p), given.decisions, options);
  EXPECT_EQ(executor.log, (std::vector<std::string>{"attend", "gather", "attend", "scatter"}));
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.attention_ms, 0.0);
  EXPECT_EQ(r.permutation_ms, 0.0);
  const testing::Comparison cmp = testing::compare_with_reference(p);
  EXPECT_TRUE(cmp.ok()) << cmp.failure;
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
  // Refused before any plan is built: a large grid the tensors do not have took seconds and gigabytes.
  bad.layout.grid = {100, 100, 200, 0, TextPlacement::After};
  EXPECT_THROW(run_routed(ref, plans, bad, std::vector<HeadRoute>(2)), InvalidArgument);
  EXPECT_EQ(plans.size(), 0u);
  bad = routed_call(p);
  bad.o = bad.q;  // output aliases an input
  EXPECT_THROW(run_routed(ref, plans, bad, std::vector<HeadRoute>(2)), InvalidArgument);
  RouterOptions ro;
  ro.samples = 8;
  EXPECT_THROW(routed_attention(ref, plans, bad, Router(ro)), InvalidArgument);
}

// A host executor whose clock is scripted: mark i reads 2^i ms, so every sum of
// distinct intervals is a different number and says which intervals it added.
class ScriptedClockExecutor final : public LoggingHostExecutor {
 public:
  int mark() override {
    log.push_back("mark");
    return marks++;
  }
  double elapsed_ms(int from, int to) override { return double(1 << to) - double(1 << from); }

  int marks = 0;
};

// RoutedResult's figures by their definitions (routed.hpp): attention_ms is both
// backend calls, permutation_ms the gather and the scatter; the bytes are read +
// write of what those passes move; kept_tile_flops 4 D per kept tile element,
// every head and batch entry. Worked out here from the call's shape.
TEST(RoutedAttention, TimesBytesAndFlopsFollowTheirDefinitions) {
  const VideoLayout layout{{3, 4, 5, 6, TextPlacement::After}, 2, 5, 64};  // 66 tokens, batch 2
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  std::int64_t temporal = 0;
  for (const HeadRoute& d : given.decisions) temporal += d.route == Route::Temporal;
  ASSERT_GT(temporal, 0);
  ASSERT_LT(temporal, layout.heads);
  testing::Problem p =
      testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed(), MemoryLayout::BNHD,
                            DType::F32);
  PlanCache plans;
  RoutedOptions options;
  options.fuse_scatter = false;
  ScriptedClockExecutor clock;
  const RoutedResult r = run_routed(clock, backend("cpu"), plans, routed_call(p), given.decisions, options);
  ASSERT_EQ(clock.log, (std::vector<std::string>{"mark", "attend", "mark", "mark", "gather", "mark", "attend", "mark",
                                                 "scatter", "mark"}));
  // Marks: 0 direct start, 1 direct end, 2 gather start, 3 gather end, 4 packed attention end, 5 scatter end.
  EXPECT_EQ(r.attention_ms, (2.0 - 1.0) + (16.0 - 8.0));
  EXPECT_EQ(r.permutation_ms, (8.0 - 4.0) + (32.0 - 16.0));

  const double n = double(layout.tokens()), b = double(layout.batch), d = double(layout.head_dim), t = double(temporal);
  const double gather = 2.0 * 3.0 * b * n * t * d * 2.0;  // read + write of bf16 q, k, v
  const double scatter = 2.0 * b * n * t * d * 4.0 + 2.0 * b * t * n * 4.0;  // fp32 o, fp32 LSE
  EXPECT_EQ(r.permutation_bytes, gather + scatter);

  double flops = 0;
  for (const HeadRoute& h : given.decisions) {
    const auto plan = TilePlan::build(layout.grid, h.spec, options.tile, options.alignment);
    flops += 4.0 * d * b * double(plan->stats().kept_tile_area);
  }
  EXPECT_EQ(r.kept_tile_flops, flops);
  // kept_flops: 4 D per allowed pair, the predicate evaluated pair by pair in each head's own order.
  double pairs = 0;
  for (const HeadRoute& h : given.decisions)
    for (std::int64_t i = 0; i < layout.tokens(); ++i)
      for (std::int64_t j = 0; j < layout.tokens(); ++j)
        pairs += allowed_at(layout.grid, h.spec, h.spec.natural_order(), i, j);
  EXPECT_EQ(r.kept_flops, 4.0 * d * b * pairs);
  EXPECT_LT(r.kept_flops, r.kept_tile_flops);

  // Fused scatter (the CPU backend stores in place): the gather alone.
  testing::Problem fused = testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed());
  RoutedOptions scatter_only;
  scatter_only.fuse_gather = false;
  const RoutedResult f = run_routed(backend("cpu"), plans, routed_call(fused), given.decisions, scatter_only);
  ASSERT_TRUE(f.scatter_fused && !f.gather_fused);
  EXPECT_EQ(f.permutation_bytes, gather);
  EXPECT_EQ(f.kept_tile_flops, flops);

  // Both fused (the CPU backend also reads in place): no permutation pass at all.
  const RoutedResult g = run_routed(backend("cpu"), plans, routed_call(fused), given.decisions);
  ASSERT_TRUE(g.scatter_fused && g.gather_fused);
  EXPECT_EQ(g.permutation_bytes, 0.0);
  EXPECT_EQ(g.permutation_ms, 0.0);
  EXPECT_EQ(g.kept_tile_flops, flops);
}

}  // namespace
}  // namespace stsa
