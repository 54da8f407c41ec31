#!/usr/bin/env python3
"""stsa's CUDA backend against PyTorch on one GPU, at Wan2.1 shapes.

Run by bench/gpu/check.sh. For each shape (21 frames; 720p = 45x80 and 1440p =
90x160 tokens per frame, then 480p = 30x52 with whatever time is left; 12 heads;
D = 128; bf16) it

  1. draws Q, K, V with torch ([B, N, H, D], the layout stsa takes) and writes
     them as raw bf16 to a RAM disk;
  2. times PyTorch's cuDNN and FlashAttention-2 SDPA (dense) first, so that
     the clock never takes the baselines, and keeps their outputs;
  3. runs build-gpu/stsa_gpu_bench on those inputs once per attention kernel
     (--kernels, default sm90-pingpong,sm90-overlap,sm90,sm80: the expected
     fastest first, in case time runs out), each in its own process so that a kernel
     that fails or hangs costs only its own rows (the process rewrites its JSON
     after every case, so a timeout keeps what finished): stsa sparse at each kept
     density and stsa dense, timed with CUDA events by the shared benchmark
     harness; it also exports every plan's full and partial tile lists and
     each kernel's sampled output rows;
  4. compares cuDNN's and FA2's outputs with each kernel's dense rows, checks
     every tile class of each exported plan against the mask's definition
     (closed form per tile; so the next comparison inherits no misclassified
     tile), then times FlexAttention with a BlockMask built from the *same*
     plan (full tiles without mask_mod, partial tiles with a mask_mod that
     evaluates the mask predicate) and compares its output with each kernel's rows;
  5. prints one table (a row per stsa kernel next to cuDNN, FA2 and
     FlexAttention, and what that makes of one video's self-attention time)
     and writes JSON under --out, rewritten after every step, so a kill keeps
     everything measured before it.

Throughout, a thread samples the SM clock and board power from NVML
(gpu_clocks.py); each row gets the mean clock over its timed runs and the
share of the tensor peak at that clock it reached, so a row that is slow
because the power cap lowered the clock shows as such.

Every case is time-boxed; cases that would pass the deadline are reported as
skipped rather than run. Needs python3 and torch only (no numpy, no network).
--dry-run needs neither torch nor a GPU: it formats made-up results, to check
this script's own bookkeeping.
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from collections import namedtuple

import gpu_clocks

SHAPES = {"720p": (21, 45, 80), "1440p": (21, 90, 160), "480p": (21, 30, 52)}
# The shapes; the others run only when this much time is left, and are
# skipped (not failed) otherwise.
REQUIRED_SHAPES = ("720p", "1440p")
OPTIONAL_SHAPE_MIN_S = 90
# What the clock did to a shape (a case not started, a process cut off), as
# opposed to what went wrong in it; stsa_gpu_bench exits 1 after any such case.
TIME_ERRORS = ("out of time", "past --deadline-s", "timed out after", "exit status 1")


def results_ok(results):
    """True when every required shape ran without an error and every optional
    one either ran without an error or was cut short by the clock only. An extra
    kernel never started for time (`kernels_skipped`) is not an error anywhere:
    the first kernel, the default, always runs."""
    for r in results:
        if r["shape"] in REQUIRED_SHAPES:
            if not r.get("stsa") or r["errors"]:
                return False
        elif any(not any(t in e for t in TIME_ERRORS) for e in r["errors"]):
            return False
    return True


HEADS, HEAD_DIM, TILE = 12, 128, 128


def log(*args):
    print(*args, flush=True)


class Clock:
    def __init__(self, deadline_s):
        self.start = time.time()
        self.deadline = self.start + deadline_s

    def left(self):
        return self.deadline - time.time()


# A timing: the median ms, and the wall-clock window (time.time()) of the timed runs.
Timed = namedtuple("Timed", "ms wall_from_s wall_to_s")


def time_cuda(fn, repeats, budget_s):
    """Median ms of `fn` over up to `repeats` runs after one warm-up, CUDA events
    (the same rule as stsa's harness: no run starts once the budget is spent)."""
    import torch
    fn()
    torch.cuda.synchronize()
    times, spent = [], 0.0
    wall_from = time.time()
    while len(times) < repeats and spent < budget_s * 1e3:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        spent += times[-1]
    wall_to = time.time()
    times.sort()
    n = len(times)
    return Timed(times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2]), wall_from, wall_to)


def attach_clocks(results, sampler):
    """The clock summary of each row's timed window, for rows that have a window
    and no summary yet (a row's samples are all in once its timing returned);
    {"samples": 0} where none fell inside, so the row is not searched again."""
    if sampler is None:
        return
    for shape in results:
        rows = [(c, c.get("wall_from_s"), c.get("wall_to_s"), "clock")
                for run in (shape.get("stsa") or {}).values() for c in run.get("cases", [])]
        dense_clock = shape.setdefault("dense_clock", {})
        rows += [(dense_clock, *window, label) for label, window in shape.get("dense_window", {}).items()]
        rows += [(case, *case["flex_window"], "flex_clock") for case in shape.get("cases", {}).values()
                 if case.get("flex_window")]
        for holder, wall_from, wall_to, key in rows:
            window_known = all(isinstance(t, (int, float)) and t > 0 for t in (wall_from, wall_to))
            if window_known and holder.get(key) is None:
                holder[key] = sampler.summary(wall_from, wall_to) or {"samples": 0}


def write_raw(tensor, path):
    """The tensor's bytes, as stored (C order), without numpy."""
    t = tensor.detach().cpu().contiguous()
    nbytes = t.numel() * t.element_size()
    with open(path, "wb") as f:
        f.write(memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())))


def read_raw(path, dtype):
    import torch
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=dtype)


def load_plan(record, n_tokens):
    """(partial_num, partial_idx, full_num, full_idx) as [1, 1, Qb(, Kb)] int32 CUDA tensors."""
    import torch
    meta = record["plan"]
    raw = read_raw(meta["file"], torch.int32)
    sec = {s["name"]: raw[s["offset"] // 4: s["offset"] // 4 + s["count"]].long() for s in meta["sections"]}
    q_blocks = len(sec["full_offsets"]) - 1
    k_blocks = (n_tokens + TILE - 1) // TILE

    def padded(offsets, tiles):
        counts = offsets.diff()
        idx = torch.zeros((q_blocks, k_blocks), dtype=torch.int32)
        rows = torch.repeat_interleave(torch.arange(q_blocks), counts)
        cols = torch.arange(len(tiles)) - torch.repeat_interleave(offsets[:-1], counts)
        idx[rows, cols] = tiles.int()
        return (counts.int()[None, None].cuda(), idx[None, None].cuda())

    partial = padded(sec["partial_offsets"], sec["partial_tiles"])
    full = padded(sec["full_offsets"], sec["full_tiles"])
    return partial + full


def tile_truth(n_tokens, per_frame, band, q_blocks, k_blocks, device):
    """([Qb, Kb] some pair allowed, [Qb, Kb] every pair allowed) for the mask
    compare.py's mask_mod evaluates (frame-0 anchor rows and columns, |q - k| <=
    band), over the tokens each tile really holds (the last tiles are ragged),
    in closed form from the definition: no plan, no element mask."""
    import torch
    a = torch.arange(q_blocks, device=device)[:, None]
    b = torch.arange(k_blocks, device=device)[None, :]
    q0, q1 = a * TILE, torch.clamp((a + 1) * TILE, max=n_tokens) - 1
    k0, k1 = b * TILE, torch.clamp((b + 1) * TILE, max=n_tokens) - 1
    # The smallest |q - k| in the tile: 0 where the ranges overlap, else the gap.
    gap = torch.clamp(torch.maximum(k0 - q1, q0 - k1), min=0)
    some = (q0 < per_frame) | (k0 < per_frame) | (gap <= band)
    # Pairs outside the anchor: rows and columns from per_frame on. None, or the
    # largest |q - k| among them within the band.
    qa, ka = torch.clamp(q0, min=per_frame), torch.clamp(k0, min=per_frame)
    every = (qa > q1) | (ka > k1) | (torch.maximum(q1 - ka, k1 - qa) <= band)
    return some, every


def plan_check(lists, n_tokens, per_frame, band):
    """The exported plan's tile classes against tile_truth, so that the
    FlexAttention comparison, which is given the plan's lists, does not inherit
    a misclassified tile. "wrong": tiles listed as full that hold a masked
    pair, tiles left out that hold an allowed one, tiles listed twice, key
    tile indices outside the grid; "wasted": partial tiles that need no mask
    or hold no allowed pair. Raises ValueError for a plan of another grid."""
    import torch
    partial_num, partial_idx, full_num, full_idx = lists
    q_blocks, k_blocks = partial_idx.shape[-2], partial_idx.shape[-1]
    tiles = (n_tokens + TILE - 1) // TILE
    if q_blocks != tiles or k_blocks != tiles:
        raise ValueError(f"a plan of {q_blocks} x {k_blocks} tiles for {n_tokens} tokens ({tiles} x {tiles})")
    device = partial_idx.device
    cols = torch.arange(k_blocks, device=device)[None, :]
    outside = 0

    def listed(num, idx):
        nonlocal outside
        listed_entries = cols < num[0, 0].long()[:, None]
        key_tiles = idx[0, 0].long()
        inside = (key_tiles >= 0) & (key_tiles < k_blocks)
        outside += int((listed_entries & ~inside).sum())  # counted, never used as an index (a device assert)
        valid = listed_entries & inside
        marks = torch.zeros(q_blocks, k_blocks, dtype=torch.int32, device=device)
        rows = torch.arange(q_blocks, device=device)[:, None].expand(q_blocks, k_blocks)
        marks.index_put_((rows[valid], key_tiles[valid]), torch.ones((), dtype=torch.int32, device=device),
                         accumulate=True)
        return marks

    partial, full = listed(partial_num, partial_idx), listed(full_num, full_idx)
    some, every = tile_truth(n_tokens, per_frame, band, q_blocks, k_blocks, device)
    is_partial, is_full = partial > 0, full > 0
    counts = {
        "full_with_masked_pairs": int((is_full & ~every).sum()),
        "left_out_with_allowed_pairs": int((~is_partial & ~is_full & some).sum()),
        "listed_twice": int(((partial + full) > 1).sum()),
        "partial_without_masked_pairs": int((is_partial & every).sum()),
        "partial_without_allowed_pairs": int((is_partial & ~some).sum()),
        "outside_the_grid": outside,
    }
    counts["wrong"] = (counts["full_with_masked_pairs"] + counts["left_out_with_allowed_pairs"] +
                       counts["listed_twice"] + counts["outside_the_grid"])
    counts["wasted"] = counts["partial_without_masked_pairs"] + counts["partial_without_allowed_pairs"]
    return counts


def add_stsa_run(shape_result, kernel, run_error, stsa):
    """Files one stsa_gpu_bench process (one kernel) under the shape: its JSON when
    it wrote one (possibly with per-case errors), the process error otherwise."""
    if run_error:
        shape_result["errors"].append(f"stsa_gpu_bench --kernels {kernel}: {run_error}")
    if stsa is None:
        return
    shape_result["stsa"][kernel] = stsa
    for e in stsa.get("errors", []):
        where = f"{e.get('kernel', kernel)}" + (f" {e['label']}" if e.get("label") else "")
        shape_result["errors"].append(f"stsa {where}: {e.get('error', '?')}")


def stsa_records(shape_result):
    """Every kernel's case records, in kernel order."""
    return [c for stsa in shape_result["stsa"].values() for c in stsa["cases"]]


def run_stsa(name, args, clock, shape_result, work, frames, height, width):
    densities = ",".join(str(d) for d in args.densities)
    # A dense 1440p call takes about 1 s (5.6e14 FLOP): fewer, shorter repeats there.
    big = name == "1440p"
    budget, repeats = ("2", "3") if big else ("3", "5")
    # What FlexAttention needs after stsa (its compile and five cases), kept out of
    # the stsa processes' share (the SDPA baselines ran before them).
    torch_reserve = 40 if big else 25
    floor = 30.0 if big else 15.0
    for i, kernel in enumerate(args.kernels):
        left_kernels = len(args.kernels) - i
        # The first kernel (the default) always runs; each other one while a
        # floor's time is left, so the clock takes the last kernels (the least
        # wanted) first. A kernel's timeout is its share of the time left, at
        # least the floor and at most the time left: no extra one overruns the deadline.
        # (Skipping by share instead dropped the fourth run's first extra row at
        # 1440p, while the kernels after it, each done in half its share, ran.)
        if i > 0 and clock.left() - torch_reserve < floor:
            # Not an error: the default ran, and an extra kernel is information
            # (the table says it was skipped).
            log(f"stsa_gpu_bench --kernels {kernel}: skipped, out of time")
            shape_result.setdefault("kernels_skipped", []).append(kernel)
            continue
        timeout = max(floor, (clock.left() - torch_reserve) / left_kernels)
        out_json = os.path.join(work, f"stsa_{kernel}.json")
        cmd = [os.path.join(args.build, "stsa_gpu_bench"), "--frames", str(frames), "--height", str(height),
               "--width", str(width), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--densities", densities,
               "--kernels", kernel, "--inputs", work, "--export", work, "--sample-rows", str(args.sample_rows),
               "--repeats", repeats, "--budget-s", budget, "--json", out_json,
               # No new case after this: a case cut off by the timeout is lost.
               f"--deadline-s={max(5.0, timeout - (6 if big else 3)):.0f}",
               # The permutation does not depend on the kernel: timed once.
               "--permutation", "true" if i == 0 else "false"]
        log(f"$ {' '.join(cmd)}   (timeout {timeout:.0f} s)")
        run_error = None
        try:
            rc = subprocess.run(cmd, timeout=timeout).returncode
            if rc != 0:
                run_error = f"exit status {rc}"
        except (subprocess.SubprocessError, OSError) as e:
            run_error = str(e)
        stsa = None
        if os.path.exists(out_json):
            try:
                with open(out_json) as f:
                    stsa = json.load(f)
            except (OSError, ValueError) as e:
                run_error = f"{run_error or 'ran'}; unreadable JSON: {e}"
        if run_error:
            log(f"stsa_gpu_bench --kernels {kernel} failed: {run_error}")
        add_stsa_run(shape_result, kernel, run_error, stsa)


def bench_shape(name, args, clock, results, save):
    frames, height, width = SHAPES[name]
    n = frames * height * width
    per_frame = height * width
    shape_result = {"shape": name, "tokens": n, "stsa": {}, "cases": {}, "errors": []}
    results.append(shape_result)
    log(f"--- {name}: {frames}x{height}x{width} = {n} tokens, {HEADS} heads, D={HEAD_DIM}, bf16")
    # Q, K, V as raw files plus plans and sampled rows; a RAM disk may be too small for 1440p (2.8 GB).
    need = 3 * n * HEADS * HEAD_DIM * 2 + (256 << 20)
    scratch = args.scratch
    os.makedirs(scratch, exist_ok=True)
    if shutil.disk_usage(scratch).free < need:
        scratch = os.path.join(args.build, "bench_scratch")
        log(f"  {args.scratch} has less than {need >> 20} MB free: using {scratch}")
    work = os.path.join(scratch, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        bench_shape_in(name, args, clock, shape_result, work, frames, height, width, n, per_frame, save)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_shape_in(name, args, clock, shape_result, work, frames, height, width, n, per_frame, save):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    torch.manual_seed(0)
    qkv = [torch.randn(1, n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for tensor, label in zip(qkv, "qkv"):
        write_raw(tensor, os.path.join(work, f"{label}.bin"))
    # PyTorch takes [B, H, N, D].
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv)
    del qkv
    big = name == "1440p"
    reps = 3 if big else 5

    # The dense baselines first, so that the clock never takes them; their outputs
    # (0.93 GB each at 1440p) wait for stsa's rows to be compared with.
    dense_ms, dense_out = {}, {}
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        if clock.left() < (15 if big else 5):
            shape_result["errors"].append(f"{label} dense skipped: out of time")
            continue
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
                timed = time_cuda(fn, reps, budget_s=6)
                dense_ms[label] = timed.ms
                shape_result.setdefault("dense_window", {})[label] = (timed.wall_from_s, timed.wall_to_s)
                dense_out[label] = fn()
            log(f"  {label} dense: {dense_ms[label]:.2f} ms")
        except Exception as e:  # a missing backend must not stop the rest
            shape_result["errors"].append(f"{label}: {e}")
            log(f"  {label} failed: {e}")
    shape_result["dense_ms"] = dense_ms
    save()

    # stsa: sparse densities and dense, one process per kernel (each reads the same bytes).
    run_stsa(name, args, clock, shape_result, work, frames, height, width)
    save()
    records = stsa_records(shape_result)
    if not records:
        # The baselines are still worth their rows; nothing to compare them with.
        shape_result["errors"].append("no stsa results")
    sample_rows = next((run["sample_rows"] for run in shape_result["stsa"].values()), [0])
    rows = torch.tensor(sample_rows, device="cuda", dtype=torch.long)

    def stsa_rows(record):
        data = read_raw(record["sample_file"], torch.float32)
        return data.reshape(len(sample_rows), HEADS, HEAD_DIM).cuda()

    def max_errs(out_bhnd, label, into):
        """max |out - stsa| over the sampled rows, per kernel that ran this case, into
        into["max_err"] (NaN where a kernel left rows unwritten: the poison), and the
        largest |out| there into into["ref_max"] (the scale of those errors)."""
        got = out_bhnd[0].index_select(1, rows).permute(1, 0, 2).float()  # [rows, H, D]
        into["ref_max"] = float(got.abs().max())
        errs = into.setdefault("max_err", {})
        for record in records:
            if record["label"] == label and "sample_file" in record:
                err = float((got - stsa_rows(record)).abs().max())
                errs[record["kernel"]] = err
                scale = into["ref_max"] or 1.0
                if not err == err or err / scale > SUSPECT_RELATIVE_ERROR:
                    shape_result["errors"].append(f"{record['kernel']} {label}: max |difference| {err:.3g} against "
                                                  f"max |reference| {into['ref_max']:.3g} on the sampled rows")

    for label, out in dense_out.items():
        max_errs(out, "dense", shape_result.setdefault("dense_check", {}).setdefault(label, {}))
    del dense_out
    save()

    # FlexAttention on the identical plan. The mask_mod is the spatial band with
    # the symmetric frame-0 anchor (no text tokens at these shapes): exactly the
    # predicate stsa's partial-tile bitmasks were derived from. The band is a
    # captured tensor so one compiled kernel serves every density.
    band = torch.zeros((), dtype=torch.int64, device="cuda")

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx < per_frame) | (kv_idx < per_frame) | ((q_idx - kv_idx).abs() <= band)

    def band_of(record):
        return max(record["band"], -1) if record["label"] != "dense" else n

    def plan_key(record):
        return record["label"], record.get("plan", {}).get("file")

    # Each exported plan file against the mask's definition, before FlexAttention
    # is handed its lists (the kernels' processes write one path per case; the
    # last one stays, so this is one check per case unless a process failed).
    plans = {}  # (label, file) -> the lists, or None when the file is unusable
    for record in records:
        key, label = plan_key(record), record["label"]
        if key in plans:
            continue
        plans[key] = None
        try:
            lists = load_plan(record, n)
            checked = plan_check(lists, n, per_frame, band_of(record))
        except Exception as e:
            shape_result["errors"].append(f"plan {label} ({record['kernel']}): {str(e)[:300]}")
            continue
        shape_result["cases"].setdefault(label, {}).setdefault("plan_check", {})[record["kernel"]] = checked
        if checked["wrong"]:
            shape_result["errors"].append(f"plan {label} ({record['kernel']}) disagrees with the mask's "
                                          f"definition: {checked}")
        else:
            plans[key] = lists
    save()

    flex = torch.compile(flex_attention, dynamic=False)
    by_label = {}
    for record in records:  # the plan is the same for every kernel: one FlexAttention run per case
        if plans.get(plan_key(record)) is not None:
            by_label.setdefault(record["label"], record)
    order = sorted(by_label.values(), key=lambda c: c["density"])  # dense (the slowest) last
    attempted = False
    compile_failed = None  # torch.compile does not remember a failure: each case would pay for it again
    for record in order:
        label = record["label"]
        case = shape_result["cases"].setdefault(label, {})
        lists = plans[plan_key(record)]
        if compile_failed:
            case["flex_error"] = f"skipped: the first case failed ({compile_failed[:120]})"
            shape_result["errors"].append(f"flex {label} {case['flex_error']}")
            continue
        if clock.left() < (20 if big else 8):
            case["flex_error"] = "skipped: out of time"
            shape_result["errors"].append(f"flex {label} skipped: out of time")
            continue
        first_attempt, attempted = not attempted, True
        try:
            band.fill_(band_of(record))
            block_mask = BlockMask.from_kv_blocks(*lists, BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                                  seq_lengths=(n, n))
            t0 = time.time()
            fn = lambda: flex(q, k, v, block_mask=block_mask)  # noqa: E731
            timed = time_cuda(fn, reps, budget_s=6)
            case["flex_ms"], case["flex_window"] = timed.ms, (timed.wall_from_s, timed.wall_to_s)
            check = case.setdefault("flex_check", {})
            max_errs(fn(), label, check)
            log(f"  flex {label}: {case['flex_ms']:.2f} ms (incl. compile {time.time() - t0:.0f} s wall), "
                f"max |flex - stsa| = {check['max_err']} (max |flex| {check['ref_max']:.3g})")
        except Exception as e:
            case["flex_error"] = str(e)[:300]
            shape_result["errors"].append(f"flex {label}: {case['flex_error']}")
            log(f"  flex {label} failed: {e}")
            if first_attempt:
                compile_failed = case["flex_error"]
        save()
    del q, k, v
    torch.cuda.empty_cache()


# A sampled-row difference above this share of the largest output there is
# listed as an error. bf16 rounding on both sides gives 0.002-0.004 here; one
# dropped 128-key tile moves a row by 0.016 (dense, 1440p) to 0.08 (s = 0.1,
# 720p) of it (a host simulation at D = 128), and garbage or unwritten rows more.
SUSPECT_RELATIVE_ERROR = 1e-2


def fmt(x, spec, missing="-"):
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and x != x:
        return "NaN"
    return format(x, spec) if isinstance(x, (int, float)) and x not in (float("inf"), float("-inf")) \
        else missing


def err_cell(check, kernel):
    """ "abs (relative to the largest reference output)" for one kernel's sampled rows."""
    err = (check or {}).get("max_err", {}).get(kernel)
    if err is None:
        return "-"
    scale = check.get("ref_max")
    rel = f" ({fmt(err / scale, '.1e')})" if scale and err == err else ""
    return fmt(err, ".2e") + rel


def ratio(a, b):
    return a / b if a and b else None


def times(a, b):
    """How many times `b` fits in `a` (a speedup when both are ms), as "1.23x"."""
    r = ratio(a, b)
    return f"{r:.2f}x" if r is not None else "-"


# Wan2.1-1.3B (12 heads x 128, the shapes measured here): 30 layers, 50 denoising
# steps, classifier-free guidance doubling the calls. Sparse VideoGen runs the
# first 10-35% of steps and the first layer dense; 25% is taken here.
VIDEO_LAYERS, VIDEO_STEPS, VIDEO_CFG, VIDEO_DENSE_STEPS = 30, 50, 2, 13


def per_video(name, records, cudnn, perm):
    """Self-attention time of one Wan2.1-1.3B video at this shape: every call on
    cuDNN, against the dense warm-up on the faster of cuDNN and stsa dense and
    the other calls on the fastest stsa kernel at each density, each paying the
    permutation of every head (the worst case; routing is timed separately by
    stsa_gpu_route_bench). None without a cuDNN time or sparse records."""
    if not cudnn:
        return None
    best = {}
    for c in records:
        ms = c.get("ms")
        if isinstance(ms, (int, float)) and ms == ms and (c["label"] not in best or ms < best[c["label"]]["ms"]):
            best[c["label"]] = c
    sparse = sorted((c for label, c in best.items() if label != "dense"), key=lambda c: c["density"])
    if not sparse:
        return None
    calls = VIDEO_LAYERS * VIDEO_STEPS * VIDEO_CFG
    sparse_calls = (VIDEO_LAYERS - 1) * (VIDEO_STEPS - VIDEO_DENSE_STEPS) * VIDEO_CFG
    dense_ms = min(cudnn, best["dense"]["ms"]) if "dense" in best else cudnn
    # Routed attention's O scatter is part of the kernel's stores (RoutedOptions::fuse_scatter): the gather is the
    # pass. The sparse rows are timed without the fused stores; NOTES predicts they cost nothing measurable
    # (fused_attention_ratio 0.985-1.015, which the route bench measures).
    perm_ms = perm["gather_qkv_ms"] if perm else 0.0
    baseline_s = calls * cudnn / 1e3
    cells = []
    for c in sparse:
        video_s = ((calls - sparse_calls) * dense_ms + sparse_calls * (c["ms"] + perm_ms)) / 1e3
        cells.append(f"{c['label']} {video_s:.0f} s ({baseline_s / video_s:.2f}x, saves {baseline_s - video_s:.0f} s)")
    return (f"{name} | per video, Wan2.1-1.3B ({VIDEO_LAYERS} layers x {VIDEO_STEPS} steps x {VIDEO_CFG} CFG = "
            f"{calls} calls; steps 1-{VIDEO_DENSE_STEPS} and layer 1 dense; the gather of all heads"
            f"{' included' if perm else ' not measured'}, the scatter fused): self-attention on cuDNN "
            f"{baseline_s:.0f} s; stsa "
            + ", ".join(cells))


# Fewer samples than this in a row's window (5 ms apart: a row timed in under
# ~15 ms) give a mean too rough for the table; the JSON keeps them.
MIN_TABLE_SAMPLES = 3


def clock_cells(clock, flops, ms, device):
    """The row's mean SM clock over its timed runs, and the share of the tensor
    peak at that clock its FLOP/s reached (work per cycle, the clock taken out)."""
    clock = clock or {}
    mhz = clock.get("sm_mhz_mean") if clock.get("samples", 0) >= MIN_TABLE_SAMPLES else None
    device = device or {}
    share = gpu_clocks.tensor_share(flops, ms, mhz, device.get("sms"), device.get("capability"))
    return fmt(mhz / 1e3 if mhz else None, ".2f"), fmt(share * 100 if share else None, ".0f")


def clock_line(name, results_shape, device):
    """The spread of the rows' clocks and how often the power cap held them."""
    clocks = [c["clock"] for run in (results_shape.get("stsa") or {}).values() for c in run.get("cases", [])
              if c.get("clock")]
    clocks += [c for c in results_shape.get("dense_clock", {}).values() if c]
    clocks += [c["flex_clock"] for c in results_shape.get("cases", {}).values() if c.get("flex_clock")]
    clocks = [c for c in clocks if c.get("samples")]  # {"samples": 0}: a window no sample fell in
    if not clocks:
        return None
    samples = sum(c["samples"] for c in clocks)
    capped = sum(c["power_capped_share"] * c["samples"] for c in clocks) / samples
    thermal = sum(c["thermal_or_hw_slowdown_share"] * c["samples"] for c in clocks) / samples
    device = device or {}
    ceiling = (f" (board: {device['max_sm_mhz'] / 1e3:.2f} GHz max, {device['power_limit_w']:.0f} W limit)"
               if device.get("max_sm_mhz") and device.get("power_limit_w") else "")
    return (f"{name} | SM clock, mean of each timed row: {min(c['sm_mhz_mean'] for c in clocks) / 1e3:.2f}-"
            f"{max(c['sm_mhz_mean'] for c in clocks) / 1e3:.2f} GHz, lowest sample "
            f"{min(c['sm_mhz_min'] for c in clocks) / 1e3:.2f} GHz{ceiling}; board power (NVML's 1 s average) "
            f"{min(c['power_w_mean'] for c in clocks):.0f}-{max(c['power_w_mean'] for c in clocks):.0f} W; "
            f"the power cap held the clock in {capped:.0%} of {samples} samples, thermal or hardware "
            f"slowdown in {thermal:.0%}")


def table(results, kernels, device=None):
    """device: {"sms", "capability", "max_sm_mhz", "power_limit_w"} (any may be
    missing) for the clock columns."""
    head = ("shape", "case", "impl", "tile dens", "ms", "TF/s kept tiles", "vs cuDNN dense", "vs flex",
            "SM GHz", "tensor % at clock", "max err vs ref (rel)")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for shape in results:
        name = shape["shape"]
        stsa_runs = shape.get("stsa") or {}
        records = [c for run in stsa_runs.values() for c in run.get("cases", [])]
        cudnn = shape.get("dense_ms", {}).get("cudnn")
        fa2 = shape.get("dense_ms", {}).get("fa2")
        if shape.get("skipped"):
            lines.append(f"{name} | skipped: {shape['skipped']} (optional shape)")
            continue
        if not records:
            lines.append(f"{name} | (no stsa results)")
            for impl, ms in (("cuDNN", cudnn), ("FA2", fa2)):
                if ms:
                    dense_flops = 4.0 * shape["tokens"] ** 2 * HEAD_DIM * HEADS
                    lines.append(f"{name} | dense | {impl} | 1.000 | {ms:.2f} | {dense_flops / ms / 1e9:.0f}")
            lines.extend(f"{name} | error: {e}" for e in shape["errors"])
            continue
        dense_checks = shape.get("dense_check", {})
        by_label = {}
        for c in records:
            by_label.setdefault(c["label"], {})[c["kernel"]] = c
        any_record = records[0]
        for label, per_kernel in sorted(by_label.items(), key=lambda kv: next(iter(kv[1].values()))["density"]):
            first = next(iter(per_kernel.values()))
            kept, density = first["kept_tile_flops"], f"{first['tile_density']:.3f}"
            extra = shape["cases"].get(label, {})
            flex_ms = extra.get("flex_ms")
            # Each stsa kernel's rows against the reference implementation: cuDNN for dense, FlexAttention else.
            check = dense_checks.get("cudnn") if label == "dense" else extra.get("flex_check")
            for kernel in kernels:
                c = per_kernel.get(kernel)
                impl = f"stsa-{kernel}"
                if c is None:
                    why = ("skipped: out of time" if kernel in shape.get("kernels_skipped", [])
                           else "failed or not run: see errors")
                    lines.append(f"{name} | {label} | {impl} | {density} | ({why})")
                    continue
                if c.get("kernel_resolved") and c["kernel_resolved"] != kernel:
                    impl += f" ({c['kernel_resolved']})"
                lines.append(" | ".join((name, label, impl, density, fmt(c["ms"], ".2f"),
                                         fmt(c["tflops_kept_tiles"], ".0f"),
                                         times(cudnn, c["ms"]), times(flex_ms, c["ms"]))
                                        + clock_cells(c.get("clock"), kept, c["ms"], device)
                                        + (err_cell(check, kernel),)))
            flex_cells = ((fmt(flex_ms, ".2f"), fmt(ratio(kept, flex_ms * 1e9 if flex_ms else None), ".0f"),
                           times(cudnn, flex_ms), "1.00x" if flex_ms else "-")
                          + clock_cells(extra.get("flex_clock"), kept, flex_ms, device)
                          + ("(ref)" if label != "dense" and flex_ms else "-",))
            if flex_ms:
                lines.append(" | ".join((name, label, "flex", density) + flex_cells))
            else:
                lines.append(f"{name} | {label} | flex | {density} | {extra.get('flex_error', 'not run')[:60]}")
            if label == "dense":
                for impl, ms in (("cuDNN", cudnn), ("FA2", fa2)):
                    if not ms:
                        continue
                    clock = shape.get("dense_clock", {}).get(impl.lower())
                    lines.append(" | ".join((name, label, impl, "1.000", fmt(ms, ".2f"),
                                             fmt(any_record["dense_flops"] / ms / 1e9, ".0f"),
                                             times(cudnn, ms), times(flex_ms, ms))
                                            + clock_cells(clock, any_record["dense_flops"], ms, device)
                                            + ("(ref)" if impl == "cuDNN" else "-",)))
        if cudnn:
            dense_tf = any_record["dense_flops"] / cudnn / 1e9
            lines.append(f"{name} | cuDNN dense {dense_tf:.0f} TFLOP/s"
                         + (f", FA2 dense {any_record['dense_flops'] / fa2 / 1e9:.0f} TFLOP/s" if fa2 else ""))
        perm = next((run["permutation"] for run in stsa_runs.values() if run.get("permutation")), None)
        if perm:
            sparse = next((x for x in records if x["label"] != "dense"), None)
            sparse_ms = sparse.get("ms") if sparse else None  # null or 0 when the case failed
            share = perm["gather_qkv_ms"] / sparse_ms * 100 if sparse_ms else float("nan")
            lines.append(f"{name} | permutation: gather QKV {perm['gather_qkv_ms']:.2f} ms "
                         f"({perm['gather_gbps']:.0f} GB/s), scatter O+LSE {perm['scatter_o_lse_ms']:.2f} ms "
                         f"({perm['scatter_gbps']:.0f} GB/s; a pass only with the fused scatter off), "
                         f"copy {perm['copy_gbps']:.0f} GB/s; the gather is "
                         f"{share:.1f}% of the {sparse['label'] + ' ' + sparse['kernel'] if sparse else '?'} "
                         "attention time (all heads permuted: the worst case)")
        video = per_video(name, records, cudnn, perm)
        if video:
            lines.append(video)
        clocks = clock_line(name, shape, device)
        if clocks:
            lines.append(clocks)
        for e in shape["errors"]:
            lines.append(f"{name} | error: {e}")
    return "\n".join(lines)


# What main() records about the board for the clock columns; --dry-run's made-up one.
DRY_DEVICE = {"name": "made-up", "max_sm_mhz": 1980, "power_limit_w": 700.0, "sms": 132, "capability": [9, 0]}


def dry_clock(mhz):
    return {"samples": 40, "sm_mhz_mean": mhz, "sm_mhz_min": mhz - 30, "power_w_mean": 690.0,
            "temperature_c_max": 70, "power_capped_share": 0.5, "thermal_or_hw_slowdown_share": 0.0}


def dry_results(args):
    """Made-up stsa_gpu_bench output in its real format (one kernel failing every
    case but the first, the next kernel whole), made-up PyTorch timings, and
    made-up clocks on all but the first kernel's rows."""
    results = []
    for name in args.shapes:
        frames, height, width = SHAPES[name]
        n = frames * height * width
        dense_flops = 4.0 * n * n * HEAD_DIM * HEADS
        shape_result = {"shape": name, "tokens": n, "stsa": {}, "cases": {}, "errors": []}
        for i, kernel in enumerate(args.kernels):
            cases, errors = [], []
            for density in args.densities:
                label = "dense" if density >= 1 else f"s{density:.2f}"
                tile_density = min(1.0, density * 1.2 + 0.03)
                if i == 0 and density != args.densities[0]:
                    errors.append({"kernel": kernel, "label": label, "error": "made-up launch failure"})
                    continue
                ms = dense_flops * tile_density / ((400 + 100 * i) * 1e12) * 1e3
                cases.append({"label": label, "kernel": kernel, "kernel_resolved": "sm90" if kernel == "auto" else kernel,
                              "density": density, "band": int(n * density), "tile_density": tile_density,
                              "ms": ms, "kept_tile_flops": dense_flops * tile_density,
                              "tflops_kept_tiles": dense_flops * tile_density / ms / 1e9, "dense_flops": dense_flops,
                              "clock": dry_clock(1500 + 10 * i) if i else None})
            stsa = {"sample_rows": [0, n - 1], "cases": cases, "errors": errors}
            if i == 0:
                stsa["permutation"] = {"gather_qkv_ms": 1.0, "gather_gbps": 3000, "scatter_o_lse_ms": 0.5,
                                       "scatter_gbps": 2900, "copy_gbps": 3900}
            add_stsa_run(shape_result, kernel, "exit status 1" if errors else None, stsa)
        if len(args.kernels) > 2:
            add_stsa_run(shape_result, "extra", "timed out after 15 seconds", None)
        shape_result["dense_ms"] = {"cudnn": dense_flops / 570e12 * 1e3, "fa2": dense_flops / 360e12 * 1e3}
        shape_result["dense_clock"] = {"cudnn": dry_clock(1600), "fa2": None}
        shape_result["dense_check"] = {"cudnn": {"max_err": {k: 1e-5 for k in args.kernels}, "ref_max": 2e-3}}
        shape_result["dense_check"]["cudnn"]["max_err"][args.kernels[-1]] = float("nan")
        for density in args.densities:
            label = "dense" if density >= 1 else f"s{density:.2f}"
            if density == args.densities[-1] and density < 1:
                shape_result["cases"][label] = {"flex_error": "skipped: out of time"}
            else:
                shape_result["cases"][label] = {"flex_ms": dense_flops * min(1.0, density * 1.2 + 0.03) / 410e12 * 1e3,
                                                "flex_clock": dry_clock(1700),
                                                "flex_check": {"max_err": {k: 2e-4 for k in args.kernels},
                                                               "ref_max": 1e-2}}
        results.append(shape_result)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", help="build directory holding stsa_gpu_bench (required unless --dry-run)")
    parser.add_argument("--out", required=True, help="directory for gpu_bench.json and gpu_bench.txt")
    # The two shapes first; 480p (where users see the smallest gains) if time is left.
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=["720p", "1440p", "480p"])
    parser.add_argument("--densities", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.1, 0.2, 0.3, 0.5, 1.0])
    parser.add_argument("--kernels", type=lambda s: [k for k in s.split(",") if k],
                        default=["sm90-pingpong", "sm90-overlap", "sm90", "sm80"],
                        help="stsa attention kernels, one stsa_gpu_bench process and one table row each")
    parser.add_argument("--sample-rows", type=int, default=512)
    parser.add_argument("--deadline-s", type=float, default=420.0)
    parser.add_argument("--scratch", default="/dev/shm/stsa_gpu_bench" if os.path.isdir("/dev/shm") else "/tmp/stsa")
    parser.add_argument("--dry-run", action="store_true", help="format made-up results; no torch, GPU or binary")
    args = parser.parse_args()
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown or not args.kernels or (not args.dry_run and not args.build):
        parser.error(f"unknown shapes {unknown}" if unknown else "--kernels is empty" if not args.kernels
                     else "--build is required")
    clock = Clock(args.deadline_s)
    os.makedirs(args.out, exist_ok=True)
    sampler = None

    def write_atomically(name, write):
        """A kill mid-write (check.sh's hard timeout) leaves the last whole file."""
        path = os.path.join(args.out, name)
        try:
            with open(path + ".tmp", "w") as f:
                write(f)
            os.replace(path + ".tmp", path)
        finally:
            if os.path.exists(path + ".tmp"):
                os.remove(path + ".tmp")

    def write_outputs(results, meta):
        """gpu_bench.json, then the table (gpu_bench.txt): after every step of a
        shape, so a later hang or kill keeps what was already measured. The
        clocks and the table are extras: an error in either is logged and
        recorded, never the end of the run."""
        meta["seconds"] = time.time() - clock.start
        try:
            attach_clocks(results, sampler)
        except Exception as e:
            meta["attach_clocks_error"] = f"{type(e).__name__}: {e}"
            log(f"clock summaries failed: {meta['attach_clocks_error']}")
        if sampler is not None and sampler.error:
            meta["clock_sampler_error"] = f"{sampler.error} ({sampler.failures} failed readings)"
        write_atomically("gpu_bench.json",
                         lambda f: json.dump({"meta": meta, "results": results}, f, indent=1, default=str))
        try:
            text = table(results, args.kernels, meta.get("clocks"))
        except Exception as e:
            text = f"(no table: {type(e).__name__}: {e}; the measurements are in gpu_bench.json)"
            log(text)
        write_atomically("gpu_bench.txt", lambda f: f.write(text + "\n"))
        return text

    if args.dry_run:
        results = dry_results(args)
        meta = {"dry_run": True, "kernels": args.kernels, "clocks": DRY_DEVICE}
    else:
        import torch
        log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, kernels {','.join(args.kernels)}, "
            f"deadline {args.deadline_s:.0f} s")
        results = []
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "kernels": args.kernels}
        sampler, board = gpu_clocks.start_nvml_sampler()
        props = torch.cuda.get_device_properties(0)
        meta["clocks"] = dict(board, sms=props.multi_processor_count, capability=[props.major, props.minor])
        log(f"clock sampler: {'NVML, ' + str(board) if sampler else board['unavailable']}")
        for name in args.shapes:
            if name not in REQUIRED_SHAPES and clock.left() < OPTIONAL_SHAPE_MIN_S:
                results.append({"shape": name, "stsa": {}, "cases": {}, "errors": [], "skipped": "out of time"})
                continue
            if clock.left() < 30:
                results.append({"shape": name, "stsa": {}, "cases": {}, "errors": ["skipped: out of time"]})
                continue
            try:
                bench_shape(name, args, clock, results, lambda: write_outputs(results, meta))
            except Exception as e:
                if not results or results[-1]["shape"] != name:
                    results.append({"shape": name, "stsa": {}, "cases": {}, "errors": []})
                results[-1]["errors"].append(f"{type(e).__name__}: {e}")
                log(f"{name} failed: {e}")
            write_outputs(results, meta)
    if sampler is not None:
        sampler.stop()
    text = write_outputs(results, meta)
    log("\n" + text)
    sys.exit(0 if results_ok(results) else 1)


if __name__ == "__main__":
    main()
