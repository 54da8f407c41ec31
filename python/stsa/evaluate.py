"""One video generated twice by a diffusers pipeline, with the model's own attention and
with stsa, from the same seed: the time each took and how far stsa's video is from the
dense one (PSNR, SSIM). What a user runs on their own GPU and weights before serving with
a policy.

    python -m stsa.evaluate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --policy wan2.1-1.3b-480p \\
        --prompt "a cat surfing" --height 480 --width 832 --frames 81 --out results/

or from Python, on a pipeline already loaded:

    import stsa.evaluate
    result, dense, sparse = stsa.evaluate.evaluate(pipe, "wan2.1-1.3b-480p", prompt="a cat surfing",
                                                   height=480, width=832, num_frames=81)
    print(result.speedup, result.psnr_db, result.ssim)

``--sweep density=0.1,0.2,0.3`` (any one policy setting; ``evaluate_policies`` from Python)
generates the dense video once and stsa's once per value: the speed and the error of each,
side by side.

Needs torch and diffusers (``pip install ".[diffusers]"``), and the pipeline's own
dependencies (transformers for its text encoder).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

from . import Error, Policy, model_preset
from .quality import frame_psnr, psnr, ssim

__all__ = ["Evaluation", "evaluate", "evaluate_policies", "main"]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Dense against stsa on one video."""

    dense_s: float                # the pipeline with the model's own attention, seconds
    stsa_s: float                 # the same with stsa.diffusers
    psnr_db: float                # stsa's video against the dense one, the whole video
    worst_frame_psnr_db: float
    ssim: float
    frames: int
    summary: dict[str, Any]       # stsa.diffusers' summary(): calls, head-calls per route, stsa's ms

    @property
    def speedup(self) -> float:
        return self.dense_s / self.stsa_s


def evaluate(pipe, policy: str | Policy, *, seed: int = 0, warmup: bool = True, timed: bool = False,
             **call) -> tuple[Evaluation, np.ndarray, np.ndarray]:
    """Generates with ``pipe(**call)`` (prompt, size, frames, steps, guidance: the pipeline's
    own arguments) twice from ``seed``, dense then through ``policy``; returns the
    evaluation and both videos ([F, H, W, C] in [0, 1]). ``warmup``: a 2-step generation of
    each first, so neither time holds one-time work (kernel selection, stsa's plans).
    ``timed``: stsa's per-call times in the summary (a GPU call then waits for its work)."""
    (result,), dense, (ours,) = evaluate_policies(pipe, [policy], seed=seed, warmup=warmup, timed=timed, **call)
    return result, dense, ours


def evaluate_policies(pipe, policies: Sequence[str | Policy], *, seed: int = 0, warmup: bool = True,
                      timed: bool = False, **call) -> tuple[list[Evaluation], np.ndarray, list[np.ndarray]]:
    """As ``evaluate``, the dense video generated once and stsa's once per policy: an
    evaluation and a video per policy, in their order."""
    import torch

    from . import diffusers as stsa_diffusers

    # Preset names or stsa.Policy objects, checked as enable() does, before anything runs.
    checked: list[Policy] = [stsa_diffusers._policy(policy) for policy in policies]

    def generate(steps=None):
        generator = torch.Generator("cpu").manual_seed(seed)  # the same noise for both, whatever the device
        arguments = {**call, "generator": generator, "output_type": "np"}
        if steps is not None:
            arguments["num_inference_steps"] = steps
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            frames = _first_video(pipe(**arguments))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return np.asarray(frames, dtype=np.float32), time.perf_counter() - start

    if warmup:
        generate(steps=2)
        for policy in checked:  # sparse from the first step, so each one's plans are built before its timed run
            with stsa_diffusers.enable(pipe, Policy(**{**policy.settings, "dense_steps": 0})):
                generate(steps=2)
    dense, dense_s = generate()
    results, videos = [], []
    for policy in checked:
        with stsa_diffusers.enable(pipe, policy, timed=timed) as sparse:
            ours, stsa_s = generate()
        results.append(Evaluation(dense_s=dense_s, stsa_s=stsa_s, psnr_db=psnr(dense, ours),
                                  worst_frame_psnr_db=min(frame_psnr(dense, ours)), ssim=ssim(dense, ours),
                                  frames=int(dense.shape[0]), summary=sparse.summary()))
        videos.append(ours)
    return results, dense, videos


def _first_video(output):
    """The first video of a pipeline's output: ``frames[0]`` (Wan, HunyuanVideo and most), or
    ``video``, one video already (Cosmos 3's)."""
    frames = getattr(output, "frames", None)
    if frames is not None:
        return frames[0]
    video = getattr(output, "video", None)
    if video is None:
        raise Error(f"the pipeline returned a {type(output).__name__} with neither frames nor video")
    return video


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, as the stsa CLI
        raise _Refused(message)


class _Refused(Exception):
    pass


def _arguments(argv) -> argparse.Namespace:
    parser = _Parser(prog="python -m stsa.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a diffusers pipeline: a Hub id or a local folder")
    parser.add_argument("--policy", required=True, help="a stsa preset name (stsa.model_presets())")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a policy setting changed from the preset's, e.g. dense_steps=8, density=0.3 "
                             "(stsa.Policy's arguments; repeat for more; density is every mask kind's "
                             "but for a kind whose own density is set)")
    parser.add_argument("--sweep", default=None, metavar="NAME=V1,V2,...",
                        help="one policy setting at several values, e.g. density=0.1,0.2,0.3: the dense video "
                             "once, stsa's once per value (after the --set changes)")
    parser.add_argument("--prompt", action="append", default=[],
                        help="a prompt (repeat for more: each is generated both ways, then the means)")
    parser.add_argument("--negative-prompt", default=None)
    parser.add_argument("--image", default=None, metavar="PATH_OR_URL",
                        help="the image an image-to-video pipeline starts from (Wan I2V, LTX-2's, ChronoEdit's "
                             "edit): a file or an http(s) URL, passed as the pipeline's `image`")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the preset's)")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-warmup", action="store_true", help="time the first generation of each")
    parser.add_argument("--out", default=None, help="a folder for evaluation.json (and, with --save-videos, both "
                                                    "videos); never overwrites a file")
    parser.add_argument("--save-videos", action="store_true")
    args = parser.parse_args(argv)
    for name in ("height", "width", "frames", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    if not math.isfinite(args.guidance):  # NaN: diffusers' `guidance_scale > 1` is False, guidance silently off
        parser.error(f"--guidance must be a finite number, got {args.guidance}")
    if args.save_videos and args.out is None:
        parser.error("--save-videos needs --out")
    if args.image is not None and not args.image.startswith(("http://", "https://")) and not os.path.isfile(args.image):
        parser.error(f"--image {args.image}: no such file")
    return args


def _check_device(device: str) -> None:
    """A device torch knows, and one this machine has, checked before the model loads (its
    `.to(device)` raised a RuntimeError traceback after loading it)."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as error:
        raise _Refused(f"--device {device}: {str(error).splitlines()[0]}") from error
    available = getattr(getattr(torch, kind, None), "is_available", None)  # torch.cuda.is_available, ...
    if kind != "cpu" and available is not None and not available():
        raise _Refused(f"--device {device}: this machine has no {kind} device")


def _changes(args, preset: dict[str, Any]) -> dict[str, Any]:
    """The --set changes, by name."""
    changes = {}
    for change in args.set:
        name, text = _change(change, "--set", preset)
        changes[name] = _setting_value(change, text)
    return changes


def _change(change: str, option: str, settings) -> tuple[str, str]:
    name, _, text = change.partition("=")
    if name not in settings or not text:
        raise _Refused(f"{option} {change}: expected NAME=VALUE with NAME one of {', '.join(settings)}")
    return name, text


def _policies(args) -> tuple[str | None, list[Any], list[Policy]]:
    """(the swept setting's name or None, its values, a policy for each: the preset's with the
    --set changes and the value; one policy without --sweep). Values out of range:
    stsa.InvalidArgument, naming them."""
    preset = Policy.from_preset(args.policy).settings
    changes = _changes(args, preset)
    if args.sweep is None:
        return None, [None], [Policy(**{**preset, **changes})]
    name, texts = _change(args.sweep, "--sweep", preset)
    values = [_setting_value(args.sweep, text) for text in texts.split(",")]
    if any(a == b for i, a in enumerate(values) for b in values[:i]):  # 1 and 1.0 too: one mean each
        raise _Refused(f"--sweep {args.sweep}: a value is repeated")
    return name, values, [Policy(**{**preset, **changes, name: value}) for value in values]


def _refuse_dense_throughout(policies: Sequence[Policy], steps: int, swept: str | None, values: list[Any]) -> None:
    """A policy whose warm-up covers every step would time dense against dense."""
    for policy, value in zip(policies, values):
        dense_steps = policy.settings["dense_steps"]
        if dense_steps >= steps:
            which = f" (--sweep {swept}={value})" if swept else ""
            raise _Refused(f"the policy{which} runs all {steps} steps dense (dense_steps={dense_steps}): nothing "
                           f"to compare; give --set dense_steps=K with K < {steps}")


def _setting_value(change: str, text: str):
    constants = {"True": True, "False": False, "None": None}
    if text in constants:
        return constants[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise _Refused(f"--set {change}: {text!r} is not a number, True, False or None")


def _load(args):
    import diffusers
    import torch

    _check_device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    return diffusers.DiffusionPipeline.from_pretrained(args.model, torch_dtype=dtype).to(args.device)


def _image(source: str):
    """The pipeline's `image`: diffusers' loader (a file or a URL; RGB)."""
    from diffusers.utils import load_image

    image = load_image(source)
    image.load()  # decoded now: a file that is no image fails here (OSError), not mid-generation
    return image


def _outputs(folder: str, names: Sequence[str]) -> dict[str, str]:
    """The files to write in ``folder`` (made if missing); refused if any exists already."""
    os.makedirs(folder, exist_ok=True)
    paths = {name: os.path.join(folder, name) for name in names}
    taken = [path for path in paths.values() if os.path.exists(path)]
    if taken:
        raise _Refused(f"{taken[0]} exists: stsa.evaluate never overwrites a file (choose another --out)")
    return paths


def _save_video(frames: np.ndarray, paths: dict[str, str], name: str) -> str:
    """An MP4 where diffusers can write one (imageio or OpenCV installed), else the frames (.npy)."""
    try:
        from diffusers.utils import export_to_video

        export_to_video(list(frames), paths[f"{name}.mp4"], fps=16)
        return paths[f"{name}.mp4"]
    except Exception:  # noqa: BLE001 (no video writer: keep the frames as an array)
        np.save(paths[f"{name}.npy"], frames)
        return paths[f"{name}.npy"]


def _json_value(value):
    """JSON has no infinity: a PSNR of two equal videos is written as the string "inf"."""
    if isinstance(value, float) and np.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    return value


_DEFAULT_PROMPT = "A cat walks on the grass, realistic style."


def main(argv: Sequence[str] | None = None, load=_load) -> int:
    """The command line; ``load`` (args -> pipeline) is for tests."""
    try:
        args = _arguments(argv)
        steps = args.steps or model_preset(args.policy)["steps"]  # an unknown preset is refused before loading
        swept, values, policies = _policies(args)
        _refuse_dense_throughout(policies, steps, swept, values)
        prompts = args.prompt or [_DEFAULT_PROMPT]
        videos = [f"{name}.{kind}" for i in range(len(prompts))
                  for name in [f"dense_{i}"] + [_video_name(i, j, swept) for j in range(len(values))]
                  for kind in ("mp4", "npy")]
        paths = _outputs(args.out, ["evaluation.json"] + (videos if args.save_videos else [])) if args.out else {}
        image = _image(args.image) if args.image is not None else None  # a bad image is refused before the model loads
        pipe = load(args)
        call = {"height": args.height, "width": args.width, "num_frames": args.frames, "num_inference_steps": steps,
                "guidance_scale": args.guidance}
        if args.negative_prompt is not None:
            call["negative_prompt"] = args.negative_prompt
        if image is not None:
            call["image"] = image
        width = max(12, len(swept or ""))  # the swept setting's column
        column = f"{swept:>{width}} " if swept else ""
        print(f"{'prompt':>6} {column}{'frames':>6} {'dense s':>9} {'stsa s':>9} {'speedup':>8} {'PSNR dB':>8} "
              f"{'worst frame':>11} {'SSIM':>6}  routes")
        results = []
        for i, prompt in enumerate(prompts):  # the warm-up once, before the first
            evaluations, dense, ours = evaluate_policies(pipe, policies, seed=args.seed,
                                                         warmup=not args.no_warmup and i == 0, prompt=prompt, **call)
            dense_video = _save_video(dense, paths, f"dense_{i}") if args.save_videos else None
            for j, (value, result) in enumerate(zip(values, evaluations)):
                print(_row(str(i), result, value if swept else _NO_COLUMN, width), flush=True)
                entry = {"prompt": prompt, **({swept: value} if swept else {}), **dataclasses.asdict(result),
                         "speedup": result.speedup}
                if args.save_videos:
                    entry["videos"] = [dense_video, _save_video(ours[j], paths, _video_name(i, j, swept))]
                results.append(entry)
    except (_Refused, Error, ImportError, OSError, ValueError, TypeError) as error:
        print(f"stsa.evaluate: {error}", file=sys.stderr)
        return 2
    means = [_mean([r for r in results if not swept or r[swept] == value]) for value in values]
    if len(prompts) > 1:
        for value, mean in zip(values, means):
            print(f"{'all':>6} {f'{value!s:>{width}} ' if swept else ''}{'':>6} {mean['dense_s']:>9.2f} "
                  f"{mean['stsa_s']:>9.2f} {mean['speedup']:>7.2f}x {mean['psnr_db']:>8.2f} "
                  f"{mean['worst_frame_psnr_db']:>11.2f} {mean['ssim']:>6.4f}")
    if paths:
        record = {"model": args.model, "policy": args.policy, "settings": policies[0].settings,
                  "call": {**call, **({"image": args.image} if image is not None else {})}, "seed": args.seed,
                  "prompts": results}
        if swept:  # the settings without the swept one, which each run and mean names
            record["settings"].pop(swept)
            record.update(sweep=swept, means=[{swept: value, **mean} for value, mean in zip(values, means)])
        else:
            record["all"] = means[0]
        with open(paths["evaluation.json"], "x") as f:
            json.dump(_json_value(record), f, indent=1, default=str)
    return 0


_NO_COLUMN = object()


def _video_name(prompt: int, run: int, swept: str | None) -> str:
    return f"stsa_{prompt}_{run}" if swept else f"stsa_{prompt}"


def _row(label: str, result: Evaluation, value=_NO_COLUMN, width: int = 12) -> str:
    routes = result.summary["head_routes"]
    head_calls = max(sum(routes.values()), 1)
    column = "" if value is _NO_COLUMN else f"{value!s:>{width}} "
    return (f"{label:>6} {column}{result.frames:>6} {result.dense_s:>9.2f} {result.stsa_s:>9.2f} "
            f"{result.speedup:>7.2f}x {result.psnr_db:>8.2f} {result.worst_frame_psnr_db:>11.2f} {result.ssim:>6.4f}  "
            + ", ".join(f"{route} {count / head_calls:.0%}" for route, count in sorted(routes.items())))


def _mean(results: list[dict]) -> dict[str, float]:
    """Over the prompts: the total times and their ratio, the mean PSNR and SSIM, the worst frame."""
    dense_s, stsa_s = sum(r["dense_s"] for r in results), sum(r["stsa_s"] for r in results)
    return {"dense_s": dense_s, "stsa_s": stsa_s, "speedup": dense_s / stsa_s,
            "psnr_db": float(np.mean([r["psnr_db"] for r in results])),
            "worst_frame_psnr_db": min(r["worst_frame_psnr_db"] for r in results),
            "ssim": float(np.mean([r["ssim"] for r in results]))}


if __name__ == "__main__":
    sys.exit(main())
