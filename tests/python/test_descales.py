"""Per-(batch, head) descales (FlashAttention-3's q_descale, k_descale, v_descale): a call
on quantized inputs with them matches the fp64 reference on the dequantized values."""

import ml_dtypes
import numpy as np
import pytest

import reference
import stsa
from helpers import masks_for

GRID = stsa.VideoGrid(9, 5, 4, text=3, text_placement="before")  # 183 tokens: ragged tiles
ROUTES = ["temporal", "spatial", "frames"]


def quantized(rng, batch=2, heads=3, head_dim=64):
    """float8 q, k, v of values spread over E4M3's range, with [B, H] descales in [1/4, 4]."""
    shape = (batch, GRID.tokens, heads, head_dim)
    q8, k8, v8 = ((rng.standard_normal(shape) * 48).astype(ml_dtypes.float8_e4m3fn) for _ in range(3))
    descales = [np.exp2(rng.uniform(-2, 2, (batch, heads))).astype(np.float32) for _ in range(3)]
    return (q8, k8, v8), descales


def dequantized(values, descales):
    """The values the descales stand for: x[b, :, h, :] * descale[b, h], in fp64 (exact)."""
    return [x.astype(np.float64) * d.astype(np.float64)[:, None, :, None] for x, d in zip(values, descales)]


@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_float8_with_descales_matches_the_reference_on_the_dequantized_values(backend, head_dim, rng):
    (q8, k8, v8), (qd, kd, vd) = quantized(rng, head_dim=head_dim)
    out, lse = stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, backend=backend, return_lse=True, q_descale=qd,
                              k_descale=kd, v_descale=vd)
    assert out.dtype == ml_dtypes.bfloat16
    reference.check(out, *dequantized((q8, k8, v8), (qd, kd, vd)), masks_for(GRID, ROUTES, 0.5), lse=lse)


def test_a_number_is_that_descale_for_every_head(rng):
    (q8, k8, v8), _ = quantized(rng)
    full = [np.full((2, 3), value, np.float32) for value in (0.5, 0.25, 3.0)]
    by_arrays = stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, q_descale=full[0], k_descale=full[1], v_descale=full[2])
    by_numbers = stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, q_descale=0.5, k_descale=0.25, v_descale=3.0)
    assert np.array_equal(by_arrays.view(np.uint16), by_numbers.view(np.uint16))
    # One descale alone: q's scales the scores as ``scale`` would.
    by_scale = stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, scale=0.5 / 8)
    assert np.array_equal(stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, q_descale=0.5).view(np.uint16),
                          by_scale.view(np.uint16))


def test_routed_attention_routes_and_runs_the_dequantized_values(rng):
    (q8, k8, v8), (qd, kd, vd) = quantized(rng)
    out, lse, info = stsa.routed_attention(q8, k8, v8, GRID, 0.5, samples=32, return_lse=True, q_descale=qd,
                                           k_descale=kd, v_descale=vd)
    reference.check(out, *dequantized((q8, k8, v8), (qd, kd, vd)), reference.head_masks(GRID, info["heads"]), lse=lse)
    # The same routing as route() alone, and as a policy's, with the same descales.
    routing = stsa.route(q8, k8, v8, GRID, 0.5, samples=32, q_descale=qd, k_descale=kd, v_descale=vd)
    assert routing["routes"] == info["routes"]
    policy = stsa.Policy(density=0.5, samples=32)
    decided = policy.route(q8, k8, v8, GRID, step=0, layer=0, q_descale=qd, k_descale=kd, v_descale=vd)
    assert decided["routes"] == info["routes"]
    policy.clear()
    by_policy, _ = policy.attention(q8, k8, v8, GRID, step=0, layer=0, q_descale=qd, k_descale=kd, v_descale=vd)
    assert np.array_equal(by_policy.view(np.uint16), out.view(np.uint16))


@pytest.mark.parametrize("bad,message", [
    (np.ones((3, 2), np.float32), r"q_descale must be \[B, H\] = \[2, 3\]"),
    (np.ones(6, np.float32), r"q_descale must be \[B, H\] = \[2, 3\]"),
    ("half", "q_descale must be a number or a"),
    (np.full((2, 3), np.nan, np.float32), "q_descale must be finite and > 0, got nan"),
    (np.zeros((2, 3), np.float32), "q_descale must be finite and > 0, got 0"),
    (-1.0, "q_descale must be finite and > 0, got -1"),
])
def test_bad_descales_are_refused_and_nothing_is_written(bad, message, rng):
    (q8, k8, v8), _ = quantized(rng)
    out = np.full(q8.shape, np.nan, np.float32)
    with pytest.raises(stsa.InvalidArgument, match=message):
        stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, out=out, q_descale=bad)
    assert np.isnan(out).all()


def test_torch_tensors_as_descales(rng):
    torch = pytest.importorskip("torch")
    (q8, k8, v8), (qd, kd, vd) = quantized(rng)
    tq, tk, tv = (torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (q8, k8, v8))
    by_numpy = stsa.attention(q8, k8, v8, GRID, ROUTES, 0.5, q_descale=qd, k_descale=kd, v_descale=vd)
    by_torch = stsa.attention(tq, tk, tv, GRID, ROUTES, 0.5, q_descale=torch.from_numpy(qd),
                              k_descale=torch.from_numpy(kd).double(), v_descale=torch.from_numpy(vd))
    assert np.array_equal(by_torch.view(torch.int16).numpy().view(np.uint16), by_numpy.view(np.uint16))
