#!/usr/bin/env python3
"""Issue 4's targets, and bench/NOTES.md's predictions, read off one GPU run.

check.sh runs it after the benchmark, so the device log ends with a verdict
per target and per prediction, taken from the run's own files:
  gpu_bench.json        compare.py: stsa rows, cuDNN dense, FlexAttention on the plan
  gpu_route_bench.json  stsa_gpu_route_bench: routing + permutation against attention
Targets (issue 4, in one run on one H200): kept-tile TFLOP/s >= cuDNN's dense
TFLOP/s and >= 1.35x FlexAttention at 720p and 1440p, s = 0.1-0.5; dense
>= 0.95x cuDNN; routing + permutation < 3% of the attention time at 1440p.
Informational: exits 0 whatever it finds, 2 only when a file cannot be read.

  targets.py --bench OUT/gpu_bench.json [--route OUT/gpu_route_bench.json]
             [--predictions bench/gpu/predictions.json] [--kernel NAME]
"""
import argparse
import json
import sys

TARGET_SHAPES = ("720p", "1440p")
SPARSE_CASES = ("s0.10", "s0.20", "s0.30", "s0.50")
FLEX_RATIO, DENSE_RATIO, OVERHEAD_SHARE = 1.35, 0.95, 0.03


def stsa_rows(shape, kernel):
    """label -> the kernel's record in this shape."""
    run = (shape.get("stsa") or {}).get(kernel) or {}
    return {c["label"]: c for c in run.get("cases", []) if c.get("ms")}


def measured(bench, route, kernel):
    """(metric, shape, case) -> value, for every figure a target or a prediction reads."""
    values = {}
    for shape in bench.get("results", []):
        name = shape["shape"]
        cudnn_ms = (shape.get("dense_ms") or {}).get("cudnn")
        for label, rec in stsa_rows(shape, kernel).items():
            values[("kept_tflops", name, label)] = rec["kept_tile_flops"] / (rec["ms"] * 1e-3) / 1e12
            clock = rec.get("clock") or {}
            if clock.get("sm_mhz_mean"):
                values[("sm_ghz", name, label)] = clock["sm_mhz_mean"] / 1e3
            if cudnn_ms:
                values[("cudnn_tflops", name, label)] = rec["dense_flops"] / (cudnn_ms * 1e-3) / 1e12
                if label == "dense":
                    values[("vs_cudnn", name, label)] = cudnn_ms / rec["ms"]
            flex_ms = ((shape.get("cases") or {}).get(label) or {}).get("flex_ms")
            if flex_ms:
                values[("vs_flex", name, label)] = flex_ms / rec["ms"]
    if route:
        for key in ("routing_ms", "routing_device_ms", "permutation_ms", "overhead_share", "two_step_permutation_ms",
                    "two_step_overhead_share"):
            if route.get(key) is not None:
                values[(key, None, None)] = route[key]
        # The fused O scatter against its own pass, in one run: what the permutation saves, what attention pays.
        if route.get("two_step_permutation_ms") is not None and route.get("permutation_ms") is not None:
            values[("fused_scatter_saving_ms", None, None)] = route["two_step_permutation_ms"] - route["permutation_ms"]
        if route.get("two_step_attention_ms") and route.get("attention_ms") is not None:
            values[("fused_attention_ratio", None, None)] = route["attention_ms"] / route["two_step_attention_ms"]
    return values


def with_vs_default(variant, default):
    """The variant's figures plus vs_default: its kept-tile TFLOP/s over the default kernel's, case by case
    (a ratio taken in one run, so the machine's clock and cuDNN cancel out)."""
    for (metric, shape, case), value in list(variant.items()):
        base = default.get(("kept_tflops", shape, case))
        if metric == "kept_tflops" and base:
            variant[("vs_default", shape, case)] = value / base
    return variant


def target_rows(values):
    """(target, shape, case, measured, needed, met) for each target with a figure; None where none."""
    rows = []
    for shape in TARGET_SHAPES:
        for case in SPARSE_CASES:
            kept, cudnn = values.get(("kept_tflops", shape, case)), values.get(("cudnn_tflops", shape, case))
            rows.append(("kept-tile TFLOP/s >= cuDNN dense", shape, case, kept, cudnn,
                         None if kept is None or cudnn is None else kept >= cudnn))
            flex = values.get(("vs_flex", shape, case))
            rows.append((f">= {FLEX_RATIO}x FlexAttention", shape, case, flex, FLEX_RATIO,
                         None if flex is None else flex >= FLEX_RATIO))
        dense = values.get(("vs_cudnn", shape, "dense"))
        rows.append((f"dense >= {DENSE_RATIO}x cuDNN", shape, "dense", dense, DENSE_RATIO,
                     None if dense is None else dense >= DENSE_RATIO))
    share = values.get(("overhead_share", None, None))
    rows.append((f"routing + permutation < {OVERHEAD_SHARE:.0%}", "1440p", "s0.10", share, OVERHEAD_SHARE,
                  None if share is None else share < OVERHEAD_SHARE))
    return rows


def prediction_rows(values, predictions, variants=None, kernel=None):
    """(metric, shape, case, low, high, measured, verdict, source) per prediction; a
    prediction that names a "kernel" other than `kernel` (whose figures are `values`)
    reads that variant's figures (variants: kernel -> values)."""
    rows = []
    for p in predictions:
        named = p.get("kernel")
        source_values = values if named in (None, kernel) else (variants or {}).get(named, {})
        value = source_values.get((p["metric"], p.get("shape"), p.get("case")))
        verdict = ("no figure" if value is None else "below" if value < p["low"]
                   else "above" if value > p["high"] else "inside")
        metric = p["metric"] + (f" ({p['kernel']})" if p.get("kernel") else "")
        rows.append((metric, p.get("shape"), p.get("case"), p["low"], p["high"], value, verdict,
                     p.get("source", "")))
    return rows


def variant_lines(variants):
    """One line per other kernel of the run: how many of the targets its rows meet, and which they miss."""
    lines = []
    for kernel, values in variants.items():
        rows = [r for r in target_rows(values) if r[5] is not None and not r[0].startswith("routing")]
        short = {"kept-tile": "kept-tile", ">=": "vs-flex", "dense": "vs-cudnn"}
        missed = [f"{r[1]} {r[2]} {short[r[0].split(' ')[0]]}" for r in rows if not r[5]]
        lines.append(f"{kernel}: {sum(1 for r in rows if r[5])} of {len(rows)} kernel targets met"
                     + (f"; missed: {', '.join(missed)}" if missed else ""))
    return lines


def fmt(x):
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.0f}"


def report(values, predictions, kernel, variants=None):
    lines = [f"targets (issue 4), stsa rows of {kernel}:", "target | shape | case | measured | needed | verdict",
             "--- | --- | --- | --- | --- | ---"]
    for target, shape, case, got, needed, met in target_rows(values):
        verdict = "no figure" if met is None else "met" if met else "MISSED"
        lines.append(f"{target} | {shape} | {case} | {fmt(got)} | {fmt(needed)} | {verdict}")
    if variants:
        lines += ["", "the run's other kernels (the same targets, without routing):"] + variant_lines(variants)
    if predictions:
        lines += ["", "predictions (bench/NOTES.md):", "metric | shape | case | predicted | measured | verdict | source",
                  "--- | --- | --- | --- | --- | --- | ---"]
        for metric, shape, case, low, high, got, verdict, source in prediction_rows(values, predictions, variants,
                                                                                   kernel):
            lines.append(f"{metric} | {shape or '-'} | {case or '-'} | {fmt(low)}-{fmt(high)} | {fmt(got)} | "
                         f"{verdict} | {source}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", required=True)
    parser.add_argument("--route")
    parser.add_argument("--predictions")
    parser.add_argument("--kernel", help="the stsa rows to judge (default: the run's first kernel, the default one)")
    args = parser.parse_args(argv)
    try:
        with open(args.bench) as f:
            bench = json.load(f)
        route = None
        if args.route:
            with open(args.route) as f:
                route = json.load(f)
        predictions = []
        if args.predictions:
            with open(args.predictions) as f:
                predictions = json.load(f)["predictions"]
    except (OSError, ValueError, KeyError) as e:
        print(f"targets.py: {e}", file=sys.stderr)
        return 2
    kernels = bench.get("meta", {}).get("kernels") or ["?"]
    kernel = args.kernel or kernels[0]
    values = measured(bench, route, kernel)
    variants = {k: with_vs_default(measured(bench, None, k), values) for k in kernels if k != kernel}
    print(report(values, predictions, kernel, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
