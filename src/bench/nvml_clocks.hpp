// The SM clock and board power while a GPU benchmark runs, read from NVML.
//
// Why: on an H200 a long call runs at the board's power cap, which lowers the
// SM clock (1.43-1.59 GHz seen where the board allows 1.98), so a TFLOP/s
// figure is work per cycle times a clock the benchmark does not control.
// With the clock beside it, a row says which of the two moved.
//
// NVML ships with the driver (libnvidia-ml.so.1) and is opened at run time
// with dlopen, so nothing links against it: without a driver, open() says why
// and the benchmark reports no clocks. bench/gpu/gpu_clocks.py does the same
// for compare.py in Python.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace stsa::bench {

struct BoardLimits {
  std::string name;
  double max_sm_mhz = 0;
  double power_limit_w = 0;
};

// What the samples taken inside one wall-clock window say.
struct ClockSummary {
  int samples = 0;
  double sm_mhz_mean = 0, sm_mhz_min = 0;
  double power_w_mean = 0;  // NVML's power reading: an average over the last second on Ampere and newer
  double power_capped_share = 0;  // of samples with the power cap (or power brake) holding the clock
};

class ClockSampler {
 public:
  // The device with this PCI bus id (as cudaDeviceGetPCIBusId writes it; empty:
  // NVML's device 0) in `library`; nullptr with the reason in *why_not when the
  // library, one of its calls or the device is not there, or a first reading fails.
  static std::unique_ptr<ClockSampler> open(const std::string& pci_bus_id, std::string* why_not,
                                            const std::string& library = "libnvidia-ml.so.1");
  ~ClockSampler();  // stops sampling and closes the library
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  const BoardLimits& board() const;
  // Samples on a thread every `period` until stop() (or the destructor), each
  // stamped with the middle of its reading. A reading that fails is skipped,
  // counted and kept as error(); kMaxFailedReadingsInARow in a row end the sampling.
  static constexpr int kMaxFailedReadingsInARow = 20;
  void start(std::chrono::microseconds period = std::chrono::milliseconds(5));
  void stop();
  // The samples taken at wall-clock seconds since the epoch (system_clock, as
  // TimedRuns::wall_from_s) in [from_s, to_s]; nullopt when there are none.
  std::optional<ClockSummary> summary(double from_s, double to_s) const;
  std::string error() const;  // the last failed reading's call, "" when none failed
  int failed_readings() const;

 private:
  struct State;
  explicit ClockSampler(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Dense fp16/bf16 tensor FLOP per clock per SM of a compute capability
// (Hopper 4096: 989 TFLOP/s at 132 SMs and 1.83 GHz; A100 2048), 0 when not known.
double tensor_flops_per_clock_per_sm(int major, int minor);
// `flops` in `ms` as a fraction of the tensor peak at `sm_mhz` on `sms` SMs; NaN when unknown.
double tensor_peak_share(double flops, double ms, double sm_mhz, int sms, int major, int minor);

}  // namespace stsa::bench
