// Policy: dense warm-up by explicit counts, decision reuse and its misses,
// presets with the documented shapes, and routed attention under a policy.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "stsa/error.hpp"
#include "stsa/policy.hpp"
#include "stsa/routed.hpp"
#include "stsa/synth.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

const VideoGrid kGrid{5, 4, 6, 0, TextPlacement::After};

HeadRoute decision(Route r) {
  HeadRoute d;
  d.route = r;
  d.spec = route_spec(kGrid, r, RouterOptions{});
  return d;
}

TEST(Policy, DenseWarmUpUsesExplicitCounts) {
  PolicyOptions o;
  o.dense_steps = 3;
  o.dense_layers = 1;
  const Policy p(o);
  EXPECT_TRUE(p.dense(0, 5));
  EXPECT_TRUE(p.dense(2, 5));
  EXPECT_FALSE(p.dense(3, 5));
  EXPECT_TRUE(p.dense(3, 0));
  EXPECT_FALSE(p.dense(100, 1));
  EXPECT_FALSE(Policy().dense(0, 0));  // no warm-up by default
  EXPECT_THROW(p.dense(-1, 0), InvalidArgument);
  EXPECT_THROW(p.dense(0, -1), InvalidArgument);
}

TEST(Policy, ReusesADecisionForRSteps) {
  PolicyOptions o;
  o.reuse_steps = 3;
  Policy p(o);
  EXPECT_FALSE(p.cached(4, 2, 1, kGrid));
  p.remember(4, 2, 1, kGrid, decision(Route::Temporal));
  EXPECT_EQ(p.cached(4, 2, 1, kGrid)->route, Route::Temporal);
  EXPECT_EQ(p.cached(6, 2, 1, kGrid)->route, Route::Temporal);
  EXPECT_FALSE(p.cached(7, 2, 1, kGrid));  // expired
  EXPECT_FALSE(p.cached(3, 2, 1, kGrid));  // an earlier step: a new generation
  EXPECT_FALSE(p.cached(5, 2, 0, kGrid));  // other head
  EXPECT_FALSE(p.cached(5, 3, 1, kGrid));  // other layer
  VideoGrid other = kGrid;
  other.frames = 6;
  EXPECT_FALSE(p.cached(5, 2, 1, other));  // other grid (resolution changed)
  // The same video with 9 text tokens (the other guidance pass's prompt): the route, its mask sized to that grid.
  VideoGrid prompted = kGrid;
  prompted.text_tokens = 9;
  const std::optional<HeadRoute> resized = p.cached(5, 2, 1, prompted);
  ASSERT_TRUE(resized);
  EXPECT_EQ(resized->route, Route::Temporal);
  EXPECT_EQ(resized->spec, route_spec(prompted, Route::Temporal, RouterOptions{}));
  EXPECT_NO_THROW(resized->spec.validate(prompted));
  EXPECT_FALSE(p.cached(7, 2, 1, prompted));  // expired there too
  EXPECT_EQ(p.cached_count(), 1u);
  p.remember(7, 2, 1, kGrid, decision(Route::Spatial));  // replaces
  EXPECT_EQ(p.cached(8, 2, 1, kGrid)->route, Route::Spatial);
  EXPECT_EQ(p.cached_count(), 1u);
  p.clear();
  EXPECT_EQ(p.cached_count(), 0u);
  // R = 1: a decision serves only its own step.
  Policy every(PolicyOptions{});
  every.remember(0, 0, 0, kGrid, decision(Route::Spatial));
  EXPECT_TRUE(every.cached(0, 0, 0, kGrid));
  EXPECT_FALSE(every.cached(1, 0, 0, kGrid));
  // Huge steps do not overflow.
  every.remember(INT64_MAX - 1, 0, 0, kGrid, decision(Route::Spatial));
  EXPECT_TRUE(every.cached(INT64_MAX - 1, 0, 0, kGrid));
  EXPECT_FALSE(every.cached(INT64_MAX, 0, 0, kGrid));
}

TEST(Policy, RejectsBadOptions) {
  PolicyOptions o;
  o.reuse_steps = 0;
  EXPECT_THROW(Policy{o}, InvalidArgument);
  o = {};
  o.dense_steps = -1;
  EXPECT_THROW(Policy{o}, InvalidArgument);
  o = {};
  o.dense_layers = -2;
  EXPECT_THROW(Policy{o}, InvalidArgument);
  o = {};
  o.router.spatial_density = 2;
  EXPECT_THROW(Policy{o}, InvalidArgument);
  Policy p;
  EXPECT_THROW(p.remember(-1, 0, 0, kGrid, decision(Route::Spatial)), InvalidArgument);
  HeadRoute broken = decision(Route::Spatial);
  broken.spec.band = -5;
  EXPECT_THROW(p.remember(0, 0, 0, kGrid, broken), InvalidArgument);
}

TEST(ModelPresets, HaveTheDocumentedShapes) {
  EXPECT_EQ(model_preset("wan2.1-480p").grid.video_tokens(), 32760);
  EXPECT_EQ(model_preset("wan2.1-720p").grid.video_tokens(), 75600);
  EXPECT_EQ(model_preset("wan2.1-720p").heads, 40);
  EXPECT_EQ(model_preset("wan2.1-720p").kv_heads, 0);  // K and V with every head
  EXPECT_EQ(model_preset("wan2.1-1.3b-480p").heads, 12);
  const ModelPreset& a14b = model_preset("wan2.2-a14b-720p");
  EXPECT_EQ(a14b.grid.video_tokens(), 75600);
  EXPECT_EQ(a14b.heads * a14b.layers, 40 * 40);
  EXPECT_EQ(a14b.steps, 40);
  EXPECT_EQ(model_preset("wan2.2-a14b-480p").grid.video_tokens(), 32760);
  const ModelPreset& ti2v = model_preset("wan2.2-5b-720p");
  EXPECT_EQ(ti2v.grid.video_tokens(), 27280);  // (121 - 1) / 4 + 1 frames of 704/32 x 1280/32
  EXPECT_EQ(ti2v.heads * ti2v.head_dim, 3072);
  EXPECT_EQ(model_preset("ltx-video").grid.video_tokens(), 7392);  // (161 - 1) / 8 + 1 frames of 512/32 x 704/32
  const ModelPreset& ltx2 = model_preset("ltx-2");
  EXPECT_EQ(ltx2.grid.video_tokens(), 6144);  // (121 - 1) / 8 + 1 frames of 512/32 x 768/32
  EXPECT_EQ(ltx2.heads * ltx2.head_dim, 4096);
  EXPECT_EQ(ltx2.layers, 48);
  EXPECT_EQ(model_preset("ltx-2-1080p").grid.video_tokens(), 32640);  // 16 frames of 1088/32 x 1920/32
  const ModelPreset& hunyuan = model_preset("hunyuan-720p");
  EXPECT_EQ(hunyuan.grid.video_tokens(), 118800);
  EXPECT_EQ(hunyuan.grid.text_tokens, 256);
  EXPECT_EQ(hunyuan.grid.text_placement, TextPlacement::After);
  EXPECT_EQ(hunyuan.heads * hunyuan.head_dim, 24 * 128);
  EXPECT_EQ(hunyuan.layers, 60);
  const ModelPreset& cog = model_preset("cogvideox1.5");
  EXPECT_EQ(cog.grid.video_tokens(), 44880);
  EXPECT_EQ(cog.grid.text_tokens, 226);
  EXPECT_EQ(cog.grid.text_placement, TextPlacement::Before);
  EXPECT_EQ(cog.head_dim, 64);
  const ModelPreset& hunyuan15 = model_preset("hunyuan1.5-720p");
  EXPECT_EQ(hunyuan15.grid.video_tokens(), 111600);  // (121 - 1) / 4 + 1 frames of 720/16 x 1280/16
  EXPECT_EQ(hunyuan15.grid.text_tokens, 1256);
  EXPECT_EQ(hunyuan15.heads * hunyuan15.head_dim, 2048);
  EXPECT_EQ(model_preset("hunyuan1.5-480p").grid.video_tokens(), 49290);  // 31 frames of 480/16 x 848/16
  EXPECT_EQ(model_preset("skyreels-v2-14b-540p").grid.video_tokens(), 51000);  // 25 frames of 544/16 x 960/16
  EXPECT_EQ(model_preset("skyreels-v2-14b-720p").grid.video_tokens(), 111600);  // (121 - 1) / 4 + 1 = 31 frames of 45 x 80
  const ModelPreset& cosmos = model_preset("cosmos-predict2.5-14b");
  EXPECT_EQ(cosmos.grid.video_tokens(), 84480);  // (93 - 1) / 4 + 1 frames of 704/16 x 1280/16
  EXPECT_EQ(cosmos.steps, 36);
  EXPECT_EQ(model_preset("cosmos-predict2.5-2b").heads, 16);
  const ModelPreset& cosmos3 = model_preset("cosmos3-720p");
  EXPECT_EQ(cosmos3.grid.video_tokens(), 44160);  // (189 - 1) / 4 + 1 frames of ceil(720/32) x 1280/32 patches
  EXPECT_EQ(cosmos3.heads * cosmos3.head_dim, 4096);
  EXPECT_EQ(cosmos3.heads, 32);
  EXPECT_EQ(cosmos3.kv_heads, 8);  // grouped-query attention
  const ModelPreset& mochi = model_preset("mochi-1-480p");
  EXPECT_EQ(mochi.grid.video_tokens(), 44520);  // (163 - 1) / 6 + 1 frames of 480/16 x 848/16
  EXPECT_EQ(mochi.grid.text_tokens, 256);
  EXPECT_EQ(mochi.heads * mochi.head_dim, 24 * 128);
  EXPECT_EQ(mochi.steps, 64);
  const ModelPreset& framepack = model_preset("framepack-720p");
  EXPECT_EQ(framepack.grid.video_tokens(), 32400);  // a section's 9 latent frames of 720/16 x 1280/16
  // History 2 x 45 x 80 + (2/2) x ceil(90/4) x (160/4) + (16/4) x ceil(90/8) x (160/8), image 27 x 27, prompt 256.
  EXPECT_EQ(framepack.grid.text_tokens, 7200 + 920 + 960 + 729 + 256);
  EXPECT_EQ(framepack.layers, 60);
  const ModelPreset& kandinsky = model_preset("kandinsky5-lite");
  EXPECT_EQ(kandinsky.grid.video_tokens(), 47616);  // 31 frames of 512/16 x 768/16
  EXPECT_EQ(kandinsky.heads * kandinsky.head_dim, 1792);
  const ModelPreset& anyflow = model_preset("anyflow-14b-480p");
  EXPECT_EQ(anyflow.grid.video_tokens(), 32760);
  EXPECT_EQ(anyflow.steps, 4);  // distilled: a warm-up sized for 50 steps would leave it dense
  EXPECT_EQ(anyflow.policy.dense_steps, 1);
  const ModelPreset& helios = model_preset("helios-384p");
  EXPECT_EQ(helios.grid.video_tokens(), 8640);  // a chunk's (33 - 1) / 4 + 1 frames of 384/16 x 640/16
  // History 2 x 24 x 40 + (2/2) x (24/2) x (40/2) + (16/4) x (24/4) x (40/4).
  EXPECT_EQ(helios.grid.text_tokens, 1920 + 240 + 240);
  EXPECT_EQ(helios.heads * helios.head_dim, 5120);
  for (const auto& p : model_presets()) {
    EXPECT_NO_THROW(p.layout(2).validate()) << p.name;
    EXPECT_NO_THROW(Policy{p.policy}) << p.name;
    EXPECT_GT(p.policy.dense_steps, 0) << p.name;
    EXPECT_LT(p.policy.dense_steps, p.steps) << p.name;
    EXPECT_FALSE(p.description.empty());
  }
  EXPECT_THROW(model_preset("sora"), InvalidArgument);
}

// decide(): the router sees only the heads without a reusable decision, once,
// and never in the warm-up; what it returns is remembered.
TEST(Policy, DecideRoutesOnlyTheHeadsWithoutAReusableDecision) {
  PolicyOptions o;
  o.dense_steps = 1;
  o.reuse_steps = 3;
  Policy p(o);
  const VideoLayout layout{kGrid, 1, 4, 64};
  std::vector<std::vector<std::int64_t>> asked;
  const Policy::RouteHeads route = [&](std::span<const std::int64_t> heads) {
    asked.emplace_back(heads.begin(), heads.end());
    RoutingReport r;
    for (std::size_t i = 0; i < heads.size(); ++i) r.heads.push_back(decision(i % 2 ? Route::Temporal : Route::Spatial));
    r.flops = 1;
    return r;
  };
  PolicyDecisions d = p.decide(0, 0, layout, route);  // warm-up
  EXPECT_TRUE(asked.empty());
  ASSERT_EQ(d.heads.size(), 4u);
  for (const auto& h : d.heads) EXPECT_EQ(h.route, Route::Dense);
  EXPECT_EQ(d.routing.flops, 0);

  d = p.decide(1, 0, layout, route);  // everything routed
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(d.heads[1].route, Route::Temporal);
  EXPECT_EQ(d.routing.flops, 1);
  EXPECT_EQ(p.cached_count(), 4u);

  d = p.decide(3, 0, layout, route);  // decisions of step 1 hold for steps 1-3
  EXPECT_EQ(asked.size(), 1u);
  p.remember(3, 0, 2, kGrid, decision(Route::FrameWindow));  // head 2 fresh at step 3; the others expire at 4
  d = p.decide(4, 0, layout, route);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], (std::vector<std::int64_t>{0, 1, 3}));
  EXPECT_EQ(d.heads[2].route, Route::FrameWindow);
  EXPECT_EQ(d.heads[3].route, Route::Spatial);  // the router's third answer (index 2: even)

  d = p.decide(5, 0, layout, route);  // all reusable
  EXPECT_EQ(asked.size(), 2u);
  EXPECT_EQ(d.routing.flops, 0);

  const Policy::RouteHeads short_router = [](std::span<const std::int64_t>) { return RoutingReport{}; };
  EXPECT_THROW(p.decide(6, 7, layout, short_router), InvalidArgument);  // layer 7: nothing cached, 0 answers
  EXPECT_THROW(p.decide(-1, 0, layout, route), InvalidArgument);
}

TEST(PolicyAttention, WarmUpRunsDenseAndReuseSkipsRouting) {
  synth::Options so;
  so.grid = kGrid;
  so.heads = 4;
  so.head_dim = 64;
  so.seed = testing::fresh_seed();
  const synth::Data d = synth::make_video_tokens(so);
  // Outputs poisoned (NaN), inputs the synthetic heads' so the router has kinds to find.
  testing::Problem p = testing::make_problem(d.layout, DType::F32, std::vector<HeadMask>(4), so.seed);
  std::memcpy(p.q.view().data, d.q.view().data, d.q.bytes());
  std::memcpy(p.k.view().data, d.k.view().data, d.k.bytes());
  std::memcpy(p.v.view().data, d.v.view().data, d.v.bytes());
  const AttentionCall c = p.call();
  const RoutedCall call{c.layout, c.q, c.k, c.v, c.o, c.lse, c.softmax_scale, c.descales};
  PolicyOptions po;
  po.dense_steps = 2;
  po.reuse_steps = 2;
  po.router.samples = 16;
  // Above the 0.36 the frame-0 anchor keeps alone: bands of their own, so temporal heads route temporal.
  po.router.spatial_density = po.router.temporal_density = 0.5;
  Policy policy(po);
  PlanCache plans;
  const Backend& ref = backend("reference");
  // One step on freshly poisoned outputs, compared with the fp64 reference under the masks it reports.
  const auto step = [&](std::int64_t s, RoutedResult& r) {
    p.o.poison();
    p.lse.poison();
    r = policy_attention(ref, plans, policy, call, s, 3);
    ASSERT_EQ(r.heads.size(), 4u) << "step " << s;
    p.heads.clear();
    std::string masks;
    for (const HeadRoute& h : r.heads) {
      p.heads.push_back(HeadMask{h.spec, TokenOrder::FrameMajor, nullptr, true});
      masks += " [" + h.spec.describe() + "]";
    }
    const testing::Comparison cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << "step " << s << ", seed " << so.seed << ", masks" << masks << ": " << cmp.failure;
  };
  RoutedResult r;
  ASSERT_NO_FATAL_FAILURE(step(1, r));
  for (const auto& h : r.heads) EXPECT_EQ(h.route, Route::Dense);
  EXPECT_EQ(policy.cached_count(), 0u);
  ASSERT_NO_FATAL_FAILURE(step(2, r));  // routed and remembered
  EXPECT_GT(r.routing_ms, 0.0);
  EXPECT_EQ(policy.cached_count(), 4u);
  const auto routed = r.heads;
  ASSERT_NO_FATAL_FAILURE(step(3, r));  // reused: no routing
  EXPECT_EQ(r.routing_ms, 0.0);
  for (std::size_t h = 0; h < routed.size(); ++h) {
    EXPECT_EQ(r.heads[h].route, routed[h].route) << "head " << h;
    EXPECT_EQ(r.heads[h].spec, routed[h].spec) << "head " << h << ": " << r.heads[h].spec.describe() << ", routed "
                                               << routed[h].spec.describe();
  }
  ASSERT_NO_FATAL_FAILURE(step(4, r));  // expired: routed again
  EXPECT_GT(r.routing_ms, 0.0);
}

}  // namespace
}  // namespace stsa
