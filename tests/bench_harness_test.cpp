// The benchmark harness (src/bench): statistics, the warm-up / repeat / budget
// logic of the timing loop driven by a scripted fake stopwatch, derived
// figures against FLOP counts worked out here from the plan's tile lists and
// the mask predicate, and the JSON timing fields. Deterministic: no real time
// is asserted on.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "bench/figures.hpp"
#include "bench/record.hpp"
#include "bench/samples.hpp"
#include "bench/stopwatch.hpp"
#include "bench/timing_loop.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa::bench {
namespace {

// Reads the next scripted time at each stop (the last one repeats) and logs every call.
class FakeStopwatch final : public Stopwatch {
 public:
  FakeStopwatch(std::string name, std::vector<double> script, std::vector<std::string>* log)
      : name_(std::move(name)), script_(std::move(script)), log_(log) {}
  void settle() override { log_->push_back(name_ + ".settle"); }
  void start() override { log_->push_back(name_ + ".start"); }
  double stop_ms() override {
    log_->push_back(name_ + ".stop");
    const double ms = script_[std::min(next_, script_.size() - 1)];
    ++next_;
    return ms;
  }

 private:
  std::string name_;
  std::vector<double> script_;
  std::size_t next_ = 0;
  std::vector<std::string>* log_;
};

TEST(BenchSamples, MedianOfOddAndEvenCountsAndExtremes) {
  EXPECT_EQ(median(std::vector<double>{5.0}), 5.0);
  EXPECT_EQ(median(std::vector<double>{9.0, 1.0, 4.0}), 4.0);
  EXPECT_EQ(median(std::vector<double>{8.0, 1.0, 4.0, 2.0}), 3.0);  // mean of the middle two
  EXPECT_EQ(median(std::vector<double>{7.0, 7.0, 1.0, 100.0, 7.0, 3.0}), 7.0);
  EXPECT_TRUE(std::isnan(median(std::vector<double>{})));

  const Samples s{{3.0, 1.5, 9.0, 2.5}};
  EXPECT_EQ(s.runs(), 4u);
  EXPECT_EQ(s.median_ms(), 2.75);
  EXPECT_EQ(s.min_ms(), 1.5);
  EXPECT_EQ(s.max_ms(), 9.0);
  EXPECT_EQ(s.ms, (std::vector<double>{3.0, 1.5, 9.0, 2.5}));  // run order is kept

  const Samples empty;
  EXPECT_TRUE(std::isnan(empty.median_ms()));
  EXPECT_TRUE(std::isnan(empty.min_ms()));
  EXPECT_TRUE(std::isnan(empty.max_ms()));
}

TEST(BenchTimingLoop, WarmUpsAreUntimedThenExactlyRepeatsWithoutBudget) {
  std::vector<std::string> log;
  FakeStopwatch clock("wall", {4.0, 2.0, 6.0}, &log);
  int calls = 0;
  std::vector<std::pair<int, int>> progress;
  Stopwatch* clocks[] = {&clock};
  const TimedRuns t = time_runs(
      {.warmup = 2, .repeats = 3}, [&] { log.push_back("run" + std::to_string(++calls)); }, clocks,
      [&](int done, int total) { progress.emplace_back(done, total); });
  EXPECT_EQ(calls, 5);
  ASSERT_EQ(t.clocks.size(), 1u);
  EXPECT_EQ(t[0].ms, (std::vector<double>{4.0, 2.0, 6.0}));
  EXPECT_EQ(t[0].median_ms(), 4.0);
  EXPECT_FALSE(t.budget_spent);
  const std::vector<std::string> expected{"run1", "run2", "wall.settle", "wall.start", "run3", "wall.stop",
                                          "wall.start", "run4", "wall.stop", "wall.start", "run5", "wall.stop"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(progress, (std::vector<std::pair<int, int>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}));
}

TEST(BenchTimingLoop, WallWindowBracketsTheTimedRunsAndNotTheWarmUps) {
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  std::vector<std::string> log;
  FakeStopwatch clock("c", {1.0}, &log);
  Stopwatch* clocks[] = {&clock};
  std::vector<double> run_times;
  double before = 0;
  const TimedRuns t = time_runs(
      {.warmup = 1, .repeats = 2},
      [&] {
        // The warm-up sleeps, so a window opened before it would contain it.
        if (run_times.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        run_times.push_back(now());
      },
      clocks, [&](int done, int) {
        if (done == 1) before = now();
      });
  ASSERT_EQ(run_times.size(), 3u);
  EXPECT_GE(t.wall_from_s, before);
  EXPECT_GT(t.wall_from_s, run_times[0]);  // after the warm-up
  EXPECT_LE(t.wall_from_s, run_times[1]);
  EXPECT_GE(t.wall_to_s, run_times[2]);
  EXPECT_LE(t.wall_to_s, now());
  EXPECT_GT(t.wall_from_s, 1.7e9);  // seconds since 1970 (after 2023), not since boot
}

TEST(BenchTimingLoop, BudgetStopsBeforeTheRunThatWouldStartPastIt) {
  std::vector<std::string> log;
  Stopwatch* clocks[1];
  {
    // 10 + 10 = 20 < 25 ms: a third run starts; 30 >= 25: no fourth.
    FakeStopwatch clock("c", {10.0}, &log);
    clocks[0] = &clock;
    const TimedRuns t = time_runs({.warmup = 0, .repeats = 10, .budget_ms = 25.0}, [] {}, clocks);
    EXPECT_EQ(t[0].runs(), 3u);
    EXPECT_TRUE(t.budget_spent);
  }
  {
    // Exactly on the budget counts as spent.
    FakeStopwatch clock("c", {10.0}, &log);
    clocks[0] = &clock;
    const TimedRuns t = time_runs({.warmup = 0, .repeats = 10, .budget_ms = 20.0}, [] {}, clocks);
    EXPECT_EQ(t[0].runs(), 2u);
    EXPECT_TRUE(t.budget_spent);
  }
  {
    // One run longer than the whole budget still gives one timed run.
    FakeStopwatch clock("c", {500.0}, &log);
    clocks[0] = &clock;
    const TimedRuns t = time_runs({.warmup = 1, .repeats = 5, .budget_ms = 1.0}, [] {}, clocks);
    EXPECT_EQ(t[0].runs(), 1u);
    EXPECT_EQ(t[0].median_ms(), 500.0);
    EXPECT_TRUE(t.budget_spent);
  }
  {
    // The repeat count reached first: the budget was not what stopped it.
    FakeStopwatch clock("c", {1.0}, &log);
    clocks[0] = &clock;
    const TimedRuns t = time_runs({.warmup = 0, .repeats = 4, .budget_ms = 4.0}, [] {}, clocks);
    EXPECT_EQ(t[0].runs(), 4u);
    EXPECT_FALSE(t.budget_spent);
  }
}

TEST(BenchTimingLoop, SeveralClocksNestAroundTheRunAndOnlyTheFirstCountsForTheBudget) {
  std::vector<std::string> log;
  FakeStopwatch wall("wall", {5.0, 5.0, 5.0}, &log);
  FakeStopwatch cpu("cpu", {100.0, 100.0, 100.0}, &log);  // would end the loop after one run if it counted
  Stopwatch* clocks[] = {&wall, &cpu};
  const TimedRuns t = time_runs({.warmup = 0, .repeats = 3, .budget_ms = 50.0}, [&] { log.push_back("run"); }, clocks);
  ASSERT_EQ(t.clocks.size(), 2u);
  EXPECT_EQ(t[0].ms, (std::vector<double>{5.0, 5.0, 5.0}));
  EXPECT_EQ(t[1].ms, (std::vector<double>{100.0, 100.0, 100.0}));
  EXPECT_FALSE(t.budget_spent);
  const std::vector<std::string> first_run(log.begin() + 2, log.begin() + 7);
  EXPECT_EQ(log[0], "wall.settle");
  EXPECT_EQ(log[1], "cpu.settle");
  EXPECT_EQ(first_run, (std::vector<std::string>{"cpu.start", "wall.start", "run", "wall.stop", "cpu.stop"}));
}

TEST(BenchTimingLoop, RejectsBadOptionsBeforeRunningAnything) {
  std::vector<std::string> log;
  FakeStopwatch clock("c", {1.0}, &log);
  Stopwatch* clocks[] = {&clock};
  int calls = 0;
  const auto run = [&] { ++calls; };
  EXPECT_THROW(time_runs({.warmup = -1, .repeats = 1}, run, clocks), InvalidArgument);
  EXPECT_THROW(time_runs({.warmup = 0, .repeats = 0}, run, clocks), InvalidArgument);
  EXPECT_THROW(time_runs({.warmup = 0, .repeats = 1, .budget_ms = 0.0}, run, clocks), InvalidArgument);
  EXPECT_THROW(time_runs({.warmup = 0, .repeats = 1, .budget_ms = std::nan("")}, run, clocks), InvalidArgument);
  EXPECT_THROW(time_runs({}, run, std::span<Stopwatch* const>{}), InvalidArgument);
  Stopwatch* null_clock[] = {nullptr};
  EXPECT_THROW(time_runs({}, run, null_clock), InvalidArgument);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(log.empty());
}

TEST(BenchTimingLoop, AStopwatchReadingNonsenseIsAnError) {
  std::vector<std::string> log;
  for (const double bad : {-1.0, std::nan(""), double(INFINITY)}) {
    FakeStopwatch clock("c", {bad}, &log);
    Stopwatch* clocks[] = {&clock};
    EXPECT_THROW(time_runs({.warmup = 0, .repeats = 2}, [] {}, clocks), Error) << bad;
  }
}

TEST(BenchTimingLoop, RealClocksReadNonNegativeTimes) {
  WallStopwatch wall;
  ProcessCpuStopwatch cpu;
  Stopwatch* clocks[] = {&wall, &cpu};
  volatile double sink = 0;
  const TimedRuns t = time_runs({.warmup = 1, .repeats = 3}, [&] {
    for (int i = 0; i < 10000; ++i) sink = sink + 1.0;
  }, clocks);
  ASSERT_EQ(t.clocks.size(), 2u);
  for (const Samples& s : t.clocks) {
    EXPECT_EQ(s.runs(), 3u);
    for (const double ms : s.ms) EXPECT_GE(ms, 0.0);
  }
}

TEST(BenchFigures, RatesSpeedupsAndPeakFractions) {
  EXPECT_DOUBLE_EQ(gflops(2e9, 1000.0), 2.0);
  EXPECT_DOUBLE_EQ(tflops(3e12, 500.0), 6.0);
  EXPECT_DOUBLE_EQ(flop_rate(5e6, 1.0, 1e9), 5.0);
  EXPECT_DOUBLE_EQ(gbps(4e9, 2000.0), 2.0);
  EXPECT_DOUBLE_EQ(speedup(30.0, 10.0), 3.0);
  EXPECT_DOUBLE_EQ(fraction_of_peak(115.0, 230.0), 0.5);
  // No figure from a time or peak that is not positive.
  EXPECT_TRUE(std::isnan(gflops(1e9, 0.0)));
  EXPECT_TRUE(std::isnan(tflops(1e9, -1.0)));
  EXPECT_TRUE(std::isnan(gbps(1e9, std::nan(""))));
  EXPECT_TRUE(std::isnan(speedup(10.0, 0.0)));
  EXPECT_TRUE(std::isnan(speedup(INFINITY, 1.0)));
  EXPECT_TRUE(std::isnan(fraction_of_peak(1.0, 0.0)));
}

// FLOPs counted here from the definitions: the tile lists with their ragged
// edges for the kept tiles, the mask predicate pair by pair for the kept pairs.
TEST(BenchFigures, AttentionWorkMatchesCountsFromTheTileListsAndThePredicate) {
  VideoLayout layout;
  layout.grid.frames = 3;
  layout.grid.height = 5;
  layout.grid.width = 7;  // 105 video tokens
  layout.grid.text_tokens = 9;
  layout.batch = 2;
  layout.heads = 3;
  layout.head_dim = 64;
  const std::int64_t n = layout.tokens();
  const MaskSpec spec = mask_for_density(layout.grid, SparseKind::Spatial, 0.3);
  const TileShape tile{32, 64};
  const auto plan = TilePlan::build(layout.grid, spec, tile);

  double area = 0;
  for (std::int64_t qt = 0; qt < plan->q_tiles(); ++qt) {
    const double rows = double(std::min<std::int64_t>(tile.q, n - qt * tile.q));
    for (const auto list : {plan->full_tiles(qt), plan->partial_tiles(qt)})
      for (const std::int32_t kt : list) area += rows * double(std::min<std::int64_t>(tile.k, n - kt * tile.k));
  }
  std::int64_t pairs = 0;
  for (std::int64_t q = 0; q < n; ++q)
    for (std::int64_t k = 0; k < n; ++k) pairs += allowed_at(layout.grid, spec, spec.natural_order(), q, k) ? 1 : 0;
  ASSERT_GT(pairs, 0);
  ASSERT_LT(pairs, n * n);

  const double per_pair = 4.0 * 64 * 2 * 3;  // QK^T and PV, 2 FLOPs per multiply-add, every (batch, head)
  const AttentionWork work = attention_work(layout, *plan);
  EXPECT_DOUBLE_EQ(work.dense_flops, per_pair * double(n * n));
  EXPECT_DOUBLE_EQ(work.kept_tile_flops, per_pair * area);
  EXPECT_DOUBLE_EQ(work.kept_pair_flops, per_pair * double(pairs));
  EXPECT_LE(work.kept_pair_flops, work.kept_tile_flops);
  EXPECT_LE(work.kept_tile_flops, work.dense_flops);
}

TEST(BenchRecord, TimingFieldsAndNonFiniteNumbers) {
  nlohmann::json j;
  add_timing(j, "dense_", Samples{{3.0, 1.0, 2.0}});
  EXPECT_EQ(j["dense_ms"].get<double>(), 2.0);
  EXPECT_EQ(j["dense_ms_min"].get<double>(), 1.0);
  EXPECT_EQ(j["dense_ms_max"].get<double>(), 3.0);
  EXPECT_EQ(j["dense_ms_runs"].get<std::vector<double>>(), (std::vector<double>{3.0, 1.0, 2.0}));

  nlohmann::ordered_json o;
  o["first"] = 1;
  add_timing(o, "", Samples{});
  EXPECT_EQ(o.begin().key(), "first");  // added after what was there
  EXPECT_TRUE(std::isnan(o["ms"].get<double>()));
  EXPECT_EQ(o.dump(), R"({"first":1,"ms":null,"ms_min":null,"ms_max":null,"ms_runs":[]})");

  EXPECT_EQ(json_number(1.5), 1.5);
  EXPECT_TRUE(std::isnan(json_number(INFINITY)));
  EXPECT_TRUE(std::isnan(json_number(-INFINITY)));
  EXPECT_EQ(nlohmann::json(json_number(INFINITY)).dump(), "null");
}

// The counts of stsa/flops.hpp by hand, and the peak fraction refused for a peak that is not positive.
TEST(BenchFigures, FlopAndByteCountsByHand) {
  const VideoLayout layout{{2, 3, 4, 6, TextPlacement::After}, 2, 5, 64};  // 24 video + 6 text tokens, batch 2, 5 heads
  EXPECT_EQ(attention_flops(10, 64), 4.0 * 10 * 64);
  EXPECT_EQ(dense_attention_flops(layout), 4.0 * 30 * 30 * 64 * 2 * 5);
  // Read + write of 3 bf16 tensors of 4 heads: 2 x 3 x 2 batch x 30 tokens x 4 heads x 64 x 2 bytes.
  EXPECT_EQ(permutation_bytes(layout, 4, 3, 2), 2.0 * 3 * 2 * 30 * 4 * 64 * 2);
  EXPECT_EQ(permutation_bytes(layout, 1, 1, 4), 2.0 * 2 * 30 * 64 * 4);
  EXPECT_TRUE(std::isnan(fraction_of_peak(1.0, -2.0)));
  EXPECT_TRUE(std::isnan(fraction_of_peak(1.0, std::nan(""))));
}

// Each clock reads its own system clock in milliseconds: a reading lies between
// two readings of that clock taken around it (no duration is asserted).
TEST(BenchStopwatch, ClocksReadTheirSystemClocksInMilliseconds) {
  const auto cpu_ms = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return 1e3 * double(t.tv_sec) + 1e-6 * double(t.tv_nsec);
  };
  const auto steady_ms = [] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  for (int i = 0; i < 3; ++i) {
    const double cpu_before = cpu_ms(), cpu = process_cpu_now_ms(), cpu_after = cpu_ms();
    EXPECT_LE(cpu_before, cpu);
    EXPECT_LE(cpu, cpu_after);
    const double wall_before = steady_ms(), wall = wall_now_ms(), wall_after = steady_ms();
    EXPECT_LE(wall_before, wall);
    EXPECT_LE(wall, wall_after);
  }
}

}  // namespace
}  // namespace stsa::bench
