#!/usr/bin/env python3
"""compare.py's table on hand-made results (no torch, no GPU): the per-video
figure against numbers worked out by hand, NaN timings skipped, and the
made-up results of --dry-run formatted without an exception, one row per kernel.
Usage: compare_table_test.py BENCH_GPU_DIR"""
import argparse
import sys

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
# 3000 calls; sparse: 29 layers x 37 steps x 2 = 2146 at 2.0 + 0.5 ms; dense: 854 at min(10, 12) ms.
# 854 * 10 + 2146 * 2.5 = 13,905 ms against 30,000 ms on cuDNN.
assert "3000 calls" in line, line
assert "self-attention on cuDNN 30 s" in line, line
assert "s0.10 14 s (2.16x, saves 16 s)" in line, line
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
