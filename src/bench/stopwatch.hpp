// What the timing loop reads around each run. A stopwatch measures one
// interval; the CPU benches use wall time and process CPU time, the GPU benches
// CUDA events (cuda/event_stopwatch.hpp, a target of its own, so the rest of
// this room needs no CUDA), the harness tests a scripted fake.
#pragma once

namespace stsa::bench {

class Stopwatch {
 public:
  virtual ~Stopwatch() = default;
  // Waits until work issued before now has finished (a device's queue), so that
  // warm-up runs do not spill into the first timed one. Default: nothing to wait for.
  virtual void settle() {}
  virtual void start() = 0;
  // Milliseconds since start(); must be finite and >= 0.
  virtual double stop_ms() = 0;
};

// std::chrono::steady_clock: wall time.
class WallStopwatch final : public Stopwatch {
 public:
  void start() override;
  double stop_ms() override;

 private:
  double start_ms_ = 0;
};

// CLOCK_PROCESS_CPUTIME_ID: CPU time of every thread of this process, which
// leaves out time the threads wait for cores other jobs hold.
class ProcessCpuStopwatch final : public Stopwatch {
 public:
  void start() override;
  double stop_ms() override;

 private:
  double start_ms_ = 0;
};

double wall_now_ms();
double process_cpu_now_ms();

}  // namespace stsa::bench
