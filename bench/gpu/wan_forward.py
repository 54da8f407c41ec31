#!/usr/bin/env python3
"""One whole Wan2.1 transformer forward (diffusers' WanTransformer3DModel, randomly
initialised at a preset's shape, bf16) with its own attention and with stsa.diffusers,
and what that makes of one video: the end-to-end figure the attention-only table
(compare.py) extrapolates to.

Five timings per preset, each the median of --repeats forwards after one warm-up:
  own      diffusers' processor (PyTorch SDPA: cuDNN or FlashAttention on an H100/H200);
  dense    stsa in the policy's dense warm-up (every head dense);
  routed   stsa at a sparse step that routes every head (the conditional pass);
  reused   stsa at the same step again (the unconditional pass: decisions reused);
  reused untimed  the same, enabled with timed=False: no layer waits for the device.
One video = the preset's steps x 2 passes (classifier-free guidance): its dense_steps
as "dense", then per step one "routed" and one "reused" forward (reuse_steps = 1).
Random weights make random attention, which no mask approximates: the router would keep
every head dense (its max_rel_l2 gate), so the routed timings lift that gate (--max-rel-l2,
default 1e9) and time the masks the router picks. The output's distance from the model's
own is printed, but says nothing about a trained model's quality.

Usage: PYTHONPATH=build-gpu/python python3 bench/gpu/wan_forward.py [--presets wan2.1-1.3b-480p,...]
       [--repeats 3] [--out DIR]; --tiny runs a 2-layer model on a small grid (any device: a check
       of this script, not a measurement). Needs torch and diffusers (check.sh: build-gpu-diffusers/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import stsa
import stsa.diffusers

# Model widths the presets do not hold (the released configs): hidden size, FFN size.
WIDTHS = {12: (1536, 8960), 40: (5120, 13824)}  # by heads: Wan2.1-T2V-1.3B, -14B
TEXT_TOKENS, TEXT_DIM, LATENT_CHANNELS = 512, 4096, 16


def build(heads: int, head_dim: int, layers: int, ffn: int, device, dtype):
    import diffusers

    torch.manual_seed(0)
    with torch.device(device):
        model = diffusers.WanTransformer3DModel(num_attention_heads=heads, attention_head_dim=head_dim,
                                                ffn_dim=ffn, num_layers=layers, in_channels=LATENT_CHANNELS,
                                                out_channels=LATENT_CHANNELS)
    model.to(dtype)
    for name, parameter in model.named_parameters():  # as from_pretrained(torch_dtype=...) leaves them
        if any(keep in name.split(".") for keep in model._keep_in_fp32_modules):
            parameter.data = parameter.data.float()
    return model.eval()


def clock(device):
    """ms of fn(), measured with CUDA events on a GPU, else the host's clock."""
    def measure(fn):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3
    return measure


def median_ms(measure, fn, repeats: int, before=lambda: None) -> float:
    times = []
    for i in range(repeats + 1):  # the first is the warm-up
        before()
        ms = measure(fn)
        if i:
            times.append(ms)
    return statistics.median(times)


def run_preset(name: str, args, device, dtype) -> dict:
    preset = stsa.model_preset(name)
    grid, heads, head_dim, layers = preset["grid"], preset["heads"], preset["head_dim"], preset["layers"]
    if args.tiny:
        grid, layers, hidden_ffn = stsa.VideoGrid(5, 4, 6), 2, (heads * head_dim, 64)
    else:
        hidden_ffn = WIDTHS[heads]
    model = build(heads, head_dim, layers, hidden_ffn[1], device, dtype)
    generator = torch.Generator(device).manual_seed(1)
    latents = torch.randn(1, LATENT_CHANNELS, grid.frames, grid.height * 2, grid.width * 2, device=device,
                          dtype=dtype, generator=generator)
    text = torch.randn(1, TEXT_TOKENS, TEXT_DIM, device=device, dtype=dtype, generator=generator)
    inputs = {"hidden_states": latents, "encoder_hidden_states": text,
              "timestep": torch.tensor([999], device=device)}
    measure = clock(device)
    outputs = {}

    def forward(key):
        def call():
            with torch.inference_mode():
                outputs[key] = model(**inputs).sample
        return call

    row = {"preset": name, "grid": [grid.frames, grid.height, grid.width], "tokens": grid.tokens, "layers": layers,
           "heads": heads, "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."), "device": str(device)}
    row["own_ms"] = median_ms(measure, forward("own"), args.repeats)
    policy = {**preset["policy"], "max_rel_l2": args.max_rel_l2}
    with stsa.diffusers.enable(model, stsa.Policy(**{**policy, "dense_steps": 1})) as sparse:
        row["dense_ms"] = median_ms(measure, forward("dense"), args.repeats, sparse.reset)
    with stsa.diffusers.enable(model, stsa.Policy(**{**policy, "dense_steps": 0})) as sparse:
        row["routed_ms"] = median_ms(measure, forward("routed"), args.repeats, sparse.reset)  # a new generation each
        row["reused_ms"] = median_ms(measure, forward("reused"), args.repeats)
        summary = sparse.summary()
    with stsa.diffusers.enable(model, stsa.Policy(**{**policy, "dense_steps": 0}), timed=False):
        row["reused_untimed_ms"] = median_ms(measure, forward("reused_untimed"), args.repeats)  # warm-up routes
    calls = max(summary["calls"], 1)
    row["head_routes"] = summary["head_routes"]
    row["stsa_attention_ms_per_forward"] = summary["attention_ms"] / calls * layers
    own = outputs["own"].double()
    for key in ("dense", "routed"):
        row[f"{key}_rel_l2_vs_own"] = float(torch.linalg.vector_norm(outputs[key].double() - own)
                                            / torch.linalg.vector_norm(own))
    steps, warm = preset["steps"], policy["dense_steps"]
    row["video_own_s"] = steps * 2 * row["own_ms"] / 1e3
    row["video_stsa_s"] = (warm * 2 * row["dense_ms"] + (steps - warm) * (row["routed_ms"] + row["reused_ms"])) / 1e3
    row["video_speedup"] = row["video_own_s"] / row["video_stsa_s"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="wan2.1-1.3b-480p")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-rel-l2", type=float, default=1e9)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if args.repeats < 1:
        print("wan_forward.py: --repeats must be at least 1", file=sys.stderr)
        return 2
    # Checked before the first model is built (each was a traceback after the presets before it ran).
    if not os.path.isdir(args.out):
        print(f"wan_forward.py: --out {args.out}: no such folder", file=sys.stderr)
        return 2
    for name in args.presets.split(","):
        try:
            heads = stsa.model_preset(name)["heads"]
        except stsa.Error as error:
            print(f"wan_forward.py: {error}", file=sys.stderr)
            return 2
        if not args.tiny and heads not in WIDTHS:
            print(f"wan_forward.py: {name}: no released Wan widths for {heads} heads (known: "
                  f"{', '.join(map(str, WIDTHS))}); --tiny runs any preset's heads", file=sys.stderr)
            return 2
    import diffusers

    diffusers.utils.logging.set_verbosity_error()  # the bf16 cast warning: build() keeps those modules fp32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    print(f"{'preset':<18} {'tokens':>7} {'own ms':>9} {'dense':>9} {'routed':>9} {'reused':>9} {'untimed':>9} "
          f"{'video own s':>12} {'stsa s':>9} {'speedup':>8}  routes")
    for name in args.presets.split(","):
        row = run_preset(name, args, device, dtype)
        rows.append(row)
        print(f"{name:<18} {row['tokens']:>7} {row['own_ms']:>9.1f} {row['dense_ms']:>9.1f} {row['routed_ms']:>9.1f} "
              f"{row['reused_ms']:>9.1f} {row['reused_untimed_ms']:>9.1f} {row['video_own_s']:>12.1f} "
              f"{row['video_stsa_s']:>9.1f} "
              f"{row['video_speedup']:>7.2f}x  {row['head_routes']}", flush=True)
        with open(os.path.join(args.out, "wan_forward.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
