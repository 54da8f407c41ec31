"""stsa.routed_attention and stsa.Policy: heads with a known structure are routed
to it, and every head's output matches the fp64 reference under the mask it ran with."""

import ml_dtypes
import numpy as np
import pytest

import reference
import stsa
from helpers import structured_heads


def test_heads_go_to_their_structure(rng):
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["spatial", "temporal", "temporal", "spatial"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    out, lse, info = stsa.routed_attention(q, k, v, grid, density=0.4, return_lse=True)
    assert info["routes"] == kinds
    assert info["temporal_heads"] == [1, 2]
    for head, kind in zip(info["heads"], kinds):
        errors = {c["route"]: c["mse"] for c in head["candidates"]}
        assert set(errors) == {"spatial", "temporal"}
        assert errors[kind] < min(e for r, e in errors.items() if r != kind)
    assert info["routing_ms"] > 0 and info["attention_ms"] > 0 and info["kept_tile_flops"] > 0
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))
    assert lse.shape == (1, 4, grid.tokens) and np.all(np.isfinite(lse))


def test_float8_heads_go_to_their_structure(rng):
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["spatial", "temporal", "temporal", "spatial"]
    q, k, v = (x.astype(ml_dtypes.float8_e4m3fn) for x in structured_heads(rng, grid, 64, kinds))
    out, info = stsa.routed_attention(q, k, v, grid, density=0.4)
    assert info["routes"] == kinds and out.dtype == ml_dtypes.bfloat16
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))


@pytest.mark.parametrize("dtype, head_dim", [(ml_dtypes.bfloat16, 72), (np.float16, 80)])
def test_head_dims_the_kernels_pad_go_to_their_structure(dtype, head_dim, rng):
    """On an AMX host these route on tile products and attend on the AMX kernel, both
    padded with zero channels (to 96); elsewhere on the fp32 path and AVX kernels."""
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["temporal", "spatial", "temporal"]
    q, k, v = (x.astype(dtype) for x in structured_heads(rng, grid, head_dim, kinds))
    out, info = stsa.routed_attention(q, k, v, grid, density=0.4)
    assert info["routes"] == kinds and out.dtype == dtype
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))


def test_each_kind_gets_its_own_density_and_the_anchor_option(rng):
    grid = stsa.VideoGrid(12, 5, 6, text=3)
    kinds = ["spatial", "temporal"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    out, info = stsa.routed_attention(q, k, v, grid, spatial_density=0.3, temporal_density=0.5, frames_density=0.2,
                                      try_frames=True, anchor=False)
    # (Which mask wins is not asserted: without the anchor a temporal mask serves frame 0's rows badly.)
    sized = {"spatial": 0.3, "temporal": 0.5, "frames": 0.2}
    for head in info["heads"]:
        for candidate in head["candidates"]:  # every candidate sized to its own kind's density, without the anchor
            p = stsa.plan(grid, candidate["route"], sized[candidate["route"]], anchor=False)
            assert (candidate["band"], candidate["frame_radius"], candidate["anchor"]) == (
                p["band"], p["frame_radius"], False)
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))


def test_unstructured_heads_stay_dense_under_a_strict_bound(rng):
    grid = stsa.VideoGrid(4, 6, 6)
    q, k, v = (rng.standard_normal((1, grid.tokens, 2, 64)).astype(np.float32) for _ in range(3))
    out, info = stsa.routed_attention(q, k, v, grid, density=0.1, max_rel_l2=1e-6)
    assert info["routes"] == ["dense", "dense"]
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))


def test_frame_window_candidate_when_asked(rng):
    grid = stsa.VideoGrid(6, 5, 5)
    q, k, v = structured_heads(rng, grid, 64, ["spatial"])
    _, info = stsa.routed_attention(q, k, v, grid, try_frames=True, frames_density=0.5)
    assert {c["route"] for c in info["heads"][0]["candidates"]} == {"spatial", "temporal", "frames"}


def test_policy_warm_up_routing_and_reuse(rng):
    grid = stsa.VideoGrid(9, 6, 6)
    kinds = ["temporal", "spatial"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    policy = stsa.Policy(dense_steps=1, dense_layers=1, reuse_steps=2, density=0.4)

    assert policy.dense(0, 3) and policy.dense(4, 0) and not policy.dense(1, 1)
    out, info = policy.attention(q, k, v, grid, step=0, layer=1)  # warm-up step
    assert info["routes"] == ["dense", "dense"] and policy.cached_count == 0
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))

    out, info = policy.attention(q, k, v, grid, step=1, layer=1)  # routed, remembered
    assert info["routes"] == kinds and info["routing_ms"] > 0 and policy.cached_count == 2
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))

    _, info = policy.attention(q, k, v, grid, step=2, layer=1)  # reused: no routing
    assert info["routes"] == kinds and info["routing_ms"] == 0

    _, info = policy.attention(q, k, v, grid, step=3, layer=1)  # past reuse_steps: routed again
    assert info["routes"] == kinds and info["routing_ms"] > 0

    policy.clear()
    assert policy.cached_count == 0


def test_an_untimed_call_reports_no_times_and_computes_the_same(rng):
    grid = stsa.VideoGrid(9, 6, 6, text=3)
    kinds = ["temporal", "spatial"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    timed_out, timed = stsa.routed_attention(q, k, v, grid, density=0.4)
    out, info = stsa.routed_attention(q, k, v, grid, density=0.4, timed=False)
    assert info["routes"] == timed["routes"] == kinds and info["routing_ms"] > 0  # routing is timed regardless
    assert info["attention_ms"] is None and info["permutation_ms"] is None
    # The CPU backend reads and stores the temporal heads in place: no permutation pass to time.
    assert timed["attention_ms"] > 0 and timed["permutation_ms"] == 0 and timed["gather_fused"]
    assert np.array_equal(out, timed_out)
    policy = stsa.Policy(density=0.4, reuse_steps=2)
    policy.attention(q, k, v, grid, step=0, layer=0)
    out, info = policy.attention(q, k, v, grid, step=1, layer=0, timed=False)  # reused: nothing routed
    assert info["routes"] == kinds and info["routing_ms"] == 0 and info["attention_ms"] is None
    reference.check(out, q, k, v, reference.head_masks(grid, info["heads"]))


def test_a_policy_made_from_anothers_settings_decides_alike_and_holds_its_own_decisions(rng):
    grid = stsa.VideoGrid(9, 6, 6)
    q, k, v = structured_heads(rng, grid, 64, ["temporal", "spatial"])
    policy = stsa.Policy(dense_steps=2, dense_layers=1, reuse_steps=3, density=0.4, temporal_density=0.3,
                         samples=32, seed=7, max_rel_l2=0.9, try_frames=True, anchor=False)
    twin = stsa.Policy(**policy.settings)
    assert twin.settings == policy.settings and twin.settings["temporal_density"] == 0.3
    policy.settings["dense_steps"] = 0  # a copy: the policy's own stays
    assert policy.settings["dense_steps"] == 2
    _, ours = policy.attention(q, k, v, grid, step=2, layer=1)
    assert twin.cached_count == 0
    _, theirs = twin.attention(q, k, v, grid, step=2, layer=1)
    assert ours["heads"] == theirs["heads"]
    assert stsa.Policy.from_preset("wan2.2-a14b-720p").settings["dense_steps"] == 10


def test_a_copied_or_pickled_policy_has_the_settings_and_no_decisions(rng):
    """copy.deepcopy and pickle (torch.save of a model holding a policy) raised TypeError on the
    native policy; copy.copy shared it, and its number, with the original."""
    import copy
    import pickle

    grid = stsa.VideoGrid(9, 6, 6)
    q, k, v = structured_heads(rng, grid, 64, ["temporal", "spatial"])
    policy = stsa.Policy(reuse_steps=4, density=0.4, temporal_density=0.3, samples=32, seed=5)
    _, ours = policy.attention(q, k, v, grid, step=0, layer=0)
    for copied in (copy.deepcopy(policy), copy.copy(policy), pickle.loads(pickle.dumps(policy))):
        assert copied.settings == policy.settings and copied.cached_count == 0 and policy.cached_count == 2
        assert copied._id != policy._id
        _, theirs = copied.attention(q, k, v, grid, step=0, layer=0)
        assert theirs["heads"] == ours["heads"]


def test_a_presets_density_is_every_kinds(rng):
    """A preset's one density for every mask kind is its policy's `density`, the kinds
    following it: a copy of its settings with another density routes at that density."""
    settings = stsa.Policy.from_preset("wan2.1-480p").settings
    assert settings["density"] == 0.25 and settings["spatial_density"] is settings["temporal_density"] is None
    grid = stsa.VideoGrid(frames=5, height=4, width=6)
    q, k, v = (rng.standard_normal((1, grid.tokens, 2, 64), dtype=np.float32) for _ in range(3))
    bands = {}
    for density in (0.4, 0.6):  # on this grid: bands of 3 and 20 tokens
        _, info = stsa.Policy(**{**settings, "density": density, "dense_steps": 0, "dense_layers": 0,
                                 "max_rel_l2": 1e9}).attention(q, k, v, grid, step=0, layer=0)
        bands[density] = {head["band"] for head in info["heads"]}
    assert bands == {0.4: {3}, 0.6: {20}}


def test_presets():
    names = [p["name"] for p in stsa.model_presets()]
    assert "wan2.1-720p" in names and "hunyuan-720p" in names and "cogvideox1.5" in names
    preset = stsa.model_preset("wan2.1-720p")
    assert (preset["grid"].frames, preset["grid"].height, preset["grid"].width) == (21, 45, 80)
    assert preset["grid"].tokens == 75_600 and preset["heads"] == 40 and preset["head_dim"] == 128
    assert preset["kv_heads"] == 40 and stsa.model_preset("cosmos3-720p")["kv_heads"] == 8  # grouped-query
    policy = stsa.Policy.from_preset("wan2.1-720p")
    steps = preset["policy"]["dense_steps"]
    assert policy.dense(steps - 1, 5) and not policy.dense(steps, 5)
    with pytest.raises(stsa.InvalidArgument, match="available: .*wan2.1-480p"):
        stsa.model_preset("sora")


def test_routing_alone_decides_as_routed_attention(rng):
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["temporal", "spatial", "spatial"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    decided = stsa.route(q, k, v, grid, density=0.4)
    out, info = stsa.routed_attention(q, k, v, grid, density=0.4)
    assert decided["routes"] == info["routes"] == kinds
    assert decided["heads"] == info["heads"]  # the same masks and the same measured errors
    assert decided["routing_ms"] > 0 and decided["flops"] > 0 and len(decided["sampled_rows"]) == 64
    # fp32 inputs: the pair paths take bf16, fp16 and fp8 only
    assert decided["tile_products"] is False and decided["product_units"] == "fma"
    # Attention run with those decisions is routed attention, to the bit.
    assert np.array_equal(stsa.attention(q, k, v, grid, decided["routes"], 0.4), out)


def test_a_call_with_fewer_tokens_than_samples_is_routed_on_every_row(rng):
    grid = stsa.VideoGrid(2, 3, 3, text=2)  # 20 tokens, fewer than the 64 default samples
    q, k, v = structured_heads(rng, grid, 64, ["temporal", "spatial"])
    every = stsa.route(q, k, v, grid, density=0.4)
    assert sorted(every["sampled_rows"]) == list(range(grid.tokens))
    exact = stsa.route(q, k, v, grid, density=0.4, samples=grid.tokens)
    assert every["sampled_rows"] == exact["sampled_rows"] and every["heads"] == exact["heads"]
    out, info = stsa.routed_attention(q, k, v, grid, density=0.4)
    assert info["routes"] == every["routes"]
    assert np.array_equal(stsa.attention(q, k, v, grid, every["routes"], 0.4), out)


def test_policy_routing_alone(rng):
    grid = stsa.VideoGrid(9, 6, 6)
    kinds = ["spatial", "temporal"]
    q, k, v = structured_heads(rng, grid, 64, kinds)
    policy = stsa.Policy(dense_steps=1, reuse_steps=2, density=0.4)
    warm = policy.route(q, k, v, grid, step=0, layer=0)
    assert warm["routes"] == ["dense", "dense"] and warm["routing"] is None
    routed = policy.route(q, k, v, grid, step=1, layer=0)
    assert routed["routes"] == kinds and routed["routing"]["routes"] == kinds and policy.cached_count == 2
    reused = policy.route(q, k, v, grid, step=2, layer=0)
    assert reused["routes"] == kinds and reused["routing"] is None
    assert reused["heads"][1]["band"] == routed["heads"][1]["band"]
