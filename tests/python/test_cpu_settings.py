"""stsa.set_num_threads / stsa.set_isa: the process defaults of host calls (the CPU backend,
the router), before STSA_THREADS / STSA_ISA, from the next call on."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import reference
import stsa
from helpers import masks_for

ISAS = ["scalar", "avx2", "avx512", "amx"]


@pytest.fixture(autouse=True)
def unset_defaults():
    stsa.set_num_threads(0)
    stsa.set_isa("auto")
    yield
    stsa.set_num_threads(0)
    stsa.set_isa("auto")


def supported_isas():
    """The instruction sets this CPU runs (set_isa refuses the others)."""
    supported = []
    for isa in ISAS:
        try:
            stsa.set_isa(isa)
            supported.append(isa)
        except stsa.Unsupported:
            pass
    stsa.set_isa("auto")
    return supported


def problem(rng, dtype=ml_dtypes.bfloat16):
    grid = stsa.VideoGrid(9, 5, 4, text=5, text_placement="after")  # 185 tokens: ragged tiles
    q, k, v = (rng.standard_normal((1, grid.tokens, 2, 64)).astype(dtype) for _ in range(3))
    return grid, q, k, v


def test_the_thread_count_is_set_and_never_changes_the_bits(rng):
    grid, q, k, v = problem(rng)
    assert stsa.get_num_threads() >= 1
    stsa.set_num_threads(1)
    assert stsa.get_num_threads() == 1
    one, lse_one = stsa.attention(q, k, v, grid, ["spatial", "temporal"], 0.5, return_lse=True)
    stsa.set_num_threads(3)
    assert stsa.get_num_threads() == 3
    three, lse_three = stsa.attention(q, k, v, grid, ["spatial", "temporal"], 0.5, return_lse=True)
    assert np.array_equal(one.view(np.uint16), three.view(np.uint16)) and np.array_equal(lse_one, lse_three)
    reference.check(three, q, k, v, masks_for(grid, ["spatial", "temporal"], 0.5), lse=lse_three)


def test_settings_come_before_the_environment():
    """In a fresh process with STSA_THREADS and STSA_ISA set: the settings win, 0 and "auto" go back."""
    script = (
        "import stsa\n"
        "assert stsa.get_num_threads() == 3 and stsa.get_isa() == 'scalar', (stsa.get_num_threads(), stsa.get_isa())\n"
        "stsa.set_num_threads(2)\n"
        "stsa.set_isa('auto')\n"
        "assert stsa.get_num_threads() == 2 and stsa.get_isa() == 'scalar'\n"  # auto: STSA_ISA again
        "stsa.set_num_threads(0)\n"
        "assert stsa.get_num_threads() == 3\n"
        "print('ok')\n")
    env = dict(os.environ, STSA_THREADS="3", STSA_ISA="scalar")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_instruction_set_reaches_the_kernels(rng):
    grid, q, k, v = problem(rng)
    isas = supported_isas()
    outputs = {}
    for isa in isas:
        stsa.set_isa(isa)
        assert stsa.get_isa() == isa
        outputs[isa] = stsa.attention(q, k, v, grid, "spatial", 0.5)
        reference.check(outputs[isa], q, k, v, masks_for(grid, ["spatial"] * 2, 0.5))
    # The kernels round differently: a setting that never reached them would give one answer.
    if len(isas) > 1:
        assert not np.array_equal(outputs["scalar"].view(np.uint16), outputs[isas[-1]].view(np.uint16))


def routing_problem(rng):
    grid = stsa.VideoGrid(9, 6, 8)
    return (grid, *(rng.standard_normal((1, grid.tokens, 2, 64)).astype(ml_dtypes.bfloat16) for _ in range(3)))


def test_a_policy_made_before_routes_with_the_instruction_set(rng):
    """The router's instruction sets differ where they take bf16 pairs: AMX tiles, and AVX-512
    dot products for the scores of bf16 and fp8 inputs; scalar and AVX2 take fp32 products."""
    pair_isas = [isa for isa in ("amx", "avx512") if isa in supported_isas()]
    if not pair_isas:
        pytest.skip("neither AMX nor AVX-512 on this CPU: the router's instruction sets give the same bits")
    units = {"amx": "amx", "avx512": "bf16_dot", "avx2": "fma", "scalar": "fma"}
    grid, q, k, v = routing_problem(rng)  # bf16
    policy = stsa.Policy()  # made before the settings below
    auto = policy.route(q, k, v, grid, step=0, layer=0)["routing"]
    assert auto["product_units"] == units[stsa.get_isa()]  # "auto": STSA_ISA, else this CPU's best
    assert auto["tile_products"] == (stsa.get_isa() == "amx")
    routed = {}
    for isa in pair_isas + ["scalar"]:
        stsa.set_isa(isa)
        policy.clear()
        routed[isa] = policy.route(q, k, v, grid, step=0, layer=0)
        assert routed[isa]["routing"]["product_units"] == units[isa]
    # The arithmetic changed with the flag: bf16 products round the candidates' errors apart.
    errors = {isa: [c["mse"] for h in r["heads"] for c in h["candidates"]] for isa, r in routed.items()}
    for isa in pair_isas:
        assert errors[isa] != errors["scalar"]


def test_a_policy_made_before_routes_with_any_thread_count(rng):
    """The router reports no thread count: what is checked is that none changes its bits."""
    grid, q, k, v = routing_problem(rng)
    policy = stsa.Policy()
    stsa.set_isa("scalar")  # the fp32 path from now on
    stsa.set_num_threads(1)
    one = policy.route(q, k, v, grid, step=0, layer=0)
    stsa.set_num_threads(2)
    policy.clear()
    two = policy.route(q, k, v, grid, step=0, layer=0)
    assert one["heads"] == two["heads"]  # the router's errors are bit-identical for any thread count


@pytest.mark.parametrize("threads", [-1, 4097, 2**40, 1.5, True, "2", None])
def test_bad_thread_counts_are_refused_and_change_nothing(threads):
    stsa.set_num_threads(2)
    with pytest.raises(stsa.InvalidArgument, match="threads"):
        stsa.set_num_threads(threads)
    assert stsa.get_num_threads() == 2


@pytest.mark.parametrize("isa", ["sse", "AVX2", "", 3, None])
def test_bad_instruction_sets_are_refused_and_change_nothing(isa):
    stsa.set_isa("scalar")
    with pytest.raises(stsa.InvalidArgument):
        stsa.set_isa(isa)
    assert stsa.get_isa() == "scalar"


def test_an_instruction_set_this_cpu_lacks_is_unsupported():
    lacking = [isa for isa in ISAS if isa not in supported_isas()]
    if not lacking:
        pytest.skip("this CPU has every instruction set stsa has kernels for")
    stsa.set_isa("scalar")
    with pytest.raises(stsa.Unsupported, match=lacking[0]):
        stsa.set_isa(lacking[0])
    assert stsa.get_isa() == "scalar"
