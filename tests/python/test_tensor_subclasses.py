"""Tensor subclasses that dispatch operators themselves (a wrapper subclass, DTensor): their data
is not their values, so they were refused as "q is null". Their calls now go through stsa's
operators, which the subclass handles; DTensor by the sharding strategies stsa registers."""

import numpy as np
import pytest

import stsa

torch = pytest.importorskip("torch")
if not hasattr(torch.Tag, "cudagraph_unsafe"):
    pytest.skip(f"torch {torch.__version__}: stsa's operators need >= 2.8", allow_module_level=True)

GRID = stsa.VideoGrid(5, 4, 6, text=3)  # 123 tokens


def random_qkv(seed, batch=2, heads=4, head_dim=64):
    rng = np.random.default_rng(seed)
    return tuple(torch.from_numpy(rng.standard_normal((batch, GRID.tokens, heads, head_dim)).astype(np.float32))
                 for _ in range(3))


def test_a_wrapper_subclass_gets_each_inner_tensors_call(rng):
    from torch.testing._internal.two_tensor import TwoTensor

    first, second = random_qkv(rng.integers(2**32)), random_qkv(rng.integers(2**32))
    pair = [TwoTensor(a, b) for a, b in zip(first, second)]
    out = stsa.attention(*pair, GRID, "temporal", 0.5)
    assert isinstance(out, TwoTensor)
    assert torch.equal(out.a, stsa.attention(*first, GRID, "temporal", 0.5))
    assert torch.equal(out.b, stsa.attention(*second, GRID, "temporal", 0.5))


def _rank(rank: int, ranks: int, rendezvous: str, seed: int) -> None:
    """One rank of test_dtensor_calls_equal_one_process (gloo on the CPU)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=ranks)
    try:
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (ranks,))
        q, k, v = random_qkv(seed)  # every rank the same: one process's call is the reference
        masks = ["spatial", "temporal", "frames", "dense"]
        calls = {
            "one mask": (lambda *x: stsa.attention(*x, GRID, "spatial", 0.4, return_lse=True), False),
            "a mask per head": (lambda *x: stsa.attention(*x, GRID, masks, 0.4, return_lse=True), False),
            "routed": (lambda *x: stsa.routed_attention(*x, GRID, 0.4, samples=16, return_lse=True), True),
        }
        # Heads, batch, tokens (the context-parallel layout: redistributed first), replicated.
        for placement in (Shard(2), Shard(0), Shard(1), Replicate()):
            inputs = [distribute_tensor(x, mesh, [placement]) for x in (q, k, v)]
            for name, (call, routed) in calls.items():
                want = call(q, k, v)
                got = call(*inputs)
                what = f"{name}, q {placement}"
                for mine, theirs in zip(got[:2], want[:2]):
                    assert isinstance(mine, torch.distributed.tensor.DTensor), what
                    assert torch.equal(mine.full_tensor(), theirs), what
                # Sharded where the call allows it, with no gather first; routed as in one process.
                kept = (placement == Replicate() or placement == Shard(2) and name != "a mask per head"
                        or placement == Shard(0) and not routed)
                assert (got[0].placements == (placement,)) == kept, (what, got[0].placements)
                if routed and got[0].placements[0] == Shard(2):  # this rank's heads
                    share = slice(rank * 2, rank * 2 + 2)
                    assert got[2]["routes"] == want[2]["routes"][share], what
        # [B, H, N, D]: the heads are dimension 1 (the layout is part of the strategy's key).
        heads_first = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        got = stsa.attention(*[distribute_tensor(x, mesh, [Shard(1)]) for x in heads_first], GRID, "temporal", 0.4,
                             layout="bhnd")
        assert got.placements == (Shard(1),)
        assert torch.equal(got.full_tensor(), stsa.attention(*heads_first, GRID, "temporal", 0.4, layout="bhnd"))
        # Grouped-query attention, 2 K/V heads for the 4 query heads: sharded over the heads, each rank
        # holds its query heads' K/V head, and its grouped call is one process's slice.
        k2, v2 = (x[:, :, ::2].contiguous() for x in (k, v))
        for placement in (Shard(2), Shard(0), Replicate()):
            inputs = [distribute_tensor(x, mesh, [placement]) for x in (q, k2, v2)]
            got = stsa.attention(*inputs, GRID, ["temporal", "spatial"] * 2, 0.4)
            # (a mask per head is gathered from a head shard, as above)
            assert (got.placements == (placement,)) == (placement != Shard(2)), (placement, got.placements)
            assert torch.equal(got.full_tensor(), stsa.attention(q, k2, v2, GRID, ["temporal", "spatial"] * 2, 0.4))
            got, info = stsa.routed_attention(*inputs, GRID, 0.4, samples=16)
            assert (got.placements == (placement,)) == (placement != Shard(0)), (placement, got.placements)
            want, want_info = stsa.routed_attention(q, k2, v2, GRID, 0.4, samples=16)
            assert torch.equal(got.full_tensor(), want), placement
            if placement == Shard(2):
                assert info["routes"] == want_info["routes"][rank * 2:rank * 2 + 2]
        # 12 query heads and 3 K/V heads shard over 2 ranks as 6 + 6 and 2 + 1 (torch.chunk): a rank's
        # groups would not be the call's 4, so the heads are gathered first (the batch's shards kept).
        q12 = random_qkv(seed + 1, heads=12)[0]
        k3, v3 = (x[:, :, :3].contiguous() for x in random_qkv(seed + 2, heads=4)[1:])
        for placement in (Shard(2), Shard(0)):
            inputs = [distribute_tensor(x, mesh, [placement]) for x in (q12, k3, v3)]
            got = stsa.attention(*inputs, GRID, "temporal", 0.4)
            assert torch.equal(got.full_tensor(), stsa.attention(q12, k3, v3, GRID, "temporal", 0.4)), placement
            assert got.placements == (Shard(0),), (placement, got.placements)
            got, _ = stsa.routed_attention(*inputs, GRID, 0.4, samples=16)
            assert got.placements == (Replicate(),), (placement, got.placements)
            assert torch.equal(got.full_tensor(), stsa.routed_attention(q12, k3, v3, GRID, 0.4, samples=16)[0])
    finally:
        torch.distributed.destroy_process_group()


def test_dtensor_calls_equal_one_process(tmp_path, rng):
    """2 ranks over gloo, q, k and v DTensors sharded over the heads, the batch or the tokens, or
    replicated: every call's out and lse, gathered, are one process's bytes, and a routed rank's
    routes are its heads' routes there."""
    if not torch.distributed.is_available():
        pytest.skip("torch without torch.distributed")
    torch.multiprocessing.spawn(_rank, args=(2, str(tmp_path / "rendezvous"), int(rng.integers(2**32))), nprocs=2)
