// The public entry points called from several threads at once, as a serving engine
// or a Python program with threads calls them (the Python module shares one
// PlanCache and the registry's backends across every call, with the GIL released):
// the registry's CPU backend and separate ones, the reference backend, Router::route,
// routed_attention / run_routed / policy_attention on one PlanCache, gather_heads /
// scatter_heads, and set_cpu_defaults changed while calls run. Every result must
// equal, bit for bit, that of the same call made alone on one thread (the CPU
// backend's and the router's bits do not depend on the thread count; the inputs are
// shared and read-only, each caller has its own outputs). Labelled "threads" (its
// name), so the ThreadSanitizer build (.ci/sanitize.sh) runs it too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/reference.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/cpu_isas.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

constexpr int kCallers = 4;

// Runs body(t) for t in [0, threads) on threads of their own, started together.
void run_concurrently(int threads, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      body(t);
    });
  for (auto& w : workers) w.join();
}

std::vector<std::byte> bytes_of(const TensorView& t) {
  const auto* p = static_cast<const std::byte*>(t.data);
  return {p, p + t.numel() * std::int64_t(element_size(t.dtype))};
}
std::vector<std::byte> bytes_of(const LseView& l) {
  const auto* p = reinterpret_cast<const std::byte*>(l.data);
  return {p, p + l.shape[0] * l.shape[1] * l.shape[2] * std::int64_t(sizeof(float))};
}

// One caller's outputs, poisoned (NaN) so that a row a call dropped cannot pass.
struct Outputs {
  Tensor o;
  LseBuffer lse;
  Outputs(const VideoLayout& l, DType dtype)
      : o(dtype, l.batch, l.tokens(), l.heads, l.head_dim), lse(l.batch, l.heads, l.tokens()) {
    std::memset(o.view().data, 0xff, o.bytes());
    const LseView v = lse.view();
    std::memset(v.data, 0xff, std::size_t(v.shape[0] * v.shape[1] * v.shape[2]) * sizeof(float));
  }
  std::vector<std::byte> bits() {
    std::vector<std::byte> all = bytes_of(o.view());
    const std::vector<std::byte> l = bytes_of(lse.view());
    all.insert(all.end(), l.begin(), l.end());
    return all;
  }
};

// Decisions as comparable bits: route, spec and every candidate's errors.
std::string decision_bits(const std::vector<HeadRoute>& heads) {
  std::string s;
  for (const HeadRoute& h : heads) {
    s += std::string(to_string(h.route)) + " " + h.spec.describe() + ";";
    for (const CandidateError& c : h.candidates) {
      s.append(reinterpret_cast<const char*>(&c.mse), sizeof c.mse);
      s.append(reinterpret_cast<const char*>(&c.rel_l2), sizeof c.rel_l2);
    }
    s += "|";
  }
  return s;
}

// Restores the process defaults a test changed.
class ThreadSafety : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = cpu_defaults(); }
  void TearDown() override { set_cpu_defaults(saved_); }

 private:
  CpuOptions saved_;
};

// Random inputs and one mask per head (dense, spatial, temporal in spatial-major
// order, frame window), plans from `plans`.
struct AttentionCase {
  VideoLayout layout;
  DType out = DType::F32;
  Tensor q, k, v;
  std::vector<HeadMask> heads;
  std::vector<float> descales;  // q, k, v: B x H each (empty: none)

  AttentionCase(const VideoLayout& l, DType in, DType out_dtype, std::uint64_t seed, PlanCache& plans,
                TileShape tile = {64, 64}, bool with_descales = false)
      : layout(l),
        out(out_dtype),
        q(in, l.batch, l.tokens(), l.heads, l.head_dim),
        k(in, l.batch, l.tokens(), l.heads, l.head_dim),
        v(in, l.batch, l.tokens(), l.heads, l.head_dim) {
    testing::fill_normal(q.view(), seed * 3 + 1);
    testing::fill_normal(k.view(), seed * 3 + 2);
    testing::fill_normal(v.view(), seed * 3 + 3);
    const MaskSpec specs[] = {mask_for_density(l.grid, SparseKind::Spatial, 0.3),
                              mask_for_density(l.grid, SparseKind::Temporal, 0.25),
                              mask_for_density(l.grid, SparseKind::FrameWindow, 0.5), MaskSpec::dense()};
    for (std::int64_t h = 0; h < l.heads; ++h) {
      const MaskSpec& spec = specs[h % 4];
      heads.push_back(HeadMask{spec, spec.natural_order(), plans.get(l.grid, spec, tile), true});
    }
    if (with_descales) {
      std::mt19937_64 rng(seed);
      descales = testing::random_descales(3 * l.batch * l.heads, rng);
    }
  }
  // The call into `outputs`' tensors.
  AttentionCall call(Outputs& outputs) const {
    AttentionCall c;
    c.layout = layout;
    c.q = q.view();
    c.k = k.view();
    c.v = v.view();
    c.o = outputs.o.view();
    c.lse = outputs.lse.view();
    c.heads = heads;
    if (!descales.empty()) {
      const auto n = std::size_t(layout.batch * layout.heads);
      const std::span<const float> all(descales);
      c.descales = {all.first(n), all.subspan(n, n), all.subspan(2 * n, n)};
    }
    return c;
  }
  std::vector<std::byte> run_on(const Backend& backend) const {
    Outputs outputs(layout, out);
    backend.run(call(outputs));
    return outputs.bits();
  }
};

// The registry's CPU backend (shared by every caller, as Python's calls share it),
// separate CPU backends of other thread counts and the reference backend, at once,
// on fp32, bf16, fp16 and fp8 inputs (the AMX tile kernel where the CPU has it).
TEST_F(ThreadSafety, BackendsServeConcurrentCallersBitForBit) {
  // Shapes that differ in tokens, batch, heads, head dim (80 runs padded) and tile, so that
  // calls interleaved on one backend size its kept buffers differently from call to call.
  const VideoGrid grid{3, 5, 6, 4, TextPlacement::Before};  // 94 tokens: a ragged last tile
  const VideoGrid other{4, 4, 5, 0, TextPlacement::After};  // 80 tokens
  PlanCache plans;
  std::vector<std::unique_ptr<AttentionCase>> cases;
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  cases.push_back(std::make_unique<AttentionCase>(VideoLayout{grid, 1, 4, 64}, DType::F32, DType::F32, seed, plans));
  cases.push_back(
      std::make_unique<AttentionCase>(VideoLayout{grid, 1, 4, 64}, DType::BF16, DType::BF16, seed + 1, plans));
  cases.push_back(std::make_unique<AttentionCase>(VideoLayout{other, 2, 3, 80}, DType::F16, DType::F32, seed + 2, plans,
                                                  TileShape{128, 128}));
  cases.push_back(std::make_unique<AttentionCase>(VideoLayout{other, 1, 5, 128}, DType::F8E4M3, DType::F16, seed + 3,
                                                  plans, TileShape{32, 64}, /*with_descales=*/true));
  cases.push_back(std::make_unique<AttentionCase>(VideoLayout{grid, 2, 2, 32}, DType::BF16, DType::F32, seed + 4, plans,
                                                  TileShape{64, 128}, /*with_descales=*/true));
  std::vector<std::vector<std::byte>> alone_cpu, alone_reference;
  for (const auto& c : cases) {
    alone_cpu.push_back(c->run_on(*make_cpu_backend()));
    alone_reference.push_back(c->run_on(*make_reference_backend()));
  }
  // The registry is first asked for here, by every caller at once (ctest runs each test in a process of its own).
  run_concurrently(kCallers, [&](int t) {
    const Backend& shared_cpu = backend("cpu");
    const Backend& reference = backend("reference");
    const auto own = make_cpu_backend({Isa::Auto, 1 + t % 3});
    for (int round = 0; round < 2; ++round)
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const std::size_t c = (i + std::size_t(t)) % cases.size();  // callers on different cases at once
        const AttentionCase& ac = *cases[c];
        if (t == 3 && round == 1) {
          EXPECT_TRUE(ac.run_on(reference) == alone_reference[c]) << "reference, case " << c;
        } else {
          const Backend& b = (t + round) % 2 == 0 ? shared_cpu : *own;
          EXPECT_TRUE(ac.run_on(b) == alone_cpu[c])
              << (&b == &shared_cpu ? "registry" : "own") << " cpu backend, case " << c << ", caller " << t;
        }
      }
  });
}

// Callers asking one cache for the same plans at once get one plan per key.
TEST_F(ThreadSafety, PlanCacheGivesOnePlanPerKey) {
  const VideoGrid grid{4, 6, 8, 8, TextPlacement::After};
  std::vector<MaskSpec> specs;
  for (double density : {0.1, 0.2, 0.3, 0.5})
    for (SparseKind kind : {SparseKind::Spatial, SparseKind::Temporal, SparseKind::FrameWindow})
      if (const MaskSpec spec = mask_for_density(grid, kind, density); std::ranges::find(specs, spec) == specs.end())
        specs.push_back(spec);  // on a small grid, some densities give one mask
  specs.push_back(MaskSpec::dense());
  ASSERT_GE(specs.size(), 6u);
  const TileShape tiles[] = {{64, 64}, {128, 128}};
  const std::size_t keys = specs.size() * 2;
  PlanCache cache;
  std::vector<std::vector<std::shared_ptr<const TilePlan>>> got(kCallers);
  run_concurrently(kCallers, [&](int t) {
    for (std::size_t i = 0; i < keys; ++i) {
      const std::size_t key = t % 2 == 0 ? i : keys - 1 - i;  // from both ends
      got[std::size_t(t)].push_back(cache.get(grid, specs[key / 2], tiles[key % 2]));
    }
  });
  EXPECT_EQ(cache.size(), keys);
  for (int t = 0; t < kCallers; ++t)
    for (std::size_t i = 0; i < keys; ++i) {
      const std::size_t key = t % 2 == 0 ? i : keys - 1 - i;
      const auto& plan = got[std::size_t(t)][i];
      ASSERT_NE(plan, nullptr);
      EXPECT_EQ(plan, cache.get(grid, specs[key / 2], tiles[key % 2])) << "caller " << t << " key " << key;
      EXPECT_TRUE(plan->spec() == specs[key / 2] && plan->tile() == tiles[key % 2]);
    }
}

// Synthetic heads of known kinds: the router finds spatial and temporal ones, so
// routed calls run both a direct call and a gathered, spatial-major one.
struct RoutedCase {
  synth::Data data;
  DType out = DType::F32;
  RoutedCall call(Outputs& outputs) const {
    return RoutedCall{data.layout, data.q.view(), data.k.view(), data.v.view(), outputs.o.view(), outputs.lse.view()};
  }
};

RoutedCase routed_case(DType dtype, std::uint64_t seed) {
  // 244 tokens; fewer frames route every head dense
  const synth::Options o{.grid = {10, 4, 6, 4, TextPlacement::Before}, .heads = 4, .head_dim = 64, .dtype = dtype,
                         .seed = seed};
  return {synth::make_video_tokens(o), dtype == DType::F32 ? DType::F32 : DType::BF16};
}

RouterOptions small_router() {
  RouterOptions ro;
  ro.samples = 24;
  ro.try_frame_window = true;
  return ro;
}

struct RoutedRun {
  std::string decisions;
  std::vector<std::int64_t> temporal;
  std::vector<std::byte> bits;
  bool operator==(const RoutedRun&) const = default;
};

// The ways a caller runs a routed call: routed (the router's decisions), or given
// decisions with the gather and scatter fused, the scatter alone, or neither
// (gather_heads / scatter_heads passes, with 0 or 2 threads).
enum class Mode { Routed, Fused, ScatterFused, Passes, PassesTwoThreads };
constexpr Mode kModes[] = {Mode::Routed, Mode::Fused, Mode::ScatterFused, Mode::Passes, Mode::PassesTwoThreads};

RoutedRun run_mode(Mode mode, const Backend& backend, PlanCache& plans, const RoutedCase& c, const Router& router,
                   const std::vector<HeadRoute>& given) {
  Outputs outputs(c.data.layout, c.out);
  RoutedOptions options;
  options.tile = {64, 64};
  options.fuse_gather = mode == Mode::Fused;
  options.fuse_scatter = mode == Mode::Fused || mode == Mode::ScatterFused;
  options.permute_threads = mode == Mode::PassesTwoThreads ? 2 : 0;
  const RoutedResult r = mode == Mode::Routed ? routed_attention(backend, plans, c.call(outputs), router, options)
                                              : run_routed(backend, plans, c.call(outputs), given, options);
  return {decision_bits(r.heads), r.temporal, outputs.bits()};
}

// One Router, one PlanCache (empty at the start, so callers build plans at once)
// and the registry's CPU backend or separate ones, shared by callers running
// every mode on fp32 and bf16 inputs.
TEST_F(ThreadSafety, RoutedAttentionSharesRouterPlansAndBackend) {
  const std::uint64_t seed = 7;  // synthetic heads of both kinds: the gathered call runs
  std::vector<RoutedCase> cases;
  cases.push_back(routed_case(DType::F32, seed));
  cases.push_back(routed_case(DType::BF16, seed + 1));
  const Router router(small_router());
  std::vector<std::vector<HeadRoute>> given;
  std::vector<std::vector<RoutedRun>> alone(cases.size());
  {
    PlanCache own_plans;
    const auto own = make_cpu_backend();
    for (std::size_t c = 0; c < cases.size(); ++c) {
      given.push_back(
          router.route(cases[c].data.layout, cases[c].data.q.view(), cases[c].data.k.view(), cases[c].data.v.view())
              .heads);
      for (Mode mode : kModes) alone[c].push_back(run_mode(mode, *own, own_plans, cases[c], router, given[c]));
      ASSERT_FALSE(alone[c][0].temporal.empty()) << "case " << c << ": no temporal head to gather";
      ASSERT_LT(alone[c][0].temporal.size(), std::size_t(cases[c].data.layout.heads)) << "case " << c;
    }
  }
  PlanCache plans;
  const Backend& shared_cpu = backend("cpu");
  std::atomic<int> running{kCallers};
  // One more thread empties the cache now and then (an engine evicting plans): calls keep the plans they hold.
  run_concurrently(kCallers + 1, [&](int t) {
    if (t == kCallers) {
      while (running.load() > 0) {
        plans.clear();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      return;
    }
    const auto own = make_cpu_backend({Isa::Auto, 1 + t % 2});
    for (std::size_t i = 0; i < cases.size() * std::size(kModes); ++i) {
      const std::size_t at = (i + std::size_t(t) * 3) % (cases.size() * std::size(kModes));
      const std::size_t c = at % cases.size(), m = at / cases.size();
      const Backend& b = (t + int(i)) % 2 == 0 ? shared_cpu : *own;
      EXPECT_TRUE(run_mode(kModes[m], b, plans, cases[c], router, given[c]) == alone[c][m])
          << "case " << c << " mode " << m << " caller " << t;
    }
    running.fetch_sub(1);
  });
}

// One Policy shared by callers, each running its own layers through the steps (a
// pipeline of layers on threads), with one PlanCache and the registry's backend;
// another thread reads the cache meanwhile. Every call matches the same sequence run alone.
TEST_F(ThreadSafety, PolicyAttentionSharesOnePolicy) {
  const RoutedCase c = routed_case(DType::BF16, 11);
  PolicyOptions po;
  po.dense_steps = 1;
  po.reuse_steps = 2;
  po.router = small_router();
  constexpr int kLayers = 3, kSteps = 4;
  using Runs = std::vector<RoutedRun>;  // [step]
  const auto run_layer = [&](Policy& policy, PlanCache& plans, const Backend& b, int layer) {
    Runs runs;
    for (int step = 0; step < kSteps; ++step) {
      Outputs outputs(c.data.layout, c.out);
      RoutedOptions options;
      options.tile = {64, 64};
      const RoutedResult r = policy_attention(b, plans, policy, c.call(outputs), step, layer, options);
      runs.push_back({decision_bits(r.heads), r.temporal, outputs.bits()});
    }
    return runs;
  };
  std::vector<Runs> alone;
  {
    Policy policy(po);
    PlanCache plans;
    const auto own = make_cpu_backend();
    for (int layer = 0; layer < kLayers; ++layer) alone.push_back(run_layer(policy, plans, *own, layer));
  }
  Policy policy(po);
  PlanCache plans;
  std::atomic<bool> done{false};
  std::vector<Runs> got(kLayers);
  run_concurrently(kLayers + 1, [&](int t) {
    if (t == kLayers) {  // a reader: the counts and cached decisions, while layers are decided
      while (!done.load()) {
        EXPECT_LE(policy.cached_count(), std::size_t(kLayers * c.data.layout.heads));
        (void)policy.cached(1, 0, 0, c.data.layout.grid);
        (void)plans.size();
        std::this_thread::yield();
      }
      return;
    }
    got[std::size_t(t)] = run_layer(policy, plans, backend("cpu"), t);
    if (t == 0) done = true;  // the reader stops once a layer is done (enough overlap)
  });
  for (int layer = 0; layer < kLayers; ++layer)
    for (int step = 0; step < kSteps; ++step)
      EXPECT_TRUE(got[std::size_t(layer)][std::size_t(step)] == alone[std::size_t(layer)][std::size_t(step)])
          << "layer " << layer << " step " << step;
  EXPECT_EQ(policy.cached_count(), std::size_t(kLayers * c.data.layout.heads));
}

// gather_heads / scatter_heads from callers sharing the source tensors, each with
// its own packed and destination tensors, on different head subsets.
TEST_F(ThreadSafety, GatherAndScatterFromSharedSources) {
  const VideoGrid grid{5, 4, 6, 3, TextPlacement::After};
  Tensor q(DType::BF16, 2, grid.tokens(), 4, 32), v(DType::BF16, 2, grid.tokens(), 4, 32);
  testing::fill_normal(q.view(), 21);
  testing::fill_normal(v.view(), 22);
  LseBuffer lse(2, 4, grid.tokens());
  {
    const LseView l = lse.view();
    for (std::int64_t i = 0; i < 2 * 4 * grid.tokens(); ++i) l.data[i] = float(i) * 0.5f;
  }
  const std::vector<std::vector<std::int64_t>> subsets{{1, 3}, {2}, {0, 1, 2, 3}, {3, 0}};
  struct Result {
    std::vector<std::byte> packed, restored;
  };
  const auto round_trip = [&](const std::vector<std::int64_t>& heads, int threads) {
    const auto count = std::int64_t(heads.size());
    Tensor pq(DType::BF16, 2, grid.tokens(), count, 32), pv(DType::BF16, 2, grid.tokens(), count, 32);
    const TensorView sources[] = {q.view(), v.view()};
    const TensorView packed[] = {pq.view(), pv.view()};
    gather_heads(grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed, threads);
    LseBuffer packed_lse(2, count, grid.tokens()), back_lse(2, 4, grid.tokens());
    // The packed LSE: the gathered heads' rows of `lse`, as an attention call would have stored them.
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t j = 0; j < count; ++j)
        for (std::int64_t n = 0; n < grid.tokens(); ++n)
          packed_lse.view().at(b, j, n) = lse.view().at(b, heads[std::size_t(j)], n);
    Tensor bq(DType::BF16, 2, grid.tokens(), 4, 32), bv(DType::BF16, 2, grid.tokens(), 4, 32);
    const TensorView dests[] = {bq.view(), bv.view()};
    scatter_heads(grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, dests, packed_lse.view(),
                  back_lse.view(), threads);
    Result r;
    for (const TensorView& t : packed) {
      const auto b = bytes_of(t);
      r.packed.insert(r.packed.end(), b.begin(), b.end());
    }
    for (const TensorView& t : dests) {
      const auto b = bytes_of(t);
      r.restored.insert(r.restored.end(), b.begin(), b.end());
    }
    const auto l = bytes_of(back_lse.view());
    r.restored.insert(r.restored.end(), l.begin(), l.end());
    return r;
  };
  std::vector<Result> alone;
  for (const auto& s : subsets) alone.push_back(round_trip(s, 1));
  run_concurrently(kCallers, [&](int t) {
    for (std::size_t i = 0; i < subsets.size(); ++i) {
      const std::size_t s = (i + std::size_t(t)) % subsets.size();
      const Result r = round_trip(subsets[s], t % 2 == 0 ? 0 : 3);
      EXPECT_TRUE(r.packed == alone[s].packed) << "subset " << s << " caller " << t;
      EXPECT_TRUE(r.restored == alone[s].restored) << "subset " << s << " caller " << t;
    }
  });
}

// set_cpu_defaults changed over and over while callers run the registry's CPU
// backend, the router, the permutation and the resolvers, all of which read the
// defaults at each call: thread counts change, the instruction set stays the one
// Auto means (named, or Auto), so every result keeps its bits.
TEST_F(ThreadSafety, DefaultsChangeWhileCallsRun) {
  const Isa isa = resolve_isa(Isa::Auto);
  PlanCache plans;
  const VideoGrid grid{3, 5, 6, 4, TextPlacement::Before};
  const AttentionCase bf16({grid, 1, 4, 64}, DType::BF16, DType::F32, 31, plans);
  const AttentionCase f32({grid, 1, 4, 64}, DType::F32, DType::F32, 32, plans);
  const RoutedCase routed = routed_case(DType::BF16, 7);
  const Router router(small_router());
  const auto route = [&] {
    return decision_bits(
        router.route(routed.data.layout, routed.data.q.view(), routed.data.k.view(), routed.data.v.view()).heads);
  };
  const auto gather = [&](int threads) {
    const VideoLayout& l = routed.data.layout;
    const std::vector<std::int64_t> heads{3, 1};
    Tensor pq(DType::BF16, l.batch, l.tokens(), 2, l.head_dim), pk(DType::BF16, l.batch, l.tokens(), 2, l.head_dim);
    const TensorView sources[] = {routed.data.q.view(), routed.data.k.view()};
    const TensorView packed[] = {pq.view(), pk.view()};
    gather_heads(l.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed, threads);
    std::vector<std::byte> all = bytes_of(pq.view());
    const auto k = bytes_of(pk.view());
    all.insert(all.end(), k.begin(), k.end());
    return all;
  };
  const std::vector<std::byte> alone_gather = gather(1);
  const std::vector<std::byte> alone_bf16 = bf16.run_on(backend("cpu")), alone_f32 = f32.run_on(backend("cpu"));
  const std::string alone_route = route();
  const int hardware = resolve_threads(0);

  std::atomic<bool> done{false};
  std::atomic<int> changes{0};
  std::thread flipper([&] {
    for (int i = 0; !done.load(); ++i) {
      set_cpu_defaults({i % 2 == 0 ? Isa::Auto : isa, i % 4});
      changes.fetch_add(1);
      std::this_thread::yield();
    }
  });
  while (changes.load() == 0) std::this_thread::yield();  // on 2 cores the callers could finish before it starts
  run_concurrently(3, [&](int t) {
    for (int i = 0; i < 3; ++i) {
      switch (t) {
        case 0:
          EXPECT_TRUE(bf16.run_on(backend("cpu")) == alone_bf16) << "bf16 call " << i;
          EXPECT_TRUE(f32.run_on(backend("cpu")) == alone_f32) << "fp32 call " << i;
          break;
        case 1:
          EXPECT_EQ(route(), alone_route) << "route " << i;
          break;
        default:
          for (int j = 0; j < 50; ++j) {
            EXPECT_EQ(resolve_isa(Isa::Auto), isa);
            const int threads = resolve_threads(0);
            EXPECT_TRUE(threads == hardware || (threads >= 1 && threads <= 3)) << threads;
          }
          EXPECT_TRUE(gather(0) == alone_gather) << "gather " << i;
      }
    }
  });
  done = true;
  flipper.join();
}

// The instruction set changed too, while callers run: each call runs one
// configuration, so its bits are those of one instruction set run alone (the
// router's those of the fp32 path, the AVX-512 pair scores or the AMX tiles); a caller making refused calls
// meanwhile changes nothing for the others.
TEST_F(ThreadSafety, InstructionSetChangesWhileCallsRun) {
  const std::vector<Isa> isas = testing::isas_of_this_machine();
  PlanCache plans;
  const VideoGrid grid{3, 5, 6, 4, TextPlacement::Before};
  const AttentionCase bf16({grid, 1, 4, 64}, DType::BF16, DType::F32, 41, plans);
  const RoutedCase routed = routed_case(DType::BF16, 8);
  const auto route = [&](const RouterOptions& options) {
    return decision_bits(
        Router(options)
            .route(routed.data.layout, routed.data.q.view(), routed.data.k.view(), routed.data.v.view())
            .heads);
  };
  std::vector<std::vector<std::byte>> alone;  // per instruction set
  std::vector<std::string> alone_routes;      // the fp32 path, then the pair paths this CPU has
  RouterOptions options = small_router();
  for (Isa isa : isas) {
    alone.push_back(bf16.run_on(*make_cpu_backend({isa, 0})));
    if (isa == Isa::Scalar || isa == Isa::Avx512 || isa == Isa::Amx) {
      options.isa = isa;
      alone_routes.push_back(route(options));
    }
  }
  options.isa = Isa::Auto;
  const auto one_of = [](const auto& got, const auto& expected) {
    return std::ranges::find(expected, got) != expected.end();
  };

  std::atomic<bool> done{false};
  std::atomic<int> changes{0};
  std::thread flipper([&] {
    for (int i = 0; !done.load(); ++i) {
      set_cpu_defaults({isas[std::size_t(i) % isas.size()], i % 3});
      changes.fetch_add(1);
      std::this_thread::yield();
    }
  });
  while (changes.load() == 0) std::this_thread::yield();
  const auto own = make_cpu_backend();
  run_concurrently(kCallers, [&](int t) {
    for (int i = 0; i < 4; ++i) {
      switch (t) {
        case 0:
          EXPECT_TRUE(one_of(bf16.run_on(backend("cpu")), alone)) << "registry backend, call " << i;
          break;
        case 1:
          EXPECT_TRUE(one_of(bf16.run_on(*own), alone)) << "own backend, call " << i;
          break;
        case 2:
          EXPECT_TRUE(one_of(route(options), alone_routes)) << "route " << i;
          break;
        default: {
          Outputs outputs(bf16.layout, DType::F32);
          AttentionCall refused = bf16.call(outputs);
          refused.heads.pop_back();  // a mask short
          EXPECT_THROW(backend("cpu").run(refused), InvalidArgument);
          refused = bf16.call(outputs);
          refused.heads[1].plan = refused.heads[0].plan;  // another mask's plan
          EXPECT_THROW(own->run(refused), InvalidArgument);
          EXPECT_TRUE(one_of(bf16.run_on(backend("cpu")), alone)) << "registry backend after refusals, call " << i;
        }
      }
    }
  });
  done = true;
  flipper.join();
}

}  // namespace
}  // namespace stsa
