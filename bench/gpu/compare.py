#!/usr/bin/env python3
"""stsa's CUDA backend against PyTorch on one GPU, at Wan2.1 shapes.

Run by bench/gpu/check.sh. For each shape (21 frames; 720p = 45x80 and 1440p =
90x160 tokens per frame; 12 heads; D = 128; bf16) it

  1. draws Q, K, V with torch ([B, N, H, D], the layout stsa takes) and writes
     them as raw bf16 to a RAM disk;
  2. runs build-gpu/stsa_gpu_bench on those inputs: stsa sparse at each kept
     density and stsa dense, timed with CUDA events; it also exports every
     plan's full and partial tile lists and sampled output rows;
  3. times PyTorch's cuDNN and FlashAttention-2 SDPA (dense) and FlexAttention
     with a BlockMask built from the *same* plan (full tiles without mask_mod,
     partial tiles with a mask_mod that evaluates the mask predicate), and
     compares FlexAttention's output (cuDNN's for dense) with stsa's rows;
  4. prints one table and writes JSON under --out.

Every case is time-boxed; cases that would pass the deadline are reported as
skipped rather than run.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

SHAPES = {"720p": (21, 45, 80), "1440p": (21, 90, 160)}
HEADS, HEAD_DIM, TILE = 12, 128, 128


def log(*args):
    print(*args, flush=True)


class Clock:
    def __init__(self, deadline_s):
        self.start = time.time()
        self.deadline = self.start + deadline_s

    def left(self):
        return self.deadline - time.time()


def time_cuda(fn, repeats, budget_s):
    """Median ms of `fn` over up to `repeats` runs after one warm-up, CUDA events."""
    fn()
    torch.cuda.synchronize()
    times, spent = [], 0.0
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        spent += times[-1]
        if spent > budget_s * 1e3:
            break
    times.sort()
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def load_plan(record, n_tokens):
    """(partial_num, partial_idx, full_num, full_idx) as [1, 1, Qb(, Kb)] int32 CUDA tensors."""
    meta = record["plan"]
    raw = np.fromfile(meta["file"], dtype=np.int32)
    sec = {s["name"]: raw[s["offset"] // 4: s["offset"] // 4 + s["count"]] for s in meta["sections"]}
    q_blocks = len(sec["full_offsets"]) - 1
    k_blocks = (n_tokens + TILE - 1) // TILE

    def padded(offsets, tiles):
        counts = np.diff(offsets).astype(np.int32)
        idx = np.zeros((q_blocks, k_blocks), dtype=np.int32)
        rows = np.repeat(np.arange(q_blocks), counts)
        cols = np.arange(len(tiles)) - np.repeat(offsets[:-1], counts)
        idx[rows, cols] = tiles
        return (torch.from_numpy(counts)[None, None].cuda(), torch.from_numpy(idx)[None, None].cuda())

    partial = padded(sec["partial_offsets"], sec["partial_tiles"])
    full = padded(sec["full_offsets"], sec["full_tiles"])
    return partial + full


def bench_shape(name, args, clock, results):
    frames, height, width = SHAPES[name]
    n = frames * height * width
    per_frame = height * width
    work = os.path.join(args.scratch, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shape_result = {"shape": name, "tokens": n, "cases": {}, "errors": []}
    results.append(shape_result)
    log(f"--- {name}: {frames}x{height}x{width} = {n} tokens, {HEADS} heads, D={HEAD_DIM}, bf16")

    torch.manual_seed(0)
    qkv = [torch.randn(1, n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for tensor, label in zip(qkv, "qkv"):
        tensor.view(torch.int16).cpu().numpy().tofile(os.path.join(work, f"{label}.bin"))

    # stsa: sparse densities and dense, in its own process (it reads the same bytes).
    densities = ",".join(str(d) for d in args.densities)
    budget = "4" if name == "1440p" else "3"
    cmd = [os.path.join(args.build, "stsa_gpu_bench"), "--frames", str(frames), "--height", str(height),
           "--width", str(width), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--densities", densities,
           "--inputs", work, "--export", work, "--sample-rows", str(args.sample_rows), "--repeats", "5",
           "--budget-s", budget, "--json", os.path.join(work, "stsa.json")]
    log("$ " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True, timeout=max(10.0, clock.left()))
    except (subprocess.SubprocessError, OSError) as e:
        shape_result["errors"].append(f"stsa_gpu_bench: {e}")
        log(f"stsa_gpu_bench failed: {e}")
        return
    stsa = json.load(open(os.path.join(work, "stsa.json")))
    shape_result["stsa"] = stsa
    rows = torch.tensor(stsa["sample_rows"], device="cuda", dtype=torch.long)

    def stsa_rows(record):
        data = np.fromfile(record["sample_file"], dtype=np.float32)
        return torch.from_numpy(data.reshape(len(stsa["sample_rows"]), HEADS, HEAD_DIM)).cuda()

    def max_err(out_bhnd, record):
        got = out_bhnd[0].index_select(1, rows).permute(1, 0, 2).float()  # [rows, H, D]
        return float((got - stsa_rows(record)).abs().max())

    # PyTorch takes [B, H, N, D].
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv)
    del qkv
    dense_ms = {}
    dense_record = next((c for c in stsa["cases"] if c["label"] == "dense"), None)
    reps = 3 if name == "1440p" else 5
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        if clock.left() < (15 if name == "1440p" else 5):
            shape_result["errors"].append(f"{label} dense skipped: out of time")
            continue
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
                dense_ms[label] = time_cuda(fn, reps, budget_s=6)
                if dense_record is not None and "sample_file" in dense_record:
                    shape_result.setdefault("dense_max_err", {})[label] = max_err(fn(), dense_record)
            log(f"  {label} dense: {dense_ms[label]:.2f} ms")
        except Exception as e:  # a missing backend must not stop the rest
            shape_result["errors"].append(f"{label}: {e}")
            log(f"  {label} failed: {e}")
    shape_result["dense_ms"] = dense_ms

    # FlexAttention on the identical plan. The mask_mod is the spatial band with
    # the symmetric frame-0 anchor (no text tokens at these shapes): exactly the
    # predicate stsa's partial-tile bitmasks were derived from. The band is a
    # captured tensor so one compiled kernel serves every density.
    band = torch.zeros((), dtype=torch.int64, device="cuda")

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx < per_frame) | (kv_idx < per_frame) | ((q_idx - kv_idx).abs() <= band)

    flex = torch.compile(flex_attention, dynamic=False)
    order = sorted(stsa["cases"], key=lambda c: c["density"])  # dense (the slowest) last
    for record in order:
        label = record["label"]
        case = shape_result["cases"].setdefault(label, {})
        if clock.left() < (20 if name == "1440p" else 8):
            case["flex_error"] = "skipped: out of time"
            continue
        try:
            band.fill_(max(record["band"], -1) if record["label"] != "dense" else n)
            block_mask = BlockMask.from_kv_blocks(*load_plan(record, n), BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                                  seq_lengths=(n, n))
            t0 = time.time()
            fn = lambda: flex(q, k, v, block_mask=block_mask)  # noqa: E731
            case["flex_ms"] = time_cuda(fn, reps, budget_s=6)
            case["flex_max_err"] = max_err(fn(), record) if "sample_file" in record else None
            log(f"  flex {label}: {case['flex_ms']:.2f} ms (incl. compile {time.time() - t0:.0f} s wall), "
                f"max |flex - stsa| = {case['flex_max_err']}")
        except Exception as e:
            case["flex_error"] = str(e)[:300]
            log(f"  flex {label} failed: {e}")
    del q, k, v
    torch.cuda.empty_cache()


def table(results):
    head = ("shape", "case", "tile dens", "stsa ms", "stsa TF/s", "flex ms", "flex TF/s", "cuDNN ms", "FA2 ms",
            "vs cuDNN", "vs flex", "max err")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for shape in results:
        stsa = shape.get("stsa")
        if not stsa:
            lines.append(f"{shape['shape']} | (no stsa results: {'; '.join(shape['errors'])})")
            continue
        cudnn = shape.get("dense_ms", {}).get("cudnn")
        fa2 = shape.get("dense_ms", {}).get("fa2")
        for c in stsa["cases"]:
            extra = shape["cases"].get(c["label"], {})
            flex_ms = extra.get("flex_ms")
            kept = c["kept_tile_flops"]
            err = extra.get("flex_max_err")
            if c["label"] == "dense" and shape.get("dense_max_err", {}).get("cudnn") is not None:
                err = shape["dense_max_err"]["cudnn"]
            cells = (shape["shape"], c["label"], f"{c['tile_density']:.3f}", f"{c['ms']:.2f}",
                     f"{c['tflops_kept_tiles']:.0f}",
                     f"{flex_ms:.2f}" if flex_ms else extra.get("flex_error", "-")[:20],
                     f"{kept / flex_ms / 1e9:.0f}" if flex_ms else "-",
                     f"{cudnn:.2f}" if cudnn else "-", f"{fa2:.2f}" if fa2 else "-",
                     f"{cudnn / c['ms']:.2f}x" if cudnn else "-",
                     f"{flex_ms / c['ms']:.2f}x" if flex_ms else "-",
                     f"{err:.2e}" if err is not None else "-")
            lines.append(" | ".join(cells))
        if cudnn:
            dense_tf = c["dense_flops"] / cudnn / 1e9
            lines.append(f"{shape['shape']} | cuDNN dense {dense_tf:.0f} TFLOP/s"
                         + (f", FA2 dense {c['dense_flops'] / fa2 / 1e9:.0f} TFLOP/s" if fa2 else ""))
        perm = stsa.get("permutation")
        if perm:
            sparse = next((x for x in stsa["cases"] if x["label"] != "dense"), None)
            share = (perm["gather_qkv_ms"] + perm["scatter_o_lse_ms"]) / sparse["ms"] * 100 if sparse else float("nan")
            lines.append(f"{shape['shape']} | permutation: gather QKV {perm['gather_qkv_ms']:.2f} ms "
                         f"({perm['gather_gbps']:.0f} GB/s), scatter O+LSE {perm['scatter_o_lse_ms']:.2f} ms "
                         f"({perm['scatter_gbps']:.0f} GB/s), copy {perm['copy_gbps']:.0f} GB/s; "
                         f"{share:.1f}% of the {sparse['label'] if sparse else '?'} attention time "
                         "(all heads permuted: the worst case)")
        for e in shape["errors"]:
            lines.append(f"{shape['shape']} | error: {e}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True, help="build directory holding stsa_gpu_bench")
    parser.add_argument("--out", required=True, help="directory for gpu_bench.json and gpu_bench.txt")
    parser.add_argument("--shapes", default="720p,1440p")
    parser.add_argument("--densities", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.1, 0.2, 0.3, 0.5, 1.0])
    parser.add_argument("--sample-rows", type=int, default=512)
    parser.add_argument("--deadline-s", type=float, default=420.0)
    parser.add_argument("--scratch", default="/dev/shm/stsa_gpu_bench" if os.path.isdir("/dev/shm") else "/tmp/stsa")
    args = parser.parse_args()
    clock = Clock(args.deadline_s)
    os.makedirs(args.out, exist_ok=True)
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, deadline {args.deadline_s:.0f} s")
    results = []
    for name in args.shapes.split(","):
        if clock.left() < 30:
            results.append({"shape": name, "cases": {}, "errors": ["skipped: out of time"]})
            continue
        try:
            bench_shape(name, args, clock, results)
        except Exception as e:
            results[-1]["errors"].append(f"{type(e).__name__}: {e}")
            log(f"{name} failed: {e}")
    text = table(results)
    log("\n" + text)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "seconds": time.time() - clock.start}
    with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    with open(os.path.join(args.out, "gpu_bench.txt"), "w") as f:
        f.write(text + "\n")
    shutil.rmtree(args.scratch, ignore_errors=True)
    ok = all(r.get("stsa") and not r["errors"] for r in results)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
