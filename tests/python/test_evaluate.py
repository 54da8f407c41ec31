"""stsa.evaluate: dense against stsa on one generated video. The command line's refusals
run everywhere (before anything is loaded); the generations need torch, diffusers and
transformers (a diffusers WanPipeline around a tiny random transformer)."""

import json
import os
import types

import numpy as np
import pytest

import stsa
import stsa.evaluate

ALL_SPARSE = {"max_rel_l2": 1e9}  # no head kept dense for its error: every routed head sparse


def never_loaded(args):
    raise AssertionError("the pipeline was loaded for a command line that should have been refused")


@pytest.mark.parametrize("argv,message", [
    (["--policy", "wan2.1-480p"], "--model"),
    (["--model", "m", "--policy", "sora"], "unknown model preset 'sora'"),
    (["--model", "m", "--policy", "wan2.1-480p", "--height", "0"], "--height must be at least 1"),
    (["--model", "m", "--policy", "wan2.1-480p", "--steps", "-2"], "--steps must be at least 1"),
    (["--model", "m", "--policy", "wan2.1-480p", "--save-videos"], "--save-videos needs --out"),
    (["--model", "m", "--policy", "wan2.1-480p", "--dtype", "fp64"], "invalid choice"),
    (["--model", "m", "--policy", "wan2.1-480p", "--set", "speed=2"], "NAME one of dense_steps"),
    (["--model", "m", "--policy", "wan2.1-480p", "--set", "density=high"], "'high' is not a number"),
    (["--model", "m", "--policy", "wan2.1-480p", "--set", "dense_steps=-1"], "dense_steps must be an integer in [0"),
    (["--model", "m", "--policy", "wan2.1-480p", "--image", "/nonexistent/first.png"], "no such file"),
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "speed=1,2"], "--sweep speed=1,2: expected NAME=VALUE"),
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "density="], "expected NAME=VALUE"),
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "density=0.1,,0.3"], "'' is not a number"),
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "density=0.1,0.1"], "a value is repeated"),
    # Equal values written differently (each mean took in both runs).
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "density=1,1.0"], "a value is repeated"),
    # NaN guidance: diffusers' `guidance_scale > 1` is False, so guidance went silently off.
    (["--model", "m", "--policy", "wan2.1-480p", "--guidance", "nan"], "--guidance must be a finite number"),
    (["--model", "m", "--policy", "wan2.1-480p", "--sweep", "dense_steps=4,-1"],
     "dense_steps must be an integer in [0"),
    # A warm-up as long as the run times dense against dense.
    (["--model", "m", "--policy", "wan2.1-480p", "--steps", "12"], "runs all 12 steps dense (dense_steps=12)"),
    (["--model", "m", "--policy", "anyflow-14b-480p", "--set", "dense_steps=4"], "runs all 4 steps dense"),
    (["--model", "m", "--policy", "wan2.1-480p", "--steps", "8", "--sweep", "dense_steps=2,8"],
     "the policy (--sweep dense_steps=8) runs all 8 steps dense"),
])
def test_bad_command_lines_exit_2_with_one_line(argv, message, capsys):
    assert stsa.evaluate.main(argv, load=never_loaded) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stsa.evaluate: ") and message in err


@pytest.mark.parametrize("changes,densities", [
    ([], (0.25, 0.25, 0.25, 0.25)),  # the preset's
    (["--set", "density=0.3"], (0.3, 0.3, 0.3, 0.3)),  # every kind's, which the preset names one by one
    (["--set", "spatial_density=0.5", "--set", "density=0.3"], (0.3, 0.5, 0.3, 0.3)),
    (["--set", "temporal_density=0.1"], (0.25, 0.25, 0.1, 0.25)),
])
def test_a_changed_density_is_every_kinds_but_one_set_itself(changes, densities):
    argv = ["--model", "m", "--policy", "wan2.1-480p", *changes]
    _, _, (policy,) = stsa.evaluate._policies(stsa.evaluate._arguments(argv))
    settings = policy.settings  # a kind's density None: the policy's density (stsa.Policy's rule)
    assert [settings["density"]] + [settings["density"] if settings[kind] is None else settings[kind]
                                    for kind in ("spatial_density", "temporal_density", "frames_density")
                                    ] == pytest.approx(densities)


def test_a_device_this_machine_lacks_is_refused_before_the_model_loads(capsys):
    """The real loader checks --device first: `.to(device)` raised a RuntimeError traceback
    after the whole model had loaded."""
    torch = pytest.importorskip("torch")
    argv = ["--model", "/nonexistent/model", "--policy", "wan2.1-480p", "--device", "gpu0"]
    assert stsa.evaluate.main(argv) == 2
    assert capsys.readouterr().err.startswith("stsa.evaluate: --device gpu0: ")
    if not torch.cuda.is_available():
        assert stsa.evaluate.main(argv[:-1] + ["cuda"]) == 2
        assert "--device cuda: this machine has no cuda device" in capsys.readouterr().err


def test_an_existing_output_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "evaluation.json").write_text("mine")
    argv = ["--model", "m", "--policy", "wan2.1-480p", "--out", str(tmp_path)]
    assert stsa.evaluate.main(argv, load=never_loaded) == 2
    assert "exists" in capsys.readouterr().err and (tmp_path / "evaluation.json").read_text() == "mine"


def _pipeline():
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("transformers")  # diffusers' WanPipeline is a placeholder without it
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip(f"torch {torch.__version__}: stsa.diffusers needs torch >= 2.8")
    from diffusers_helpers import TEXT_DIM, wan_pipeline

    torch.manual_seed(0)
    transformer = diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                                  in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                                  ffn_dim=64, num_layers=2, rope_max_seq_len=64).eval()
    return wan_pipeline(transformer)


def _prompts():
    import torch
    from diffusers_helpers import TEXT_DIM, TEXT_TOKENS

    generator = torch.Generator().manual_seed(3)
    return {name: torch.randn(1, TEXT_TOKENS, TEXT_DIM, generator=generator)
            for name in ("prompt_embeds", "negative_prompt_embeds")}


CALL = {"height": 64, "width": 96, "num_frames": 17, "num_inference_steps": 4, "guidance_scale": 5.0}


def test_a_dense_policy_gives_the_dense_video_and_a_sparse_one_differs():
    pipe = _pipeline()
    import stsa.diffusers

    with pytest.warns(stsa.diffusers.DenseWarning, match="its 4 denoising step"):
        same, dense, ours = stsa.evaluate.evaluate(pipe, stsa.Policy(dense_steps=4), **_prompts(), **CALL)
    assert dense.shape == ours.shape == (17, 64, 96, 3) and same.frames == 17
    assert same.psnr_db > 60 and same.ssim > 0.9999  # the same attention, rounded differently at most
    assert same.summary["head_routes"] == {"dense": 4 * 2 * 2 * 2}  # steps x guidance x layers x heads
    assert same.dense_s > 0 and same.stsa_s > 0 and same.speedup == same.dense_s / same.stsa_s
    sparse, dense_again, ours = stsa.evaluate.evaluate(pipe, stsa.Policy(density=0.25, **ALL_SPARSE), warmup=False,
                                                       **_prompts(), **CALL)
    assert np.array_equal(dense_again, dense)  # the seed fixes the dense video
    assert set(sparse.summary["head_routes"]) - {"dense"}
    assert sparse.psnr_db == pytest.approx(stsa.quality.psnr(dense, ours)) and sparse.psnr_db < same.psnr_db
    assert sparse.worst_frame_psnr_db <= sparse.psnr_db + 1e-9 and sparse.ssim < 1


def test_a_pipeline_returning_one_video_not_a_batch_of_frames():
    """Cosmos 3's pipeline returns `video` ([F, H, W, C]) where the others return `frames` ([B, F, H, W, C])."""
    pipe = _pipeline()

    def one_video(**call):
        return types.SimpleNamespace(video=pipe(**call).frames[0], sound=None)

    one_video.transformer, one_video.transformer_2 = pipe.transformer, None
    result, dense, ours = stsa.evaluate.evaluate(one_video, stsa.Policy(density=0.25, **ALL_SPARSE), warmup=False,
                                                 **_prompts(), **CALL)
    assert dense.shape == ours.shape == (17, 64, 96, 3) and result.frames == 17
    assert set(result.summary["head_routes"]) - {"dense"} and not np.array_equal(dense, ours)

    def nothing(**call):
        return types.SimpleNamespace(images=None)

    nothing.transformer, nothing.transformer_2 = pipe.transformer, None
    with pytest.raises(stsa.Error, match="neither frames nor video"):
        stsa.evaluate.evaluate(nothing, "wan2.1-1.3b-480p", warmup=False, **CALL)


class _PromptEmbedding:
    """The tiny pipeline behind the command line's text prompt: embeddings in its place
    (the pipeline has no text encoder), the rest passed on."""

    def __init__(self, pipe):
        self.pipe, self.transformer, self.transformer_2 = pipe, pipe.transformer, None
        self.seen = {}

    def __call__(self, prompt, **call):
        self.seen.setdefault("prompts", []).append(prompt)
        self.seen.update(call)
        return self.pipe(**_prompts(), **call)


def test_the_command_line_writes_its_record_and_videos(tmp_path, capsys):
    pipe = _PromptEmbedding(_pipeline())
    out = tmp_path / "run"
    argv = ["--model", "tiny", "--policy", "wan2.1-1.3b-480p", "--height", "64", "--width", "96", "--frames", "17",
            "--steps", "3", "--set", "dense_steps=1", "--set", "max_rel_l2=1e9", "--out", str(out), "--save-videos",
            "--no-warmup", "--prompt", "a cat", "--prompt", "a dog"]
    assert stsa.evaluate.main(argv, load=lambda args: pipe) == 0
    # Each prompt generated twice (dense, stsa); the prompts reach the pipeline, the embeddings are the test's.
    assert pipe.seen["prompts"] == ["a cat"] * 2 + ["a dog"] * 2
    assert pipe.seen["num_inference_steps"] == 3 and pipe.seen["height"] == 64
    record = json.loads((out / "evaluation.json").read_text())
    assert record["policy"] == "wan2.1-1.3b-480p" and record["settings"]["dense_steps"] == 1
    assert record["settings"]["density"] == stsa.Policy.from_preset("wan2.1-1.3b-480p").settings["density"]
    first, second = record["prompts"]
    assert (first["prompt"], second["prompt"]) == ("a cat", "a dog")
    assert first["summary"]["head_routes"].get("dense", 0) < 3 * 2 * 2 * 2  # steps 1 and 2 ran sparse
    assert 0 < first["psnr_db"] < 200
    assert record["all"]["psnr_db"] == pytest.approx((first["psnr_db"] + second["psnr_db"]) / 2)
    assert record["all"]["speedup"] == pytest.approx((first["dense_s"] + second["dense_s"])
                                                     / (first["stsa_s"] + second["stsa_s"]))
    videos = first["videos"] + second["videos"]
    assert len(set(videos)) == 4 and all(os.path.exists(path) for path in videos)
    printed = capsys.readouterr().out
    assert "speedup" in printed and printed.count("\n") == 4  # the header, a row per prompt, the means
    assert stsa.evaluate.main(argv, load=lambda args: pipe) == 2  # the same --out again: refused, nothing lost
    assert json.loads((out / "evaluation.json").read_text()) == record


def test_a_sweep_generates_the_dense_video_once_and_each_value_after(tmp_path, capsys):
    pipe = _PromptEmbedding(_pipeline())
    out = tmp_path / "sweep"
    argv = ["--model", "tiny", "--policy", "wan2.1-1.3b-480p", "--height", "64", "--width", "96", "--frames", "17",
            "--steps", "3", "--set", "dense_steps=1", "--set", "max_rel_l2=1e9", "--sweep", "density=0.2,0.6",
            "--out", str(out), "--save-videos", "--no-warmup", "--prompt", "a cat", "--prompt", "a dog"]
    assert stsa.evaluate.main(argv, load=lambda args: pipe) == 0
    assert pipe.seen["prompts"] == ["a cat"] * 3 + ["a dog"] * 3  # dense once, then one per value
    record = json.loads((out / "evaluation.json").read_text())
    assert record["sweep"] == "density" and "density" not in record["settings"]
    assert record["settings"]["dense_steps"] == 1 and "all" not in record
    runs = record["prompts"]
    assert [(r["prompt"], r["density"]) for r in runs] == [("a cat", 0.2), ("a cat", 0.6), ("a dog", 0.2),
                                                           ("a dog", 0.6)]
    assert runs[0]["dense_s"] == runs[1]["dense_s"] and runs[0]["psnr_db"] != runs[1]["psnr_db"]
    assert runs[0]["videos"][0] == runs[1]["videos"][0] and len({r["videos"][1] for r in runs}) == 4
    assert all(os.path.exists(path) for r in runs for path in r["videos"])
    means = record["means"]
    assert [m["density"] for m in means] == [0.2, 0.6]
    assert means[1]["psnr_db"] == pytest.approx((runs[1]["psnr_db"] + runs[3]["psnr_db"]) / 2)
    printed = capsys.readouterr().out.splitlines()
    assert "density" in printed[0] and len(printed) == 1 + 4 + 2  # the header, a row per run, a mean per value
    assert [line.split()[1] for line in printed[1:]] == ["0.2", "0.6", "0.2", "0.6", "0.2", "0.6"]


def test_an_image_to_video_run_passes_its_image(tmp_path, capsys):
    """--image reaches the pipeline as its `image` (RGB, decoded before the model loads); the
    record names the file. A file that is no image: exit 2, nothing loaded."""
    pipe = _PromptEmbedding(_pipeline())  # skips where torch, diffusers or transformers are missing
    from PIL import Image  # diffusers' own dependency

    picture = tmp_path / "first.png"
    Image.new("RGB", (96, 64), (200, 30, 10)).save(picture)
    argv = ["--model", "tiny", "--policy", "wan2.1-1.3b-480p", "--height", "64", "--width", "96", "--frames", "17",
            "--steps", "2", "--set", "dense_steps=1", "--no-warmup", "--image", str(picture),
            "--out", str(tmp_path / "run")]
    given = {}

    def image_pipe(**call):  # the tiny text-to-video pipeline takes no image: keep it, pass the rest on
        given["image"] = call.pop("image")
        return pipe(**call)

    image_pipe.transformer, image_pipe.transformer_2 = pipe.transformer, None
    assert stsa.evaluate.main(argv, load=lambda args: image_pipe) == 0
    assert given["image"].size == (96, 64) and given["image"].getpixel((0, 0)) == (200, 30, 10)
    record = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    assert record["call"]["image"] == str(picture)
    (tmp_path / "broken.png").write_text("not an image")
    argv[argv.index(str(picture))] = str(tmp_path / "broken.png")
    argv[-1] = str(tmp_path / "again")
    assert stsa.evaluate.main(argv, load=never_loaded) == 2
    assert capsys.readouterr().err.startswith("stsa.evaluate: ")
