#!/usr/bin/env python3
"""gpu_clocks.py's NVML calls against a stand-in library (fake_nvml.c) that
checks every argument: the ctypes plumbing the GPU machine relies on, tested
without a driver. Usage: gpu_clocks_nvml_test.py BENCH_GPU_DIR FAKE_NVML_SO"""
import sys
import time

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, sys.argv[1])
import gpu_clocks  # noqa: E402

fake = sys.argv[2]
nvml = gpu_clocks.Nvml(library=fake)
assert nvml.describe() == {"name": "Fake H200", "max_sm_mhz": 1980, "power_limit_w": 700.0}, nvml.describe()
assert nvml.read() == (1545, 688.5, 0x4 | (1 << 40), 61), nvml.read()

sampler, board = gpu_clocks.start_nvml_sampler(library=fake)
assert sampler is not None and board["name"] == "Fake H200", board
t0 = time.time()
time.sleep(0.05)
sampler.stop()
summary = sampler.summary(t0 - 1, time.time() + 1)
assert sampler.error is None, sampler.error
assert summary["samples"] >= 2 and summary["sm_mhz_mean"] == 1545 and summary["power_w_mean"] == 688.5, summary
assert summary["power_capped_share"] == 1.0 and summary["thermal_or_hw_slowdown_share"] == 0.0, summary

# A reading that keeps failing ends the sampling (after max_failures in a row),
# keeps what was read and says which call failed.
import ctypes  # noqa: E402
broken, _ = gpu_clocks.start_nvml_sampler(library=fake)
ctypes.CDLL(fake).fake_nvml_fail_clock_after(ctypes.c_long(2))
deadline = time.time() + 10
while broken.error is None and time.time() < deadline:
    time.sleep(0.005)
broken._thread.join(timeout=10)
assert not broken._thread.is_alive() and broken.failures == 20, broken.failures
broken.stop()
assert broken.error == "OSError: nvmlDeviceGetClockInfo returned NVML error 999", broken.error
assert len(broken.samples) >= 2, broken.samples
ctypes.CDLL(fake).fake_nvml_fail_clock_after(ctypes.c_long(-1))

# A library that is not there: no sampler, a reason, no exception.
none, why = gpu_clocks.start_nvml_sampler(library="libnvidia-ml-not-here.so.1")
assert none is None and "OSError" in why["unavailable"], why
print("gpu_clocks NVML calls: ok")
