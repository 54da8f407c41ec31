"""stsa.plan: the tile plan's counts against the mask evaluated from its definition."""

import numpy as np
import pytest

import reference
import stsa
from helpers import real_mask


@pytest.mark.parametrize("route", ["dense", "spatial", "temporal", "frames"])
@pytest.mark.parametrize("tile", [(128, 128), (64, 64), (32, 192)])
def test_counts_match_the_mask(route, tile):
    grid = stsa.VideoGrid(12, 7, 9, text=6, text_placement="before")
    p = stsa.plan(grid, route, 0.3, tile=tile)
    assert real_mask(route, p)  # not the anchor alone
    # The mask in the plan's token order (spatial-major for a temporal mask).
    order = stsa.token_order(grid, p["order"])
    mask = reference.allowed(grid, route, p["band"], p["frame_radius"], p["anchor"])[np.ix_(order, order)]
    assert p["tokens"] == grid.tokens == mask.shape[0]
    assert p["exact_kept_pairs"] == p["kept_pairs"] == mask.sum()
    assert p["kept_fraction"] == pytest.approx(mask.mean())
    # Every tile classified from the mask: empty (no pair), full (every pair) or partial.
    q_tiles, k_tiles = -(-grid.tokens // tile[0]), -(-grid.tokens // tile[1])
    assert (p["q_tiles"], p["k_tiles"]) == (q_tiles, k_tiles)
    counts = {"full": 0, "partial": 0, "empty": 0}
    for i in range(q_tiles):
        for j in range(k_tiles):
            block = mask[i * tile[0] : (i + 1) * tile[0], j * tile[1] : (j + 1) * tile[1]]
            counts["full" if block.all() else "empty" if not block.any() else "partial"] += 1
    assert (p["tiles_full"], p["tiles_partial"], p["tiles_empty"]) == (
        counts["full"], counts["partial"], counts["empty"])
    assert p["order"] == ("spatial-major" if route == "temporal" else "frame-major")


def spatial_kept_pairs(grid, band):
    """The pairs a spatial band with the frame-0 anchor keeps on a grid without text, from the mask's
    definition: every pair touching frame 0's P tokens, and |i - j| <= band among the other N - P."""
    others = grid.tokens - grid.height * grid.width
    reach = min(band, others - 1)
    return grid.tokens**2 - others**2 + others + 2 * (reach * others - reach * (reach + 1) // 2)


def test_density_picks_the_closest_band():
    small = stsa.VideoGrid(3, 4, 5)  # the closed form against the mask evaluated pair by pair
    for band in (0, 1, 7, 39, 100):
        assert spatial_kept_pairs(small, band) == reference.allowed(small, "spatial", band).sum()
    grid = stsa.VideoGrid(21, 30, 52)  # Wan2.1 480p: 32,760 tokens, too many for an [N, N] mask here
    p = stsa.plan(grid, "spatial", 0.25)
    assert p["anchor"] and p["kept_pairs"] == spatial_kept_pairs(grid, p["band"]) and p["tile"] == (128, 128)
    # One band step moves the kept fraction by ~5e-5: the neighbours on both sides miss 0.25 by more.
    neighbours = range(p["band"] - 1, p["band"] + 2)
    off = {band: abs(spatial_kept_pairs(grid, band) / grid.tokens**2 - 0.25) for band in neighbours}
    assert off[p["band"] - 1] > off[p["band"]] < off[p["band"] + 1]
    assert stsa.plan(grid, "spatial", 0.25, tile=64)["tile"] == (64, 64)
    assert stsa.plan(grid, "spatial", 1.0)["kept_fraction"] == 1.0


def test_plans_are_cached_and_can_be_freed():
    grid = stsa.VideoGrid(4, 4, 4)
    stsa.clear_plan_cache()
    assert stsa._stsa.plan_cache_size() == 0
    first = stsa.plan(grid, "temporal", 0.5)
    second = stsa.plan(grid, "temporal", 0.5)
    assert second["build_ms"] == first["build_ms"]  # the same plan object, not a rebuild
    assert stsa._stsa.plan_cache_size() == 1
    assert "cpu" in stsa.backends() and "reference" in stsa.backends()
    stsa.clear_plan_cache()
    assert stsa._stsa.plan_cache_size() == 0  # freed: the next call builds afresh, the same plan
    third = stsa.plan(grid, "temporal", 0.5)
    assert stsa._stsa.plan_cache_size() == 1
    assert {key: value for key, value in third.items() if key != "build_ms"} == {
        key: value for key, value in first.items() if key != "build_ms"}


@pytest.mark.parametrize("route", ["spatial", "temporal", "frames", "dense"])
@pytest.mark.parametrize("align", ["exact", "round"])
def test_tile_lists_rebuild_the_mask(route, align):
    grid = stsa.VideoGrid(12, 5, 7, text=3)
    tile = (32, 64)
    lists = stsa.tile_lists(grid, route, 0.35, tile=tile, align=align)
    p = stsa.plan(grid, route, 0.35, tile=tile, align=align)
    assert real_mask(route, p)
    n, (tq, tk) = grid.tokens, tile
    # Every pair the lists keep: full tiles whole, partial tiles through their element mask.
    kept = np.zeros((n, n), dtype=bool)
    for row in range(lists["kv_num_blocks"].shape[0]):
        rows = slice(row * tq, min((row + 1) * tq, n))
        for col in lists["full_kv_indices"][row, : lists["full_kv_num_blocks"][row]]:
            kept[rows, col * tk : (col + 1) * tk] = True
        for col in lists["kv_indices"][row, : lists["kv_num_blocks"][row]]:
            mask = lists["masks"][lists["mask_ids"][row, col]]
            block = kept[rows, col * tk : (col + 1) * tk]
            block[:] = mask[: block.shape[0], : block.shape[1]]
    assert kept.sum() == p["kept_pairs"]
    assert lists["order"] == p["order"] and lists["tile"] == tile
    # In the plan's token order, the mask from its definition (exact plans keep exactly it).
    order = stsa.token_order(grid, lists["order"])
    truth = reference.allowed(grid, route, p["band"], p["frame_radius"])[np.ix_(order, order)]
    if align == "exact":
        assert np.array_equal(kept, truth)
    else:
        assert lists["kv_num_blocks"].sum() == 0
        assert np.count_nonzero(kept != truth) == p["changed_pairs"]


def test_token_order_gathers_and_scatters():
    grid = stsa.VideoGrid(3, 2, 3, text=2, text_placement="before")
    order = stsa.token_order(grid, "spatial-major")
    assert sorted(order) == list(range(grid.tokens))
    assert np.array_equal(stsa.token_order(grid, "frame-major"), np.arange(grid.tokens))
    is_text, frame, patch = reference.coordinates(3, 2, 3, 2, True)
    # Text first, then frame 0 as a block, then each patch's frames 1 and 2 side by side.
    assert list(order[:2]) == [0, 1] and list(frame[order[2:8]]) == [0] * 6
    assert list(zip(patch[order[8:]], frame[order[8:]])) == [(p, f) for p in range(6) for f in (1, 2)]
    with pytest.raises(stsa.InvalidArgument, match="order must be"):
        stsa.token_order(grid, "patch-major")
