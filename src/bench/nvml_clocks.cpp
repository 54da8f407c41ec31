#include "bench/nvml_clocks.hpp"

#include "bench/timing_loop.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace stsa::bench {
namespace {

// The NVML calls used, as nvml.h declares them (nvmlReturn_t is an int, 0 on
// success; nvmlDevice_t an opaque pointer).
using Device = void*;
using InitFn = int (*)();
using ByIndexFn = int (*)(unsigned, Device*);
using ByPciFn = int (*)(const char*, Device*);
using NameFn = int (*)(Device, char*, unsigned);
using ClockFn = int (*)(Device, int, unsigned*);
using UintFn = int (*)(Device, unsigned*);
using ReasonsFn = int (*)(Device, unsigned long long*);

constexpr int kClockSm = 1;                                       // NVML_CLOCK_SM
constexpr unsigned long long kPowerCapReasons = 0x4ull | 0x80ull;  // SW power cap, HW power brake

struct Sample {
  double time_s, sm_mhz, power_w;
  unsigned long long reasons;
};

}  // namespace

struct ClockSampler::State {
  void* library = nullptr;
  InitFn shutdown = nullptr;
  ClockFn clock_info = nullptr;
  UintFn power_usage = nullptr;
  ReasonsFn reasons = nullptr;
  Device device = nullptr;
  BoardLimits board;

  std::thread thread;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::vector<Sample> samples;
  std::string error;
  int failed_readings = 0;

  ~State() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }

  // One reading, stamped with the middle of its calls, or the name of the call that failed.
  std::optional<Sample> read(std::string* failed) const {
    unsigned mhz = 0, milliwatts = 0;
    unsigned long long why = 0;
    const double before = wall_clock_seconds();
    if (clock_info(device, kClockSm, &mhz) != 0) *failed = "nvmlDeviceGetClockInfo";
    else if (power_usage(device, &milliwatts) != 0) *failed = "nvmlDeviceGetPowerUsage";
    else if (reasons(device, &why) != 0) *failed = "the clock event reasons";
    else return Sample{0.5 * (before + wall_clock_seconds()), double(mhz), milliwatts / 1e3, why};
    return std::nullopt;
  }
};

ClockSampler::ClockSampler(std::unique_ptr<State> state) : state_(std::move(state)) {}

ClockSampler::~ClockSampler() { stop(); }

std::unique_ptr<ClockSampler> ClockSampler::open(const std::string& pci_bus_id, std::string* why_not,
                                                 const std::string& library) {
  auto state = std::make_unique<State>();
  const auto fail = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return nullptr;
  };
  state->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!state->library) return fail(std::string("cannot load ") + library + ": " + dlerror());
  const auto symbol = [&](const char* name) { return dlsym(state->library, name); };
  const auto init = reinterpret_cast<InitFn>(symbol("nvmlInit_v2"));
  const auto by_index = reinterpret_cast<ByIndexFn>(symbol("nvmlDeviceGetHandleByIndex_v2"));
  const auto by_pci = reinterpret_cast<ByPciFn>(symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  const auto name = reinterpret_cast<NameFn>(symbol("nvmlDeviceGetName"));
  const auto max_clock = reinterpret_cast<ClockFn>(symbol("nvmlDeviceGetMaxClockInfo"));
  const auto power_limit = reinterpret_cast<UintFn>(symbol("nvmlDeviceGetEnforcedPowerLimit"));
  state->clock_info = reinterpret_cast<ClockFn>(symbol("nvmlDeviceGetClockInfo"));
  state->power_usage = reinterpret_cast<UintFn>(symbol("nvmlDeviceGetPowerUsage"));
  // Renamed in newer drivers; the old name is still exported.
  state->reasons = reinterpret_cast<ReasonsFn>(symbol("nvmlDeviceGetCurrentClocksEventReasons"));
  if (!state->reasons) state->reasons = reinterpret_cast<ReasonsFn>(symbol("nvmlDeviceGetCurrentClocksThrottleReasons"));
  if (!init || !by_index || !by_pci || !name || !max_clock || !power_limit || !state->clock_info ||
      !state->power_usage || !state->reasons)
    return fail(library + " lacks one of the NVML calls the clock sampler makes");
  if (const int rc = init(); rc != 0) return fail("nvmlInit_v2 returned NVML error " + std::to_string(rc));
  state->shutdown = reinterpret_cast<InitFn>(symbol("nvmlShutdown"));
  const int found = pci_bus_id.empty() ? by_index(0, &state->device) : by_pci(pci_bus_id.c_str(), &state->device);
  if (found != 0)
    return fail("NVML has no device " + (pci_bus_id.empty() ? std::string("0") : pci_bus_id) + " (error " +
                std::to_string(found) + ")");
  char text[96] = {};
  unsigned max_mhz = 0, limit_mw = 0;
  if (name(state->device, text, sizeof text) != 0 || max_clock(state->device, kClockSm, &max_mhz) != 0 ||
      power_limit(state->device, &limit_mw) != 0)
    return fail("NVML could not describe the device");
  state->board = {text, double(max_mhz), limit_mw / 1e3};
  std::string failed;
  if (!state->read(&failed)) return fail(failed + " failed on the first reading");
  return std::unique_ptr<ClockSampler>(new ClockSampler(std::move(state)));
}

const BoardLimits& ClockSampler::board() const { return state_->board; }

void ClockSampler::start(std::chrono::microseconds period) {
  if (state_->thread.joinable()) return;
  state_->stopping = false;
  state_->thread = std::thread([this, period] {
    State& s = *state_;
    std::unique_lock lock(s.mutex);
    int in_a_row = 0;
    while (!s.stopping) {
      lock.unlock();
      std::string failed;
      const std::optional<Sample> sample = s.read(&failed);
      lock.lock();
      if (sample) {
        in_a_row = 0;
        s.samples.push_back(*sample);
      } else {
        s.error = failed + " failed";
        ++s.failed_readings;
        if (++in_a_row == kMaxFailedReadingsInARow) return;
      }
      s.wake.wait_for(lock, period, [&] { return s.stopping; });
    }
  });
}

void ClockSampler::stop() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

std::optional<ClockSummary> ClockSampler::summary(double from_s, double to_s) const {
  std::lock_guard lock(state_->mutex);
  ClockSummary out;
  double mhz = 0, watts = 0, capped = 0;
  out.sm_mhz_min = std::numeric_limits<double>::infinity();
  for (const Sample& s : state_->samples) {
    if (s.time_s < from_s || s.time_s > to_s) continue;
    ++out.samples;
    mhz += s.sm_mhz;
    watts += s.power_w;
    capped += (s.reasons & kPowerCapReasons) ? 1 : 0;
    out.sm_mhz_min = std::min(out.sm_mhz_min, s.sm_mhz);
  }
  if (out.samples == 0) return std::nullopt;
  out.sm_mhz_mean = mhz / out.samples;
  out.power_w_mean = watts / out.samples;
  out.power_capped_share = capped / out.samples;
  return out;
}

int ClockSampler::failed_readings() const {
  std::lock_guard lock(state_->mutex);
  return state_->failed_readings;
}

std::string ClockSampler::error() const {
  std::lock_guard lock(state_->mutex);
  return state_->error;
}

double tensor_flops_per_clock_per_sm(int major, int minor) {
  if (major == 9 && minor == 0) return 4096;
  if (major == 8 && minor == 0) return 2048;
  return 0;
}

double tensor_peak_share(double flops, double ms, double sm_mhz, int sms, int major, int minor) {
  const double per_clock = tensor_flops_per_clock_per_sm(major, minor);
  if (!(flops > 0 && ms > 0 && sm_mhz > 0 && sms > 0 && per_clock > 0)) return std::nan("");
  return flops / (ms * 1e-3) / (double(sms) * per_clock * sm_mhz * 1e6);
}

}  // namespace stsa::bench
