"""stsa.diffusers on small randomly initialised diffusers transformers (one of each family
it knows), where torch and diffusers are installed (CI's venv has neither; the test
skips there). The model's own processor is the yardstick for everything but the
attention (projections, QK norm, rotary embedding, output projection); the fp64
reference, with each head's mask evaluated from what the call reports it ran, is the
yardstick for the attention."""

import dataclasses
import faulthandler
import functools
import gc
import inspect
import os
import pathlib
import types
import warnings

import numpy as np
import pytest

import reference
import stsa

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
if not hasattr(torch.Tag, "cudagraph_unsafe"):
    pytest.skip(f"torch {torch.__version__}: stsa.diffusers needs torch >= 2.8", allow_module_level=True)

import stsa.diffusers  # noqa: E402  (needs torch)

from diffusers_helpers import TEXT_DIM, TEXT_TOKENS, regional_compile_runs, wan_pipeline  # noqa: E402
from diffusers_models import (  # noqa: E402
    ANYFLOW, CHRONOEDIT, FRAMEPACK, HELIOS, HISTORY_TOKENS, HUNYUAN, HUNYUAN15, KANDINSKY, KANDINSKY6, LTX, LTX2,
    MOCHI, MODELS, MOTIF, SKYREELS_V2, WAN, WAN_ANIMATE, attentions, denoising, framepack_inputs, hunyuan15_inputs,
    hunyuan_inputs, inputs, mochi_inputs, motif_inputs, needs, param, tiny, tiny_helios, tiny_ltx2, tiny_motif,
    tiny_wan)
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from torch_helpers import check, require_gpu  # noqa: E402

diffusers.utils.logging.set_verbosity_error()  # a bf16 model cast with .to() is warned about; tiny() mends it
# Mochi's rotary embedding asks for an fp32 autocast, which the CPU does not have (the model's own warning).
# Kandinsky 5 normalizes fp32 q, k with a bf16 model's RMS norm weights (its own warning too).
pytestmark = [pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning"),
              pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning"),
              # Most tests run a step or two under a warm-up on purpose; the warning's own tests see it.
              pytest.mark.filterwarnings("ignore::stsa.diffusers.DenseWarning")]

ALL_SPARSE = {"max_rel_l2": 1e9}  # no head kept dense for its error: every routed head sparse


def padded(mask, tokens, sees_keys=True):
    """A head's [n, n] mask within `tokens` positions, the rest a prompt's padding, which
    the model's mask hides as keys (its query rows see the n kept keys) or both ways
    (they see nothing)."""
    kept = mask.shape[0]
    full = np.zeros((tokens, tokens), dtype=bool)
    full[:kept, :kept] = mask
    full[kept:, :kept] = sees_keys
    return full


def forward(model, x):
    with torch.no_grad():
        return model(**x).sample


def relative_l2(a, b):
    return float(torch.linalg.vector_norm((a - b).double()) / torch.linalg.vector_norm(b.double()))


DEVICES = [pytest.param("cpu", torch.float32, id="cpu-fp32"), pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
           pytest.param("cuda", torch.bfloat16, id="cuda-bf16")]


def on(device, spec):
    if device == "cuda":
        require_gpu()
        if spec.head_dim not in (64, 128):
            pytest.skip(f"the CUDA kernel takes heads of 64 and 128, not {spec.name}'s {spec.head_dim}")


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("fused", [False, True])
def test_a_dense_policy_gives_the_models_own_output(spec, device, dtype, fused, rng):
    on(device, spec)
    model = tiny(spec, device, dtype)
    if fused:
        if not spec.fuses or not hasattr(model, "fuse_qkv_projections"):
            pytest.skip(f"{spec.name}'s attention does not fuse its projections")
        model.fuse_qkv_projections()
        assert all(attn.fused_projections for attn in attentions(model, spec))
    x = inputs(rng, 999, device, dtype, spec)
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    # bf16: the two kernels round differently (unit roundoff 3.9e-3; 2.4e-3 measured).
    tolerance = spec.fp32_tolerance if dtype == torch.float32 else 1e-2
    assert relative_l2(ours, own) < tolerance
    assert [(r.step, r.layer, r.grid, r.routes) for r in sparse.records] == [
        (0, layer, spec.grid, ("dense",) * 2) for layer in range(len(attentions(model, spec)))]


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_routed_layers_match_the_reference_on_the_models_own_qkv(spec, device, dtype, rng, monkeypatch):
    """Each layer's q, k, v as the model's own processor makes them from the same input;
    the attention stsa returned against the fp64 reference with the masks it reports."""
    on(device, spec)
    model = tiny(spec, device, dtype)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    layer_inputs, attended = {}, {}
    for layer, attn in enumerate(attentions(model, spec)):
        attn.register_forward_pre_hook(
            lambda _, args, kwargs, layer=layer: layer_inputs.setdefault(layer, (args, kwargs)), with_kwargs=True)
    attend = sparse._attend

    def attend_and_keep(layer, q, k, v, layout, prompt_mask=None, history=0):
        assert layout == spec.layout
        return attended.setdefault(layer, (q, k, v, attend(layer, q, k, v, layout, prompt_mask, history)))[3]

    monkeypatch.setattr(sparse, "_attend", attend_and_keep)
    forward(model, inputs(rng, 999, device, dtype, spec))
    sparse.disable()

    if not hasattr(*spec.stock_attention):
        pytest.skip(f"diffusers {diffusers.__version__}'s {spec.name} calls another attention function")
    stock = {}
    monkeypatch.setattr(*spec.stock_attention, lambda q, k, v, **_: stock.setdefault("qkv", (q, k, v))[0])
    routes = set()
    for layer, attn in enumerate(attentions(model, spec)):
        args, kwargs = layer_inputs[layer]
        stock.clear()
        attn.processor = spec.stock()  # through the module's forward, which may map its arguments (Kandinsky 6)
        with torch.no_grad():
            attn(*args, **kwargs)
        q, k, v, out = attended[layer]
        for ours, theirs in zip((q, k, v), stock["qkv"]):
            assert torch.equal(spec.as_stock(ours, spec), theirs)
        heads = sparse.last_info[layer]["heads"]
        routes.update(h["route"] for h in heads)
        if spec.layout == "bhnd":
            q, k, v, out = (x.transpose(1, 2) for x in (q, k, v, out))
        check(out, q, k, v, [padded(mask, q.shape[1], spec.padding_sees_keys)
                             for mask in reference.head_masks(spec.grid, heads)])
    assert routes - {"dense"}, "every head ran dense: the test would not see a sparse mask"


def _batch_of_two(rng, spec):
    """Two samples' latents, timesteps and prompts in one batch (their masks added by the caller)."""
    one, two = (inputs(rng, 999, spec=spec) for _ in range(2))
    return {name: torch.cat([one[name], two[name]]) for name in ("hidden_states", "timestep", "encoder_hidden_states")}


@pytest.mark.parametrize("spec,masks,texts", [
    pytest.param(HUNYUAN, lambda: hunyuan_inputs("cpu", torch.float32, kept=(3, 7)), (3, 7), id="hunyuan",
                 marks=needs(HUNYUAN)),
    pytest.param(MOCHI, lambda: mochi_inputs("cpu", torch.float32, kept=(5, 2)), (5, 2), id="mochi",
                 marks=needs(MOCHI)),
    pytest.param(FRAMEPACK, lambda: framepack_inputs("cpu", torch.float32, kept=(3, 7)),
                 (HISTORY_TOKENS + 3 + 3, HISTORY_TOKENS + 3 + 7), id="framepack", marks=needs(FRAMEPACK)),
    pytest.param(MOTIF, lambda: motif_inputs("cpu", torch.float32, kept=(3, 7)), (3, 7), id="motif",
                 marks=needs(MOTIF))])
def test_prompts_of_different_lengths_in_one_batch(spec, masks, texts, rng):
    """Each sample runs with its own grid (the prompt tokens its mask keeps; Framepack's
    history and image tokens too), the padding's rows seeing the kept keys (HunyuanVideo,
    Framepack) or nothing (Mochi: zero): a dense policy gives the model's own output."""
    model = tiny(spec)
    x = {**_batch_of_two(rng, spec), **masks()}
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    assert relative_l2(ours, own) < 1e-6
    assert [(r.layer, r.grid.text) for r in sparse.records] == [(layer, text) for layer in range(2) for text in texts]


@needs(LTX2)
@pytest.mark.parametrize("rope_type,perturbed_attn", [("interleaved", True), ("split", True), ("split", False)])
def test_ltx2_guidance_perturbation_gates_and_rotary_types(rope_type, perturbed_attn, rng):
    """LTX-2 with per-head gates, either rotary type, either processor, in a batch of two: a
    dense policy gives the model's own output, and so it does in spatio-temporal guidance's
    pass (block 1 perturbed: the first sample's attention kept, the second's replaced by its
    value projection; then both replaced, where stsa is not called at all)."""
    def batch():
        one, two = (inputs(rng, 999, spec=LTX2) for _ in range(2))
        return {name: torch.cat([one[name], two[name]]) if isinstance(one[name], torch.Tensor) else one[name]
                for name in one}

    torch.manual_seed(0)
    model = tiny_ltx2(2, rope_type, perturbed_attn).eval()
    passes = [{}]
    if perturbed_attn:
        passes += [{"spatio_temporal_guidance_blocks": [1], "perturbation_mask": torch.tensor(mask)}
                   for mask in ([1.0, 0.0], [0.0, 0.0])]
    for guidance in passes:
        x = {**batch(), **guidance}
        own = forward(model, x)
        with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
            ours = forward(model, x)
        assert relative_l2(ours, own) < 1e-6, guidance
        all_perturbed = guidance and not any(guidance["perturbation_mask"])
        assert [r.layer for r in sparse.records] == ([0] if all_perturbed else [0, 1])


@needs(LTX2)
def test_ltx2_keyframe_tokens_after_the_video_are_global(rng):
    """LTX2ConditionPipeline appends a keyframe's tokens (and their coordinates) after the
    video's while the forward's frames, height and width stay the video's; LTX2ICLoraPipeline
    does so with a reference video. They were refused as tokens split across devices; they
    are global tokens, as history is: a dense policy gives the model's own output."""
    torch.manual_seed(0)
    model = tiny_ltx2(2).eval()
    x = inputs(rng, 999, spec=LTX2)
    grid = LTX2.grid
    keyframe = model.rope.prepare_video_coords(1, 1, grid.height, grid.width, "cpu")  # one latent frame
    x["hidden_states"] = torch.cat([x["hidden_states"], torch.randn(1, keyframe.shape[2], 4)], dim=1)
    x["video_coords"] = torch.cat(
        [model.rope.prepare_video_coords(1, grid.frames, grid.height, grid.width, "cpu"), keyframe], dim=2)
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    assert relative_l2(ours, own) < 1e-6
    assert [(r.layer, r.grid.video_tokens, r.grid.text) for r in sparse.records] == [
        (layer, grid.video_tokens, grid.height * grid.width) for layer in range(2)]


@needs(HUNYUAN15)
def test_hunyuan15_prompts_of_different_lengths_and_an_image(rng):
    """HunyuanVideo 1.5 (image-to-video: its 3 image tokens kept) with a batch of two whose
    prompts keep 3 + 4 + 5 and 3 + 1 + 7 tokens, then text-to-video (the image tokens
    dropped): each sample runs with its own grid, read anew each forward, the padding's
    rows left at zero, and a dense policy gives the model's own output."""
    model = tiny(HUNYUAN15)
    x = {**_batch_of_two(rng, HUNYUAN15), **hunyuan15_inputs("cpu", torch.float32, kept=((5, 4), (7, 1)), image=True)}
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
        x.update(hunyuan15_inputs("cpu", torch.float32, kept=((5, 4), (7, 1))))  # next: no image, 3 tokens fewer
        text_only = forward(model, x)
    assert relative_l2(ours, own) < 1e-6 and relative_l2(text_only, forward(model, x)) < 1e-6
    assert [(r.layer, r.grid.text) for r in sparse.records] == [(0, 12), (0, 11), (1, 12), (1, 11),
                                                                 (0, 9), (0, 8), (1, 9), (1, 8)]


@needs(HUNYUAN15)
def test_the_guidance_pass_with_a_shorter_prompt_reuses_the_decisions(rng):
    """HunyuanVideo 1.5 runs the unconditional pass as its own forward, its (negative)
    prompt keeping fewer tokens: the same video, another grid, the same step. The heads
    keep the conditional pass's routes, their masks sized to that grid: no routing."""
    model = tiny(HUNYUAN15, layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    conditional = inputs(rng, 999, spec=HUNYUAN15)
    unconditional = {**conditional, **hunyuan15_inputs("cpu", torch.float32, kept=((2, 1),))}
    forward(model, conditional)
    forward(model, unconditional)
    first, second = sparse.records
    assert (first.grid.text, second.grid.text) == (7, 3)
    assert first.routing_ms > 0 and second.routing_ms == 0 and second.routes == first.routes
    assert "dense" not in second.routes


@needs(MOTIF)
def test_motif_image_embeddings_cross_attention_and_decoder_blocks(rng):
    """Motif-Video with the image's 2 embeddings before the prompt's tokens (its mask keeps 5
    of 7), its text cross-attention after every block, and one decoder block (attending to the
    encoder's video tokens, left to the model's own processor): a dense policy gives the
    model's own output, each encoder layer's call sees the video and 2 + 5 global tokens, and
    the decoder block makes none."""
    torch.manual_seed(0)
    model = tiny_motif(2, decoder_layers=1, cross_attention=True).eval()
    x = {**inputs(rng, 999, spec=MOTIF), **motif_inputs("cpu", torch.float32, kept=(5,), images=2)}
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    assert relative_l2(ours, own) < 1e-6
    assert [(r.layer, r.grid) for r in sparse.records] == [(layer, stsa.VideoGrid(5, 4, 6, text=7))
                                                          for layer in range(2)]
    assert len(model.single_transformer_blocks) == 2  # the last one the decoder's, without a record
    bad = {**x, "encoder_attention_mask": torch.tensor([[1, 0, 1, 1, 1, 0, 0]])}
    with stsa.diffusers.enable(model, stsa.Policy()), pytest.raises(stsa.Unsupported, match="kept tokens first"):
        forward(model, bad)


@needs(HUNYUAN15)
def test_hunyuan15_refuses_a_mask_with_kept_tokens_after_padding(rng):
    model = tiny(HUNYUAN15, layers=1)
    stsa.diffusers.enable(model, stsa.Policy())
    video, prompt = torch.zeros(1, 120, 128), torch.zeros(1, 3, 128)
    with torch.no_grad(), pytest.raises(stsa.Unsupported, match="kept tokens first"):
        model.transformer_blocks[0].attn(video, prompt, attention_mask=torch.tensor([[True, False, True]]))


def test_steps_follow_the_timestep_and_guidance_reuses_the_decision(rng):
    """A lower timestep is the next step, an equal one (the unconditional pass) the same
    step, which reuses the conditional pass's decisions; a higher one starts over."""
    model = tiny_wan(layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(dense_steps=1, density=0.4, **ALL_SPARSE))
    for timestep in (999, 999, 700, 700, 400, 999):
        forward(model, inputs(rng, timestep))
    records = sparse.records
    assert [r.step for r in records] == [0, 0, 1, 1, 2, 0]
    assert records[0].routes == records[1].routes == ("dense", "dense")
    assert "dense" not in records[2].routes + records[4].routes
    assert records[2].routing_ms > 0 and records[3].routing_ms == 0 and records[3].routes == records[2].routes
    assert records[5].routes == ("dense", "dense")
    summary = sparse.summary()
    assert summary["calls"] == 6 and sum(summary["head_routes"].values()) == 12
    assert summary["routing_ms"] == sum(r.routing_ms for r in records) > 0
    sparse.reset()
    forward(model, inputs(rng, 10))
    assert sparse.records[-1].step == 0
    sparse.disable()
    bounded = stsa.diffusers.enable(model, stsa.Policy(), max_records=2)
    for timestep in (999, 700, 400):
        forward(model, inputs(rng, timestep))
    assert [r.step for r in bounded.records] == [1, 2]


def _dense_warnings(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, stsa.diffusers.DenseWarning)]


def test_a_generation_inside_the_warm_up_is_reported_once(rng):
    """A generation whose steps all fall in the dense warm-up saved nothing: one
    DenseWarning when the next generation begins or the model is disabled, none for a
    generation that went past it. A model whose layers are all dense layers: at enable."""
    model = tiny_wan(layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(dense_steps=2, density=0.4, **ALL_SPARSE))

    def generate(*timesteps):
        for timestep in timesteps:
            forward(model, inputs(rng, timestep))

    assert _dense_warnings(lambda: generate(999, 999, 700)) == []  # under way: not known yet
    (message,) = _dense_warnings(lambda: generate(999, 700, 400))  # the first ended: 2 steps, both dense
    assert "its 2 denoising step(s) all fall in the policy's dense warm-up (dense_steps=2)" in message
    assert "'dense_steps': 0" in message  # a quarter of its steps
    assert _dense_warnings(sparse.disable) == []  # the second went past the warm-up
    assert [r.step for r in sparse.records] == [0, 0, 1, 0, 1, 2] and "dense" not in sparse.records[-1].routes
    sparse = stsa.diffusers.enable(model, stsa.Policy(dense_steps=2))
    generate(999)
    assert len(_dense_warnings(sparse.disable)) == 1
    assert _dense_warnings(sparse.disable) == []  # reported once
    (layers,) = _dense_warnings(lambda: stsa.diffusers.enable(model, stsa.Policy(dense_layers=1)).disable())
    assert "its 1 self-attention layer(s) all fall in the policy's dense layers (dense_layers=1)" in layers


def test_untimed_records_have_no_attention_times(rng):
    model = tiny_wan(layers=1)
    with stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE), timed=False) as sparse:
        forward(model, inputs(rng, 999))
    (record,) = sparse.records
    assert record.attention_ms is None and record.routing_ms > 0 and "dense" not in record.routes
    assert sparse.summary()["attention_ms"] is None
    with pytest.raises(stsa.InvalidArgument, match="timed must be True or False"):
        stsa.diffusers.enable(model, stsa.Policy(), timed=None)


def test_a_new_generation_routes_afresh_however_long_the_reuse(rng):
    model = tiny_wan(layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(reuse_steps=100, density=0.4, **ALL_SPARSE))
    for timestep in (999, 700, 999):
        forward(model, inputs(rng, timestep))
    first, reused, next_video = sparse.records
    assert (first.step, reused.step, next_video.step) == (0, 1, 0)
    assert first.routing_ms > 0 and reused.routing_ms == 0 and next_video.routing_ms > 0


@needs(MOCHI)
def test_mochis_rising_timesteps_count_its_steps(rng):
    """Mochi's pipeline inverts its scheduler's sigmas: its timesteps rise over a generation
    (0, 8.3, ..., 464 at six steps). A higher one is the next step, an equal one the same
    step, a lower one (its start again) a new generation, whose heads are routed afresh."""
    model = tiny(MOCHI, layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(dense_steps=1, reuse_steps=100, density=0.4, **ALL_SPARSE))
    for timestep in (0.0, 0.0, 8.3, 16.7, 463.9, 0.0, 8.3):  # as MochiPipeline passes them
        forward(model, inputs(rng, timestep, spec=MOCHI))
    records = sparse.records
    assert [r.step for r in records] == [0, 0, 1, 2, 3, 0, 1]
    assert records[0].routes == records[5].routes == ("dense", "dense")
    assert "dense" not in records[2].routes + records[6].routes
    assert records[2].routing_ms > 0 and records[3].routing_ms == 0 and records[6].routing_ms > 0
    sparse.disable()


def test_a_pipelines_own_timestep_tells_apart_steps_its_cast_made_equal(rng):
    """HunyuanVideo 1.5's pipeline hands the model its timestep cast to bfloat16, where steps
    close together round to one value (at shift 9: 3 of 50 steps), which counted as guidance
    passes of the step before. The pipeline's own ``_current_timestep`` (fp32, set before each
    step's forwards) tells them apart; a bare transformer, which has none, still cannot."""
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=9.0)
    scheduler.set_timesteps(50)
    steps = scheduler.timesteps[:8]
    cast = [float(t.to(torch.bfloat16)) for t in steps]
    assert len(set(cast)) < len(cast), cast  # the case itself: some consecutive steps collide
    model = tiny_wan(layers=1)
    pipe = types.SimpleNamespace(transformer=model, _current_timestep=None)
    sparse = stsa.diffusers.enable(pipe, stsa.Policy(dense_steps=1000))
    seen = []
    for t in steps:
        pipe._current_timestep = t
        for _ in range(2):  # the conditional and the unconditional pass
            forward(model, inputs(rng, float(t.to(torch.bfloat16))))
            seen.append(sparse.step)
    pipe._current_timestep = None
    assert seen == [step for step in range(8) for _ in range(2)]
    sparse.disable()
    bare = stsa.diffusers.enable(model, stsa.Policy(dense_steps=1000))
    for t in steps:
        forward(model, inputs(rng, float(t.to(torch.bfloat16))))
    assert bare.step == len(set(cast)) - 1  # what the model's timesteps alone tell
    bare.disable()


def test_a_refused_enable_leaves_the_model_as_it_was(rng):
    """enable's DenseWarning comes before anything is installed: raised (warnings as
    errors), it leaves the model's own processors and no hook behind."""
    model = tiny_wan(layers=1)
    processors = [attn.processor for attn in attentions(model)]
    hooks = len(model._forward_pre_hooks)
    with warnings.catch_warnings():
        warnings.simplefilter("error", stsa.diffusers.DenseWarning)
        with pytest.raises(stsa.diffusers.DenseWarning, match="dense layers"):
            stsa.diffusers.enable(model, stsa.Policy(dense_layers=1))
    assert [attn.processor for attn in attentions(model)] == processors
    assert len(model._forward_pre_hooks) == hooks


@needs(CHRONOEDIT)
def test_chronoedit_drops_its_reasoning_frames_and_routes_the_new_grid(rng):
    """ChronoEdit's temporal reasoning: the first steps run 5 latent frames, the rest the 2 of
    the input and the edit. The steps after the drop route afresh on the new grid, whatever
    the reuse (a decision is about the grid it was made on), then reuse that."""
    model = tiny(CHRONOEDIT, layers=1)
    # The 2-frame grid has 48 tokens, fewer than the 64 samples: it is routed on every row.
    sparse = stsa.diffusers.enable(model, stsa.Policy(reuse_steps=100, density=0.4, **ALL_SPARSE))
    for timestep, frames in ((999, 5), (800, 5), (600, 2), (400, 2)):
        x = inputs(rng, timestep, spec=CHRONOEDIT)
        x["hidden_states"] = x["hidden_states"][:, :, :frames]
        forward(model, x)
    grids = [(r.step, r.grid.frames, r.routing_ms > 0) for r in sparse.records]
    assert grids == [(0, 5, True), (1, 5, False), (2, 2, True), (3, 2, False)]


def _two_experts():
    """Wan2.2 A14B's shape in small: two Wan transformers, the second with other weights."""
    torch.manual_seed(1)
    return tiny_wan(layers=1), tiny_wan(layers=2)


def test_a_pipelines_experts_count_its_steps_together(rng):
    """As WanPipeline runs Wan2.2 A14B: `transformer` while the timestep is at or above the
    boundary, `transformer_2` below it, each step twice (guidance)."""
    high, low = _two_experts()
    pipe = types.SimpleNamespace(transformer=high, transformer_2=low, vae=None)
    policy = stsa.Policy(dense_steps=2, density=0.4, **ALL_SPARSE)
    sparse = stsa.diffusers.enable(pipe, policy)
    assert isinstance(sparse, stsa.diffusers.SparsePipeline) and list(sparse.parts) == ["transformer", "transformer_2"]
    assert sparse.parts["transformer"].policy is policy
    low_policy = sparse.parts["transformer_2"].policy
    assert low_policy is not policy and low_policy.settings == policy.settings
    for timestep, expert in ((999, high), (999, high), (900, high), (900, high), (700, low), (700, low), (400, low)):
        forward(expert, inputs(rng, timestep))
    assert sparse.step == 3
    records = [(r.model, r.step, r.layer) for r in sparse.records]
    assert records == [("transformer", 0, 0)] * 2 + [("transformer", 1, 0)] * 2 + [
        ("transformer_2", 2, 0), ("transformer_2", 2, 1)] * 2 + [("transformer_2", 3, 0), ("transformer_2", 3, 1)]
    routed = list(sparse.records)[4:]  # the low-noise expert starts past the warm-up
    assert all("dense" not in r.routes for r in routed) and routed[0].routing_ms > 0
    assert routed[2].routing_ms == 0  # the guidance pass reuses step 2's decision
    assert sparse.summary()["calls"] == 10 and low_policy.cached_count == 2 * 2 and policy.cached_count == 0
    forward(high, inputs(rng, 999))  # the next video
    assert sparse.records[-1].step == 0 and sparse.records[-1].routes == ("dense", "dense")
    forward(low, inputs(rng, 700))
    assert low_policy.cached_count == 0  # step 1 dense: forgotten, not reused
    sparse.reset()
    # The video before took 2 steps, both in the warm-up: one warning for the pipeline.
    assert len(_dense_warnings(lambda: forward(low, inputs(rng, 10)))) == 1
    assert sparse.step == 0
    own = [block.attn1.processor for block in (*high.blocks, *low.blocks)]
    assert all(isinstance(p, stsa.diffusers._SelfAttention) for p in own)
    assert len(_dense_warnings(sparse.disable)) == 1  # the last video's one step, once for both experts
    assert not any(isinstance(block.attn1.processor, stsa.diffusers._SelfAttention)
                   for block in (*high.blocks, *low.blocks))


def test_a_pipeline_with_one_transformer_and_refusals():
    model = tiny_wan(layers=1)
    with stsa.diffusers.enable(types.SimpleNamespace(transformer=model, transformer_2=None), "wan2.1-480p") as sparse:
        assert list(sparse.parts) == ["transformer"]
        assert sparse.parts["transformer"].policy.settings == stsa.Policy.from_preset("wan2.1-480p").settings
    with pytest.raises(stsa.InvalidArgument, match="holds no transformer"):
        stsa.diffusers.enable(types.SimpleNamespace(transformer=None), stsa.Policy())
    # The second transformer refused: the first gets its own processors back.
    with pytest.raises(stsa.InvalidArgument, match="not a transformer stsa.diffusers knows"):
        stsa.diffusers.enable(types.SimpleNamespace(transformer=model, transformer_2=torch.nn.Linear(2, 2)),
                              stsa.Policy())
    assert not isinstance(model.blocks[0].attn1.processor, stsa.diffusers._SelfAttention)


def test_wan_pipeline_with_two_experts(rng):
    """diffusers' own WanPipeline (Wan2.2 A14B's, boundary_ratio 0.875) on two tiny experts:
    a dense policy gives the pipeline's own latents, and the experts share its steps."""
    pytest.importorskip("transformers")  # WanPipeline is a placeholder without it
    pipe = wan_pipeline(*_two_experts(), boundary_ratio=0.875)
    prompts = {name: torch.from_numpy(rng.standard_normal((1, TEXT_TOKENS, TEXT_DIM)).astype(np.float32))
               for name in ("prompt_embeds", "negative_prompt_embeds")}

    def generate():
        with torch.no_grad():
            return pipe(**prompts, height=64, width=96, num_frames=17, num_inference_steps=6, guidance_scale=5.0,
                        output_type="latent", generator=torch.Generator().manual_seed(2)).frames

    own = generate()
    with stsa.diffusers.enable(pipe, stsa.Policy(dense_steps=6)) as sparse:
        ours = generate()
    assert relative_l2(ours, own) < 1e-5
    steps = {name: sorted({r.step for r in sparse.records if r.model == name}) for name in sparse.parts}
    assert steps["transformer"] and steps["transformer_2"]  # both experts ran, each its own share of the 6 steps
    assert steps["transformer"] + steps["transformer_2"] == list(range(6))
    assert len(sparse.records) == 6 * 2 * 2 - len(steps["transformer"]) * 2  # 1 layer high, 2 low; guidance


def _ulysses_rank(rank: int, ranks: int, rendezvous: str, compiled: bool) -> None:
    """One rank of test_ulysses_context_parallelism (a process of its own, gloo on the CPU)."""
    # A rank killed by a signal leaves no Python error: its last stage and, from
    # faulthandler, every thread's stack go to this file for the test to show.
    trace = open(f"{rendezvous}.rank{rank}", "w")
    faulthandler.enable(file=trace, all_threads=True)

    def reached(stage):
        trace.write(f"reached: {stage}\n")
        trace.flush()

    # A file rendezvous: a free port probed beforehand can be taken before rank 0 binds it.
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=ranks)
    try:
        torch.accelerator.device_count = lambda: 1  # enable_parallelism asks for an accelerator; the CPU serves
        rng = np.random.default_rng(7)
        x = inputs(rng, 999)
        # A timestep per token, as Wan2.2-TI2V passes it: diffusers 0.42's plan splits a 1-D one with a
        # warning its logger cannot give (logger.warning_once), a bug of its own.
        x["timestep"] = torch.full((1, WAN.grid.tokens), 999.0)
        def four_heads():  # two a rank, so a rank's share is more than one head
            torch.manual_seed(0)
            return diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64,
                                                   in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                                   ffn_dim=64, num_layers=2, rope_max_seq_len=64).eval()

        single = {}
        model = four_heads()
        with torch.no_grad():
            single["own"] = model(**x, return_dict=False)[0]
        for name, policy in (("dense", stsa.Policy(dense_steps=1)), ("routed", stsa.Policy(density=0.4, **ALL_SPARSE))):
            with stsa.diffusers.enable(model, policy) as sparse, torch.no_grad():
                single[name] = (model(**x, return_dict=False)[0], [r.routes for r in sparse.records])
        reached("one process's outputs")
        heads = slice(2 * rank, 2 * rank + 2)  # 4 heads over 2 ranks: rank r attends to heads 2r and 2r + 1
        # A mesh of the CPU's gloo groups, whatever accelerator the host has (the model runs on the CPU).
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (1, ranks), mesh_dim_names=("ring", "ulysses"))
        config = diffusers.ContextParallelConfig(ulysses_degree=ranks, mesh=mesh)
        if compiled:
            with pytest.MonkeyPatch.context() as monkeypatch:
                _ulysses_compiled(four_heads, config, x, single["routed"], heads, monkeypatch)
            reached("parallel outputs, compiled")
        for stsa_first in () if compiled else (True, False):
            model = four_heads()
            for name, policy in (("dense", stsa.Policy(dense_steps=1)),
                                 ("routed", stsa.Policy(density=0.4, **ALL_SPARSE))):
                if stsa_first:
                    sparse = stsa.diffusers.enable(model, policy)
                    if name == "dense":
                        model.enable_parallelism(config=config)
                else:
                    if name == "dense":
                        model.enable_parallelism(config=config)
                    sparse = stsa.diffusers.enable(model, policy)
                with torch.no_grad():
                    out = model(**x, return_dict=False)[0]
                sparse.disable()
                reference_out, reference_routes = single[name]
                assert relative_l2(out, reference_out) < 1e-6, (name, stsa_first)
                assert [r.routes for r in sparse.records] == [routes[heads] for routes in reference_routes]
                assert [r.grid for r in sparse.records] == [WAN.grid] * 2
            assert relative_l2(out, single["own"]) > 1e-3  # the routed pass ran sparse
            reached(f"parallel outputs, stsa enabled {'before' if stsa_first else 'after'} parallelism")
        # Neither rank tears its group down while the other is still in a collective (gloo
        # aborts the other then: "terminate called without an active exception", seen 1 in ~10).
        torch.distributed.barrier()
        reached("the last barrier")
    finally:
        torch.distributed.destroy_process_group()
        reached("the group destroyed")
    if compiled:
        # The compiled blocks keep both groups' gloo threads alive past the teardown (torch's doing: so
        # do diffusers' own processors compiled), and such threads abort the interpreter's shutdown about
        # once in 50 (below): this rank leaves without one.
        trace.close()
        os._exit(0)
    # enable_parallelism leaves the model in a reference cycle (diffusers' own, stsa or not) that holds
    # the mesh and its gloo groups past destroy_process_group, so their threads were torn down during the
    # interpreter's shutdown, where about 1 run in 50 died after passing ("terminate called without an
    # active exception", SIGABRT; pytorch/pytorch#179291 describes gloo threads that need the GIL then).
    # Collected here, while the interpreter is whole.
    del model, config, mesh, sparse
    gc.collect()
    gloo = [name for name in _thread_names() if "gloo" in name]
    assert not gloo, f"gloo threads outlive the teardown: {gloo}"
    reached("the groups collected")


def _thread_names() -> list:
    """This process's threads' names (Linux; elsewhere none)."""
    tasks = pathlib.Path("/proc/self/task")
    return [(task / "comm").read_text().strip() for task in tasks.iterdir()] if tasks.is_dir() else []


def _ulysses_compiled(make_model, config, x, single, heads, monkeypatch) -> None:
    """Ulysses under diffusers' regional compilation: each block's graph holds stsa's operator and
    its all-to-alls (q, k and v out, the output back), and the routed output and routes are one
    process's. Not fullgraph: diffusers' own context-parallel hook breaks the graph at the first
    block (inspect.signature in its pre_forward), stsa or not. Then the same with a graph break in
    the exchange (as a torch that cannot trace it would make): it was a TypeError (_attend)."""
    exchange = stsa.diffusers._all_to_all

    def exchange_with_a_break(*args):
        torch._dynamo.graph_break()
        return exchange(*args)

    for breaking in (False, True):
        if breaking:
            monkeypatch.setattr(stsa.diffusers, "_all_to_all", exchange_with_a_break)
            torch._dynamo.reset()
        graphs = _ulysses_compiled_run(make_model(), config, x, single, heads)
        if not breaking:
            in_graphs = sorted((ops.count("stsa.diffusers_attention"), sum("all_to_all" in op for op in ops))
                               for ops in graphs)
            assert in_graphs[-2:] == [(1, 4), (1, 4)] and sum(n for n, _ in in_graphs) == 2, in_graphs


def _ulysses_compiled_run(model, config, x, single, heads) -> list:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(node.target) for node in gm.graph.nodes if node.op == "call_function"])
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    model.enable_parallelism(config=config)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    model.compile_repeated_blocks(backend=backend)
    with torch.no_grad():
        out = model(**x, return_dict=False)[0]
    sparse.disable()
    single_out, single_routes = single
    assert relative_l2(out, single_out) < 1e-6
    assert [r.routes for r in sparse.records] == [routes[heads] for routes in single_routes]
    return graphs


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ulysses_context_parallelism(compiled, tmp_path):
    """diffusers' Ulysses context parallelism (enable_parallelism, 2 ranks over gloo) with
    stsa enabled before it or after: each rank gets every token of its share of the heads
    (an all-to-all), routes and attends them, and gives the tokens back; the output equals
    one process's, dense and routed, and each rank's routes are its heads' routes there.
    Compiled: the same under regional compilation (_ulysses_compiled)."""
    if not torch.distributed.is_available():
        pytest.skip("torch without torch.distributed")
    if "mesh" not in inspect.signature(getattr(diffusers, "ContextParallelConfig", lambda: None)).parameters:
        pytest.skip(f"diffusers {diffusers.__version__} has no context parallelism on a mesh of CPU groups")
    rendezvous = tmp_path / "rendezvous"
    try:
        torch.multiprocessing.spawn(_ulysses_rank, args=(2, str(rendezvous), compiled), nprocs=2)
    except torch.multiprocessing.ProcessExitedException as died:
        # A rank killed by a signal (as the teardown's flake was: _ulysses_rank's end says
        # why) leaves no Python error; what each had reached says where.
        traces = [f"rank {r}:\n" + (rendezvous.parent / f"rendezvous.rank{r}").read_text() for r in range(2)]
        raise AssertionError("\n".join([str(died)] + traces)) from died


def test_an_operator_call_whose_integration_is_gone_says_so(rng):
    """The compiled (or exported) block calls stsa's operator with its integration's number:
    once that integration is gone, the call is refused by name (it was a KeyError)."""
    sparse = stsa.diffusers.enable(tiny_wan(layers=1), stsa.Policy())
    number = sparse._id
    sparse.disable()
    del sparse
    gc.collect()
    q = torch.zeros(1, WAN.grid.tokens, 2, 64)
    with pytest.raises(stsa.InvalidArgument, match=rf"stsa.diffusers.enable .* \(number {number}\) no longer exists"):
        torch.ops.stsa.diffusers_attention(q, q, q, number, torch.tensor(0), "bnhd", None, 0)


@pytest.mark.parametrize("spec", MODELS)
def test_a_forward_on_the_meta_device_gives_the_models_shapes(spec, rng):
    """A forward for shapes (the model and its inputs on the meta device): with stsa enabled it
    gives the output the model's own forward gives, through the operator's fake implementation,
    with nothing read or recorded (it failed reading the timestep, then in the policy's call)."""
    model = tiny(spec).to("meta")
    x = {name: value.to("meta") if isinstance(value, torch.Tensor) else value
         for name, value in inputs(rng, 999, spec=spec).items()}
    try:
        with torch.no_grad():
            own = forward(model, x)
    except RuntimeError as refused:  # diffusers 0.42.1: HunyuanVideo 1.5, Mochi, Framepack, Helios, Allegro
        pytest.skip(f"the model's own forward fails on the meta device: {refused}")
    with stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE)) as sparse, torch.no_grad():
        ours = forward(model, x)
    assert (ours.shape, ours.dtype, ours.device) == (own.shape, own.dtype, own.device)
    assert not sparse.records


def stsa_flops(counter) -> dict:
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items() if str(op).startswith("stsa.")}


def test_flop_counter_counts_each_layers_call(rng):
    """FlopCounterMode over a forward with stsa: each layer's call counted as what it ran
    (the warm-up layer dense, the other routed, its sampled rows included); on the meta
    device, as the policy's estimate (the warm-up dense, the other layer its spatial plan)."""
    model, x = tiny_wan(layers=2), inputs(rng, 999)
    policy = stsa.Policy(dense_layers=1, density=0.4, samples=16, **ALL_SPARSE)
    with stsa.diffusers.enable(model, policy) as sparse, FlopCounterMode(display=False) as counter:
        forward(model, x)
    assert [info["routes"][0] == "dense" for info in sparse.last_info.values()] == [True, False]
    assert stsa_flops(counter) == {"stsa.policy_attention": sum(info["kept_flops"] + info["routing_flops"]
                                                                for info in sparse.last_info.values())}
    heads, head_dim = model.config.num_attention_heads, model.config.attention_head_dim
    dense = stsa.attention_flops(WAN.grid, "dense", heads=heads, head_dim=head_dim)["kept"]
    spatial = stsa.attention_flops(WAN.grid, "spatial", 0.4, heads=heads, head_dim=head_dim)["kept"]
    assert sparse.last_info[0]["kept_flops"] == dense and sparse.last_info[1]["kept_flops"] == spatial

    meta = {name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in x.items()}
    with stsa.diffusers.enable(model.to("meta"), policy) as sparse, FlopCounterMode(display=False) as counter:
        forward(model, meta)
    assert stsa_flops(counter) == {"stsa.diffusers_attention": dense + spatial} and not sparse.records


def test_a_model_with_stsa_enabled_is_not_copied_or_pickled(rng):
    """copy.deepcopy of an enabled model made a copy whose forward failed (its hook was the
    original's), and torch.save failed in pickle on the hook's function: both are refused by
    name. Disabled, the model copies, and stsa enabled on the copy gives the original's output."""
    import copy
    import io

    model, x = tiny_wan(layers=2), inputs(rng, 999)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    for copy_it in (copy.deepcopy, lambda m: torch.save(m, io.BytesIO())):
        with pytest.raises(stsa.Unsupported, match="cannot be copied or pickled"):
            copy_it(model)
    ours = forward(model, x)
    sparse.disable()
    twin = copy.deepcopy(model)
    with stsa.diffusers.enable(twin, stsa.Policy(density=0.4, **ALL_SPARSE)):
        assert torch.equal(forward(twin, x), ours)


def test_ring_attention_is_refused(rng):
    model = tiny_wan(layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy())
    ring = types.SimpleNamespace(context_parallel_config=types.SimpleNamespace(ring_degree=2, ulysses_degree=1,
                                                                               ulysses_anything=False))
    model.blocks[0].attn1.processor._parallel_config = ring
    with torch.no_grad(), pytest.raises(stsa.Unsupported, match="Ulysses context parallelism only"):
        forward(model, inputs(rng, 999))
    sparse.disable()


@pytest.mark.parametrize("cache,calls", [
    # Pyramid Attention Broadcast: every self-attention reused on every other step (no call to stsa there).
    pytest.param(lambda state: diffusers.PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(0, 1000),
        current_timestep_callback=lambda: state["timestep"]),
        [(step, layer) for step in (0, 2) for layer in range(3)], id="pyramid-attention-broadcast"),
    # First Block Cache, a threshold no change reaches: after step 0 only the first block runs.
    pytest.param(lambda state: diffusers.FirstBlockCacheConfig(threshold=10.0),
                 [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (3, 0)], id="first-block-cache")])
def test_diffusers_caches_skip_what_they_skip(cache, calls, rng):
    """diffusers' caches (enable_cache) and stsa together: what a cache skips never reaches
    stsa, the rest runs through it; a dense policy gives the cached model's own output."""
    steps = [inputs(rng, timestep) for timestep in (900, 700, 500, 300)]
    outputs = []
    for with_stsa in (False, True):
        model, state = tiny_wan(layers=3), {}
        model.enable_cache(cache(state))
        # Dense at every step: the output is then the cached model's own (a routed step would not be).
        sparse = stsa.diffusers.enable(model, stsa.Policy(dense_steps=len(steps))) if with_stsa else None
        outputs.append([])
        for x in steps:
            state["timestep"] = float(x["timestep"][0])
            with model.cache_context("cond"):
                outputs[-1].append(forward(model, x))
    own, ours = outputs
    assert all(relative_l2(a, b) < 1e-6 for a, b in zip(ours, own))
    assert [(r.step, r.layer) for r in sparse.records] == calls


def test_disable_gives_the_model_back(rng):
    model = tiny_wan()
    processors = [block.attn1.processor for block in model.blocks]
    cross = [block.attn2.processor for block in model.blocks]
    x = inputs(rng, 500)
    own = forward(model, x)
    with stsa.diffusers.enable(model, "wan2.1-1.3b-480p"):
        assert all(isinstance(b.attn1.processor, stsa.diffusers._SelfAttention) for b in model.blocks)
        assert [block.attn2.processor for block in model.blocks] == cross  # cross-attention untouched
        assert not torch.equal(forward(model, x), own)  # the preset's policy runs sparse after its warm-up
    assert [block.attn1.processor for block in model.blocks] == processors
    assert torch.equal(forward(model, x), own)


def test_a_forward_wrapped_by_hooks_still_gives_the_grid_and_step(rng):
    """diffusers < 0.40's hook registry (context parallelism among its users) replaced the
    instance's forward by a wrapper whose signature is (module, *args, **kwargs):
    stsa reads the forward's arguments by the class's signature, so a model hooked before
    stsa is enabled still gives its grid and step."""
    model = tiny_wan(layers=1)
    x = inputs(rng, 999)
    own = forward(model, x)

    def generic(module, *args, **kwargs):
        return type(module).forward(module, *args, **kwargs)

    model.forward = functools.update_wrapper(functools.partial(generic, model), generic)
    assert "module" in inspect.signature(model.forward).parameters  # what broke the binding
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    assert relative_l2(ours, own) < WAN.fp32_tolerance
    assert [(r.step, r.grid) for r in sparse.records] == [(0, WAN.grid)]


def test_refusals(rng):
    with pytest.raises(stsa.InvalidArgument, match="not a transformer stsa.diffusers knows"):
        stsa.diffusers.enable(torch.nn.Linear(2, 2), stsa.Policy())
    model = tiny_wan(layers=1)
    x = inputs(rng, 999)
    own_processors = [block.attn1.processor for block in model.blocks]
    own = forward(model, x)
    with pytest.raises(stsa.InvalidArgument, match="unknown model preset"):
        stsa.diffusers.enable(model, "wan9")
    with pytest.raises(stsa.InvalidArgument, match="policy must be"):
        stsa.diffusers.enable(model, 0.25)
    with pytest.raises(stsa.InvalidArgument, match="max_records"):
        stsa.diffusers.enable(model, stsa.Policy(), max_records=-1)
    sparse = stsa.diffusers.enable(model, stsa.Policy())
    with pytest.raises(stsa.InvalidArgument, match="disable what installed the other one"):
        stsa.diffusers.enable(model, stsa.Policy())
    assert [block.attn1.processor for block in model.blocks] != own_processors  # stsa's are installed
    with pytest.raises(stsa.Unsupported, match="no gradients"):
        model(**x)  # grad enabled: stsa has no backward pass
    hidden = torch.zeros(1, 10, 128)
    with torch.no_grad(), pytest.raises(stsa.Unsupported, match="10 query tokens"):
        model.blocks[0].attn1(hidden, None, None, None)  # a token count the transformer's input does not make
    with torch.no_grad(), pytest.raises(stsa.Unsupported, match="without an attention mask"):
        model.blocks[0].attn1(hidden, None, torch.ones(1, 10, 10, dtype=torch.bool), None)
    old_rotary = torch.ones(1, 1, 10, 32, dtype=torch.complex64)  # diffusers < 0.35 passed one complex table
    with torch.no_grad(), pytest.raises(stsa.Unsupported, match="rotary embedding"):
        model.blocks[0].attn1(hidden, None, None, old_rotary)
    sparse.disable()  # the refusals left the model as it was: its own processors, its own output to the bit
    assert [block.attn1.processor for block in model.blocks] == own_processors
    assert torch.equal(forward(model, x), own)


@needs(SKYREELS_V2)
def test_an_older_diffusers_processor_is_refused_with_the_release_stsa_needs():
    """SkyReels-V2's processor in diffusers 0.35 (SkyReelsV2AttnProcessor2_0) took a complex
    rotary table; stsa reproduces the one from 0.36 on, and says so."""
    model = tiny(SKYREELS_V2, layers=1)
    model.blocks[0].attn1.processor = type("SkyReelsV2AttnProcessor2_0", (), {})()
    with pytest.raises(stsa.InvalidArgument, match=r"SkyReelsV2AttnProcessor \(diffusers >= 0\.36\) only"):
        stsa.diffusers.enable(model, stsa.Policy())


@needs(HELIOS)
def test_helios_history_refusals(rng):
    """Helios's history is what precedes the video's tokens: fewer tokens than the video's,
    or the video's grid unknown (a call outside a forward), are refused."""
    helios = tiny(HELIOS, layers=1)
    with stsa.diffusers.enable(helios, stsa.Policy()), torch.no_grad():
        attn = helios.blocks[0].attn1
        with pytest.raises(stsa.Unsupported, match="fewer than the video's 120"):
            attn(torch.zeros(1, 100, 128), original_context_length=120)
        with pytest.raises(stsa.Unsupported, match="176 query tokens, but the transformer's input makes none"):
            attn(torch.zeros(1, 176, 128), original_context_length=120)


@needs(FRAMEPACK)
def test_framepack_history_refusals(rng):
    """Framepack's history precedes the video's tokens too: fewer tokens than the video's are refused."""
    framepack = tiny(FRAMEPACK, layers=1)
    with stsa.diffusers.enable(framepack, stsa.Policy()) as sparse, torch.no_grad():
        forward(framepack, inputs(rng, 999, spec=FRAMEPACK))  # the grid: 120 video tokens
        attn = framepack.transformer_blocks[0].attn
        with pytest.raises(stsa.Unsupported, match="fewer than the video's 120"):
            attn(torch.zeros(1, 100, 128), torch.zeros(1, 8, 128))
    assert len(sparse.records) == 1


@pytest.mark.parametrize("spec", [param(LTX, "ltx"), param(LTX2, "ltx2")])
def test_ltx_without_its_grid_is_refused(spec, rng):
    """LTX-Video's and LTX-2's tokens come packed: the grid is the forward's num_frames, height
    and width (LTX's conditioning pipeline passes token coordinates instead, for tokens no
    grid makes)."""
    model = tiny(spec, layers=1)
    x = inputs(rng, 999, spec=spec)
    del x["num_frames"]
    with stsa.diffusers.enable(model, stsa.Policy()), pytest.raises(stsa.InvalidArgument, match="num_frames"):
        forward(model, x)


@needs(KANDINSKY)
def test_kandinsky_with_its_own_sparse_attention_is_refused(rng):
    """Kandinsky 5's NABLA attention (sparse_params) reorders the tokens into 8 x 8 blocks
    and masks them its own way: refused before any layer runs, the model's own output back
    after disable()."""
    model = tiny(KANDINSKY, layers=1)
    x = {**inputs(rng, 999, spec=KANDINSKY), "sparse_params": {"to_fractal": True}}
    with stsa.diffusers.enable(model, stsa.Policy()) as sparse, pytest.raises(stsa.Unsupported, match="NABLA"):
        forward(model, x)
    assert not sparse.records


@needs(HELIOS)
def test_helios_keeps_a_bf16_models_keys_bf16(rng):
    """A bf16 Helios with its history's key scales in fp32, as from_pretrained leaves them:
    stsa's keys stay bf16 (diffusers' own processor makes them fp32 and its attention call
    refuses them), and the output is what diffusers gives with the scales rounded to bf16."""
    spec = dataclasses.replace(HELIOS, build=lambda layers: tiny_helios(layers, scale_in_fp32=True))
    model = tiny(spec, dtype=torch.bfloat16)
    assert model.blocks[0].attn1.history_key_scale.dtype == torch.float32
    x = inputs(rng, 999, dtype=torch.bfloat16, spec=spec)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)):
        ours = forward(model, x)
    for block in model.blocks:
        block.attn1.history_key_scale.data = block.attn1.history_key_scale.data.bfloat16()
    assert ours.dtype == torch.bfloat16
    assert relative_l2(ours, forward(model, x)) < 1e-2


@pytest.mark.parametrize("spec", [param(WAN, "wan"), param(HUNYUAN, "hunyuan"), param(SKYREELS_V2, "skyreels-v2"),
                                  param(LTX, "ltx"), param(HUNYUAN15, "hunyuan15"), param(CHRONOEDIT, "chronoedit"),
                                  param(LTX2, "ltx2"), param(KANDINSKY, "kandinsky"),
                                  param(WAN_ANIMATE, "wan-animate"), param(ANYFLOW, "anyflow"),
                                  param(HELIOS, "helios"), param(KANDINSKY6, "kandinsky6"), param(MOTIF, "motif")])
def test_regional_compilation_holds_stsa_as_one_operator(spec, rng):
    """diffusers' compile_repeated_blocks(fullgraph=True; a graph break would raise): each
    kind of block compiles once for every layer and step (the layer reaches the operator as a
    tensor, the step is read when it runs), stsa one operator in it, and the compiled
    model returns the eager one's bytes and makes the same decisions."""
    steps = [inputs(rng, timestep, spec=spec) for timestep in (999, 999, 500, 500)]
    graphs, ((eager, eager_records), (compiled, compiled_records)) = regional_compile_runs(
        tiny(spec, layers=3), steps, forward, {"dense_steps": 1, "density": 0.4, **ALL_SPARSE})
    # One graph per kind of block that holds stsa (HunyuanVideo's prompt refiner blocks
    # compile too, without it); a recompile would add one.
    assert [ops for ops in graphs if ops] == [1] * len(spec.blocks)
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    assert compiled_records == eager_records
    assert {route for record in eager_records for route in record[2]} - {"dense"}  # sparse steps were compiled


# The models whose own forward splits a whole-model compile (diffusers 0.42.1; compiled without stsa they
# split the same way): HunyuanVideo 1.5 branches on a tensor (`if is_t2v`) and indexes by a mask in a
# loop, FramePack calls .item(); dynamo runs the rest of the forward eagerly and compiles each kind of block's
# forward on its own (HunyuanVideo 1.5's two blocks share one graph, FramePack's two kinds have one each).
SPLIT_BY_THE_MODEL = {"hunyuan15": [0, 1, 0], "framepack": [0, 1, 1, 0]}


@pytest.mark.parametrize("spec", MODELS)
def test_a_whole_model_compile_breaks_at_the_step_hook_only(spec, rng):
    """torch.compile of the whole transformer: the hook that reads the timestep is left out
    (torch.compile runs a module's hooks outside the frame it traces; torch.compiler.disable
    where it would trace them), so the forward is one graph holding every layer's stsa
    operator; the second step recompiles nothing, and the eager bytes come back."""
    graphs, runs = [], []  # per graph compiled, its stsa operators; per graph run, the same

    def backend(gm, example_inputs):
        ops = sum(str(node.target) == "stsa.diffusers_attention" for node in gm.graph.nodes
                  if node.op == "call_function")
        graphs.append(ops)
        compiled = torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

        def run(*args):
            runs.append(ops)
            return compiled(*args)
        return run

    torch._dynamo.reset()
    model = tiny(spec)
    steps = [inputs(rng, timestep, spec=spec) for timestep in denoising(spec, 999, 500)]
    policy = {"dense_steps": 1, "density": 0.4, **ALL_SPARSE}
    with stsa.diffusers.enable(model, stsa.Policy(**policy)):
        eager = [forward(model, x) for x in steps]
    compiled_model = torch.compile(model, backend=backend)
    compiled, compiles = [], []
    with stsa.diffusers.enable(model, stsa.Policy(**policy)) as sparse:
        for x in steps:
            compiled.append(forward(compiled_model, x))
            compiles.append(len(graphs))
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    layers = len(attentions(model, spec))
    assert [(r.step, r.layer) for r in sparse.records] == [(step, layer) for step in (0, 1) for layer in range(layers)]
    assert sum(runs) == 2 * layers  # every stsa call of both steps ran in a compiled graph, none eagerly
    assert compiles[1] == compiles[0]  # the step is read when the operator runs: step 1 reuses step 0's graphs
    # stsa adds no graph break: one graph, or the model's own split (compiled without stsa, diffusers 0.42.1:
    # the same split, or more: Mochi's own processor breaks at its prompt mask's nonzero(), 11 graphs).
    assert graphs == SPLIT_BY_THE_MODEL.get(spec.name, [layers])


def test_a_model_compiled_before_stsa_is_enabled(rng):
    """enable() on what torch.compile returned (the pipeline's transformer replaced by it, as
    users do): stsa goes into the model the wrapper holds, the compiled calls recompile for
    it and give the eager bytes; disable() gives the model's own output back."""
    torch._dynamo.reset()
    model = tiny_wan()
    steps = [inputs(rng, timestep) for timestep in (999, 500)]
    policy = {"dense_steps": 1, "density": 0.4, **ALL_SPARSE}
    with stsa.diffusers.enable(model, stsa.Policy(**policy)):
        eager = [forward(model, x) for x in steps]
    own = forward(model, steps[1])
    compiled = torch.compile(model, backend="aot_eager")
    assert torch.equal(forward(compiled, steps[1]), own)  # compiled without stsa first
    pipe = types.SimpleNamespace(transformer=compiled)
    with stsa.diffusers.enable(pipe, stsa.Policy(**policy)) as sparse:
        ours = [forward(compiled, x) for x in steps]
    assert all(torch.equal(a, b) for a, b in zip(ours, eager))
    assert [(r.step, r.layer) for r in sparse.records] == [(step, layer) for step in (0, 1) for layer in range(2)]
    assert torch.equal(forward(compiled, steps[1]), own)
    torch._dynamo.reset()


def test_the_operator_passes_torch_opcheck(rng):
    model = tiny_wan(layers=1)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    forward(model, inputs(rng, 999))  # the grid, from a forward
    q, k, v = (torch.from_numpy(rng.standard_normal((1, WAN.grid.tokens, 2, 64)).astype(np.float32))
               for _ in range(3))
    torch.library.opcheck(torch.ops.stsa.diffusers_attention.default,
                          (q, k, v, sparse._id, torch.tensor(0), "bnhd", None, 0))
