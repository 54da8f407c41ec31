"""The SM clock and board power while the benchmark runs, read from NVML.

Why: at 1440p a call runs for 0.1-1 s at full tensor load, long enough for the
board's power cap to pull the SM clock down (ncu on the second run: 1.43 GHz
across heads, 1.54 GHz head by head, in nearly the same cycle count), so a
row's TFLOP/s is (work per cycle) x (clock), and only the clock tells the two
apart. The sampler polls NVML from a thread; each row then asks for the
samples inside its timed window (wall-clock seconds, time.time(), which
stsa_gpu_bench's records use too: both are CLOCK_REALTIME).

Power is what nvmlDeviceGetPowerUsage reports, which on Ampere and newer
boards (GA100 aside) is an average over the last second: a reading says how
hard the board has been pulling, not what one short row drew.

NVML is loaded with ctypes from the driver (libnvidia-ml.so.1): nothing to
install, and without a driver the sampler says why and every summary is None.
"""
import ctypes
import threading
import time

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
# nvmlClocksEventReasons bits (nvml.h): what held the clock down.
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_THERMAL = 0x20 | 0x40  # software and hardware thermal slowdown
REASON_POWER_BRAKE = 0x80

# Dense bf16/fp16 tensor FLOP per clock per SM (Hopper: 989.4 TFLOP/s at 132 SMs
# and 1.83 GHz; A100: 2048), as src/bench/nvml_clocks.cpp; None elsewhere, where
# the table leaves the column out.
TENSOR_FLOP_PER_CLOCK_PER_SM = {(9, 0): 4096, (8, 0): 2048}


class Nvml:
    """The few NVML calls the sampler makes, on one device."""

    def __init__(self, index=0, library="libnvidia-ml.so.1"):
        lib = ctypes.CDLL(library)
        self._lib = lib
        self._check(lib.nvmlInit_v2(), "nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        self._check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self._handle)),
                    "nvmlDeviceGetHandleByIndex_v2")
        # Renamed in CUDA 12.x drivers; the old name is still exported.
        self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def _check(self, rc, what):
        if rc != 0:
            raise OSError(f"{what} returned NVML error {rc}")

    def _uint(self, fn, *args):
        value = ctypes.c_uint()
        self._check(fn(self._handle, *args, ctypes.byref(value)), fn.__name__)
        return value.value

    def describe(self):
        """What the board allows: the ceiling the samples are read against."""
        name = ctypes.create_string_buffer(96)
        self._check(self._lib.nvmlDeviceGetName(self._handle, name, ctypes.c_uint(96)), "nvmlDeviceGetName")
        return {"name": name.value.decode(errors="replace"),
                "max_sm_mhz": self._uint(self._lib.nvmlDeviceGetMaxClockInfo, ctypes.c_int(NVML_CLOCK_SM)),
                "power_limit_w": self._uint(self._lib.nvmlDeviceGetEnforcedPowerLimit) / 1e3}

    def read(self):
        """(SM MHz, board power W (1 s average), clock event reasons bitmask,
        temperature C or None: deprecated in newer drivers, so optional)."""
        reasons = ctypes.c_ulonglong()
        self._check(self._reasons(self._handle, ctypes.byref(reasons)), "clock event reasons")
        try:
            temperature = self._uint(self._lib.nvmlDeviceGetTemperature, ctypes.c_int(NVML_TEMPERATURE_GPU))
        except (OSError, AttributeError):
            temperature = None
        return (self._uint(self._lib.nvmlDeviceGetClockInfo, ctypes.c_int(NVML_CLOCK_SM)),
                self._uint(self._lib.nvmlDeviceGetPowerUsage) / 1e3, reasons.value, temperature)


class ClockSampler:
    """Polls `read()` (as Nvml.read) every `period_s` on a thread between start()
    and stop(); summary(t0, t1) describes the samples taken in [t0, t1]. Each
    sample is stamped with the middle of its reading. A failed reading is
    skipped and counted; `max_failures` failures in a row end the sampling,
    with the last one kept as `error`."""

    def __init__(self, read, period_s=0.005, now=time.time, max_failures=20):
        self._read, self._period, self._now, self._max_failures = read, period_s, now, max_failures
        self.samples = []  # (time, sm_mhz, power_w, reasons, temperature_c)
        self.error = None
        self.failures = 0
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="clock-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Returns within about a second even if a reading hangs in the driver
        (the thread is a daemon: it cannot hold the process)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=1.0)

    def _run(self):
        in_a_row = 0
        while not self._stop.is_set():
            before = self._now()
            try:
                sample = self._read()
            except Exception as e:  # the benchmark goes on, with fewer samples or none
                self.error = f"{type(e).__name__}: {e}"
                self.failures += 1
                in_a_row += 1
                if in_a_row >= self._max_failures:
                    return
            else:
                in_a_row = 0
                self.samples.append((0.5 * (before + self._now()),) + tuple(sample))
            self._stop.wait(self._period)

    def summary(self, t0, t1):
        """Mean and lowest SM clock, mean power, highest temperature, and the
        share of samples with the power cap (or a thermal or hardware slowdown)
        holding the clock, over the samples in [t0, t1]; None without any there."""
        window = [s for s in list(self.samples) if t0 <= s[0] <= t1]
        if not window:
            return None
        n = len(window)

        def share(mask):
            return sum(1 for s in window if s[3] & mask) / n

        temperatures = [s[4] for s in window if s[4] is not None]
        return {"samples": n,
                "sm_mhz_mean": sum(s[1] for s in window) / n,
                "sm_mhz_min": min(s[1] for s in window),
                "power_w_mean": sum(s[2] for s in window) / n,
                "temperature_c_max": max(temperatures) if temperatures else None,
                "power_capped_share": share(REASON_SW_POWER_CAP | REASON_POWER_BRAKE),
                "thermal_or_hw_slowdown_share": share(REASON_THERMAL | REASON_HW_SLOWDOWN)}


def start_nvml_sampler(library="libnvidia-ml.so.1"):
    """(sampler, device description) on device 0, or (None, why not): the
    benchmark must run on without clocks, whatever NVML does."""
    try:
        nvml = Nvml(library=library)
        board = nvml.describe()
        nvml.read()
    except Exception as e:  # no driver, one without these calls, or a call that fails
        return None, {"unavailable": f"{type(e).__name__}: {e}"}
    return ClockSampler(nvml.read).start(), board


def tensor_share(flops, ms, sm_mhz, sms, capability):
    """Achieved FLOP/s over the tensor peak at the clock the row ran at: the
    work done per cycle, with the clock taken out. None where unknown."""
    per_clock = TENSOR_FLOP_PER_CLOCK_PER_SM.get(tuple(capability) if capability else None)
    if not (flops and ms and sm_mhz and sms and per_clock):
        return None
    return flops / (ms * 1e-3) / (sms * per_clock * sm_mhz * 1e6)
