"""An fp64 NumPy reference for the Python package's tests, written from the
definitions in include/stsa/mask.hpp and attention.hpp, sharing no code with
the library: the mask is evaluated pair by pair from token coordinates."""

from __future__ import annotations

import numpy as np


def coordinates(frames: int, height: int, width: int, text: int, text_before: bool):
    """Per frame-major position: is_text, frame, patch (-1 for text)."""
    per_frame = height * width
    video = frames * per_frame
    begin = text if text_before else 0
    positions = np.arange(video + text)
    rel = positions - begin
    is_text = (rel < 0) | (rel >= video)
    frame = np.where(is_text, -1, rel // per_frame)
    patch = np.where(is_text, -1, rel % per_frame)
    return is_text, frame, patch


def allowed(grid, route: str, band: int = -1, frame_radius: int = -1, anchor: bool = True) -> np.ndarray:
    """[N, N] booleans: may query i (row) see key j (column), tokens in frame-major order."""
    is_text, frame, patch = coordinates(grid.frames, grid.height, grid.width, grid.text,
                                        grid.text_placement == "before")
    per_frame = grid.height * grid.width
    if route == "dense":
        kept = np.ones((len(frame), len(frame)), dtype=bool)
    elif route == "spatial":
        pos = frame * per_frame + patch
        kept = np.abs(pos[:, None] - pos[None, :]) <= band
    elif route == "temporal":
        # Spatial-major with frame 0 in front: (f, p) sits at p for f = 0, else P + p (F - 1) + f - 1.
        pos = np.where(frame == 0, patch, per_frame + patch * (grid.frames - 1) + frame - 1)
        kept = np.abs(pos[:, None] - pos[None, :]) <= band
    elif route == "frames":
        kept = np.abs(frame[:, None] - frame[None, :]) <= frame_radius
    else:
        raise ValueError(route)
    if anchor:
        kept |= (frame[:, None] == 0) | (frame[None, :] == 0)
    kept |= is_text[:, None] | is_text[None, :]
    return kept


def ungrouped(q, k, v):
    """q, k, v as float64 arrays with K and V holding q's heads: grouped-query attention's
    fewer K/V heads repeated by its definition (query head h reads K/V head h // (H // Hkv))."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    return q, np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)


def attention(q, k, v, masks, scale=None, precision=np.float64):
    """O [B, N, H, D] and LSE [B, H, N] computed in `precision` (fp64: the reference;
    fp32: a naive same-precision run, the yardstick of the bounds below); masks: one
    [N, N] array per head. A row with no allowed key gets O = 0 and LSE = -inf. K and V
    may hold fewer heads than Q (grouped-query attention)."""
    q, k, v = (x.astype(precision) for x in ungrouped(q, k, v))
    batch, tokens, heads, dim = q.shape
    scale = precision(1.0 / np.sqrt(dim) if scale is None else scale)
    out = np.zeros((batch, tokens, heads, dim), dtype=precision)
    lse = np.full((batch, heads, tokens), -np.inf, dtype=precision)
    for b in range(batch):
        for h in range(heads):
            scores = scale * q[b, :, h, :] @ k[b, :, h, :].T
            scores = np.where(masks[h], scores, -np.inf)
            row_max = scores.max(axis=1, keepdims=True)
            has_key = np.isfinite(row_max[:, 0])
            weights = np.where(has_key[:, None], np.exp(scores - np.where(has_key[:, None], row_max, 0)), 0)
            total = weights.sum(axis=1, keepdims=True)
            out[b, :, h, :] = np.where(has_key[:, None], weights @ v[b, :, h, :] / np.where(has_key[:, None], total, 1),
                                       0)
            lse[b, h, :] = np.where(has_key, row_max[:, 0] + np.log(np.where(has_key, total[:, 0], 1)), -np.inf)
    return out, lse


UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def score_rounding(q, k, v, scale=None):
    """How far fp32 rounding of the scores can move a logit, and O with it: a sum of D
    products is off by about u * sum_d |q_d k_d| <= u * |q| |k| (Cauchy-Schwarz) in
    any order, and a logit off by e moves O by at most e * max |v_j - O| <= 2 e max |v|.
    LSE moves with the logits one for one: its error measured up to 2.7x the first
    term (median 1.15x, fp32 kernel at 4x N(0, 1) inputs), so check takes 4x it.
    The floor of check's bounds does not grow with the logits; this does (with inputs
    at 3-4x N(0, 1), 2-12% of fp32 calls failed without it, none of 4,000 with it)."""
    q, k, v = ungrouped(q, k, v)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    per_head = 2.0**-24 * abs(scale) * np.linalg.norm(q, axis=-1).max(axis=1) * np.linalg.norm(k, axis=-1).max(axis=1)
    return per_head.max(), (2 * per_head * np.abs(v).max(axis=(1, 3))).max()


def check(out, q, k, v, masks, scale=None, lse=None, out_type=None, round_to_out=None):
    """Asserts that `out` (and `lse`) match the fp64 reference within FlashAttention's
    rule, as the C++ tests bound them: twice what a naive fp32 implementation with
    the output's type gets wrong, plus a rounding floor, plus what the scores' fp32
    rounding can do (score_rounding). `out_type` and
    `round_to_out` name the output's type and round to it, where `out` holds its
    values in a wider NumPy type (default: out's own dtype)."""
    out_type = out_type or np.dtype(out.dtype).name
    round_to_out = round_to_out or (lambda x: x.astype(out.dtype))
    ref_out, ref_lse = attention(q, k, v, masks, scale)
    naive_out, naive_lse = attention(q, k, v, masks, scale, np.float32)
    naive_out = np.asarray(round_to_out(naive_out), dtype=np.float64)  # rounded as the kernels' output is
    got = np.asarray(out, dtype=np.float64)
    finite = np.isfinite(ref_lse)
    unit = UNIT_ROUNDOFF[out_type]
    logit_rounding, output_rounding = score_rounding(q, k, v, scale)
    tolerance = 2 * np.abs(naive_out - ref_out).max() + (4 * unit + 16 * 2.0**-24) * max(
        1.0, np.abs(ref_out).max()) + output_rounding
    error = np.abs(got - ref_out).max()
    assert error <= tolerance, f"max |O - ref| = {error:.3g} > tolerance {tolerance:.3g}"
    if lse is not None:
        assert np.array_equal(np.isfinite(lse), finite) and np.all(lse[~finite] == ref_lse[~finite])
        ref_finite = ref_lse[finite]
        lse_tolerance = 2 * np.abs(naive_lse[finite] - ref_finite).max(initial=0) + 8 * 2.0**-24 * max(
            1.0, np.abs(ref_finite).max(initial=0)) + 4 * logit_rounding
        lse_error = np.abs(lse[finite] - ref_finite).max(initial=0)
        assert lse_error <= lse_tolerance, f"max |LSE - ref| = {lse_error:.3g} > tolerance {lse_tolerance:.3g}"


def head_masks(grid, heads_info):
    """The [N, N] mask of every head from what a call reports it ran (route, band, radius, anchor)."""
    return [allowed(grid, h["route"], h["band"], h["frame_radius"], h["anchor"]) for h in heads_info]
