// The one timing loop of every benchmark: `warmup` untimed runs, then timed
// runs until `repeats` of them or until the first stopwatch's times add up to
// the budget, whichever comes first (at least one timed run always).
#pragma once

#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "bench/samples.hpp"
#include "bench/stopwatch.hpp"

namespace stsa::bench {

struct TimingOptions {
  int warmup = 1;
  int repeats = 5;
  // Milliseconds of timed runs (as the first stopwatch reads them) after which
  // no further run starts; infinity: always `repeats` runs.
  double budget_ms = std::numeric_limits<double>::infinity();

  // Throws InvalidArgument: warmup >= 0, repeats >= 1, budget_ms > 0.
  void validate() const;
};

struct TimedRuns {
  std::vector<Samples> clocks;  // one per stopwatch, in the order given
  bool budget_spent = false;    // fewer than `repeats` runs because the budget ran out
  // Wall-clock seconds since the Unix epoch (std::chrono::system_clock) just
  // before the first timed run and just after the last: the window in which a
  // sampler outside the process (the SM clock, bench/gpu/gpu_clocks.py) read
  // what these runs ran at.
  double wall_from_s = 0, wall_to_s = 0;

  const Samples& operator[](std::size_t clock) const { return clocks[clock]; }
};

// Seconds since the Unix epoch (std::chrono::system_clock): the clock of
// TimedRuns::wall_from_s/wall_to_s and of the GPU clock sampler's samples.
double wall_clock_seconds();

// Called after every run, warm-ups included, with runs done and the most there can be.
using RunObserver = std::function<void(int done, int total)>;

// Times `run` with every stopwatch in `clocks` (at least one). The first is
// started last and stopped first, so it is the one tightest around the run;
// the budget counts its times. Throws InvalidArgument for bad options and
// Error when a stopwatch reads a negative or non-finite time.
TimedRuns time_runs(const TimingOptions& options, const std::function<void()>& run,
                    std::span<Stopwatch* const> clocks, const RunObserver& observer = {});

}  // namespace stsa::bench
