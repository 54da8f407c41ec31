#include "bench/stopwatch.hpp"

#include <chrono>
#include <ctime>

namespace stsa::bench {

double wall_now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_now_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return 1e3 * double(t.tv_sec) + 1e-6 * double(t.tv_nsec);
}

void WallStopwatch::start() { start_ms_ = wall_now_ms(); }
double WallStopwatch::stop_ms() { return wall_now_ms() - start_ms_; }

void ProcessCpuStopwatch::start() { start_ms_ = process_cpu_now_ms(); }
double ProcessCpuStopwatch::stop_ms() { return process_cpu_now_ms() - start_ms_; }

}  // namespace stsa::bench
