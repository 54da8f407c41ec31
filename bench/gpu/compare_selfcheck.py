#!/usr/bin/env python3
"""Self-check of compare.py's torch paths, on the CPU, before the benchmark
relies on them (bench/gpu/check.sh runs it; needs only torch): the raw file
round trip, and the FlexAttention BlockMask that load_plan builds from an
exported tile plan (full and partial CSR lists, the exporter's file format),
which must give the same attention as SDPA with the explicit element mask,
and the plan check (compare.tile_truth, compare.plan_check) that tells a
plan's tile classes from the mask's definition. The plan here is classified by brute force from the same predicate, on a
ragged grid (7 tiles of 128, the last partly outside)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import compare  # noqa: E402

torch.Tensor.cuda = lambda self, *a, **k: self  # load_plan copies to the GPU; here everything stays on the CPU

# raw I/O round trip
t = torch.randn(3, 5, 7).to(torch.bfloat16)
d = tempfile.mkdtemp()
compare.write_raw(t, os.path.join(d, "t.bin"))
back = compare.read_raw(os.path.join(d, "t.bin"), torch.bfloat16).reshape(3, 5, 7)
assert torch.equal(back, t), "raw round trip"

TILE = compare.TILE
frames, h, w = 5, 8, 20
pf = h * w
n = frames * pf
heads, dim = 2, 64
for band in (-1, 0, 37, 200, n):
    def allowed(qi, ki):
        return (qi < pf) | (ki < pf) | ((qi - ki).abs() <= band)
    qi = torch.arange(n)[:, None]
    ki = torch.arange(n)[None, :]
    dense_mask = allowed(qi, ki)
    qb = kb = (n + TILE - 1) // TILE
    full_off, full, part_off, part = [0], [], [0], []
    for a in range(qb):
        for b in range(kb):
            blk = dense_mask[a * TILE:(a + 1) * TILE, b * TILE:(b + 1) * TILE]
            if blk.all():
                full.append(b)
            elif blk.any():
                part.append(b)
        full_off.append(len(full))
        part_off.append(len(part))
    arrays = [("full_offsets", full_off), ("full_tiles", full), ("partial_offsets", part_off), ("partial_tiles", part)]
    path = os.path.join(d, f"plan_{band}.bin")
    sections, offset = [], 0
    with open(path, "wb") as f:
        for name, arr in arrays:
            f.write(bytes(torch.tensor(arr, dtype=torch.int32).untyped_storage()))
            sections.append({"name": name, "offset": offset, "count": len(arr)})
            offset += 4 * len(arr)
    record = {"plan": {"file": path, "dtype": "int32", "sections": sections}}

    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    band_t = torch.tensor(band)
    def mask_mod(b, hh, q_idx, kv_idx):
        return (q_idx < pf) | (kv_idx < pf) | ((q_idx - kv_idx).abs() <= band_t)
    lists = compare.load_plan(record, n)
    # The closed-form tile classes against the brute-force ones, and the plan check
    # on this plan (right) and on two corruptions of it (wrong).
    some, every = compare.tile_truth(n, pf, band, qb, kb, "cpu")
    for a in range(qb):
        for b in range(kb):
            blk = dense_mask[a * TILE:(a + 1) * TILE, b * TILE:(b + 1) * TILE]
            assert bool(some[a, b]) == bool(blk.any()) and bool(every[a, b]) == bool(blk.all()), (band, a, b)
    checked = compare.plan_check(lists, n, pf, band)
    assert checked["wrong"] == 0 and checked["wasted"] == 0, checked
    if part:  # a partial tile listed as full: its masked pairs would be attended
        bad = [t.clone() for t in lists]
        a = next(r for r in range(qb) if part_off[r + 1] > part_off[r])
        tile = part[part_off[a]]
        bad[0][0, 0, a] -= 1
        bad[1][0, 0, a, : int(bad[0][0, 0, a])] = torch.tensor(
            [t for t in part[part_off[a]:part_off[a + 1]] if t != tile], dtype=torch.int32)
        bad[3][0, 0, a, int(bad[2][0, 0, a])] = tile
        bad[2][0, 0, a] += 1
        got = compare.plan_check(bad, n, pf, band)
        assert got["full_with_masked_pairs"] == 1 and got["wrong"] == 1, got
    if full:  # a full tile left out
        bad = [t.clone() for t in lists]
        a = next(r for r in range(qb) if full_off[r + 1] > full_off[r])
        bad[2][0, 0, a] -= 1
        got = compare.plan_check(bad, n, pf, band)
        assert got["left_out_with_allowed_pairs"] == 1 and got["wrong"] == 1, got
    # A full tile listed twice, and key tile indices outside the grid (negative, past the
    # end): counted, never used as indices.
    room = next((r for r in range(qb) if 0 < full_off[r + 1] - full_off[r] < kb), None)  # a row with space
    if room is not None:
        for value, key in ((None, "listed_twice"), (-1, "outside_the_grid"), (kb, "outside_the_grid")):
            bad = [t.clone() for t in lists]
            a = room
            count = int(bad[2][0, 0, a])
            bad[3][0, 0, a, count] = bad[3][0, 0, a, 0] if value is None else value
            bad[2][0, 0, a] += 1
            got = compare.plan_check(bad, n, pf, band)
            assert got[key] == 1 and got["wrong"] >= 1, (key, got)
    # Tiles listed as partial that need no mask, or hold no allowed pair: wasted, not wrong.
    empty = [(a, b) for a in range(qb) for b in range(kb) if not bool(some[a, b])]
    for kind, cells in (("partial_without_masked_pairs", [(a, b) for a in range(qb) for b in range(kb)
                                                          if b in full[full_off[a]:full_off[a + 1]]]),
                        ("partial_without_allowed_pairs", empty)):
        if not cells:
            continue
        a, b = cells[0]
        bad = [t.clone() for t in lists]
        if kind == "partial_without_masked_pairs":  # move the full tile (a, b) to the partial list
            row = [t for t in full[full_off[a]:full_off[a + 1]] if t != b]
            bad[2][0, 0, a] = len(row)
            bad[3][0, 0, a, :len(row)] = torch.tensor(row, dtype=torch.int32)
        count = int(bad[0][0, 0, a])
        bad[1][0, 0, a, count] = b
        bad[0][0, 0, a] += 1
        got = compare.plan_check(bad, n, pf, band)
        assert got[kind] == 1 and got["wasted"] == 1 and got["wrong"] == 0, (kind, got)
    # A plan of another grid is refused.
    try:
        compare.plan_check(lists, n + TILE, pf, band)
        raise AssertionError("a plan of another grid was checked")
    except ValueError:
        pass
    block_mask = BlockMask.from_kv_blocks(*lists, BLOCK_SIZE=TILE, mask_mod=mask_mod, seq_lengths=(n, n))
    # Full blocks skip mask_mod on the GPU (not in CPU eager mode, so the outputs
    # below cannot tell full from partial): check the split itself.
    for counts, offsets, tiles, got_counts, got_idx in (
            (lists[0], part_off, part, block_mask.kv_num_blocks, block_mask.kv_indices),
            (lists[2], full_off, full, block_mask.full_kv_num_blocks, block_mask.full_kv_indices)):
        assert torch.equal(got_counts[0, 0].int(), torch.tensor(offsets).diff().int()), "block counts"
        for a in range(qb):
            row = got_idx[0, 0, a, : offsets[a + 1] - offsets[a]].tolist()
            assert row == tiles[offsets[a]:offsets[a + 1]], f"blocks of query tile {a}: {row}"
    torch.manual_seed(band + 2)
    q, k, v = (torch.randn(1, heads, n, dim) for _ in range(3))
    got = flex_attention(q, k, v, block_mask=block_mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask)
    err = (got - want).abs().max().item()
    print(f"band {band}: full {len(full)} partial {len(part)} of {qb * kb} tiles, max |flex - sdpa| = {err:.2e}")
    assert err < 1e-4, err
print("compare.py torch paths: ok")
