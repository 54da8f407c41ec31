#!/usr/bin/env python3
"""stsa's CPU backend against PyTorch's CPU attention, on one machine, in one run.

For one shape (default: the `stsa bench` problem, 21 x 16 x 16 tokens, 8 heads,
D = 128, bf16) it times, in rounds that run every implementation once each, so
that the machine's drift touches all of them alike:

  - stsa dense and stsa sparse (the spatial mask with the frame-0 anchor, at each
    kept density) through `stsa.attention`;
  - PyTorch's `scaled_dot_product_attention`, dense (its CPU flash kernel);
  - FlexAttention, compiled, given the identical tile plan: a BlockMask from
    `stsa.tile_lists`' full and partial tiles, whose mask_mod reads the plan's
    own bitmasks for the partial ones.

All of them get the same [B, H, N, D] tensors and use the same number of
threads. Each output is checked against fp64 attention on sampled rows under
the plan's mask. Prints one table (median ms, GFLOP/s on the kept pairs,
speedups against SDPA dense and against FlexAttention on the same plan, error)
and, with --out, writes the numbers as JSON.

Needs torch (>= 2.8; FlexAttention on the CPU compiles C++, so a compiler too)
and the stsa package. A benchmark, not a test: it asserts nothing about time.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=21)
    p.add_argument("--height", type=int, default=16)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--densities", default="0.1,0.25,0.5", help="kept densities of the spatial mask, comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (each runs every implementation once)")
    p.add_argument("--threads", type=int, default=0, help="threads for stsa and torch (0: all cores)")
    p.add_argument("--check-rows", type=int, default=64, help="query rows per head checked against fp64")
    p.add_argument("--no-flex", action="store_true", help="leave FlexAttention out (it compiles for a while)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON to this file (refused if it exists)")
    args = p.parse_args(argv)
    try:
        args.densities = [float(d) for d in args.densities.split(",")]
    except ValueError:
        p.error(f"--densities: not a comma-separated list of numbers: {args.densities!r}")
    if any(not 0 < d <= 1 for d in args.densities):
        p.error("--densities: each in (0, 1]")
    names = [f"{d:g}" for d in args.densities]  # each density's rows are named so: two alike were one row
    if len(set(names)) != len(names):
        p.error(f"--densities: {args.densities} has two densities printed alike ({', '.join(names)})")
    for name in ("frames", "height", "width", "heads", "head_dim", "rounds", "check_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: at least 1")
    if args.threads < 0:
        p.error("--threads: 0 (all cores) or more")
    if args.out and os.path.exists(args.out):
        p.error(f"--out: {args.out} exists; it is never replaced")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):  # else lost after the whole run
        p.error(f"--out: {args.out}: no such folder")
    return args


def plan_tiles(torch, lists):
    """The plan as tensors: which tiles are full, each tile's bitmask id (-1: not
    partial), the bitmasks, and the tile shape."""
    tq, tk = lists["tile"]
    mask_ids = torch.as_tensor(lists["mask_ids"], dtype=torch.int64)
    full = torch.zeros(mask_ids.shape, dtype=torch.bool)
    for t in range(mask_ids.shape[0]):
        listed = lists["full_kv_indices"][t][: int(lists["full_kv_num_blocks"][t])]
        full[t, torch.as_tensor(listed, dtype=torch.int64)] = True
    masks = torch.as_tensor(lists["masks"])
    if masks.shape[0] == 0:  # no partial tile; a mask to index all the same (never selected)
        masks = torch.zeros((1, tq, tk), dtype=torch.bool)
    return full, mask_ids, masks, tq, tk


def allowed_rows(torch, plan, rows, n):
    """[len(rows), N] bool: the keys the plan lets each of `rows` attend."""
    full, mask_ids, masks, tq, tk = plan
    cols = torch.arange(n)
    qt, kt = (rows // tq)[:, None], (cols // tk)[None, :]
    ids = mask_ids[qt, kt]
    partial = masks[ids.clamp(min=0), (rows % tq)[:, None], (cols % tk)[None, :]] & (ids >= 0)
    return full[qt, kt] | partial


def reference_rows(torch, q, k, v, rows, allowed, scale):
    """fp64 attention of `rows` (per head) under `allowed` ([R, N]); q, k, v [1, H, N, D]."""
    qd, kd, vd = (x[0].double() for x in (q, k, v))
    s = torch.einsum("hrd,hnd->hrn", qd[:, rows], kd) * scale
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hrn,hnd->hrd", torch.softmax(s, -1), vd)


def rel_l2(torch, out, rows, ref):
    got = out[0][:, rows].double()
    return float((got - ref).norm() / ref.norm())


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    threads = args.threads or os.cpu_count() or 1
    os.environ["STSA_THREADS"] = str(threads)  # read when stsa's CPU backend starts
    import torch
    import stsa
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    grid = stsa.VideoGrid(args.frames, args.height, args.width)
    n, h, d = grid.tokens, args.heads, args.head_dim
    scale = d ** -0.5
    q, k, v = (torch.randn(1, h, n, d, dtype=dtype) for _ in range(3))
    check_rows = torch.randperm(n)[: min(args.check_rows, n)]

    # name -> (callable, kept pairs per head, the plan for the error check or None for dense)
    impls = {}
    impls["stsa dense"] = (lambda: stsa.attention(q, k, v, grid, "dense", layout="bhnd"), n * n, None)
    impls["sdpa dense"] = (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), n * n, None)
    flex = None if args.no_flex else torch.compile(flex_attention, dynamic=False)
    for density in args.densities:
        lists = stsa.tile_lists(grid, "spatial", density)
        info = stsa.plan(grid, "spatial", density)
        plan = plan_tiles(torch, lists)
        kept = info["kept_pairs"]
        impls[f"stsa sparse {density:g}"] = (
            lambda density=density: stsa.attention(q, k, v, grid, "spatial", density, layout="bhnd"), kept, plan)
        if flex is None:
            continue
        _, mask_ids, masks, tq, tk = plan

        def mask_mod(b, head, q_idx, kv_idx, mask_ids=mask_ids, masks=masks, tq=tq, tk=tk):
            ids = mask_ids[q_idx // tq, kv_idx // tk]
            return masks[ids.clamp(min=0), q_idx % tq, kv_idx % tk]

        def blocks(name):
            return torch.as_tensor(lists[name], dtype=torch.int32)[None, None]

        block_mask = BlockMask.from_kv_blocks(blocks("kv_num_blocks"), blocks("kv_indices"),
                                              blocks("full_kv_num_blocks"), blocks("full_kv_indices"),
                                              BLOCK_SIZE=(tq, tk), mask_mod=mask_mod, seq_lengths=(n, n))
        impls[f"flex sparse {density:g}"] = (
            lambda block_mask=block_mask: flex(q, k, v, block_mask=block_mask, scale=scale), kept, plan)

    results = {"shape": {"frames": args.frames, "height": args.height, "width": args.width, "tokens": n,
                         "heads": h, "head_dim": d, "dtype": args.dtype},
               "threads": threads, "torch": torch.__version__, "rounds": args.rounds, "impls": {}}
    for name, (fn, kept, plan) in impls.items():  # warm-up (FlexAttention compiles here), then the error check
        t0 = time.perf_counter()
        out = fn()
        warm_s = time.perf_counter() - t0
        allowed = (torch.ones(len(check_rows), n, dtype=torch.bool) if plan is None
                   else allowed_rows(torch, plan, check_rows, n))
        ref = reference_rows(torch, q, k, v, check_rows, allowed, scale)
        results["impls"][name] = {"kept_pairs": kept, "warm_up_s": warm_s,
                                  "rel_l2": rel_l2(torch, out, check_rows, ref), "ms": []}
        print(f"{name}: warmed up in {warm_s:.1f} s, rel L2 {results['impls'][name]['rel_l2']:.3g} vs fp64",
              file=sys.stderr)
    for r in range(args.rounds):
        for name, (fn, _, _) in impls.items():
            t0 = time.perf_counter()
            fn()
            results["impls"][name]["ms"].append((time.perf_counter() - t0) * 1e3)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    for name, rec in results["impls"].items():
        rec["median_ms"] = statistics.median(rec["ms"])
        rec["gflops_kept"] = 4 * d * h * rec["kept_pairs"] / (rec["median_ms"] * 1e6)
    sdpa = results["impls"]["sdpa dense"]["median_ms"]
    lines = ["| impl | ms (median) | min-max | GFLOP/s kept | vs SDPA dense | vs flex, same plan | rel L2 vs fp64 |",
             "|---|---|---|---|---|---|---|"]
    for name, rec in results["impls"].items():
        rec["vs_sdpa_dense"] = sdpa / rec["median_ms"]
        flex_rec = results["impls"].get(name.replace("stsa sparse", "flex sparse"))
        if name.startswith("stsa sparse") and flex_rec:
            rec["vs_flex"] = flex_rec["median_ms"] / rec["median_ms"]
        vs_flex = f"{rec['vs_flex']:.2f}x" if "vs_flex" in rec else "-"
        lines.append(f"| {name} | {rec['median_ms']:.1f} | {min(rec['ms']):.1f}-{max(rec['ms']):.1f} | "
                     f"{rec['gflops_kept']:.0f} | {rec['vs_sdpa_dense']:.2f}x | {vs_flex} | {rec['rel_l2']:.3g} |")
    print(f"{n} tokens ({args.frames}x{args.height}x{args.width}), {h} heads, D = {d}, {args.dtype}, "
          f"{threads} threads, torch {torch.__version__}, {args.rounds} rounds")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "x") as f:  # never replaces a file
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
