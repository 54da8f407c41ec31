"""stsa.attention against the fp64 reference, on fresh random inputs and awkward shapes."""

import os

import ml_dtypes
import numpy as np
import pytest

import reference
import stsa
from helpers import masks_for

# (frames, height, width, text, placement): one frame (every mask is the anchor's:
# dense), token counts that are not tile multiples, text before and after the
# video, a grid taller than wide. From 9 frames on, the frame-0 anchor keeps at
# most 21% of the pairs, so at density 0.5 every band and frame radius is real
# (helpers.masks_for refuses one below 1).
GRIDS = [
    (1, 5, 7, 0, "after"),
    (10, 4, 3, 0, "after"),
    (9, 5, 4, 11, "before"),
    (16, 3, 3, 7, "after"),
]
DENSITY = 0.5


def random_qkv(rng, shape, dtype=np.float32):
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("grid_args", GRIDS)
@pytest.mark.parametrize("route", ["dense", "spatial", "temporal", "frames"])
@pytest.mark.parametrize("head_dim", [64, 80, 128, 59])
def test_matches_reference_fp32(grid_args, route, head_dim, rng):
    grid = stsa.VideoGrid(*grid_args)
    q, k, v = random_qkv(rng, (2, grid.tokens, 3, head_dim))
    out, lse = stsa.attention(q, k, v, grid, route, DENSITY, return_lse=True)
    assert out.dtype == np.float32 and out.shape == q.shape and lse.shape == (2, 3, grid.tokens)
    reference.check(out, q, k, v, masks_for(grid, [route] * 3, DENSITY), lse=lse)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("head_dim", [64, 59, 72])  # no kernel is built for 59 or 72: padded to 64 and 96 / 80
def test_half_precision_inputs(dtype, backend, head_dim, rng):
    grid = stsa.VideoGrid(9, 5, 4, text=4, text_placement="before")
    q, k, v = random_qkv(rng, (1, grid.tokens, 2, head_dim), dtype)
    out = stsa.attention(q, k, v, grid, ["temporal", "spatial"], DENSITY, backend=backend)
    assert out.dtype == dtype
    reference.check(out, q, k, v, masks_for(grid, ["temporal", "spatial"], DENSITY))  # on the same rounded inputs


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_float8_inputs_give_a_bfloat16_out_unless_one_is_given(backend, head_dim, rng):
    grid = stsa.VideoGrid(9, 5, 4, text=3, text_placement="after")
    q, k, v = random_qkv(rng, (2, grid.tokens, 2, head_dim), ml_dtypes.float8_e4m3fn)
    masks = masks_for(grid, ["temporal", "spatial"], DENSITY)
    out, lse = stsa.attention(q, k, v, grid, ["temporal", "spatial"], DENSITY, backend=backend, return_lse=True)
    assert out.dtype == ml_dtypes.bfloat16  # float8 is no output type
    reference.check(out, q, k, v, masks, lse=lse)  # on the float8 values themselves
    given = np.empty(q.shape, np.float32)
    assert stsa.attention(q, k, v, grid, ["temporal", "spatial"], DENSITY, backend=backend, out=given) is given
    reference.check(given, q, k, v, masks)
    with pytest.raises(stsa.InvalidArgument, match="o must be fp32, bf16 or fp16, got fp8_e4m3"):
        stsa.attention(q, k, v, grid, out=np.empty_like(q))
    with pytest.raises(stsa.InvalidArgument, match="share a dtype"):
        stsa.attention(q, k, v.astype(ml_dtypes.bfloat16), grid)


def test_float8_descales_fold_into_scale_and_out(rng):
    """A model's per-tensor descales (x = x8 * descale) fold in exactly as the docs say:
    q's and k's into the softmax scale, v's onto out."""
    grid = stsa.VideoGrid(4, 4, 5)
    q, k, v = random_qkv(rng, (1, grid.tokens, 1, 64), np.float32)
    descales = [0.37, 2.5, 0.06]
    q8, k8, v8 = ((x / s).astype(ml_dtypes.float8_e4m3fn) for x, s in zip((q, k, v), descales))
    out = stsa.attention(q8, k8, v8, grid, "spatial", DENSITY, scale=descales[0] * descales[1] / 8.0,
                         out=np.empty(q.shape, np.float32)) * descales[2]
    dequantized = [x.astype(np.float32) * s for x, s in zip((q8, k8, v8), descales)]
    reference.check(out, *dequantized, masks_for(grid, ["spatial"], DENSITY))


def test_large_logits_are_rounding_not_errors(rng):
    """Inputs at 4x N(0, 1) make logits ~16x the usual, and fp32 rounding of the scores
    grows with them: without reference.score_rounding in its bound, check failed 187
    of 400 such calls (measured), and with it none."""
    grid = stsa.VideoGrid(2, 3, 5)
    for _ in range(12):
        q, k, v = (4 * x for x in random_qkv(rng, (1, grid.tokens, 2, 128)))
        out, lse = stsa.attention(q, k, v, grid, "dense", return_lse=True)
        reference.check(out, q, k, v, masks_for(grid, ["dense"] * 2, 1.0), lse=lse)


def test_one_mask_per_head_and_head_major_memory(rng):
    grid = stsa.VideoGrid(10, 4, 3, text=3)
    routes = ["dense", "temporal", "spatial", "frames"]
    q, k, v = random_qkv(rng, (1, 4, grid.tokens, 64))  # [B, H, N, D]
    out = stsa.attention(q, k, v, grid, routes, DENSITY, layout="bhnd")
    assert out.shape == q.shape
    bnhd = (x.transpose(0, 2, 1, 3) for x in (q, k, v, out))
    q, k, v, out = bnhd
    reference.check(out, q, k, v, masks_for(grid, routes, DENSITY))


def test_strided_views_are_read_and_written_in_place(rng):
    grid = stsa.VideoGrid(9, 3, 4)
    # Every other channel of a wider array, and an output that is a slice of a larger buffer.
    wide = [rng.standard_normal((1, grid.tokens, 2, 128)).astype(np.float32) for _ in range(3)]
    q, k, v = (w[..., ::2] for w in wide)
    buffer = np.full((1, grid.tokens, 3, 64), 7.0, dtype=np.float32)
    out = buffer[:, :, 1:, :]
    returned = stsa.attention(q, k, v, grid, "spatial", DENSITY, out=out)
    assert returned is out
    reference.check(out, q, k, v, masks_for(grid, ["spatial"] * 2, DENSITY))
    assert np.all(buffer[:, :, 0, :] == 7.0)  # the head outside the view is untouched


def test_inputs_are_not_modified(rng):
    grid = stsa.VideoGrid(9, 4, 4, text=2)
    q, k, v = random_qkv(rng, (1, grid.tokens, 2, 64))
    copies = [x.copy() for x in (q, k, v)]
    stsa.attention(q, k, v, grid, "temporal", DENSITY)
    for before, after in zip(copies, (q, k, v)):
        assert np.array_equal(before, after)


def test_explicit_scale_and_rows_without_keys(rng):
    grid = stsa.VideoGrid(3, 4, 4)
    q, k, v = random_qkv(rng, (1, grid.tokens, 1, 64))
    # Density 0 without the anchor keeps only the diagonal band 0: each row sees itself.
    out, lse = stsa.attention(q, k, v, grid, "spatial", 0.0, anchor=False, scale=0.3, return_lse=True)
    reference.check(out, q, k, v, masks_for(grid, ["spatial"], 0.0, anchor=False), scale=0.3, lse=lse)
    # A frame window of radius -1 without the anchor keeps nothing: O = 0, LSE = -inf.
    assert stsa.plan(grid, "frames", 0.0, anchor=False)["frame_radius"] == -1
    out, lse = stsa.attention(q, k, v, grid, "frames", 0.0, anchor=False, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_rounded_plan_reports_its_changes_and_reaches_the_kernel(rng):
    grid = stsa.VideoGrid(12, 8, 9, text=5)
    tile = (64, 64)
    q, k, v = random_qkv(rng, (1, grid.tokens, 1, 64))
    exact = stsa.plan(grid, "spatial", 0.3, tile=tile)
    rounded = stsa.plan(grid, "spatial", 0.3, tile=tile, align="round")
    assert exact["band"] >= 1 and rounded["tiles_partial"] == 0
    assert rounded["changed_pairs"] == rounded["added_pairs"] + rounded["removed_pairs"]
    assert rounded["kept_pairs"] - exact["kept_pairs"] == rounded["added_pairs"] - rounded["removed_pairs"]
    # The rounded plan's pairs from the exact mask: each partial tile, row by row, made full or empty,
    # whichever keeps the running surplus of kept pairs nearer zero (a tie: full), as the plan builder rounds.
    mask = reference.allowed(grid, "spatial", exact["band"])
    assert mask.sum() == exact["exact_kept_pairs"]
    rounded_mask, surplus = mask.copy(), 0
    for row in range(0, grid.tokens, tile[0]):
        for col in range(0, grid.tokens, tile[1]):
            block = rounded_mask[row : row + tile[0], col : col + tile[1]]
            kept = int(block.sum())
            if 0 < kept < block.size:
                full = abs(surplus + block.size - kept) <= abs(surplus - kept)
                surplus += block.size - kept if full else -kept
                block[:] = full
    assert rounded_mask.sum() == rounded["kept_pairs"]
    assert np.count_nonzero(rounded_mask & ~mask) == rounded["added_pairs"]
    assert np.count_nonzero(mask & ~rounded_mask) == rounded["removed_pairs"]
    # align reaches the kernel: it attends over the rounded pairs, and those rounding changed change the output.
    assert rounded["changed_pairs"] > 0
    out = stsa.attention(q, k, v, grid, "spatial", 0.3, tile=tile, align="round")
    reference.check(out, q, k, v, [rounded_mask])
    exact_out = stsa.attention(q, k, v, grid, "spatial", 0.3, tile=tile)
    assert not np.allclose(out, exact_out, rtol=0, atol=1e-3)


def test_concurrent_calls_from_threads(rng):
    import concurrent.futures

    grid = stsa.VideoGrid(9, 6, 6)
    problems = [random_qkv(rng, (1, grid.tokens, 2, 64)) for _ in range(4)]
    serial = [stsa.attention(*p, grid, "temporal", DENSITY) for p in problems]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda p: stsa.attention(*p, grid, "temporal", DENSITY), problems))
    for a, b in zip(serial, threaded):
        assert np.array_equal(a, b)


def test_the_interpreter_runs_while_a_call_computes(rng):
    """The GIL is released during the computation: another Python thread keeps
    running. With the GIL held it would stand still for the whole call, so its
    longest pause would be the call's length; here it must be far shorter."""
    import threading
    import time

    grid = stsa.VideoGrid(9, 12, 12)
    # One head under AddressSanitizer, whose instrumented fp64 loops take ~3 s for it (11 s for four).
    heads = 1 if "asan" in os.environ.get("LD_PRELOAD", "") else 4
    q, k, v = random_qkv(rng, (1, grid.tokens, heads, 128))
    done, call_s = threading.Event(), []

    def call():
        start = time.perf_counter()
        stsa.attention(q, k, v, grid, "dense", 1.0, backend="reference")  # fp64 loops: about a second
        call_s.append(time.perf_counter() - start)
        done.set()

    worker = threading.Thread(target=call)
    last, longest_pause = time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():
        now = time.perf_counter()
        longest_pause, last = max(longest_pause, now - last), now
    worker.join()
    assert call_s[0] > 0.2, "the call is too short to tell"
    assert longest_pause < 0.5 * call_s[0], f"this thread stood still {longest_pause:.3f} s of a {call_s[0]:.3f} s call"


@pytest.mark.parametrize("kv_heads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_grouped_kv_heads_are_the_repeated_call(kv_heads, dtype, rng):
    """K and V with fewer heads than Q (grouped-query attention): query head h reads K/V head
    h // (H // Hkv), which is the call on K and V repeated per query head, bit for bit, and
    within the fp64 reference's bound; routing and routed attention alike."""
    grid = stsa.VideoGrid(9, 5, 4, text=11, text_placement="before")
    routes = ["temporal", "spatial", "frames", "dense", "temporal", "spatial"]
    q = rng.standard_normal((2, grid.tokens, 6, 80)).astype(dtype)
    k, v = (rng.standard_normal((2, grid.tokens, kv_heads, 80)).astype(dtype) for _ in range(2))
    k_rep, v_rep = (np.repeat(x, 6 // kv_heads, axis=2) for x in (k, v))
    out, lse = stsa.attention(q, k, v, grid, routes, DENSITY, return_lse=True)
    out_rep, lse_rep = stsa.attention(q, k_rep, v_rep, grid, routes, DENSITY, return_lse=True)
    assert np.array_equal(out, out_rep) and np.array_equal(lse, lse_rep)
    reference.check(out, q, k, v, masks_for(grid, routes, DENSITY), lse=lse)
    routed, info = stsa.routed_attention(q, k, v, grid, DENSITY, samples=16)
    routed_rep, info_rep = stsa.routed_attention(q, k_rep, v_rep, grid, DENSITY, samples=16)
    assert np.array_equal(routed, routed_rep)
    assert [h["candidates"] for h in info["heads"]] == [h["candidates"] for h in info_rep["heads"]]


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_kv_broadcast_over_the_heads_is_multi_query_attention(layout, rng):
    """K and V broadcast over the heads (NumPy's broadcast_to: head stride 0, read-only) are
    one K/V head's values: the grouped call with one K/V head, bit for bit, uncopied; and
    within the fp64 reference's bound. One of them broadcast alone is refused by name."""
    grid = stsa.VideoGrid(9, 5, 4, text=5)
    heads_axis = 2 if layout == "bnhd" else 1
    shape = [2, grid.tokens, 4, 64] if layout == "bnhd" else [2, 4, grid.tokens, 64]
    q = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    one = list(shape)
    one[heads_axis] = 1
    k1, v1 = (rng.standard_normal(one).astype(ml_dtypes.bfloat16) for _ in range(2))
    kb, vb = (np.broadcast_to(x, shape) for x in (k1, v1))
    assert kb.strides[heads_axis] == 0 and not kb.flags.writeable
    routes = ["temporal", "spatial", "dense", "frames"]
    out, lse = stsa.attention(q, kb, vb, grid, routes, DENSITY, layout=layout, return_lse=True)
    out_one, lse_one = stsa.attention(q, k1, v1, grid, routes, DENSITY, layout=layout, return_lse=True)
    assert np.array_equal(out, out_one) and np.array_equal(lse, lse_one)
    as_bnhd = (lambda x: x) if layout == "bnhd" else (lambda x: np.swapaxes(x, 1, 2))
    reference.check(as_bnhd(out), as_bnhd(q), as_bnhd(kb), as_bnhd(vb), masks_for(grid, routes, DENSITY), lse=lse)
    routed, info = stsa.routed_attention(q, kb, vb, grid, DENSITY, samples=16, layout=layout)
    routed_one, info_one = stsa.routed_attention(q, k1, v1, grid, DENSITY, samples=16, layout=layout)
    assert np.array_equal(routed, routed_one)
    assert [h["candidates"] for h in info["heads"]] == [h["candidates"] for h in info_one["heads"]]
    with pytest.raises(stsa.InvalidArgument, match=r"^v is broadcast over the heads \(stride 0\) and k is not: "
                                                   r"broadcast both \(multi-query attention\) or neither$"):
        stsa.attention(q, np.ascontiguousarray(kb), vb, grid, layout=layout)
    wider = list(shape)
    wider[heads_axis] = 8  # broadcast or not, K and V's head count must divide q's 4
    with pytest.raises(stsa.InvalidArgument, match="k and v hold 8 heads: grouped-query attention needs a count"):
        stsa.attention(q, np.broadcast_to(k1, wider), np.broadcast_to(v1, wider), grid, layout=layout)
    batch_broadcast = np.broadcast_to(q[:1], shape)  # any other broadcast is still two elements at one address
    with pytest.raises(stsa.InvalidArgument, match="k has overlapping strides"):
        stsa.attention(q, batch_broadcast, batch_broadcast, grid, layout=layout)


def test_kv_head_counts_that_do_not_group_are_refused(rng):
    grid = stsa.VideoGrid(3, 4, 4)
    q = rng.standard_normal((1, grid.tokens, 6, 64)).astype(np.float32)
    k = rng.standard_normal((1, grid.tokens, 4, 64)).astype(np.float32)
    with pytest.raises(stsa.InvalidArgument, match="k and v hold 4 heads: grouped-query attention needs a count "
                                                   "that divides q's 6"):
        stsa.attention(q, k, k, grid)
    with pytest.raises(stsa.InvalidArgument, match="router: k and v hold 4 heads: grouped-query"):
        stsa.route(q, k, k, grid)
    with pytest.raises(stsa.InvalidArgument, match="k and v must hold as many heads, got 4 and 2"):
        stsa.attention(q, k, k[:, :, :2], grid)
