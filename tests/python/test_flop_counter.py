"""torch's FlopCounterMode (any TorchDispatchMode, and torch's profiler) around stsa's calls: an
eager call on torch tensors reaches no dispatcher, so while they watch it goes through its
operator, which they see and FlopCounterMode counts; the outputs and the info stay the eager call's."""

import subprocess
import sys

import numpy as np
import pytest

import reference
import stsa
from helpers import masks_for

torch = pytest.importorskip("torch")
if not hasattr(torch.Tag, "cudagraph_unsafe"):
    pytest.skip(f"torch {torch.__version__}: stsa's operators need >= 2.8", allow_module_level=True)

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

GRID = stsa.VideoGrid(9, 4, 6, text=7, text_placement="before")  # 223 tokens: no tile multiple


def random_qkv(rng, batch, heads, head_dim):
    return tuple(torch.from_numpy(rng.standard_normal((batch, GRID.tokens, heads, head_dim)).astype(np.float32))
                 for _ in range(3))


def kept_flops_by_definition(masks, batch, head_dim):
    """4 D per kept pair (Q K^T and P V, two per multiply-add), the masks evaluated from their definition."""
    return 4 * head_dim * batch * sum(int(m.sum()) for m in masks)


class OpsSeen(TorchDispatchMode):
    """Records every operator it sees and runs it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("head_dim", [64, 80])
def test_attention_is_counted_by_its_masks_kept_pairs(head_dim, rng):
    masks = ["spatial", "temporal", "frames"]
    q, k, v = random_qkv(rng, 2, 3, head_dim)
    eager, eager_lse = stsa.attention(q, k, v, GRID, masks, 0.4, return_lse=True)
    with FlopCounterMode(display=False) as counter:
        out, lse = stsa.attention(q, k, v, GRID, masks, 0.4, return_lse=True)
    expected = kept_flops_by_definition(masks_for(GRID, masks, 0.4), 2, head_dim)
    assert counter.get_total_flops() == expected
    assert stsa.attention_flops(GRID, masks, 0.4, heads=3, head_dim=head_dim, batch=2)["kept"] == expected
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


def test_attention_flops_reports_tiles_and_dense():
    flops = stsa.attention_flops(GRID, "spatial", 0.3, heads=2, head_dim=64, batch=3)
    dense = 4 * 64 * 3 * 2 * GRID.tokens**2
    assert flops["dense"] == dense
    assert flops["kept"] < flops["kept_tiles"] <= dense  # partial tiles computed whole
    assert stsa.attention_flops(GRID, "dense", heads=2, head_dim=64, batch=3)["kept"] == dense
    # One mask for every head is counted once, times the heads (a loop over 2^40 heads took hours).
    huge = stsa.attention_flops(GRID, "spatial", 0.3, heads=2**40, head_dim=64, batch=3)
    assert (huge["kept"], huge["kept_tiles"]) == (flops["kept"] * 2**39, flops["kept_tiles"] * 2**39)
    with pytest.raises(stsa.InvalidArgument, match="one per head"):
        stsa.attention_flops(GRID, ["spatial", "temporal"], heads=3, head_dim=64)
    with pytest.raises(stsa.InvalidArgument, match="heads"):
        stsa.attention_flops(GRID, heads=0, head_dim=64)


def test_a_routed_call_counts_its_heads_masks_and_its_routing(rng):
    q, k, v = random_qkv(rng, 1, 4, 64)
    _, eager_info = stsa.routed_attention(q, k, v, GRID, 0.4, samples=16)
    with FlopCounterMode(display=False) as counter:
        out, info = stsa.routed_attention(q, k, v, GRID, 0.4, samples=16)
    assert info["routes"] == eager_info["routes"]
    assert info["kept_flops"] == kept_flops_by_definition(reference.head_masks(GRID, info["heads"]), 1, 64)
    routing = stsa.route(q, k, v, GRID, 0.4, samples=16)
    assert info["routing_flops"] == routing["flops"] > 0
    assert counter.get_total_flops() == info["kept_flops"] + info["routing_flops"]


def test_a_policy_call_counts_what_it_ran_and_returns_its_info(rng):
    q, k, v = random_qkv(rng, 1, 2, 64)
    policy = stsa.Policy(dense_steps=1, density=0.4, samples=16)
    with FlopCounterMode(display=False) as counter:
        _, warm_up = policy.attention(q, k, v, GRID, step=0, layer=0)
    assert warm_up["routes"] == ["dense", "dense"] and policy.last_info is warm_up
    assert counter.get_total_flops() == 4 * 64 * 2 * GRID.tokens**2
    with FlopCounterMode(display=False) as counter:
        _, routed = policy.attention(q, k, v, GRID, step=1, layer=0)
    assert routed["routing_flops"] > 0 and policy.last_info is routed
    assert counter.get_total_flops() == routed["kept_flops"] + routed["routing_flops"]


def test_given_outputs_are_filled_under_a_mode(rng):
    q, k, v = random_qkv(rng, 1, 2, 64)
    eager, eager_lse = stsa.attention(q, k, v, GRID, "spatial", 0.4, return_lse=True)
    out, lse = torch.full_like(q, float("nan")), torch.full((1, 2, GRID.tokens), float("nan"))
    with FlopCounterMode(display=False):
        returned = stsa.attention(q, k, v, GRID, "spatial", 0.4, out=out, lse=lse)
    assert returned[0] is out and returned[1] is lse
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    with FlopCounterMode(display=False), pytest.raises(stsa.InvalidArgument, match="out must be a torch tensor of "
                                                                                 "shape"):
        stsa.attention(q, k, v, GRID, "spatial", 0.4, out=torch.empty(1, GRID.tokens, 2, 32))
    with FlopCounterMode(display=False), pytest.raises(stsa.InvalidArgument, match="lse must be"):
        stsa.attention(q, k, v, GRID, "spatial", 0.4, lse=np.empty((1, 2, GRID.tokens), np.float32))


def test_any_dispatch_mode_sees_one_operator_and_counting_under_it_counts_once(rng):
    q, k, v = random_qkv(rng, 1, 2, 64)
    eager, eager_info = stsa.routed_attention(q, k, v, GRID, 0.4, samples=16)
    with FlopCounterMode(display=False) as counter, OpsSeen() as seen:
        out, info = stsa.routed_attention(q, k, v, GRID, 0.4, samples=16)
    assert [op for op in seen.ops if op.startswith("stsa.")] == ["stsa.routed_attention.default"]
    assert torch.equal(out, eager) and info["routes"] == eager_info["routes"]
    assert counter.get_total_flops() == info["kept_flops"] + info["routing_flops"]


def test_calls_without_data_are_counted_by_their_plans():
    """The meta device: attention exactly; a routed call as every head at its spatial candidate;
    a policy's warm-up dense."""
    with torch.device("meta"):
        q = torch.empty(1, GRID.tokens, 2, 64)
    spatial = stsa.attention_flops(GRID, "spatial", 0.4, heads=2, head_dim=64)["kept"]
    calls = {
        "attention": (lambda: stsa.attention(q, q, q, GRID, "spatial", 0.4), spatial),
        "routed": (lambda: stsa.routed_attention(q, q, q, GRID, 0.4), spatial),
        "policy warm-up": (lambda: stsa.Policy(dense_steps=1).attention(q, q, q, GRID, 0, 0),
                           4 * 64 * 2 * GRID.tokens**2),
        "policy": (lambda: stsa.Policy(density=0.4).attention(q, q, q, GRID, 0, 0), spatial),
    }
    for name, (call, expected) in calls.items():
        with FlopCounterMode(display=False) as counter:
            call()
        assert counter.get_total_flops() == expected, name


def test_a_counter_made_before_stsas_first_call_counts_it():
    """FlopCounterMode copies torch's formulas when it is made; stsa's register with its first
    call that goes through an operator (a fresh process: this one has made such calls)."""
    script = ("import torch, stsa\n"
              "from torch.utils.flop_counter import FlopCounterMode\n"
              "g = stsa.VideoGrid(3, 4, 4)\n"
              "q = torch.ones(1, g.tokens, 1, 64)\n"
              "with FlopCounterMode(display=False) as counter:\n"
              "    stsa.attention(q, q, q, g, 'dense')\n"
              "print(counter.get_total_flops())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == 4 * 64 * 48**2


def test_the_profiler_records_each_call_as_its_operator(rng):
    """torch.profiler's trace had no event for an eager stsa call; now one per call, by name."""
    q, k, v = random_qkv(rng, 1, 2, 64)
    eager = stsa.attention(q, k, v, GRID, "spatial", 0.4)
    policy = stsa.Policy(density=0.4, samples=16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profiler:
        out = stsa.attention(q, k, v, GRID, "spatial", 0.4)
        _, info = stsa.routed_attention(q, k, v, GRID, 0.4, samples=16)
        _, policy_info = policy.attention(q, k, v, GRID, step=0, layer=0)
    events = {event.key: event.count for event in profiler.key_averages() if event.key.startswith("stsa::")}
    assert events == {"stsa::attention": 1, "stsa::routed_attention": 1, "stsa::policy_attention": 1}
    assert torch.equal(out, eager) and info is not None and policy_info is policy.last_info is not None
