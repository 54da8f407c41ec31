// A stand-in for the driver's libnvidia-ml.so.1 with the calls gpu_clocks.py
// makes, their signatures as nvml.h declares them (C linkage; they return
// nvmlReturn_t, 0 on success). Each checks what it is handed, so a wrong
// argument from ctypes fails the test instead of reading garbage on the GPU
// machine. fake_nvml_fail_clock_after(n) makes the clock reading fail for good
// after n more successful ones, fake_nvml_fail_clock_times(n) the next n
// readings only (the samplers' error paths).
#include <cstring>

extern "C" {

typedef struct FakeDevice { int magic; } FakeDevice;
static FakeDevice device = {0x5157};
static int initialised = 0;
static long clock_readings_left = -1;  // < 0: never fails

static long clock_failures_left = 0;     // > 0: that many readings fail first, then they succeed again

// Not NVML: the tests' handles on the failures above.
void fake_nvml_fail_clock_after(long n) { clock_readings_left = n; }
void fake_nvml_fail_clock_times(long n) { clock_failures_left = n; }

enum { kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2 };

static int valid(const FakeDevice* d) { return initialised && d == &device && d->magic == 0x5157; }

int nvmlInit_v2(void) { initialised = 1; return kSuccess; }
int nvmlShutdown(void) { initialised = 0; return kSuccess; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, FakeDevice** out) {
  if (!initialised) return kUninitialized;
  if (index != 0 || !out) return kInvalidArgument;
  *out = &device;
  return kSuccess;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, FakeDevice** out) {
  if (!initialised) return kUninitialized;
  if (!bus_id || !out) return kInvalidArgument;
  if (std::strcmp(bus_id, "00000000:00:06.0") != 0) return 6;  // NVML_ERROR_NOT_FOUND
  *out = &device;
  return kSuccess;
}

int nvmlDeviceGetName(FakeDevice* d, char* name, unsigned int length) {
  if (!valid(d) || !name || length < 12) return kInvalidArgument;
  std::strcpy(name, "Fake H200");
  return kSuccess;
}

// type 1 is NVML_CLOCK_SM
int nvmlDeviceGetMaxClockInfo(FakeDevice* d, int type, unsigned int* mhz) {
  if (!valid(d) || type != 1 || !mhz) return kInvalidArgument;
  *mhz = 1980;
  return kSuccess;
}

int nvmlDeviceGetClockInfo(FakeDevice* d, int type, unsigned int* mhz) {
  if (!valid(d) || type != 1 || !mhz) return kInvalidArgument;
  if (clock_failures_left > 0) {
    --clock_failures_left;
    return 999;  // NVML_ERROR_UNKNOWN
  }
  if (clock_readings_left == 0) return 999;
  if (clock_readings_left > 0) --clock_readings_left;
  *mhz = 1545;
  return kSuccess;
}

int nvmlDeviceGetEnforcedPowerLimit(FakeDevice* d, unsigned int* milliwatts) {
  if (!valid(d) || !milliwatts) return kInvalidArgument;
  *milliwatts = 700000;
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(FakeDevice* d, unsigned int* milliwatts) {
  if (!valid(d) || !milliwatts) return kInvalidArgument;
  *milliwatts = 688500;
  return kSuccess;
}

// 0x4: software power cap; a 64-bit mask
int nvmlDeviceGetCurrentClocksEventReasons(FakeDevice* d, unsigned long long* reasons) {
  if (!valid(d) || !reasons) return kInvalidArgument;
  *reasons = 0x4ull | (1ull << 40); // and a high bit: the mask must not be cut to 32 bits
  return kSuccess;
}

// sensor 0 is NVML_TEMPERATURE_GPU
int nvmlDeviceGetTemperature(FakeDevice* d, int sensor, unsigned int* celsius) {
  if (!valid(d) || sensor != 0 || !celsius) return kInvalidArgument;
  *celsius = 61;
  return kSuccess;
}

}  // extern "C"
