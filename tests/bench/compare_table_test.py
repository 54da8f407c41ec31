#!/usr/bin/env python3
"""compare.py's table on hand-made results (no torch, no GPU): the per-video
figure against numbers worked out by hand, NaN timings skipped, and the
made-up results of --dry-run formatted without an exception, one row per kernel.
Usage: compare_table_test.py BENCH_GPU_DIR"""
import argparse
import sys
import time

sys.dont_write_bytecode = True  # nothing written into the source tree

sys.path.insert(0, sys.argv[1])
import compare  # noqa: E402


def record(label, kernel, density, ms):
    return {"label": label, "kernel": kernel, "kernel_resolved": kernel, "density": density, "band": 1,
            "tile_density": min(1.0, density), "ms": ms, "kept_tile_flops": 1e12, "tflops_kept_tiles": 1.0,
            "dense_flops": 1e12}


# Two kernels: the faster one counts per density; a NaN (or, from JSON, null) time never wins.
records = [record("s0.10", "a", 0.1, 3.0), record("s0.10", "b", 0.1, 2.0), record("s0.10", "c", 0.1, float("nan")),
           record("s0.10", "d", 0.1, None), record("dense", "a", 1.0, 12.0)]
perm = {"gather_qkv_ms": 0.3, "scatter_o_lse_ms": 0.2}
line = compare.per_video("720p", records, 10.0, perm)
# 3000 calls; sparse: 29 layers x 37 steps x 2 = 2146 at 2.0 + 0.3 ms (the gather; the scatter is in the
# kernel's stores); dense: 854 at min(10, 12) ms. 854 * 10 + 2146 * 2.3 = 13,476 ms against 30,000 ms on cuDNN.
assert "3000 calls" in line, line
assert "self-attention on cuDNN 30 s" in line, line
assert "s0.10 13 s (2.23x, saves 17 s)" in line and "the scatter fused" in line, line
assert compare.per_video("720p", records, None, perm) is None
assert compare.per_video("720p", [record("dense", "a", 1.0, 12.0)], 10.0, perm) is None
no_perm = compare.per_video("720p", records, 10.0, None)
# 854 * 10 + 2146 * 2.0 = 12,832 ms.
assert "s0.10 13 s (2.34x, saves 17 s)" in no_perm and "not measured" in no_perm, no_perm

kernels = ["sm90-pingpong", "sm90", "sm80", "sm90-pingpong+head-by-head"]  # '+': a work-order variant
args = argparse.Namespace(shapes=["720p", "1440p"], kernels=kernels, densities=[0.1, 0.2, 0.3, 0.5, 1.0])
text = compare.table(compare.dry_results(args), kernels)
for shape in args.shapes:
    for kernel in kernels:
        assert f"{shape} | s0.20 | stsa-{kernel} |" in text, (shape, kernel)
    assert f"{shape} | per video, Wan2.1-1.3B" in text, shape
assert "NaN" in text  # the made-up NaN error is shown as NaN
print("compare.py table: ok")

# An optional shape skipped for time is a line of its own, not an error.
skipped = compare.table([{"shape": "480p", "stsa": {}, "cases": {}, "errors": [], "skipped": "out of time"}], kernels)
assert "480p | skipped: out of time (optional shape)" in skipped, skipped
print("compare.py skipped shape: ok")

# Only the clock may cut an optional shape short; the shapes must run clean.
clean = {"shape": "720p", "stsa": {"sm90": {}}, "errors": []}
assert compare.results_ok([clean, {"shape": "480p", "stsa": {}, "errors": [], "skipped": "out of time"}])
cut = {"shape": "480p", "stsa": {"sm90": {}}, "errors": [
    "stsa_gpu_bench --kernels sm80: exit status 1", "stsa sm80 s0.30: skipped: past --deadline-s",
    "fa2 dense skipped: out of time", "stsa_gpu_bench --kernels sm90: Command '...' timed out after 15 seconds"]}
assert compare.results_ok([clean, cut])
wrong = {"shape": "480p", "stsa": {"sm90": {}}, "errors": ["sm90 s0.10: max |difference| 0.5 against max |reference| 1"]}
assert not compare.results_ok([clean, wrong])
assert not compare.results_ok([dict(clean, errors=["fa2 dense skipped: out of time"])])  # required: no excuse
assert not compare.results_ok([dict(clean, stsa={})])
# An extra kernel never started for time is no error, in a required shape too,
# and its rows say so; a kernel that ran and failed still is.
extra_skipped = dict(clean, kernels_skipped=["sm80"])
assert compare.results_ok([extra_skipped])
assert not compare.results_ok([dict(extra_skipped, errors=["stsa_gpu_bench --kernels sm90: exit status 1"])])
rows = compare.table([dict(compare.dry_results(args)[0], kernels_skipped=["sm80"])], kernels + ["sm80-extra"])
assert "720p | s0.20 | stsa-sm80 |" in rows  # the dry run has its rows: they are shown
assert "720p | s0.20 | stsa-sm80-extra | 0.270 | (failed or not run: see errors)" in rows, rows
only_default = compare.dry_results(args)[0]
only_default["stsa"] = {k: v for k, v in only_default["stsa"].items() if k == kernels[0]}
only_default["kernels_skipped"] = kernels[1:]
rows = compare.table([only_default], kernels)
assert f"720p | s0.10 | stsa-{kernels[1]} | 0.150 | (skipped: out of time)" in rows, rows
print("compare.py results_ok: ok")


# The outputs are rewritten after every step of a shape: the table takes a shape
# with only its baselines, and one whose sparse case has no time (a failed case).
partial = {"shape": "720p", "tokens": 75600, "stsa": {}, "cases": {}, "errors": [],
           "dense_ms": {"cudnn": 60.0, "fa2": 95.0}}
assert "720p" in compare.table([partial], kernels)
failed_case = record("s0.10", "sm90", 0.1, None)
with_perm = {"shape": "720p", "tokens": 75600, "cases": {}, "errors": [], "dense_ms": {"cudnn": 60.0},
             "stsa": {"sm90": {"cases": [failed_case, record("dense", "sm90", 1.0, 61.0)],
                               "permutation": {"gather_qkv_ms": 1.0, "gather_gbps": 3000.0, "scatter_o_lse_ms": 0.5,
                                               "scatter_gbps": 2900.0, "copy_gbps": 3900.0}}}}
text = compare.table([with_perm], ["sm90"])
assert "nan% of the s0.10 sm90 attention time" in text, text
print("compare.py partial shapes: ok")


# The clock columns. gpu_clocks' sampler on a scripted NVML reading and a scripted
# clock: each row's summary takes exactly the samples inside its window.
import gpu_clocks  # noqa: E402

script = iter([(1980, 300.0, 0x0, 40), (1500, 700.0, 0x4, 60), (1400, 690.0, 0x4 | 0x40, 65),
               (1450, 695.0, 0x4, 63), (1600, 650.0, 0x0, None)])  # the last without a temperature
# Each reading reads the clock before and after; its sample is stamped with the
# middle: 10.0, 11.0, ... 14.0 (quarters: exact in binary).
times = [t + d for t in (10.0, 11.0, 12.0, 13.0, 14.0) for d in (-0.25, 0.25)]
done = []


def read():
    try:
        return next(script)
    except StopIteration:
        done.append(True)
        raise RuntimeError("no more readings")


def now():
    return times.pop(0) if times else 99.0


sampler = gpu_clocks.ClockSampler(read, period_s=0.0, now=now, max_failures=3).start()
sampler._thread.join(timeout=10)  # readings 6, 7 and 8 fail: three in a row end the thread, error kept
assert len(done) == 3 and not sampler._thread.is_alive()
sampler.stop()
assert sampler.error == "RuntimeError: no more readings" and sampler.failures == 3, (sampler.error, sampler.failures)
assert [s[0] for s in sampler.samples] == [10.0, 11.0, 12.0, 13.0, 14.0], sampler.samples
mid = sampler.summary(10.5, 13.5)  # the 1500, 1400 and 1450 MHz samples
assert mid["samples"] == 3 and mid["sm_mhz_mean"] == 1450 and mid["sm_mhz_min"] == 1400, mid
assert mid["power_w_mean"] == 695.0 and mid["temperature_c_max"] == 65, mid
assert mid["power_capped_share"] == 1.0 and abs(mid["thermal_or_hw_slowdown_share"] - 1 / 3) < 1e-12, mid
assert sampler.summary(13.5, 20.0)["temperature_c_max"] is None  # temperature is optional
assert sampler.summary(14.5, 20.0) is None  # no sample in the window: no figure made up
# A failed reading between good ones is skipped, and the sampling goes on.
flaky_script = iter([(1700, 500.0, 0, 50), RuntimeError("busy"), (1710, 500.0, 0, 50)])


def flaky_read():
    item = next(flaky_script, None)
    if item is None:
        raise RuntimeError("done")
    if isinstance(item, Exception):
        raise item
    return item


flaky = gpu_clocks.ClockSampler(flaky_read, period_s=0.0, max_failures=2).start()
flaky._thread.join(timeout=10)
assert [s[1] for s in flaky.samples] == [1700, 1710] and flaky.failures == 3, (flaky.samples, flaky.failures)
# A sampler stops when asked, whatever the reading.
steady = gpu_clocks.ClockSampler(lambda: (1700, 500.0, 0, 50), period_s=0.001).start()
time.sleep(0.02)
steady.stop()
assert not steady._thread.is_alive() and steady.samples and steady.error is None

# 132 SMs x 4096 FLOP per clock at 1.5 GHz = 811 TFLOP/s; 405.5 TFLOP in 1 s is half of it.
peak = 132 * 4096 * 1.5e9
assert abs(gpu_clocks.tensor_share(peak / 2, 1000.0, 1500, 132, [9, 0]) - 0.5) < 1e-12
assert abs(gpu_clocks.tensor_share(peak / 4, 1000.0, 1500, 132, [8, 0]) - 0.5) < 1e-12  # A100: half per clock
assert gpu_clocks.tensor_share(peak / 2, 1000.0, 1500, 132, [8, 9]) is None  # no peak known for sm89
assert gpu_clocks.tensor_share(peak / 2, 1000.0, None, 132, [9, 0]) is None

# compare.py fills each row's clock from its window and prints it with the share.
rec = record("s0.10", "sm90", 0.1, 1000.0)
rec.update(kept_tile_flops=peak / 2, wall_from_s=10.5, wall_to_s=13.5)
half_known = record("s0.20", "sm90", 0.2, 1000.0)
half_known.update(wall_from_s=10.5, wall_to_s=None)  # a window without an end: left without a clock
shape = {"shape": "720p", "tokens": 75600, "errors": [], "dense_ms": {"cudnn": 60.0},
         "dense_window": {"cudnn": (13.5, 14.5), "fa2": (20.0, 21.0)},
         "cases": {"s0.10": {"flex_ms": 2000.0, "flex_window": (9.0, 10.0)}},
         "stsa": {"sm90": {"cases": [rec, half_known]}}}
compare.attach_clocks([shape], sampler)
assert rec["clock"]["sm_mhz_mean"] == 1450
assert "clock" not in half_known or half_known["clock"] is None, half_known
assert shape["dense_clock"]["cudnn"]["sm_mhz_mean"] == 1600
assert shape["dense_clock"]["fa2"] == {"samples": 0}  # no sample in its window: marked, not searched again
assert shape["cases"]["s0.10"]["flex_clock"]["sm_mhz_mean"] == 1980
device = {"sms": 132, "capability": [9, 0], "max_sm_mhz": 1980, "power_limit_w": 700.0}
text = compare.table([shape], ["sm90"], device)
# 405.5 TFLOP in 1 s at 1.45 GHz: 405.5 / (132 x 4096 x 1.45e9) = 52%.
assert "720p | s0.10 | stsa-sm90 | 0.100 | 1000.00 | 1 | 0.06x | 2.00x | 1.45 | 52 |" in text, text
# FlexAttention's window holds one sample: too few for the table (the JSON keeps it).
assert "720p | s0.10 | flex | 0.100 | 2000.00 | 203 | 0.03x | 1.00x | - | - | (ref)" in text, text
# Row means 1.45 (3 samples), 1.60 and 1.98 (1 each); lowest sample 1.40.
assert ("SM clock, mean of each timed row: 1.45-1.98 GHz, lowest sample 1.40 GHz "
        "(board: 1.98 GHz max, 700 W limit); board power (NVML's 1 s average) 300-695 W") in text, text
assert "the power cap held the clock in 60% of 5 samples, thermal or hardware slowdown in 20%" in text, text
# Without a sampler (no NVML) the rows say "-", and nothing fails.
bare = {"shape": "720p", "tokens": 75600, "errors": [], "cases": {}, "stsa": {"sm90": {"cases": [record("s0.10", "sm90", 0.1, 5.0)]}}}
compare.attach_clocks([bare], None)
assert "| 0.100 | 5.00 | 1 | - | - | - | - |" in compare.table([bare], ["sm90"]), compare.table([bare], ["sm90"])
# NVML may or may not load here (no GPU driver on CI): either way no exception.
live, board = gpu_clocks.start_nvml_sampler()
if live is not None:
    live.stop()
else:
    assert board["unavailable"], board
print("gpu_clocks and the clock columns: ok")

# Which stsa_gpu_bench processes a shape starts when time runs short: the clock
# takes the last kernels (the least wanted) first, never an early extra while
# later ones run. A fake clock; each process "takes" 20 s of it.
class FakeClock:
    def __init__(self, left):
        self.remaining = left

    def left(self):
        return self.remaining


started = []


def fake_run(cmd, timeout):
    started.append((cmd[cmd.index("--kernels") + 1], timeout))
    fake_clock.remaining -= 20
    return argparse.Namespace(returncode=0)


kernels_in_order = ["default", "extra-1", "extra-2", "extra-3", "extra-4", "extra-5"]
fake_args = argparse.Namespace(kernels=kernels_in_order, densities=[0.1, 1.0], build="/nonexistent", sample_rows=8)
real_run, compare.subprocess.run = compare.subprocess.run, fake_run
try:
    fake_clock = FakeClock(150.0)  # 1440p: 40 s kept for FlexAttention, a 30 s floor per process
    shape = {"shape": "1440p", "stsa": {}, "cases": {}, "errors": []}
    compare.run_stsa("1440p", fake_args, fake_clock, shape, "/nonexistent", 21, 90, 160)
finally:
    compare.subprocess.run = real_run
assert [k for k, _ in started] == kernels_in_order[:5], started
assert shape["kernels_skipped"] == ["extra-5"], shape
# No extra one is given more than the time left (less FlexAttention's reserve), nor less than the floor.
assert all(30 <= t <= left - 40 for (_, t), left in zip(started[1:], (130, 110, 90, 70))), started
print("compare.py kernels dropped last first: ok")
