// The process defaults (set_cpu_defaults): what Isa::Auto and threads = 0 mean
// for the CPU backend and the router, before STSA_ISA / STSA_THREADS, from each
// object's next call on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cpu/isa.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

// Sets (or clears) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      ::setenv(name_, saved_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// Every test starts and ends with the defaults unset.
class CpuDefaults : public ::testing::Test {
 protected:
  void SetUp() override { set_cpu_defaults({}); }
  void TearDown() override { set_cpu_defaults({}); }
};

bool same(const CpuOptions& a, const CpuOptions& b) { return a.isa == b.isa && a.threads == b.threads; }

testing::Problem spatial_problem(DType dtype) {
  const VideoGrid grid{3, 5, 6, 4, TextPlacement::After};  // 94 tokens: ragged tiles
  const VideoLayout layout{grid, 1, 2, 64};
  const MaskSpec spec = mask_for_density(grid, SparseKind::Spatial, 0.4);
  PlanCache plans;
  return testing::make_problem(layout, dtype, uniform_heads(layout, spec, plans), testing::fresh_seed());
}

// O and LSE of a run, as bits.
std::vector<float> outputs(const AttentionCall& call) {
  std::vector<float> all;
  const VideoLayout& l = call.layout;
  for (std::int64_t n = 0; n < l.tokens(); ++n)
    for (std::int64_t h = 0; h < l.heads; ++h) {
      all.push_back(call.lse.at(0, h, n));
      for (std::int64_t d = 0; d < l.head_dim; ++d) all.push_back(call.o.load(0, n, h, d));
    }
  return all;
}

std::vector<float> run_with(const Backend& backend, testing::Problem& problem) {
  problem.o.poison();  // the last run's bits must not stand in for work a call dropped
  problem.lse.poison();
  const AttentionCall call = problem.call();
  backend.run(call);
  return outputs(call);
}

TEST_F(CpuDefaults, StartUnsetAndResolveBeforeTheMachine) {
  EXPECT_TRUE(same(cpu_defaults(), CpuOptions{}));
  set_cpu_defaults({Isa::Scalar, 3});
  EXPECT_TRUE(same(cpu_defaults(), CpuOptions{Isa::Scalar, 3}));
  EXPECT_EQ(resolve_threads(0), 3);
  EXPECT_EQ(resolve_isa(Isa::Auto), Isa::Scalar);
  // What a caller asks for explicitly still wins.
  EXPECT_EQ(resolve_threads(5), 5);
  EXPECT_EQ(resolve_isa(cpu::machine_best_isa()), cpu::machine_best_isa());
  set_cpu_defaults({});
  EXPECT_EQ(resolve_isa(Isa::Auto), best_isa());
}

TEST_F(CpuDefaults, RefusedDefaultsChangeNothing) {
  set_cpu_defaults({Isa::Scalar, 2});
  EXPECT_THROW(set_cpu_defaults({Isa::Auto, -1}), InvalidArgument);
  EXPECT_THROW(set_cpu_defaults({Isa::Auto, 4097}), InvalidArgument);
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Amx}) {
    if (!cpu::machine_supports(isa)) {
      EXPECT_THROW(set_cpu_defaults({isa, 0}), Unsupported) << to_string(isa);
    }
  }
  EXPECT_TRUE(same(cpu_defaults(), CpuOptions{Isa::Scalar, 2}));
}

TEST_F(CpuDefaults, ComeBeforeTheEnvironment) {
  const auto problem = spatial_problem(DType::F32);
  const auto backend = make_cpu_backend();
  {
    const ScopedEnv threads("STSA_THREADS", "many");
    EXPECT_THROW(resolve_threads(0), InvalidArgument);
    const Support refused = backend->supports(problem.call());
    EXPECT_FALSE(refused.ok);
    EXPECT_NE(refused.why.find("STSA_THREADS"), std::string::npos) << refused.why;
    EXPECT_THROW(backend->run(problem.call()), InvalidArgument);  // a malformed setting, not a CPU that lacks one
    set_cpu_defaults({Isa::Auto, 2});
    EXPECT_EQ(resolve_threads(0), 2);
    EXPECT_TRUE(backend->supports(problem.call()).ok);
  }
  {
    const ScopedEnv isa("STSA_ISA", "sse");
    set_cpu_defaults({});
    EXPECT_FALSE(backend->supports(problem.call()).ok);
    // Named no instruction set: InvalidArgument, as a malformed STSA_THREADS is (it was Unsupported).
    EXPECT_THROW(backend->run(problem.call()), InvalidArgument);
    EXPECT_THROW(resolve_isa(Isa::Auto), InvalidArgument);
    set_cpu_defaults({Isa::Scalar, 0});
    EXPECT_TRUE(backend->supports(problem.call()).ok);
    EXPECT_EQ(resolve_isa(Isa::Auto), Isa::Scalar);
  }
}

// A backend made before the change (the registry's, say) runs with the new
// defaults from its next call: the same bits as one made with them explicitly.
TEST_F(CpuDefaults, ReachABackendMadeBefore) {
  auto problem = spatial_problem(DType::BF16);
  const auto backend = make_cpu_backend();
  const Isa best = best_isa();  // what Auto means without defaults (STSA_ISA may cap it)

  set_cpu_defaults({Isa::Scalar, 1});
  const std::vector<float> scalar = run_with(*backend, problem);
  EXPECT_EQ(scalar, run_with(*make_cpu_backend({Isa::Scalar, 1}), problem));

  set_cpu_defaults({Isa::Auto, 3});  // a new thread count: the pool is remade
  const std::vector<float> fastest = run_with(*backend, problem);
  EXPECT_EQ(fastest, run_with(*make_cpu_backend({best, 2}), problem));
  // The two kernels round differently, so equality above says which one ran.
  if (best != Isa::Scalar) {
    EXPECT_NE(scalar, fastest);
  }

  set_cpu_defaults({});
  EXPECT_EQ(run_with(*backend, problem), fastest);  // the thread count never changes the bits
}

// The router's threads = 0 follows the same rule (it used to take all hardware
// threads whatever STSA_THREADS said).
TEST_F(CpuDefaults, ReachTheRouter) {
  const synth::Options o{.grid = {4, 12, 16, 0, TextPlacement::After}, .heads = 3, .head_dim = 64,
                         .dtype = DType::BF16, .seed = testing::fresh_seed()};
  const synth::Data data = synth::make_video_tokens(o);
  RouterOptions ro;
  ro.samples = 16;
  const Router router(ro);
  auto route = [&] { return router.route(data.layout, data.q.view(), data.k.view(), data.v.view()); };
  const RoutingReport all = route();
  {
    const ScopedEnv threads("STSA_THREADS", "-3");
    EXPECT_THROW(route(), InvalidArgument);
    set_cpu_defaults({Isa::Auto, 3});
    const RoutingReport three = route();
    ASSERT_EQ(three.heads.size(), all.heads.size());
    for (std::size_t h = 0; h < all.heads.size(); ++h) {
      for (std::size_t c = 0; c < all.heads[h].candidates.size(); ++c)
        EXPECT_EQ(three.heads[h].candidates[c].mse, all.heads[h].candidates[c].mse) << "head " << h;
    }
  }
  // The instruction set too: Scalar takes the fp32 path, not the products of bf16 pairs.
  const ProductUnits best_units = best_isa() == Isa::Amx      ? ProductUnits::AmxTiles
                                  : best_isa() == Isa::Avx512 ? ProductUnits::Bf16Dot
                                                              : ProductUnits::Fma;
  EXPECT_EQ(all.product_units, best_units);
  EXPECT_EQ(all.tile_products, best_isa() == Isa::Amx);
  set_cpu_defaults({Isa::Scalar, 0});
  const RoutingReport scalar = route();
  EXPECT_EQ(scalar.product_units, ProductUnits::Fma);
  EXPECT_FALSE(scalar.tile_products);
}

// Changing the defaults while another thread runs calls (ThreadSanitizer's case):
// each call runs with one consistent configuration.
TEST_F(CpuDefaults, CanChangeWhileCallsRun) {
  auto problem = spatial_problem(DType::F32);
  const auto backend = make_cpu_backend();
  const std::vector<float> expected = run_with(*backend, problem);
  std::atomic<bool> done{false};
  std::thread flipper([&] {
    for (int i = 0; !done.load(); ++i) set_cpu_defaults({Isa::Auto, 1 + i % 3});
  });
  for (int i = 0; i < 6; ++i) EXPECT_EQ(run_with(*backend, problem), expected) << "call " << i;
  done = true;
  flipper.join();
}

}  // namespace
}  // namespace stsa
