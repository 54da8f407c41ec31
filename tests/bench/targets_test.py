#!/usr/bin/env python3
"""bench/gpu/targets.py on the second H200 run's stored files (bench/gpu/runs/
2026-11-30-fd6cf44), whose verdicts bench/gpu/RESULTS.md records by hand, and
on made-up figures for the prediction verdicts. Usage: targets_test.py BENCH_GPU_DIR"""
import contextlib
import io
import os
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree
bench_gpu = sys.argv[1]
sys.path.insert(0, bench_gpu)
import targets  # noqa: E402

run = os.path.join(bench_gpu, "runs", "2026-11-30-fd6cf44")
# The predictions the third run was judged by (the live file changes run by run).
import json as _json  # noqa: E402
import tempfile  # noqa: E402
predictions_file = os.path.join(tempfile.mkdtemp(), "predictions.json")
with open(predictions_file, "w") as f:
    _json.dump({"predictions": [
        {"metric": "kept_tflops", "shape": "1440p", "case": "s0.30", "low": 570, "high": 595,
         "source": "The clock, not the cycles"},
        {"metric": "sm_ghz", "shape": "1440p", "case": "s0.30", "low": 1.50, "high": 1.58,
         "source": "The clock, not the cycles"},
        {"metric": "routing_ms", "low": 1.2, "high": 1.6, "source": "Routing v2"}]}, f)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = targets.main(["--bench", os.path.join(run, "gpu_bench.json"), "--route",
                       os.path.join(run, "gpu_route_bench.json"), "--predictions", predictions_file,
                       "--kernel", "sm90-overlap+head-by-head"])
text = out.getvalue()
assert rc == 0, rc
# The live predictions file parses and names metrics targets.py measures.
import json  # noqa: E402
live = json.load(open(os.path.join(bench_gpu, "predictions.json")))["predictions"]
assert live and all(p["metric"] in ("kept_tflops", "vs_cudnn", "vs_flex", "sm_ghz", "routing_ms", "routing_device_ms",
                                    "overhead_share", "vs_default", "permutation_ms", "fused_scatter_saving_ms",
                                    "fused_attention_ratio") and p["low"] <= p["high"] and set(p) <= {
                                        "metric", "shape", "case", "low", "high", "source", "kernel"}
                    for p in live), live
# RESULTS.md, second run, the configuration Auto then took at 1440p: 596 / 579 /
# 542 / 535 TFLOP/s against cuDNN's 558; 1.42 / 1.39 / 1.29 / 1.32x FlexAttention;
# dense 1.06x cuDNN; routing + permutation 3.2% of the attention time.
for line in ("kept-tile TFLOP/s >= cuDNN dense | 1440p | s0.10 | 596 | 558 | met",
             "kept-tile TFLOP/s >= cuDNN dense | 1440p | s0.30 | 542 | 558 | MISSED",
             ">= 1.35x FlexAttention | 1440p | s0.30 | 1.288 | 1.350 | MISSED",
             ">= 1.35x FlexAttention | 1440p | s0.50 | 1.324 | 1.350 | MISSED",
             "dense >= 0.95x cuDNN | 1440p | dense | 1.057 | 0.950 | met",
             "routing + permutation < 3% | 1440p | s0.10 | 0.032 | 0.030 | MISSED",
             "kept_tflops | 1440p | s0.30 | 570-595 | 542 | below | The clock, not the cycles",
             "routing_ms | - | - | 1.200-1.600 | 2.365 | above | Routing v2",
             "sm_ghz | 1440p | s0.30 | 1.500-1.580 | - | no figure"):
    assert line in text, f"missing: {line}\n{text}"

# The default kernel is the run's first unless one is named.
bench = {"meta": {"kernels": ["k"]},
         "results": [{"shape": "720p", "dense_ms": {"cudnn": 2.0},
                      "cases": {"s0.10": {"flex_ms": 0.30}},
                      "stsa": {"k": {"cases": [{"label": "s0.10", "ms": 0.2, "kept_tile_flops": 1.2e11,
                                                "dense_flops": 1.0e12, "clock": {"sm_mhz_mean": 1550.0}}]}}}]}
values = targets.measured(bench, None, "k")
assert abs(values[("kept_tflops", "720p", "s0.10")] - 600) < 1e-9, values
assert abs(values[("cudnn_tflops", "720p", "s0.10")] - 500) < 1e-9, values
assert abs(values[("vs_flex", "720p", "s0.10")] - 1.5) < 1e-9, values
rows = {(r[1], r[2], r[0]): r for r in targets.target_rows(values)}
assert rows[("720p", "s0.10", "kept-tile TFLOP/s >= cuDNN dense")][5] is True
assert rows[("720p", "s0.10", ">= 1.35x FlexAttention")][5] is True
assert rows[("1440p", "s0.10", ">= 1.35x FlexAttention")][5] is None  # no figure: neither met nor missed
predictions = [{"metric": "kept_tflops", "shape": "720p", "case": "s0.10", "low": 590, "high": 610},
               {"metric": "kept_tflops", "shape": "720p", "case": "s0.10", "low": 500, "high": 599},
               {"metric": "sm_ghz", "shape": "720p", "case": "s0.10", "low": 1.6, "high": 1.7}]
verdicts = [r[6] for r in targets.prediction_rows(values, predictions)]
assert verdicts == ["inside", "above", "below"], verdicts

# The route bench's figures, the router's device time among them (runs before
# session 18 have none: no figure, not a verdict).
route_values = targets.measured({}, {"routing_ms": 1.5, "routing_device_ms": 1.1, "overhead_share": 0.025}, "k")
assert route_values[("routing_device_ms", None, None)] == 1.1, route_values
verdicts = [r[6] for r in targets.prediction_rows(route_values, [
    {"metric": "routing_device_ms", "low": 0.9, "high": 1.4}, {"metric": "overhead_share", "low": 0.026, "high": 0.03}])]
assert verdicts == ["inside", "below"], verdicts
assert ("routing_device_ms", None, None) not in targets.measured({}, {"routing_ms": 2.1}, "k")
# The fused O scatter against its own pass (route bench runs from session 19 on).
fused = targets.measured({}, {"permutation_ms": 0.75, "two_step_permutation_ms": 1.0, "attention_ms": 99.0,
                              "two_step_attention_ms": 100.0}, "k")
assert abs(fused[("fused_scatter_saving_ms", None, None)] - 0.25) < 1e-12, fused
assert abs(fused[("fused_attention_ratio", None, None)] - 0.99) < 1e-12, fused
assert ("fused_scatter_saving_ms", None, None) not in targets.measured({}, {"permutation_ms": 0.99}, "k")

# The run's other kernels: a line each with the targets their rows meet, and a
# prediction that names a kernel reads that kernel's figures.
variant = {("kept_tflops", "720p", "s0.10"): 610.0, ("cudnn_tflops", "720p", "s0.10"): 600.0,
           ("vs_flex", "720p", "s0.10"): 1.2}
line = targets.variant_lines({"k+snake": variant})[0]
assert line == "k+snake: 1 of 2 kernel targets met; missed: 720p s0.10 vs-flex", line
rows = targets.prediction_rows({}, [{"metric": "kept_tflops", "shape": "720p", "case": "s0.10", "low": 600,
                                     "high": 620, "kernel": "k+snake"},
                                    {"metric": "kept_tflops", "shape": "720p", "case": "s0.10", "low": 600,
                                     "high": 620, "kernel": "not-run"}], {"k+snake": variant})
assert [(r[0], r[6]) for r in rows] == [("kept_tflops (k+snake)", "inside"), ("kept_tflops (not-run)", "no figure")], rows
# A prediction naming the judged kernel itself reads its own figures.
rows = targets.prediction_rows({("kept_tflops", "720p", "s0.10"): 605.0}, [
    {"metric": "kept_tflops", "shape": "720p", "case": "s0.10", "low": 600, "high": 620, "kernel": "k"}], {}, "k")
assert rows[0][6] == "inside", rows

# vs_default: a variant's kept-tile TFLOP/s over the default kernel's, case by case.
ratios = targets.with_vs_default({("kept_tflops", "720p", "s0.10"): 630.0, ("kept_tflops", "1440p", "s0.10"): 1.0},
                                 {("kept_tflops", "720p", "s0.10"): 600.0})
assert abs(ratios[("vs_default", "720p", "s0.10")] - 1.05) < 1e-12, ratios
assert ("vs_default", "1440p", "s0.10") not in ratios, ratios  # no default figure: no ratio

# A file that cannot be read: exit 2 and one line, no traceback.
err = io.StringIO()
with contextlib.redirect_stderr(err):
    assert targets.main(["--bench", os.path.join(run, "no-such.json")]) == 2
assert err.getvalue().startswith("targets.py: ") and err.getvalue().count("\n") == 1, err.getvalue()
print("targets.py: ok")
