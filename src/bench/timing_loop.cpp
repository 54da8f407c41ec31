#include "bench/timing_loop.hpp"

#include <chrono>
#include <cmath>

#include "stsa/error.hpp"

namespace stsa::bench {

double wall_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void TimingOptions::validate() const {
  STSA_CHECK(warmup >= 0, InvalidArgument, "warmup (untimed runs) must be >= 0, got ", warmup);
  STSA_CHECK(repeats >= 1, InvalidArgument, "repeats (timed runs) must be >= 1, got ", repeats);
  STSA_CHECK(budget_ms > 0, InvalidArgument, "the time budget must be > 0 ms, got ", budget_ms);
}

TimedRuns time_runs(const TimingOptions& options, const std::function<void()>& run,
                    std::span<Stopwatch* const> clocks, const RunObserver& observer) {
  options.validate();
  STSA_CHECK(!clocks.empty(), InvalidArgument, "time_runs needs at least one stopwatch");
  for (Stopwatch* clock : clocks) STSA_CHECK(clock != nullptr, InvalidArgument, "time_runs got a null stopwatch");
  const int total = options.warmup + options.repeats;
  int done = 0;
  for (int i = 0; i < options.warmup; ++i) {
    run();
    if (observer) observer(++done, total);
  }
  for (Stopwatch* clock : clocks) clock->settle();

  TimedRuns timed;
  timed.clocks.resize(clocks.size());
  double spent_ms = 0;
  timed.wall_from_s = wall_clock_seconds();
  while (int(timed.clocks[0].runs()) < options.repeats) {
    if (spent_ms >= options.budget_ms) {
      timed.budget_spent = true;
      break;
    }
    for (std::size_t c = clocks.size(); c-- > 0;) clocks[c]->start();
    run();
    for (std::size_t c = 0; c < clocks.size(); ++c) {
      const double ms = clocks[c]->stop_ms();
      STSA_CHECK(std::isfinite(ms) && ms >= 0, Error, "stopwatch ", c, " read ", ms, " ms for one run");
      timed.clocks[c].ms.push_back(ms);
    }
    spent_ms += timed.clocks[0].ms.back();
    if (observer) observer(++done, total);
  }
  timed.wall_to_s = wall_clock_seconds();
  return timed;
}

}  // namespace stsa::bench
