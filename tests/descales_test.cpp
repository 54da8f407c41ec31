// Per-(batch, head) descales (FlashAttention-3's q_descale, k_descale, v_descale):
// the reference computes with the dequantized values by definition, the CPU
// backend and the router match it, bad descales are refused before anything runs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/reference.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/cpu_isas.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

// The definition, checked on the reference itself: descales give what the
// reference computes on inputs multiplied by them (in fp32, no descales).
TEST(Descales, TheReferenceComputesWithTheDequantizedValues) {
  const VideoLayout layout{{3, 4, 5, 6, TextPlacement::Before}, 2, 3, 64};
  PlanCache plans;
  const std::uint64_t seed = testing::fresh_seed();
  testing::Problem scaled = testing::make_problem(layout, DType::F32, testing::mixed_heads(layout, 0.4, plans), seed);
  testing::give_descales(scaled, seed);
  testing::Problem multiplied = scaled;
  multiplied.q_descale = multiplied.k_descale = multiplied.v_descale = {};
  const AttentionCall by_descales = scaled.call(), by_values = multiplied.call();
  const std::int64_t heads = layout.heads;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t n = 0; n < layout.tokens(); ++n)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < layout.head_dim; ++d) {
          const std::size_t i = std::size_t(b * heads + h);
          by_values.q.store(b, n, h, d, by_descales.q.load(b, n, h, d) * scaled.q_descale[i]);
          by_values.k.store(b, n, h, d, by_descales.k.load(b, n, h, d) * scaled.k_descale[i]);
          by_values.v.store(b, n, h, d, by_descales.v.load(b, n, h, d) * scaled.v_descale[i]);
        }
  const Backend& reference = backend("reference");
  reference.run(by_descales);
  reference.run(by_values);
  double worst = 0;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t n = 0; n < layout.tokens(); ++n) {
        // The products above round to fp32: scores move by ~1e-7 relative, no more.
        EXPECT_NEAR(by_descales.lse.at(b, h, n), by_values.lse.at(b, h, n), 1e-5);
        for (std::int64_t d = 0; d < layout.head_dim; ++d)
          worst = std::max(worst, double(std::abs(by_descales.o.load(b, n, h, d) - by_values.o.load(b, n, h, d))));
      }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(by_descales.o.load(0, 1, 0, 0) * by_descales.o.load(0, 1, 0, 0), 0.f);  // not a vacuous all-zero output
}

// Every kernel of this machine, fp8, bf16 and fp32 inputs, awkward shapes, against the fp64 reference.
TEST(Descales, TheCpuBackendMatchesTheReference) {
  struct Shape {
    VideoGrid grid;
    std::int64_t batch, heads, head_dim;
    DType in, out;
  };
  const Shape shapes[] = {
      {{3, 5, 7, 0, TextPlacement::After}, 1, 3, 64, DType::F8E4M3, DType::BF16},
      {{1, 9, 11, 13, TextPlacement::Before}, 2, 3, 128, DType::F8E4M3, DType::F32},  // one frame, text before
      {{4, 6, 10, 20, TextPlacement::After}, 1, 3, 80, DType::F8E4M3, DType::F16},
      {{2, 12, 16, 7, TextPlacement::Before}, 1, 3, 128, DType::BF16, DType::BF16},  // several 64-tiles
      {{3, 4, 6, 5, TextPlacement::After}, 2, 3, 64, DType::F32, DType::F32},
  };
  std::uint64_t seed = testing::fresh_seed();
  for (const Shape& s : shapes)
    for (Isa isa : testing::isas_of_this_machine()) {
      const VideoLayout layout{s.grid, s.batch, s.heads, s.head_dim};
      PlanCache plans;
      testing::Problem p =
          testing::make_problem(layout, s.in, testing::mixed_heads(layout, 0.3, plans), ++seed, MemoryLayout::BNHD, s.out);
      testing::give_descales(p, seed);
      SCOPED_TRACE(p.label + " isa " + std::string(to_string(isa)));
      make_cpu_backend({isa, 2})->run(p.call());
      const testing::Comparison cmp = testing::compare_with_reference(p);
      EXPECT_TRUE(cmp.ok()) << cmp.failure;
    }
}

// Descales of 1 are no descales: the same bits on every kernel.
TEST(Descales, OnesGiveTheSameBitsAsNone) {
  const VideoLayout layout{{3, 5, 6, 4, TextPlacement::After}, 2, 3, 128};
  PlanCache plans;
  for (DType in : {DType::F8E4M3, DType::BF16, DType::F32})
    for (Isa isa : testing::isas_of_this_machine()) {
      testing::Problem none = testing::make_problem(layout, in, testing::mixed_heads(layout, 0.3, plans),
                                                    testing::fresh_seed(), MemoryLayout::BNHD, DType::BF16);
      testing::Problem ones = none;
      ones.q_descale = ones.k_descale = ones.v_descale = std::vector<float>(std::size_t(2 * 3), 1.f);
      const auto cpu = make_cpu_backend({isa, 2});
      cpu->run(none.call());
      cpu->run(ones.call());
      const AttentionCall a = none.call(), b = ones.call();
      for (std::int64_t n = 0; n < layout.tokens(); ++n)
        for (std::int64_t h = 0; h < layout.heads; ++h) {
          ASSERT_EQ(a.lse.at(1, h, n), b.lse.at(1, h, n)) << to_string(isa);
          for (std::int64_t d = 0; d < layout.head_dim; ++d)
            ASSERT_EQ(a.o.load(1, n, h, d), b.o.load(1, n, h, d)) << to_string(isa);
        }
    }
}

// Q and K of head h (every batch entry) multiplied by `factor`, a power of two: exact in bf16.
void scale_qk(const AttentionCall& call, std::int64_t h, float factor) {
  for (std::int64_t b = 0; b < call.layout.batch; ++b)
    for (std::int64_t n = 0; n < call.layout.tokens(); ++n)
      for (std::int64_t d = 0; d < call.layout.head_dim; ++d) {
        call.q.store(b, n, h, d, call.q.load(b, n, h, d) * factor);
        call.k.store(b, n, h, d, call.k.load(b, n, h, d) * factor);
      }
}

// bf16 Q and K scaled by 2^-62 with descales of 2^62: most products fall under 2^-126,
// which VDPBF16PS and the tile unit flush to zero, so at such a score scale every kernel
// must take fp32 products (kBf16PairScoreScaleLimit); with flushed products rel L2 was ~0.75.
TEST(Descales, TinyBf16ProductsUnderHugeDescalesKeepTheirScores) {
  const VideoLayout layout{{3, 5, 7, 4, TextPlacement::After}, 1, 3, 64};
  PlanCache plans;
  for (Isa isa : testing::isas_of_this_machine()) {
    testing::Problem p = testing::make_problem(layout, DType::BF16, testing::mixed_heads(layout, 0.4, plans),
                                               testing::fresh_seed(), MemoryLayout::BNHD, DType::F32);
    for (std::int64_t h = 0; h < layout.heads; ++h) scale_qk(p.call(), h, 0x1p-62f);
    p.q_descale = p.k_descale = std::vector<float>(std::size_t(layout.heads), 0x1p62f);
    SCOPED_TRACE(p.label + " isa " + std::string(to_string(isa)));
    make_cpu_backend({isa, 2})->run(p.call());
    const testing::Comparison cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
  }
}

// The choice is each head's own: head 1 at a score scale past 2^91 takes fp32 products, and
// heads 0 and 2 beside it keep the bits they get in a call where no head is past it (a
// call-wide choice moved them to fp32 products too), while every head matches the reference.
TEST(Descales, OneHeadPastTheBf16LimitLeavesTheOthersTheirBits) {
  const VideoLayout layout{{3, 5, 7, 4, TextPlacement::After}, 2, 3, 64};
  PlanCache plans;
  for (Isa isa : testing::isas_of_this_machine()) {
    testing::Problem p = testing::make_problem(layout, DType::BF16, testing::mixed_heads(layout, 0.4, plans),
                                               testing::fresh_seed(), MemoryLayout::BNHD, DType::F32);
    scale_qk(p.call(), 1, 0x1p-62f);
    testing::Problem plain = p;  // head 1 without its descales: every head below the limit
    p.q_descale = p.k_descale = {1.f, 0x1p62f, 1.f, 1.f, 0x1p62f, 1.f};  // [b * H + h]
    SCOPED_TRACE(p.label + " isa " + std::string(to_string(isa)));
    const auto cpu = make_cpu_backend({isa, 2});
    cpu->run(p.call());
    const testing::Comparison cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
    cpu->run(plain.call());
    const AttentionCall mixed = p.call(), alone = plain.call();
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (const std::int64_t h : {0, 2})
        for (std::int64_t n = 0; n < layout.tokens(); ++n) {
          ASSERT_EQ(mixed.lse.at(b, h, n), alone.lse.at(b, h, n)) << "head " << h << " token " << n;
          for (std::int64_t d = 0; d < layout.head_dim; ++d)
            ASSERT_EQ(mixed.o.load(b, n, h, d), alone.o.load(b, n, h, d)) << "head " << h << " token " << n;
        }
  }
}

// The router's pair products (AMX tiles, VDPBF16PS) flush the same way: at such a scale it
// computes in fp32 too. (2^-64 here: at 2^-62 the synthetic heads' larger values kept enough
// products above 2^-126 that flushed scores still routed alike on the AVX-512 path.)
TEST(Descales, TheRouterKeepsTinyBf16ProductsUnderHugeDescales) {
  const synth::Options o{.grid = {4, 6, 8, 3, TextPlacement::After}, .heads = 3, .head_dim = 64, .dtype = DType::BF16,
                         .seed = testing::fresh_seed()};
  const synth::Data data = synth::make_video_tokens(o);
  Tensor q = data.q, k = data.k;  // copies, scaled below
  for (std::int64_t n = 0; n < data.layout.tokens(); ++n)
    for (std::int64_t h = 0; h < o.heads; ++h)
      for (std::int64_t d = 0; d < o.head_dim; ++d) {
        q.view().store(0, n, h, d, data.q.view().load(0, n, h, d) * 0x1p-64f);
        k.view().store(0, n, h, d, data.k.view().load(0, n, h, d) * 0x1p-64f);
      }
  const std::vector<float> huge(std::size_t(o.heads), 0x1p64f);
  for (Isa isa : testing::isas_of_this_machine()) {
    SCOPED_TRACE(to_string(isa));
    RouterOptions ro;
    ro.samples = 24;
    ro.isa = isa;
    const Router router(ro);
    const RoutingReport scaled = router.route(data.layout, q.view(), k.view(), data.v.view(), TokenOrder::FrameMajor,
                                              0.f, {}, Descales{huge, huge, {}});
    const RoutingReport plain = router.route(data.layout, data.q.view(), data.k.view(), data.v.view());
    ASSERT_EQ(scaled.heads.size(), plain.heads.size());
    for (std::size_t h = 0; h < plain.heads.size(); ++h) {
      EXPECT_EQ(scaled.heads[h].route, plain.heads[h].route) << "head " << h;
      for (std::size_t c = 0; c < plain.heads[h].candidates.size(); ++c)  // tile and fp32 paths: last bits differ
        EXPECT_NEAR(scaled.heads[h].candidates[c].rel_l2, plain.heads[h].candidates[c].rel_l2,
                    1e-3 * plain.heads[h].candidates[c].rel_l2)
            << "head " << h;
    }
    // The choice is the head's own: head 0 at scale 1 keeps its bits whether it is routed beside
    // head 1 at 2^62 or in a call of its own (as a Ulysses rank holding it alone would route it);
    // a call-wide choice moved it to the fp32 path beside head 1.
    const std::vector<float> mixed{1.f, 0x1p62f, 1.f}, one{1.f};
    const RoutingReport beside = router.route(data.layout, data.q.view(), data.k.view(), data.v.view(),
                                              TokenOrder::FrameMajor, 0.f, {}, Descales{mixed, mixed, {}});
    VideoLayout first = data.layout;
    first.heads = 1;
    TensorView q0 = data.q.view(), k0 = data.k.view(), v0 = data.v.view();
    for (TensorView* t : {&q0, &k0, &v0}) t->shape[2] = 1;  // head 0 alone, same strides
    const RoutingReport solo = router.route(first, q0, k0, v0, TokenOrder::FrameMajor, 0.f, {}, Descales{one, one, {}});
    for (std::size_t c = 0; c < solo.heads[0].candidates.size(); ++c)
      EXPECT_EQ(beside.heads[0].candidates[c].mse, solo.heads[0].candidates[c].mse);
  }
}

TEST(Descales, BadDescalesAreRefusedBeforeAnythingIsWritten) {
  const VideoLayout layout{{2, 3, 4, 0, TextPlacement::After}, 2, 2, 64};
  PlanCache plans;
  testing::Problem p =
      testing::make_problem(layout, DType::F32, testing::mixed_heads(layout, 0.5, plans), testing::fresh_seed());
  const std::vector<float> good(4, 0.5f);
  struct Bad {
    std::vector<float> values;
    const char* message;
  };
  const Bad bad[] = {{std::vector<float>(3, 0.5f), "batch x heads (2 x 2) values, got 3"},
                     {{0.5f, 0.5f, 0.f, 0.5f}, "finite and > 0, got 0 for (batch, head) (1, 0)"},
                     {{0.5f, -1.f, 0.5f, 0.5f}, "finite and > 0"},
                     {{0.5f, 0.5f, 0.5f, std::numeric_limits<float>::quiet_NaN()}, "finite and > 0"},
                     {{std::numeric_limits<float>::infinity(), 0.5f, 0.5f, 0.5f}, "finite and > 0"}};
  for (const char* which : {"q_descale", "k_descale", "v_descale"})
    for (const Bad& b : bad) {
      p.o.poison();
      AttentionCall call = p.call();
      call.descales = Descales{good, good, good};
      std::span<const float>& target = std::string(which) == "q_descale"   ? call.descales.q
                                       : std::string(which) == "k_descale" ? call.descales.k
                                                                           : call.descales.v;
      target = b.values;
      for (const Backend* backend : {&stsa::backend("cpu"), &stsa::backend("reference")}) {
        try {
          backend->run(call);
          ADD_FAILURE() << which << " " << b.message << ": ran";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(std::string(which) + " must"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::isnan(call.o.load(0, 0, 0, 0)));  // still the poison
      }
    }
  // An output over a descale: the caller's factors would change under the call.
  AttentionCall call = p.call();
  for (std::int64_t d = 0; d < 4; ++d) call.o.store(0, 0, 0, d, 0.5f);  // valid factors, so only the overlap is wrong
  call.descales.v = std::span<const float>(static_cast<const float*>(call.o.data), 4);
  EXPECT_THROW(
      {
        try {
          validate(call, true);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("o overlaps an input tensor (v_descale)"), std::string::npos)
              << e.what();
          throw;
        }
      },
      InvalidArgument);
}

// The router scores the dequantized values: its errors with descales are those
// of the inputs multiplied by them (up to the products' fp32 rounding).
// A subset of heads' factors (routed attention's temporal heads): a head outside the call, or
// factors short of B x H, are refused (both were read past the span); narrowing twice with one
// storage vector, which the first result's spans view, reads the values before replacing them
// (the second came out 0).
TEST(Descales, ForHeadsChecksItsHeadsAndMayReuseItsStorage) {
  const std::vector<float> q{1, 2, 3, 4, 5, 6, 7, 8}, v{10, 20, 30, 40, 50, 60, 70, 80};  // B = 2, H = 4
  const Descales all{q, {}, v};
  std::vector<float> storage;
  const std::int64_t odd[] = {3, 1};
  const Descales picked = all.for_heads(odd, 2, 4, storage);
  EXPECT_EQ(std::vector<float>(picked.q.begin(), picked.q.end()), (std::vector<float>{4, 2, 8, 6}));
  EXPECT_TRUE(picked.k.empty());
  EXPECT_EQ(std::vector<float>(picked.v.begin(), picked.v.end()), (std::vector<float>{40, 20, 80, 60}));
  const std::int64_t second[] = {1};
  const Descales again = picked.for_heads(second, 2, 2, storage);  // picked's spans view `storage`
  EXPECT_EQ(std::vector<float>(again.q.begin(), again.q.end()), (std::vector<float>{2, 6}));
  EXPECT_EQ(std::vector<float>(again.v.begin(), again.v.end()), (std::vector<float>{20, 60}));
  const std::int64_t outside[] = {0, 4}, negative[] = {-1};
  EXPECT_THROW(all.for_heads(outside, 2, 4, storage), InvalidArgument);
  EXPECT_THROW(all.for_heads(negative, 2, 4, storage), InvalidArgument);
  EXPECT_THROW(all.for_heads(odd, 3, 4, storage), InvalidArgument);  // 8 factors for 3 x 4
}

TEST(Descales, TheRouterRoutesTheDequantizedValues) {
  const synth::Options o{.grid = {6, 8, 10, 5, TextPlacement::After}, .batch = 2, .heads = 4, .head_dim = 64,
                         .seed = testing::fresh_seed()};
  const synth::Data data = synth::make_video_tokens(o);
  std::mt19937_64 rng(o.seed);
  const std::int64_t count = o.batch * o.heads;
  const std::vector<float> qd = testing::random_descales(count, rng), kd = testing::random_descales(count, rng),
                           vd = testing::random_descales(count, rng);
  Tensor q = data.q, k = data.k, v = data.v;  // copies, multiplied below
  for (std::int64_t b = 0; b < o.batch; ++b)
    for (std::int64_t n = 0; n < data.layout.tokens(); ++n)
      for (std::int64_t h = 0; h < o.heads; ++h)
        for (std::int64_t d = 0; d < o.head_dim; ++d) {
          const std::size_t i = std::size_t(b * o.heads + h);
          q.view().store(b, n, h, d, data.q.view().load(b, n, h, d) * qd[i]);
          k.view().store(b, n, h, d, data.k.view().load(b, n, h, d) * kd[i]);
          v.view().store(b, n, h, d, data.v.view().load(b, n, h, d) * vd[i]);
        }
  RouterOptions ro;
  ro.samples = 24;
  ro.isa = Isa::Avx512;  // fp32 inputs take the fp32 path anyway; no tile products on either side
  const Router router(ro);
  const RoutingReport with = router.route(data.layout, data.q.view(), data.k.view(), data.v.view(),
                                          TokenOrder::FrameMajor, 0.f, {}, Descales{qd, kd, vd});
  const RoutingReport multiplied = router.route(data.layout, q.view(), k.view(), v.view());
  const RoutingReport without = router.route(data.layout, data.q.view(), data.k.view(), data.v.view());
  ASSERT_EQ(with.heads.size(), multiplied.heads.size());
  bool differs_from_without = false;
  for (std::size_t h = 0; h < with.heads.size(); ++h) {
    EXPECT_EQ(with.heads[h].route, multiplied.heads[h].route) << "head " << h;
    for (std::size_t c = 0; c < with.heads[h].candidates.size(); ++c) {
      const CandidateError &a = with.heads[h].candidates[c], &b = multiplied.heads[h].candidates[c];
      EXPECT_NEAR(a.mse, b.mse, 1e-3 * b.mse) << "head " << h;
      EXPECT_NEAR(a.rel_l2, b.rel_l2, 1e-3 * b.rel_l2) << "head " << h;
      differs_from_without |= a.mse != without.heads[h].candidates[c].mse;
    }
  }
  EXPECT_TRUE(differs_from_without);  // the descales reached the errors
  EXPECT_THROW(router.route(data.layout, data.q.view(), data.k.view(), data.v.view(), TokenOrder::FrameMajor, 0.f, {},
                            Descales{std::vector<float>(3, 1.f), {}, {}}),
               InvalidArgument);
}

}  // namespace
}  // namespace stsa
