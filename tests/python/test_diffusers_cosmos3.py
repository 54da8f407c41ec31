"""stsa.diffusers on a tiny, randomly initialised Cosmos 3 transformer (diffusers >= 0.42;
the test skips elsewhere): one packed sequence of a prompt, a video of 5 x 4 x 6 patches and
6 sound tokens, grouped-query attention (4 query heads, 2 key heads). The model's own
processor is the yardstick for everything but the generated tokens' attention; the fp64
reference, with each head's mask evaluated from what the call reports, for that attention."""

import numpy as np
import pytest

import reference
import stsa

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
cosmos3 = pytest.importorskip("diffusers.models.transformers.transformer_cosmos3")
if not hasattr(torch.Tag, "cudagraph_unsafe"):
    pytest.skip(f"torch {torch.__version__}: stsa.diffusers needs torch >= 2.8", allow_module_level=True)

import stsa.diffusers  # noqa: E402  (needs torch)

from diffusers_helpers import regional_compile_runs  # noqa: E402
from torch_helpers import check  # noqa: E402

diffusers.utils.logging.set_verbosity_error()  # tiny() casts the model with .to(), which diffusers warns about
pytestmark = pytest.mark.filterwarnings("ignore::stsa.diffusers.DenseWarning")
ALL_SPARSE = {"max_rel_l2": 1e9}  # no head kept dense for its error: every routed head sparse

PROMPT, FRAMES, HEIGHT, WIDTH, SOUND = 7, 5, 4, 6, 6
VIDEO = FRAMES * HEIGHT * WIDTH
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
GRID = stsa.VideoGrid(FRAMES, HEIGHT, WIDTH, text=SOUND + PROMPT, text_placement="after")


def tiny(dtype=torch.float32, layers=2):
    torch.manual_seed(0)
    model = cosmos3.Cosmos3OmniTransformer(
        head_dim=HEAD_DIM, hidden_size=128, intermediate_size=64, latent_channel=4, latent_patch_size=2,
        num_attention_heads=HEADS, num_hidden_layers=layers, num_key_value_heads=KV_HEADS, patch_latent_dim=16,
        vocab_size=32, rope_axes_dim=(6, 5, 5), sound_dim=4, sound_gen=True)
    model = model.to(dtype)
    model.time_embedder.float()  # as from_pretrained keeps it (_keep_in_fp32_modules)
    return model.eval()


def inputs(rng, timestep, dtype=torch.float32, prompt=PROMPT):
    """As the pipeline packs one pass: the prompt's tokens, then the video's (frame 0 an image
    condition, not noisy), then the sound's; mRoPE positions counting on through the sequence."""
    total = prompt + VIDEO + SOUND
    noisy_frames = torch.arange(1, FRAMES)
    frame = HEIGHT * WIDTH
    video_from = prompt
    return {
        "input_ids": torch.from_numpy(rng.integers(0, 32, prompt)),
        "text_indexes": torch.arange(prompt),
        "position_ids": torch.arange(total).expand(3, total).contiguous(),
        "und_len": prompt,
        "sequence_length": total,
        "vision_tokens": [torch.from_numpy(rng.standard_normal((1, 4, FRAMES, 2 * HEIGHT, 2 * WIDTH),
                                                               dtype=np.float32)).to(dtype)],
        "vision_token_shapes": [(FRAMES, HEIGHT, WIDTH)],
        "vision_sequence_indexes": torch.arange(video_from, video_from + VIDEO),
        "vision_mse_loss_indexes": torch.arange(video_from + frame, video_from + VIDEO),
        "vision_timesteps": torch.full((len(noisy_frames) * frame,), float(timestep)),
        "vision_noisy_frame_indexes": [noisy_frames],
        "sound_tokens": [torch.from_numpy(rng.standard_normal((4, SOUND), dtype=np.float32)).to(dtype)],
        "sound_token_shapes": [(SOUND, 1, 1)],
        "sound_sequence_indexes": torch.arange(prompt + VIDEO, total),
        "sound_mse_loss_indexes": torch.arange(prompt + VIDEO, total),
        "sound_timesteps": torch.full((SOUND,), float(timestep)),
        "sound_noisy_frame_indexes": [torch.arange(SOUND)],
    }


def forward(model, x):
    with torch.no_grad():
        out = model(**x)
    return torch.cat([out.sample[0].flatten(), out.sound[0].flatten()])


def relative_l2(a, b):
    return float(torch.linalg.vector_norm((a - b).double()) / torch.linalg.vector_norm(b.double()))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_a_dense_policy_gives_the_models_own_output(dtype, tolerance, rng):
    model = tiny(dtype)
    x = inputs(rng, 999, dtype)
    own = forward(model, x)
    with stsa.diffusers.enable(model, stsa.Policy(dense_steps=1)) as sparse:
        ours = forward(model, x)
    assert relative_l2(ours, own) < tolerance
    assert [(r.step, r.layer, r.grid, r.routes) for r in sparse.records] == [
        (0, layer, GRID, ("dense",) * HEADS) for layer in range(2)]
    assert all(type(layer.self_attn.processor) is cosmos3.Cosmos3AttnProcessor for layer in model.layers)


def test_routed_layers_match_the_reference_on_the_models_own_qkv(rng, monkeypatch):
    """stsa's q, k, v against what the model's own processor hands its attention for the
    generated tokens (K and V with their own heads, grouped-query attention, the prompt's
    rows moved after the others'), and stsa's output against the fp64 reference with the
    masks it reports."""
    model = tiny()
    x = inputs(rng, 999)
    sparse = stsa.diffusers.enable(model, stsa.Policy(density=0.4, **ALL_SPARSE))
    layer_inputs, attended = {}, {}
    for layer, block in enumerate(model.layers):
        block.self_attn.register_forward_pre_hook(
            lambda _, args, layer=layer: layer_inputs.setdefault(layer, args))
    attend = sparse._attend

    def attend_and_keep(layer, q, k, v, layout, prompt_mask=None, history=0):
        return attended.setdefault(layer, (q, k, v, attend(layer, q, k, v, layout, prompt_mask, history)))[3]

    monkeypatch.setattr(sparse, "_attend", attend_and_keep)
    forward(model, x)
    sparse.disable()

    calls = []
    monkeypatch.setattr(cosmos3, "dispatch_attention_fn", lambda q, k, v, **kw: calls.append((q, k, v, kw)) or q)
    routes = set()
    for layer, block in enumerate(model.layers):
        calls.clear()
        with torch.no_grad():
            block.self_attn(*layer_inputs[layer])
        (_, _, _, causal), (q_gen, k_all, v_all, full) = calls
        assert causal["is_causal"] and not full["is_causal"]
        q, k, v, out = attended[layer]
        generated = VIDEO + SOUND
        assert torch.equal(q[0, :generated], q_gen[0])
        for ours, theirs in ((k, k_all), (v, v_all)):
            assert torch.equal(ours[0], torch.cat([theirs[0, PROMPT:], theirs[0, :PROMPT]]))
            assert ours.shape[2] == KV_HEADS < HEADS
        heads = sparse.last_info[layer]["heads"]
        routes.update(h["route"] for h in heads)
        check(out, q, k, v, reference.head_masks(GRID, heads))
    assert routes - {"dense"}, "every head ran dense: the test would not see a sparse mask"


def test_the_guidance_pass_with_another_prompt_length_is_the_same_step(rng):
    model = tiny()
    with stsa.diffusers.enable(model, stsa.Policy(density=0.4, reuse_steps=2)) as sparse:
        for timestep in (999, 500):
            forward(model, inputs(rng, timestep))
            forward(model, inputs(rng, timestep, prompt=3))  # the negative prompt's pass
    short = stsa.VideoGrid(FRAMES, HEIGHT, WIDTH, text=SOUND + 3, text_placement="after")
    assert [(r.step, r.grid) for r in sparse.records if r.layer == 0] == [(0, GRID), (0, short), (1, GRID),
                                                                        (1, short)]
    # Routed once, at step 0's first pass; the rest reuse its decisions.
    assert [r.routing_ms > 0 for r in sparse.records if r.layer == 0] == [True, False, False, False]


def test_regional_compilation_holds_stsa_as_one_operator(rng):
    """compile_repeated_blocks(fullgraph=True; a graph break would raise): the decoder layer
    compiles once for every layer and step, stsa one operator in it, the prompt's causal
    attention diffusers' own; the compiled model returns the eager one's bytes and decisions."""
    steps = [inputs(rng, timestep) for timestep in (999, 999, 500, 500)]
    graphs, ((eager, eager_records), (compiled, compiled_records)) = regional_compile_runs(
        tiny(layers=3), steps, forward, {"dense_steps": 1, "density": 0.4, **ALL_SPARSE})
    assert graphs == [1]
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    assert compiled_records == eager_records
    assert {route for record in eager_records for route in record[2]} - {"dense"}  # sparse steps were compiled


def test_refusals(rng):
    model = tiny()
    x = inputs(rng, 999)
    with stsa.diffusers.enable(model, "wan2.1-480p"):
        two_videos = {**x, "vision_token_shapes": [(FRAMES, HEIGHT, WIDTH)] * 2}
        with pytest.raises(stsa.Unsupported, match="2 videos in one packed sequence"):
            forward(model, two_videos)
        shuffled = {**x, "vision_sequence_indexes": x["vision_sequence_indexes"].flip(0)}
        with pytest.raises(stsa.Unsupported, match="directly follow the prompt's"):
            forward(model, shuffled)
        quiet = {**x, "vision_timesteps": torch.zeros(0), "sound_timesteps": None}
        with pytest.raises(stsa.InvalidArgument, match="no noisy token"):
            forward(model, quiet)
        model._cp_shard_fn = lambda *parts: parts
        try:
            with pytest.raises(stsa.Unsupported, match="its own context parallelism"):
                forward(model, x)
        finally:
            del model._cp_shard_fn
