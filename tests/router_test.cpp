// Head routing: the unrolled candidate masks against the mask predicate, the
// sampled errors against the fp64 reference, routing accuracy on synthetic
// heads of known kind, the dense fallback, and argument checks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "cpu/isa.hpp"
#include "router/candidate_mask.hpp"
#include "stsa/error.hpp"
#include "stsa/first_block_anchor.hpp"
#include "stsa/permute.hpp"
#include "stsa/route_eval.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

std::array<std::int64_t, 3> check_block_cover(const router_detail::CandidateMask& mask, std::int64_t tokens);

TEST(CandidateMask, MatchesThePredicateOnEveryPair) {
  const std::vector<VideoGrid> grids = {{1, 3, 4, 0, TextPlacement::After},
                                        {5, 3, 4, 7, TextPlacement::Before},
                                        {4, 2, 5, 3, TextPlacement::After},
                                        {3, 1, 1, 0, TextPlacement::After}};
  for (const auto& g : grids)
    for (bool anchor : {true, false}) {
      std::vector<MaskSpec> specs = {MaskSpec::dense()};
      for (std::int64_t w : {std::int64_t(-1), std::int64_t(0), std::int64_t(2), g.video_tokens() / 3})
        specs.push_back(MaskSpec::spatial(w, anchor)), specs.push_back(MaskSpec::temporal(w, anchor));
      for (std::int64_t r : {-1, 0, 1}) specs.push_back(MaskSpec::frame_window(r, anchor));
      for (const auto& spec : specs)
        for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
          const auto mask = router_detail::make_candidate_mask(g, spec, order);
          for (std::int64_t i = 0; i < g.tokens(); ++i)
            for (std::int64_t j = 0; j < g.tokens(); ++j)
              ASSERT_EQ(mask.allows(i, j), allowed_at(g, spec, order, i, j))
                  << g.describe() << " " << spec.describe() << " " << to_string(order) << " pair " << i << "," << j;
          check_block_cover(mask, g.tokens());
        }
    }
}

// cover() of every (query, key block): All only if every key of the block is
// allowed, None only if none is. Returns how often each of None, Some, All came up.
std::array<std::int64_t, 3> check_block_cover(const router_detail::CandidateMask& mask, std::int64_t tokens) {
  using Cover = router_detail::CandidateMask::Cover;
  std::array<std::int64_t, 3> seen{0, 0, 0};
  const std::int64_t block = router_detail::CandidateMask::kBlock;
  for (std::int64_t i = 0; i < tokens; ++i)
    for (std::int64_t b = 0; b * block < tokens; ++b) {
      std::int64_t allowed = 0;
      const std::int64_t end = std::min(tokens, (b + 1) * block);
      for (std::int64_t j = b * block; j < end; ++j) allowed += mask.allows(i, j);
      const Cover cover = mask.cover(i, b);
      ++seen[std::size_t(cover)];
      if (cover == Cover::All) {
        EXPECT_EQ(allowed, end - b * block) << mask.spec.describe() << " query " << i << " block " << b;
      }
      if (cover == Cover::None) {
        EXPECT_EQ(allowed, 0) << mask.spec.describe() << " query " << i << " block " << b;
      }
    }
  return seen;
}

TEST(CandidateMask, BlockCoverAgreesWithThePairsOnLargerGrids) {
  // Grids of several 64-key blocks, blocks straddling frames and text.
  const std::vector<VideoGrid> grids = {{5, 6, 9, 13, TextPlacement::Before}, {4, 7, 11, 5, TextPlacement::After}};
  for (const auto& g : grids)
    for (bool anchor : {true, false})
      for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
        const std::int64_t w = g.video_tokens() / 4;
        for (const MaskSpec& spec : {MaskSpec::spatial(w, anchor), MaskSpec::temporal(w, anchor),
                                     MaskSpec::frame_window(1, anchor), MaskSpec::dense()}) {
          const auto seen = check_block_cover(router_detail::make_candidate_mask(g, spec, order), g.tokens());
          // The shortcut must actually fire: in their own token order the bands
          // skip some blocks, and every mask takes some whole.
          if (spec.kind == MaskKind::Band && spec.natural_order() == order) {
            EXPECT_GT(seen[0], 0) << spec.describe() << " " << to_string(order);
          }
          EXPECT_GT(seen[2], 0) << spec.describe() << " " << to_string(order);
        }
      }
}

// The units the router computes on under `isa` (RouterOptions::isa), from the
// rule router.hpp states: AMX tiles for bf16, fp16 and fp8; AVX-512 bf16 dot
// products for bf16 and fp8; fp32 FMAs otherwise (any head dim here is <= 512).
ProductUnits expected_units(Isa isa, DType dtype) {
  const Isa resolved = resolve_isa(isa);
  if (resolved == Isa::Amx && dtype != DType::F32) return ProductUnits::AmxTiles;
  if (resolved == Isa::Avx512 && (dtype == DType::BF16 || dtype == DType::F8E4M3)) return ProductUnits::Bf16Dot;
  return ProductUnits::Fma;
}

// What the router is asked to try: spatial, temporal (and the frame window) at the options' densities.
std::vector<std::pair<Route, MaskSpec>> asked_candidates(const VideoGrid& g, const RouterOptions& o) {
  std::vector<std::pair<Route, MaskSpec>> asked = {
      {Route::Spatial, mask_for_density(g, SparseKind::Spatial, o.spatial_density, o.anchor)},
      {Route::Temporal, mask_for_density(g, SparseKind::Temporal, o.temporal_density, o.anchor)}};
  if (o.try_frame_window)
    asked.emplace_back(Route::FrameWindow,
                       mask_for_density(g, SparseKind::FrameWindow, o.frame_window_density, o.anchor));
  return asked;
}

// Every head measured exactly the asked candidates, in order (so loops over them check something).
void check_candidates(const RoutingReport& report, const VideoGrid& g, const RouterOptions& o) {
  const auto asked = asked_candidates(g, o);
  for (std::size_t h = 0; h < report.heads.size(); ++h) {
    const std::vector<CandidateError>& got = report.heads[h].candidates;
    ASSERT_EQ(got.size(), asked.size()) << "head " << h;
    for (std::size_t c = 0; c < asked.size(); ++c) {
      EXPECT_EQ(got[c].route, asked[c].first) << "head " << h << " candidate " << c;
      EXPECT_EQ(got[c].spec, asked[c].second)
          << "head " << h << " candidate " << c << ": " << got[c].spec.describe() << ", asked "
          << asked[c].second.describe();
    }
  }
}

// The sampled attention's FLOPs by their definition (router.hpp): per head, the scores
// and the dense output over every key (2 S N D each), plus 2 D per (sampled row, key)
// pair each candidate keeps.
double expected_flops(const VideoLayout& layout, TokenOrder order, const RoutingReport& report) {
  const auto s = double(report.sampled_rows.size()), n = double(layout.tokens()), d = double(layout.head_dim);
  double flops = 0;
  for (const HeadRoute& head : report.heads) {
    std::int64_t kept = 0;
    for (const CandidateError& c : head.candidates)
      for (const std::int64_t row : report.sampled_rows)
        for (std::int64_t j = 0; j < layout.tokens(); ++j) kept += allowed_at(layout.grid, c.spec, order, row, j);
    flops += 4.0 * s * n * d + 2.0 * d * double(kept);
  }
  return flops;
}

// Router errors against fp64 outputs of the same sampled rows from reference_rows.
void check_errors_against_reference(const VideoLayout& layout, DType dtype, TokenOrder order, std::uint64_t seed,
                                    int samples = 24, Isa isa = Isa::Auto,
                                    MemoryLayout memory = MemoryLayout::BNHD) {
  SCOPED_TRACE(layout.grid.describe() + " B=" + std::to_string(layout.batch) + " D=" +
               std::to_string(layout.head_dim) + " " + std::string(to_string(dtype)) + " " +
               std::string(to_string(order)) + " seed " + std::to_string(seed) + " samples " + std::to_string(samples) +
               " isa " + std::string(to_string(isa)) + (memory == MemoryLayout::BHND ? " BHND" : ""));
  testing::Problem p = testing::make_problem(
      layout, dtype, std::vector<HeadMask>(std::size_t(layout.heads), HeadMask{MaskSpec::dense(), order, nullptr, true}),
      seed, memory);
  RouterOptions options;
  options.samples = samples;
  options.seed = seed;
  options.try_frame_window = true;
  // Shares of what the anchor (and text) leave: on these few-frame grids the anchor alone keeps
  // more than 0.2-0.4 of the pairs, where every candidate would be the same anchor-only mask.
  const double floor = kept_fraction(layout.grid, MaskSpec::spatial(-1));
  options.spatial_density = floor + (1 - floor) * 0.2;
  options.temporal_density = floor + (1 - floor) * 0.3;
  options.frame_window_density = floor + (1 - floor) * 0.4;
  options.isa = isa;
  const Router router(options);
  AttentionCall call = p.call();
  const RoutingReport report = router.route(layout, call.q, call.k, call.v, order, 0.f);
  ASSERT_TRUE(report.product_units.has_value());
  EXPECT_EQ(*report.product_units, expected_units(isa, dtype));
  EXPECT_EQ(report.tile_products, report.product_units == ProductUnits::AmxTiles);
  ASSERT_EQ(report.heads.size(), std::size_t(layout.heads));
  ASSERT_EQ(report.sampled_rows.size(), std::size_t(std::min<std::int64_t>(samples, layout.tokens())));
  ASSERT_NO_FATAL_FAILURE(check_candidates(report, layout.grid, options));
  if (layout.grid.frames > 1) {
    for (const CandidateError& c : report.heads[0].candidates)
      EXPECT_TRUE(c.spec.kind != MaskKind::Band || c.spec.band >= 0) << "an anchor-only candidate: " << c.spec.describe();
  }

  std::vector<double> dense_o, lse;
  reference_rows(call, report.sampled_rows, dense_o, lse);
  const auto count = std::int64_t(report.sampled_rows.size());
  for (std::size_t c = 0; c < report.heads[0].candidates.size(); ++c) {
    AttentionCall masked = call;
    for (auto& h : masked.heads) h = HeadMask{report.heads[0].candidates[c].spec, order, nullptr, true};
    std::vector<double> mask_o;
    reference_rows(masked, report.sampled_rows, mask_o, lse);
    for (std::int64_t h = 0; h < layout.heads; ++h) {
      double err = 0, ref = 0;
      for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t b = report.sampled_batch[std::size_t(i)];
        for (std::int64_t d = 0; d < layout.head_dim; ++d) {
          const std::size_t at = std::size_t(((b * count + i) * layout.heads + h) * layout.head_dim + d);
          err += std::pow(mask_o[at] - dense_o[at], 2);
          ref += dense_o[at] * dense_o[at];
        }
      }
      const CandidateError& got = report.heads[std::size_t(h)].candidates[c];
      const double mse = err / double(count * layout.head_dim);
      // fp32 accumulation against fp64 (tiles: weights within 2^-16 of themselves):
      // errors agree to a small absolute floor plus a relative share.
      EXPECT_NEAR(got.mse, mse, 1e-7 + 1e-3 * mse) << "head " << h << " " << got.spec.describe();
      EXPECT_NEAR(got.rel_l2, std::sqrt(err / ref), 1e-4 + 1e-3 * std::sqrt(err / ref)) << "head " << h;
    }
  }
  const double flops = expected_flops(layout, order, report);
  EXPECT_NEAR(report.flops, flops, 1e-12 * flops);
}

TEST(Router, SampledErrorsMatchTheReference) {
  const std::uint64_t seed = testing::fresh_seed();
  check_errors_against_reference({{4, 5, 7, 0, TextPlacement::After}, 1, 3, 64}, DType::F32, TokenOrder::FrameMajor,
                                 seed);
  check_errors_against_reference({{5, 3, 9, 11, TextPlacement::Before}, 2, 2, 80}, DType::BF16, TokenOrder::FrameMajor,
                                 seed + 1);
  check_errors_against_reference({{3, 6, 5, 9, TextPlacement::After}, 1, 2, 128}, DType::F32, TokenOrder::SpatialMajor,
                                 seed + 2);
  check_errors_against_reference({{1, 9, 10, 0, TextPlacement::After}, 1, 2, 64}, DType::F16, TokenOrder::FrameMajor,
                                 seed + 3);
  // Several key chunks and sub-chunks (9,463 keys, the last block ragged) and two
  // batch entries: the per-chunk partial sums merged with their own maxima.
  check_errors_against_reference({{7, 30, 45, 13, TextPlacement::Before}, 2, 2, 64}, DType::F32, TokenOrder::FrameMajor,
                                 seed + 4);
  // More samples than tokens: every position is sampled, text rows too.
  check_errors_against_reference({{2, 2, 3, 5, TextPlacement::Before}, 2, 2, 64}, DType::F32, TokenOrder::SpatialMajor,
                                 seed + 5, 64);
  check_errors_against_reference({{1, 3, 3, 0, TextPlacement::After}, 1, 2, 128}, DType::BF16, TokenOrder::FrameMajor,
                                 seed + 6, 64);
  // fp8 inputs (the fp32 path on any isa), text before, heads of 80.
  check_errors_against_reference({{4, 6, 7, 9, TextPlacement::Before}, 2, 2, 80}, DType::F8E4M3,
                                 TokenOrder::SpatialMajor, seed + 7);
}

// A call with fewer tokens than samples (a small debug video under the default
// 64) is routed on every position once, exactly as with samples = tokens,
// instead of being refused.
TEST(Router, MoreSamplesThanTokensSampleEveryPositionOnce) {
  const VideoLayout layout{{2, 2, 2, 3, TextPlacement::Before}, 2, 2, 64};  // 11 tokens
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), testing::fresh_seed());
  const AttentionCall call = p.call();
  const RoutingReport many = Router().route(layout, call.q, call.k, call.v);
  std::vector<std::int64_t> positions = many.sampled_rows;
  std::sort(positions.begin(), positions.end());
  std::vector<std::int64_t> every(std::size_t(layout.tokens()));
  std::iota(every.begin(), every.end(), std::int64_t{0});
  EXPECT_EQ(positions, every);
  for (std::size_t i = 0; i < many.sampled_batch.size(); ++i)
    EXPECT_EQ(many.sampled_batch[i], std::int64_t(i) % layout.batch) << "round-robin over the batch";

  RouterOptions exact;
  exact.samples = int(layout.tokens());
  const RoutingReport same = Router(exact).route(layout, call.q, call.k, call.v);
  EXPECT_EQ(same.sampled_rows, many.sampled_rows);
  EXPECT_EQ(same.sampled_batch, many.sampled_batch);
  ASSERT_EQ(same.heads.size(), many.heads.size());
  for (std::size_t h = 0; h < many.heads.size(); ++h) {
    EXPECT_EQ(same.heads[h].route, many.heads[h].route);
    ASSERT_EQ(same.heads[h].candidates.size(), many.heads[h].candidates.size());
    for (std::size_t c = 0; c < many.heads[h].candidates.size(); ++c)
      EXPECT_EQ(same.heads[h].candidates[c].mse, many.heads[h].candidates[c].mse) << "head " << h << " candidate " << c;
  }
}

TEST(Router, ErrorsAreBitIdenticalForAnyThreadCount) {
  // 7,207 tokens: two key chunks.
  const synth::Options o{.grid = {6, 30, 40, 7, TextPlacement::After}, .batch = 2, .heads = 5, .head_dim = 64,
                         .seed = testing::fresh_seed()};
  const synth::Data data = synth::make_video_tokens(o);
  RouterOptions ro;
  ro.samples = 20;
  ro.try_frame_window = true;
  auto route = [&](int threads) {
    ro.threads = threads;
    return Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view());
  };
  const RoutingReport one = route(1);
  ASSERT_EQ(one.heads.size(), 5u);
  ASSERT_NO_FATAL_FAILURE(check_candidates(one, o.grid, ro));
  for (int threads : {2, 3, 7}) {
    const RoutingReport many = route(threads);
    ASSERT_EQ(many.heads.size(), one.heads.size());
    EXPECT_EQ(many.flops, one.flops) << threads << " threads";
    for (std::size_t h = 0; h < one.heads.size(); ++h) {
      EXPECT_EQ(many.heads[h].route, one.heads[h].route) << threads << " threads, head " << h;
      ASSERT_EQ(many.heads[h].candidates.size(), one.heads[h].candidates.size());
      for (std::size_t c = 0; c < one.heads[h].candidates.size(); ++c) {
        // Exact equality on purpose: the work split must not change the arithmetic.
        EXPECT_EQ(many.heads[h].candidates[c].mse, one.heads[h].candidates[c].mse)
            << threads << " threads, head " << h << ", candidate " << c;
        EXPECT_EQ(many.heads[h].candidates[c].rel_l2, one.heads[h].candidates[c].rel_l2)
            << threads << " threads, head " << h << ", candidate " << c;
      }
    }
  }
}

double routing_accuracy(std::uint64_t seed, std::int64_t batch, DType dtype) {
  const synth::Options o{.grid = {13, 12, 16, 0, TextPlacement::After}, .batch = batch, .heads = 16, .head_dim = 64,
                         .dtype = dtype, .seed = seed};
  const synth::Data data = synth::make_video_tokens(o);
  RouterOptions ro;
  ro.seed = seed;
  const RoutingReport r = Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view());
  int correct = 0;
  for (std::size_t h = 0; h < r.heads.size(); ++h) correct += r.heads[h].route == data.truth[h];
  return double(correct) / double(r.heads.size());
}

TEST(Router, FindsTheKnownKindOfSyntheticHeads) {
  for (std::uint64_t seed : {1, 2, 3}) EXPECT_GE(routing_accuracy(seed, 1, DType::F32), 0.98) << "seed " << seed;
  EXPECT_GE(routing_accuracy(4, 2, DType::BF16), 0.98);
}

TEST(Router, SamplesSpreadOverAllFramesAndStayDeterministic) {
  const VideoLayout layout{{9, 4, 4, 5, TextPlacement::Before}, 2, 1, 64};
  RouterOptions options;
  options.samples = 64;
  options.seed = 5;
  const Router router(options);
  std::vector<std::int64_t> rows, batch, rows2, batch2;
  router.sample_rows(layout, TokenOrder::FrameMajor, rows, batch);
  router.sample_rows(layout, TokenOrder::FrameMajor, rows2, batch2);
  EXPECT_EQ(rows, rows2);
  EXPECT_EQ(batch, batch2);
  std::set<std::int64_t> frames;
  for (std::int64_t r : rows) {
    const TokenCoord c = layout.grid.coord(r, TokenOrder::FrameMajor);
    ASSERT_FALSE(c.is_text);
    ASSERT_NE(c.frame, 0);  // anchor rows tell no mask apart
    frames.insert(c.frame);
  }
  EXPECT_EQ(frames.size(), 8u);
  EXPECT_EQ(std::count(batch.begin(), batch.end(), 1), 32);

  // More samples than non-anchor rows: falls back to all rows; more than all
  // tokens: every position once, the same rows as with samples = tokens.
  options.samples = int(layout.tokens());
  Router(options).sample_rows(layout, TokenOrder::FrameMajor, rows, batch);
  options.samples = int(layout.tokens()) + 1;
  Router(options).sample_rows(layout, TokenOrder::FrameMajor, rows2, batch2);
  EXPECT_EQ(rows2, rows);
  EXPECT_EQ(batch2, batch);
  EXPECT_EQ(std::set<std::int64_t>(rows.begin(), rows.end()).size(), std::size_t(layout.tokens()));
}

TEST(Router, KeepsAHeadDenseWhenNoMaskFitsIt) {
  const VideoLayout layout{{6, 6, 6, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 3);
  // Sharpen the scores so the random heads attend to a few arbitrary keys.
  AttentionCall call = p.call();
  RouterOptions options;
  options.max_rel_l2 = 0.01;
  RoutingReport r = Router(options).route(layout, call.q, call.k, call.v, TokenOrder::FrameMajor, 3.0f);
  for (const auto& h : r.heads) {
    ASSERT_NE(h.best(), nullptr);
    EXPECT_GT(h.best()->rel_l2, 0.01);
    EXPECT_EQ(h.route, Route::Dense);
    EXPECT_EQ(h.spec, MaskSpec::dense());
  }
  options.max_rel_l2 = 100;
  r = Router(options).route(layout, call.q, call.k, call.v, TokenOrder::FrameMajor, 3.0f);
  for (const auto& h : r.heads) EXPECT_NE(h.route, Route::Dense);
}

TEST(Router, NonFiniteInputsKeepTheHeadDense) {
  const VideoLayout layout{{4, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 4);
  // NaN in every key of head 1: every sampled output of that head is NaN.
  for (std::int64_t n = 0; n < layout.tokens(); ++n) p.k.view().store(0, n, 1, 0, NAN);
  AttentionCall call = p.call();
  RouterOptions lenient;  // random heads fit no mask well; accept any finite error
  lenient.max_rel_l2 = 100;
  const RoutingReport r = Router(lenient).route(layout, call.q, call.k, call.v);
  EXPECT_EQ(r.heads[1].route, Route::Dense);
  EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].mse));
  EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].rel_l2));  // not reported as exact
  EXPECT_NE(r.heads[0].route, Route::Dense);
}

// One key whose scores are all -inf (q's channel 0 positive, the key's -inf),
// every other score finite: the head is still reported non-finite and kept
// dense, as the GPU router does (the weight of such a key would otherwise be a
// silent 0, which depends on where the key falls in the router's key chunks).
TEST(Router, OneInfiniteScoreKeepsTheHeadDense) {
  const VideoLayout layout{{4, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 4);
  for (std::int64_t n = 0; n < layout.tokens(); ++n)
    p.q.view().store(0, n, 1, 0, 0.5f + std::abs(p.q.view().load(0, n, 1, 0)));
  p.k.view().store(0, 37, 1, 0, -INFINITY);
  AttentionCall call = p.call();
  RouterOptions lenient;
  lenient.max_rel_l2 = 100;
  const RoutingReport r = Router(lenient).route(layout, call.q, call.k, call.v);
  EXPECT_EQ(r.heads[1].route, Route::Dense);
  EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].mse));
  EXPECT_NE(r.heads[0].route, Route::Dense);
}

// Densities of 0 without the anchor or text: every candidate allows a sampled
// row no key, so its output is 0 (attention.hpp) and its error is the dense
// output itself: relative L2 exactly 1 (to rounding), MSE the dense output's.
TEST(Router, CandidatesThatAllowNoKeyHaveTheDenseOutputAsError) {
  const VideoLayout layout{{4, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), testing::fresh_seed());
  RouterOptions none;
  none.spatial_density = none.temporal_density = none.frame_window_density = 0;
  none.anchor = false;
  none.try_frame_window = true;
  const AttentionCall call = p.call();
  const RoutingReport r = Router(none).route(layout, call.q, call.k, call.v);
  for (const HeadRoute& h : r.heads) {
    ASSERT_EQ(h.candidates.size(), 3u);
    for (const CandidateError& c : h.candidates) {
      EXPECT_NEAR(c.rel_l2, 1.0, 1e-6) << c.spec.describe();
      EXPECT_NEAR(c.mse, h.candidates[0].mse, 1e-6 * c.mse);
      EXPECT_GT(c.mse, 0.0);
    }
    EXPECT_EQ(h.route, Route::Dense);
  }
}

TEST(Router, RelativeL2FromTheSums) {
  EXPECT_DOUBLE_EQ(relative_l2(1.0, 4.0), 0.5);
  EXPECT_EQ(relative_l2(0.0, 0.0), 0.0);
  EXPECT_TRUE(std::isinf(relative_l2(1.0, 0.0)));
  EXPECT_TRUE(std::isnan(relative_l2(NAN, 1.0)));
  EXPECT_TRUE(std::isnan(relative_l2(1.0, NAN)));
  EXPECT_TRUE(std::isnan(relative_l2(NAN, NAN)));
}

TEST(Router, RejectsBadArguments) {
  RouterOptions bad;
  bad.samples = 0;
  EXPECT_THROW(Router{bad}, InvalidArgument);
  bad = {};
  bad.temporal_density = 1.5;
  EXPECT_THROW(Router{bad}, InvalidArgument);
  bad = {};
  bad.spatial_density = NAN;
  EXPECT_THROW(Router{bad}, InvalidArgument);
  bad = {};
  bad.max_rel_l2 = -1;
  EXPECT_THROW(Router{bad}, InvalidArgument);
  EXPECT_THROW(parse_route("diagonal"), InvalidArgument);
  EXPECT_EQ(parse_route("temporal"), Route::Temporal);
  // Cast integers are no Route or TokenOrder (a route was made dense, an order read as spatial-major).
  EXPECT_THROW(route_spec({2, 2, 2, 0, TextPlacement::After}, Route(9), RouterOptions{}), InvalidArgument);
  EXPECT_THROW(permutation_map({2, 2, 2, 0, TextPlacement::After}, TokenOrder(2), TokenOrder::FrameMajor),
               InvalidArgument);

  const VideoLayout layout{{2, 2, 2, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  AttentionCall call = p.call();
  RouterOptions few;
  few.samples = 4;
  const Router router(few);
  VideoLayout other = layout;
  other.grid.frames = 3;  // layout does not match the tensors
  EXPECT_THROW(router.route(other, call.q, call.k, call.v), InvalidArgument);
  const std::vector<std::int64_t> heads = {2};
  EXPECT_THROW(router.route(layout, call.q, call.k, call.v, TokenOrder::FrameMajor, 0.f, heads), InvalidArgument);
  const std::vector<std::int64_t> one = {1};
  EXPECT_EQ(router.route(layout, call.q, call.k, call.v, TokenOrder::FrameMajor, 0.f, one).heads.size(), 1u);
  EXPECT_THROW(router.route(layout, call.q, call.k, call.v, TokenOrder(2)), InvalidArgument);

  // The views' memory, by validate()'s rules, before any element is read: strides
  // past the address space (their offsets would overflow), two elements at one
  // address, a pointer that is not aligned to its element.
  TensorView huge = call.k;
  huge.stride[1] = std::int64_t(1) << 61;
  EXPECT_THROW(router.route(layout, call.q, huge, call.v), InvalidArgument);
  TensorView shared = call.v;
  shared.stride[2] = 0;
  EXPECT_THROW(router.route(layout, call.q, call.k, shared), InvalidArgument);
  TensorView misaligned = call.q;
  misaligned.data = static_cast<std::byte*>(misaligned.data) + 1;
  EXPECT_THROW(router.route(layout, misaligned, call.k, call.v), InvalidArgument);
}

// The sampled population at its edges: exactly as many samples as non-anchor
// video rows still avoids the anchor (every such row is sampled once), and
// without the anchor frame 0's rows are as informative as any and get sampled.
TEST(Router, SamplesAvoidTheAnchorOnlyWhenItIsOn) {
  const VideoLayout layout{{3, 2, 4, 5, TextPlacement::Before}, 1, 1, 64};  // 8 rows per frame
  RouterOptions options;
  options.samples = 16;  // the 16 rows of frames 1 and 2
  std::vector<std::int64_t> rows, batch;
  Router(options).sample_rows(layout, TokenOrder::FrameMajor, rows, batch);
  std::set<std::int64_t> distinct;
  for (std::int64_t r : rows) {
    const TokenCoord c = layout.grid.coord(r, TokenOrder::FrameMajor);
    ASSERT_FALSE(c.is_text);
    EXPECT_NE(c.frame, 0) << "row " << r;
    distinct.insert(r);
  }
  EXPECT_EQ(distinct.size(), 16u);
  options.anchor = false;  // the same 16 samples now spread over all 24 video rows
  Router(options).sample_rows(layout, TokenOrder::FrameMajor, rows, batch);
  std::set<std::int64_t> frames;
  for (std::int64_t r : rows) frames.insert(layout.grid.coord(r, TokenOrder::FrameMajor).frame);
  EXPECT_EQ(frames, (std::set<std::int64_t>{0, 1, 2}));
}

// The softmax scale given to route() is the one the errors are computed with:
// scale 2 / sqrt(D) on q is the default scale on 2 q (exact in fp32).
TEST(Router, UsesTheSoftmaxScaleItIsGiven) {
  const VideoLayout layout{{4, 4, 5, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), testing::fresh_seed());
  testing::Problem twice = p;
  for (std::int64_t n = 0; n < layout.tokens(); ++n)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 64; ++d) twice.q.view().store(0, n, h, d, 2.f * p.q.view().load(0, n, h, d));
  RouterOptions options;
  options.samples = 16;
  const Router router(options);
  const AttentionCall a = p.call(), b = twice.call();
  const RoutingReport scaled = router.route(layout, a.q, a.k, a.v, TokenOrder::FrameMajor, 2.f / 8.f);
  const RoutingReport doubled = router.route(layout, b.q, b.k, b.v, TokenOrder::FrameMajor, 0.f);
  const RoutingReport plain = router.route(layout, a.q, a.k, a.v, TokenOrder::FrameMajor, 0.f);
  for (const RoutingReport* r : {&scaled, &doubled, &plain}) {
    ASSERT_EQ(r->heads.size(), 2u);
    ASSERT_NO_FATAL_FAILURE(check_candidates(*r, layout.grid, options));
  }
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t c = 0; c < scaled.heads[h].candidates.size(); ++c) {
      const double want = doubled.heads[h].candidates[c].mse;
      EXPECT_NEAR(scaled.heads[h].candidates[c].mse, want, 1e-6 * want) << "head " << h << " candidate " << c;
      EXPECT_GT(std::abs(plain.heads[h].candidates[c].mse - want), 1e-3 * want) << "the scale makes no difference?";
    }
}

// The first-block comparison masks (first_block_anchor.hpp) by their definition:
// video token (f, p) at f P + p (spatial) or p F + f (temporal, interleaved);
// a query sees a key if either is text, the key lies in positions [0, P) of that
// order, or the two lie within the band. The closed-form count must count that
// predicate, and the band chosen for an stsa mask must be the one whose count is
// closest to the stsa mask's.
TEST(FirstBlockAnchor, PredicateCountAndBandFollowTheDefinition) {
  const std::vector<VideoGrid> grids = {{4, 2, 3, 5, TextPlacement::Before}, {3, 3, 3, 0, TextPlacement::After},
                                        {5, 1, 2, 2, TextPlacement::After}};
  for (const VideoGrid& g : grids) {
    const std::int64_t per_frame = g.tokens_per_frame(), n = g.tokens();
    for (const bool temporal : {false, true}) {
      const auto fb_position = [&](const TokenCoord& c) {
        return temporal ? c.patch * g.frames + c.frame : c.frame * per_frame + c.patch;
      };
      const auto count = [&](std::int64_t band) {
        std::int64_t kept = 0;
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            const TokenCoord q = g.coord(i, TokenOrder::FrameMajor), k = g.coord(j, TokenOrder::FrameMajor);
            kept += q.is_text || k.is_text || fb_position(k) < per_frame ||
                    (band >= 0 && std::llabs(fb_position(q) - fb_position(k)) <= band);
          }
        return kept;
      };
      for (std::int64_t w = -1; w < g.video_tokens(); ++w) {
        SCOPED_TRACE(g.describe() + (temporal ? " temporal" : " spatial") + " band " + std::to_string(w));
        EXPECT_EQ(first_block_kept_pairs(g, w), count(w));  // positions permute, counts do not
        const MaskSpec spec = temporal ? MaskSpec::temporal(w) : MaskSpec::spatial(w);
        const FirstBlockMask m = first_block_mask(g, spec);
        ASSERT_FALSE(m.dense);
        EXPECT_EQ(m.interleaved, temporal);
        EXPECT_EQ(m.kept_pairs, count(m.band));
        const std::int64_t target = kept_pairs(g, spec);
        for (std::int64_t other = -1; other < g.video_tokens(); ++other)
          EXPECT_LE(std::llabs(m.kept_pairs - target), std::llabs(count(other) - target)) << "band " << other << " is closer";
        HeadRoute head;
        head.spec = spec;
        for (const TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
          const PairPredicate allowed = first_block_predicate(g, {head}, order);
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const TokenCoord q = g.coord(i, order), k = g.coord(j, order);
              const bool want = q.is_text || k.is_text || fb_position(k) < per_frame ||
                                (m.band >= 0 && std::llabs(fb_position(q) - fb_position(k)) <= m.band);
              ASSERT_EQ(allowed(0, i, j), want) << "pair " << i << "," << j << " in " << to_string(order);
            }
        }
      }
    }
  }
}

// rel_l2 by its definition (route_eval.hpp): sqrt(sum error / sum reference) over the heads of the given routes.
TEST(RouteEvaluation, RelL2SumsTheHeadsOfTheGivenRoutes) {
  RouteEvaluation eval;
  eval.reference_squared = {4.0, 9.0, 16.0};
  std::vector<HeadRoute> heads(3);
  heads[0].route = Route::Spatial;
  heads[1].route = Route::Temporal;
  heads[2].route = Route::Spatial;
  const std::vector<double> error{1.0, 4.0, 9.0};
  EXPECT_DOUBLE_EQ(eval.rel_l2(error, heads), std::sqrt(14.0 / 29.0));
  EXPECT_DOUBLE_EQ(eval.rel_l2(error, heads, {Route::Spatial}), std::sqrt(10.0 / 20.0));
  EXPECT_DOUBLE_EQ(eval.rel_l2(error, heads, {Route::Temporal}), std::sqrt(4.0 / 9.0));
  EXPECT_EQ(eval.rel_l2(error, heads, {Route::Dense}), 0.0);  // no such head
  // Errors or routes for more heads than the evaluation holds: refused (read past its sums before).
  const std::vector<double> four{1.0, 4.0, 9.0, 1.0};
  std::vector<HeadRoute> four_heads(4);
  EXPECT_THROW(eval.rel_l2(four, four_heads), InvalidArgument);
  EXPECT_THROW(eval.rel_l2(error, four_heads), InvalidArgument);
}

// evaluate_routes against an fp64 computation here: a random routed output's error
// against dense attention, and the first-block layout's error with its predicate
// written out (as in PredicateCountAndBandFollowTheDefinition), on a spatial, a
// temporal, a frame-window and a dense head; and sampled rows are stratified: one
// in each of eval_rows equal strata, placed by the seed.
TEST(RouteEvaluation, ErrorsAreAgainstDenseAndRowsAreStratified) {
  const VideoLayout layout{{3, 4, 5, 0, TextPlacement::After}, 2, 4, 64};  // 60 tokens
  const VideoGrid& g = layout.grid;
  const std::int64_t n = layout.tokens(), per_frame = g.tokens_per_frame();
  Tensor q(DType::F32, 2, n, 4, 64), k(DType::F32, 2, n, 4, 64), v(DType::F32, 2, n, 4, 64), o(DType::F32, 2, n, 4, 64);
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  testing::fill_normal(q.view(), seed);
  testing::fill_normal(k.view(), seed + 1);
  testing::fill_normal(v.view(), seed + 2);
  testing::fill_normal(o.view(), seed + 3, 0.1f);  // the routed output: any values, read as they are
  std::vector<HeadRoute> heads(4);
  const std::pair<Route, MaskSpec> decided[] = {{Route::Spatial, MaskSpec::spatial(7)},
                                                {Route::Temporal, MaskSpec::temporal(5)},
                                                {Route::FrameWindow, MaskSpec::frame_window(0)},
                                                {Route::Dense, MaskSpec::dense()}};
  for (std::size_t h = 0; h < heads.size(); ++h) std::tie(heads[h].route, heads[h].spec) = decided[h];

  // The first-block mask by its definition: bands over f P + p (spatial) or p F + f
  // (temporal), keys at positions [0, P) and text always seen; frame windows keep
  // their own mask, dense heads stay dense.
  const PairPredicate first_block = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
    const MaskSpec& spec = heads[std::size_t(h)].spec;
    const TokenCoord qc = g.coord(i, TokenOrder::FrameMajor), kc = g.coord(j, TokenOrder::FrameMajor);
    if (spec.kind == MaskKind::Dense) return true;
    if (spec.kind == MaskKind::FrameWindow) return allowed(g, spec, qc, kc);
    const bool temporal = spec.band_order == TokenOrder::SpatialMajor;
    const auto position = [&](const TokenCoord& c) {
      return temporal ? c.patch * g.frames + c.frame : c.frame * per_frame + c.patch;
    };
    const std::int64_t band = first_block_mask(g, spec).band;
    return qc.is_text || kc.is_text || position(kc) < per_frame ||
           (band >= 0 && std::llabs(position(qc) - position(kc)) <= band);
  };
  // Expected per-head sums over `rows`, every batch entry and channel.
  const auto check = [&](const RouteEvaluation& eval) {
    AttentionCall call;
    call.layout = layout;
    call.q = q.view();
    call.k = k.view();
    call.v = v.view();
    call.o = o.view();
    call.heads.assign(4, HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, true});
    std::vector<double> dense_o, fb_o, lse;
    reference_rows(call, eval.rows, dense_o, lse);
    reference_rows(call, eval.rows, fb_o, lse, first_block);
    const auto count = std::int64_t(eval.rows.size());
    ASSERT_EQ(eval.routed_squared_error.size(), 4u);
    ASSERT_EQ(eval.first_block_squared_error.size(), 4u);
    ASSERT_EQ(eval.reference_squared.size(), 4u);
    for (std::int64_t h = 0; h < 4; ++h) {
      double routed = 0, fb = 0, ref = 0;
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t r = 0; r < count; ++r)
          for (std::int64_t d = 0; d < 64; ++d) {
            const std::size_t at = std::size_t(((b * count + r) * 4 + h) * 64 + d);
            routed += std::pow(double(o.view().load(b, eval.rows[std::size_t(r)], h, d)) - dense_o[at], 2);
            fb += std::pow(fb_o[at] - dense_o[at], 2);
            ref += dense_o[at] * dense_o[at];
          }
      const auto hs = std::size_t(h);
      EXPECT_NEAR(eval.routed_squared_error[hs], routed, 1e-12 * routed) << "head " << h;
      EXPECT_NEAR(eval.reference_squared[hs], ref, 1e-12 * ref) << "head " << h;
      EXPECT_NEAR(eval.first_block_squared_error[hs], fb, 1e-12 * fb) << "head " << h;
      // Only the dense head's first-block output is the dense one.
      if (heads[hs].route == Route::Dense) {
        EXPECT_EQ(fb, 0.0);
      } else {
        EXPECT_GT(fb, 1e-6 * ref) << "head " << h << ": the mask drops nothing";
      }
    }
  };
  const RouteEvaluation all = evaluate_routes(layout, q.view(), k.view(), v.view(), o.view(), heads, 0, seed, 0.f, 1);
  ASSERT_EQ(std::int64_t(all.rows.size()), n);
  for (std::int64_t r = 0; r < n; ++r) EXPECT_EQ(all.rows[std::size_t(r)], r);
  check(all);

  // 7 strata of 60 rows: row i in [60 i / 7, 60 (i + 1) / 7); over a few seeds not always each stratum's first row.
  bool placed = false;
  for (std::uint64_t s = seed; s < seed + 4; ++s) {
    const RouteEvaluation some = evaluate_routes(layout, q.view(), k.view(), v.view(), o.view(), heads, 7, s, 0.f, 2);
    ASSERT_EQ(some.rows.size(), 7u);
    for (std::int64_t i = 0; i < 7; ++i) {
      EXPECT_GE(some.rows[std::size_t(i)], n * i / 7);
      EXPECT_LT(some.rows[std::size_t(i)], n * (i + 1) / 7);
      placed = placed || some.rows[std::size_t(i)] != n * i / 7;
    }
    check(some);
  }
  EXPECT_TRUE(placed) << "stratified rows ignore the seed";
}

// A NaN in the routed output (or the reference) is not "no error": the relative
// error of its head and of every total over it is NaN (relative_l2's own cases:
// Router.RelativeL2FromTheSums).
TEST(RouteEvaluation, ANanIsNotNoError) {
  const VideoLayout layout{{3, 4, 5, 0, TextPlacement::After}, 1, 2, 64};
  const std::int64_t n = layout.tokens();
  Tensor q(DType::F32, 1, n, 2, 64), k(DType::F32, 1, n, 2, 64), v(DType::F32, 1, n, 2, 64), o(DType::F32, 1, n, 2, 64);
  const std::uint64_t seed = testing::fresh_seed();
  testing::fill_normal(q.view(), seed);
  testing::fill_normal(k.view(), seed + 1);
  testing::fill_normal(v.view(), seed + 2);
  testing::fill_normal(o.view(), seed + 3);
  o.view().store(0, 17, 1, 5, std::nanf(""));  // head 1
  std::vector<HeadRoute> heads(2);
  for (HeadRoute& h : heads) std::tie(h.route, h.spec) = std::pair{Route::Spatial, MaskSpec::spatial(7)};
  const RouteEvaluation eval = evaluate_routes(layout, q.view(), k.view(), v.view(), o.view(), heads, 0, seed);
  EXPECT_TRUE(std::isfinite(relative_l2(eval.routed_squared_error[0], eval.reference_squared[0])));
  EXPECT_TRUE(std::isnan(relative_l2(eval.routed_squared_error[1], eval.reference_squared[1])));
  EXPECT_TRUE(std::isnan(eval.rel_l2(eval.routed_squared_error, heads)));
  EXPECT_TRUE(std::isfinite(eval.rel_l2(eval.first_block_squared_error, heads)));
}

// The isas that name the router's products of bf16 pairs on this CPU: Avx512
// (VDPBF16PS) and Amx (tiles), where it has them.
std::vector<Isa> pair_paths() {
  std::vector<Isa> paths;
  if (cpu::machine_supports(Isa::Avx512)) paths.push_back(Isa::Avx512);
  if (cpu::machine_supports(Isa::Amx)) paths.push_back(Isa::Amx);
  return paths;
}

// Isa::Scalar (the fp32 path, on any CPU) and the pair paths.
std::vector<Isa> router_paths() {
  std::vector<Isa> paths{Isa::Scalar};
  for (const Isa isa : pair_paths()) paths.push_back(isa);
  return paths;
}

// The reported FLOPs are exactly the definition's, on the fp32 path and the pair
// paths (the tiles compute more but count the same): every candidate's kept
// pairs (a third candidate, the frame window, adds its own), text forced in.
TEST(Router, FlopsCountEveryCandidatesKeptPairs) {
  synth::Options s;
  s.grid = {5, 6, 7, 3, TextPlacement::Before};
  s.heads = 2;
  s.head_dim = 64;
  s.batch = 2;
  s.dtype = DType::BF16;
  s.seed = testing::fresh_seed();
  const synth::Data data = synth::make_video_tokens(s);
  for (const Isa isa : router_paths())
    for (const bool frame_window : {false, true}) {
      SCOPED_TRACE(std::string(to_string(isa)) + (frame_window ? " with" : " without") + " the frame window, seed " +
                   std::to_string(s.seed));
      RouterOptions ro;
      ro.samples = 16;
      ro.threads = 2;
      ro.isa = isa;
      // Above what the anchor and text alone keep (0.38 here): every candidate's band or window keeps pairs.
      ro.spatial_density = 0.45;
      ro.temporal_density = 0.55;
      ro.frame_window_density = 0.7;
      ro.try_frame_window = frame_window;
      const RoutingReport r = Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view());
      EXPECT_EQ(r.product_units, expected_units(isa, s.dtype));
      ASSERT_EQ(r.heads.size(), 2u);
      ASSERT_EQ(r.sampled_rows.size(), 16u);
      ASSERT_NO_FATAL_FAILURE(check_candidates(r, data.layout.grid, ro));
      for (const CandidateError& c : r.heads[0].candidates)
        EXPECT_TRUE(c.spec.band >= 0 || c.spec.frame_radius >= 0) << c.spec.describe();
      const double flops = expected_flops(data.layout, TokenOrder::FrameMajor, r);
      EXPECT_NEAR(r.flops, flops, 1e-12 * flops);
    }
}

// Every way of computing the sampled attention against the fp64 reference, on the
// shapes the pair paths take (bf16, fp16 (tiles only) and fp8; head dims 64, 96 and 128, and 80,
// 72, 59 and 40 padded with zero channels to 96 and 64) and fp32, which they leave
// to the fp32 path, with ragged key blocks, several key chunks and sub-chunks, text
// before and after, two batch entries, fewer rows than a tile and more, and
// [B, H, N, D] tensors.
TEST(Router, SampledErrorsMatchTheReferenceOnEveryPath) {
  struct Shape {
    VideoLayout layout;
    DType dtype;
    TokenOrder order;
    int samples;
    MemoryLayout memory = MemoryLayout::BNHD;
  };
  const Shape shapes[] = {
      {{{5, 3, 9, 11, TextPlacement::Before}, 2, 2, 64}, DType::BF16, TokenOrder::FrameMajor, 24},
      {{{3, 6, 5, 9, TextPlacement::After}, 1, 2, 96}, DType::F16, TokenOrder::SpatialMajor, 24},
      {{{7, 30, 45, 13, TextPlacement::Before}, 2, 2, 128}, DType::BF16, TokenOrder::FrameMajor, 40},
      {{{4, 20, 24, 7, TextPlacement::After}, 1, 2, 64}, DType::F16, TokenOrder::FrameMajor, 7},
      {{{2, 2, 3, 5, TextPlacement::Before}, 2, 2, 128}, DType::BF16, TokenOrder::SpatialMajor, 64},
      {{{3, 5, 6, 0, TextPlacement::After}, 1, 2, 80}, DType::BF16, TokenOrder::FrameMajor, 24},
      {{{4, 7, 9, 5, TextPlacement::After}, 2, 2, 72}, DType::F16, TokenOrder::SpatialMajor, 20},
      {{{3, 8, 5, 0, TextPlacement::After}, 1, 3, 59}, DType::BF16, TokenOrder::FrameMajor, 33},
      {{{2, 9, 6, 4, TextPlacement::Before}, 1, 2, 40}, DType::F8E4M3, TokenOrder::FrameMajor, 24},
      {{{6, 9, 11, 5, TextPlacement::Before}, 2, 2, 64}, DType::F8E4M3, TokenOrder::SpatialMajor, 24},
      {{{3, 5, 6, 0, TextPlacement::After}, 1, 2, 64}, DType::F32, TokenOrder::FrameMajor, 24},
      {{{4, 6, 7, 3, TextPlacement::Before}, 2, 3, 64}, DType::BF16, TokenOrder::FrameMajor, 24, MemoryLayout::BHND},
  };
  const std::uint64_t seed = testing::fresh_seed();
  for (const Isa isa : router_paths())
    for (std::size_t i = 0; i < std::size(shapes); ++i)
      check_errors_against_reference(shapes[i].layout, shapes[i].dtype, shapes[i].order, seed + i, shapes[i].samples,
                                     isa, shapes[i].memory);
}

RoutingReport route_with(Isa isa, const synth::Data& data, int threads = 0, int samples = 64) {
  RouterOptions ro;
  ro.isa = isa;
  ro.threads = threads;
  ro.samples = samples;
  ro.try_frame_window = true;
  RoutingReport r = Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view());
  check_candidates(r, data.layout.grid, ro);  // the callers loop over them
  return r;
}

// Each pair path against the fp32 path on synthetic heads of known kind: the
// same decisions (the true ones), flops and samples, each error within what the
// weights' rounding moves it. (fp16 on AVX-512 takes the fp32 path: the same.)
TEST(Router, PairPathsDecideLikeTheFp32Path) {
  if (pair_paths().empty()) GTEST_SKIP() << "no AVX-512 here";
  for (const Isa isa : pair_paths())
    // (D = 80 runs padded to 96.)
    for (const auto& [dtype, head_dim] : {std::pair{DType::BF16, 128}, std::pair{DType::F16, 128},
                                          std::pair{DType::F8E4M3, 128}, std::pair{DType::BF16, 80}}) {
      const synth::Options o{.grid = {9, 20, 30, 0, TextPlacement::After}, .heads = 6, .head_dim = head_dim,
                             .dtype = dtype, .seed = testing::fresh_seed()};
      const synth::Data data = synth::make_video_tokens(o);
      // One thread: one work item per chunk with all six heads, packed four and two at a time.
      const RoutingReport fp32 = route_with(Isa::Scalar, data), tiles = route_with(isa, data, 1);
      SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)) + " D=" +
                   std::to_string(head_dim) + " seed " + std::to_string(o.seed));
      EXPECT_EQ(fp32.product_units, ProductUnits::Fma);
      EXPECT_EQ(tiles.product_units, expected_units(isa, dtype));
      EXPECT_EQ(tiles.flops, fp32.flops);
      EXPECT_EQ(tiles.sampled_rows, fp32.sampled_rows);
      ASSERT_EQ(tiles.heads.size(), fp32.heads.size());
      for (std::size_t h = 0; h < tiles.heads.size(); ++h) {
        EXPECT_EQ(tiles.heads[h].route, fp32.heads[h].route) << "head " << h;
        EXPECT_EQ(tiles.heads[h].route, data.truth[h]) << "head " << h;
        for (std::size_t c = 0; c < tiles.heads[h].candidates.size(); ++c) {
          const CandidateError &got = tiles.heads[h].candidates[c], &want = fp32.heads[h].candidates[c];
          // The weights' rounding (2^-16) moves a well-fitting candidate's MSE, a
          // difference of two close outputs, most: measured up to 1.5e-4 of itself
          // with bf16 and fp16 inputs. fp8's synthetic heads fit their true kind to a
          // rel L2 of ~4e-4, where that rounding moves rel L2 by up to ~3e-7 (60
          // seeds): an absolute floor of 1e-6 in rel L2, and the same in MSE terms
          // (MSE = rel^2 x the dense output's mean square, so d MSE = 2 MSE d rel / rel).
          const double rel_floor = 1e-6;
          const double mse_floor = want.rel_l2 > 0 ? 2 * rel_floor * want.mse / want.rel_l2 : 1e-12;
          EXPECT_NEAR(got.mse, want.mse, 1e-3 * want.mse + mse_floor)
              << "head " << h << " candidate " << c;
          EXPECT_NEAR(got.rel_l2, want.rel_l2, 5e-4 * want.rel_l2 + rel_floor) << "head " << h << " candidate " << c;
        }
      }
    }
}

TEST(Router, PairPathErrorsAreBitIdenticalForAnyThreadCount) {
  if (pair_paths().empty()) GTEST_SKIP() << "no AVX-512 here";
  // 7,207 tokens: two key chunks.
  const synth::Options o{.grid = {6, 30, 40, 7, TextPlacement::After}, .batch = 2, .heads = 5, .head_dim = 64,
                         .dtype = DType::BF16, .seed = testing::fresh_seed()};
  const synth::Data data = synth::make_video_tokens(o);
  for (const Isa isa : pair_paths()) {
    SCOPED_TRACE(to_string(isa));
    const RoutingReport one = route_with(isa, data, 1, 20);
    for (int threads : {2, 3, 7}) {
      const RoutingReport many = route_with(isa, data, threads, 20);
      ASSERT_EQ(many.heads.size(), one.heads.size());
      for (std::size_t h = 0; h < one.heads.size(); ++h)
        for (std::size_t c = 0; c < one.heads[h].candidates.size(); ++c)
          EXPECT_EQ(many.heads[h].candidates[c].mse, one.heads[h].candidates[c].mse)
              << threads << " threads, head " << h << ", candidate " << c;
    }
  }
}

// Values below 2^-64 in V, whose products with small weights bf16 tiles flush
// to zero: the chunks holding them are computed by the fp32 path, so a head of
// tiny values gets the fp32 path's errors exactly (and its true route). The
// AVX-512 pair path takes V in fp32 anyway: its errors are the fp32 path's up
// to the scores' last bits.
TEST(Router, TinyValuesTakeTheFp32Path) {
  if (pair_paths().empty()) GTEST_SKIP() << "no AVX-512 here";
  const synth::Options o{.grid = {9, 20, 30, 0, TextPlacement::After}, .heads = 2, .head_dim = 64, .dtype = DType::BF16,
                         .seed = testing::fresh_seed()};
  synth::Data data = synth::make_video_tokens(o);
  const TensorView v = data.v.view();
  for (std::int64_t n = 0; n < data.layout.tokens(); ++n)
    for (std::int64_t d = 0; d < data.layout.head_dim; ++d) v.store(0, n, 1, d, std::ldexp(v.load(0, n, 1, d), -100));
  const RoutingReport fp32 = route_with(Isa::Scalar, data);
  for (const Isa isa : pair_paths()) {
    SCOPED_TRACE(to_string(isa));
    const RoutingReport pairs = route_with(isa, data);
    ASSERT_EQ(pairs.heads.size(), 2u);
    EXPECT_EQ(pairs.heads[1].route, fp32.heads[1].route);
    EXPECT_EQ(pairs.heads[1].route, data.truth[1]);
    for (std::size_t c = 0; c < pairs.heads[1].candidates.size(); ++c) {
      const double got = pairs.heads[1].candidates[c].rel_l2, want = fp32.heads[1].candidates[c].rel_l2;
      EXPECT_GT(pairs.heads[1].candidates[c].mse, 0.0) << c;
      if (isa == Isa::Amx)
        EXPECT_EQ(got, want) << c;
      else  // flushed products would leave the head's outputs 0 and its rel L2 NaN
        EXPECT_NEAR(got, want, 1e-4 * want) << c;
    }
  }
}

// One V value below 2^-64 moves only its own head's chunk to the fp32 path: the
// heads beside it keep the tile path's bits, whatever group the thread count puts
// them in and whichever heads are routed (the whole group used to move with it).
// (The AVX-512 pair path takes V in fp32: the same bits for every head anyway.)
TEST(Router, ATinyValueMovesOnlyItsOwnHeadOffThePairPaths) {
  if (pair_paths().empty()) GTEST_SKIP() << "no AVX-512 here";
  for (const Isa isa : pair_paths()) {
    const synth::Options o{.grid = {4, 16, 16, 0, TextPlacement::After}, .heads = 8, .head_dim = 64,
                           .dtype = DType::BF16, .seed = testing::fresh_seed()};
    SCOPED_TRACE(std::string(to_string(isa)) + " seed " + std::to_string(o.seed));
    synth::Data data = synth::make_video_tokens(o);
    const auto route = [&](int threads, std::span<const std::int64_t> heads = {}) {
      RouterOptions ro;
      ro.isa = isa;
      ro.threads = threads;
      return Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view(), TokenOrder::FrameMajor, 0.f,
                              heads);
    };
    const RoutingReport clean = route(1);
    data.v.view().store(0, 5, 3, 0, 1e-25f);
    const auto same = [](const HeadRoute& a, const HeadRoute& b, const std::string& what) {
      ASSERT_EQ(a.candidates.size(), b.candidates.size()) << what;
      for (std::size_t c = 0; c < a.candidates.size(); ++c)
        EXPECT_EQ(a.candidates[c].mse, b.candidates[c].mse) << what;
    };
    const RoutingReport one = route(1);
    for (const std::int64_t h : {0, 1, 2, 4, 7}) same(one.heads[std::size_t(h)], clean.heads[std::size_t(h)], "head");
    for (const int threads : {2, 3, 8}) {
      const RoutingReport many = route(threads);
      for (std::size_t h = 0; h < 8; ++h) same(many.heads[h], one.heads[h], std::to_string(threads) + " threads");
    }
    const std::int64_t alone[] = {3}, beside[] = {0};
    same(route(2, alone).heads[0], one.heads[3], "head 3 routed alone");
    same(route(2, beside).heads[0], one.heads[0], "head 0 routed alone");
  }
}

// Inf or NaN in bf16, fp16 or fp8 keys: on every path the head is reported
// non-finite and stays dense (the pair products turn an Inf score into Inf or
// NaN, the fp32 path into Inf; both are non-finite).
TEST(Router, NonFiniteLowPrecisionInputsKeepTheHeadDenseOnEveryPath) {
  const VideoLayout layout{{4, 4, 8, 0, TextPlacement::After}, 1, 2, 64};
  for (const DType dtype : {DType::BF16, DType::F16, DType::F8E4M3})
    for (const float bad : {NAN, -INFINITY})  // (-Inf is NaN in fp8, which has no infinity)
      for (const Isa isa : router_paths()) {
        SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::to_string(bad) + " " + std::string(to_string(isa)));
        testing::Problem p = testing::make_problem(layout, dtype, std::vector<HeadMask>(2), testing::fresh_seed());
        for (std::int64_t n = 0; n < layout.tokens(); ++n)
          p.q.view().store(0, n, 1, 0, 0.5f + std::abs(p.q.view().load(0, n, 1, 0)));
        p.k.view().store(0, 77, 1, 0, bad);
        AttentionCall call = p.call();
        RouterOptions lenient;
        lenient.max_rel_l2 = 100;
        lenient.isa = isa;
        const RoutingReport r = Router(lenient).route(layout, call.q, call.k, call.v);
        EXPECT_EQ(r.heads[1].route, Route::Dense);
        EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].mse));
        EXPECT_NE(r.heads[0].route, Route::Dense);
      }
}

TEST(Router, RejectsAnUnknownInstructionSet) {
  RouterOptions bad;
  bad.isa = static_cast<Isa>(9);
  EXPECT_THROW(Router{bad}, InvalidArgument);
}

}  // namespace
}  // namespace stsa

namespace stsa {
namespace {

// A sample count near the token count keeps partial sums of rows x heads x key chunks,
// which grows as the square of the tokens: past this machine's memory it is refused up
// front (ResourceError), where it met the OOM killer partway through. One head of 16
// channels and a sequence long enough for ~2x the memory; inputs of a few tens of MiB.
TEST(Router, PartialSumsPastMemoryAreRefusedUpFront) {
  const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  ASSERT_GT(physical, 0);
  // bytes ~ tokens x (tokens / 4096) x 3 outputs x 16 channels x 4 bytes
  const auto tokens = std::int64_t(std::sqrt(2 * physical * 4096 / (3 * 16 * 4)));
  const VideoLayout layout{{1, 1, tokens, 0, TextPlacement::After}, 1, 1, 16};
  const Tensor q(DType::BF16, 1, tokens, 1, 16), k(DType::BF16, 1, tokens, 1, 16), v(DType::BF16, 1, tokens, 1, 16);
  RouterOptions ro;
  ro.samples = tokens;
  try {
    Router(ro).route(layout, q.view(), k.view(), v.view());
    ADD_FAILURE() << "no exception for " << tokens << " sampled rows";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("partial sums"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stsa
