"""Bad input gets a clear exception (a stsa.Error that is also the built-in kind),
and nothing the caller gave is written when a call is refused."""

import os
import subprocess
import sys

import numpy as np
import pytest

import stsa

GRID = stsa.VideoGrid(3, 4, 4, text=2)


@pytest.fixture
def qkv(rng):
    return tuple(rng.standard_normal((1, GRID.tokens, 2, 64)).astype(np.float32) for _ in range(3))


def test_exception_hierarchy():
    assert issubclass(stsa.InvalidArgument, stsa.Error) and issubclass(stsa.InvalidArgument, ValueError)
    assert issubclass(stsa.Unsupported, stsa.Error) and issubclass(stsa.Unsupported, NotImplementedError)
    assert issubclass(stsa.ResourceError, stsa.Error) and issubclass(stsa.ResourceError, MemoryError)
    assert issubclass(stsa.IoError, stsa.Error) and issubclass(stsa.IoError, OSError)
    assert issubclass(stsa.Error, RuntimeError)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v: (q[:, :-1], k, v), "q has shape"),
        (lambda q, k, v: (q, k[..., :32], v), "k has shape"),
        (lambda q, k, v: (q.astype(np.float64), k, v), "q must be float32, float16, bfloat16 or float8_e4m3fn"),
        (lambda q, k, v: (q, k, v.astype(np.float16)), "dtype"),
        (lambda q, k, v: (q[..., 0], k, v), "q must have 4 dimensions"),
        (lambda q, k, v: (q.tolist(), k, v), "q must have 4 dimensions"),
        (lambda q, k, v: (q[:, ::-1], k, v), "stride"),
    ],
)
def test_bad_tensors(qkv, change, message):
    q, k, v = change(*qkv)
    with pytest.raises(stsa.InvalidArgument, match=message):
        stsa.attention(q, k, v, GRID)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"mask": "causal"}, stsa.InvalidArgument, "causal"),
        ({"mask": ["spatial"] * 3}, stsa.InvalidArgument, "one per head"),
        ({"density": 1.5}, stsa.InvalidArgument, "density"),
        ({"density": float("nan")}, stsa.InvalidArgument, "density"),
        ({"scale": 0.0}, stsa.InvalidArgument, "scale must be non-zero"),
        ({"scale": float("inf")}, stsa.InvalidArgument, "scale"),
        ({"backend": "tpu"}, stsa.InvalidArgument, "unknown backend 'tpu'"),
        ({"tile": (128, 100)}, stsa.InvalidArgument, "multiple of 64"),
        ({"tile": "128x128"}, stsa.InvalidArgument, "tile must be"),
        ({"align": "snap"}, stsa.InvalidArgument, "snap"),
        ({"layout": "nbhd"}, stsa.InvalidArgument, "layout must be 'bnhd' or 'bhnd'"),
    ],
)
def test_bad_options(qkv, kwargs, error, message):
    with pytest.raises(error, match=message):
        stsa.attention(*qkv, GRID, **kwargs)


def test_bad_grids(qkv):
    with pytest.raises(stsa.InvalidArgument, match="q has shape"):
        stsa.attention(*qkv, stsa.VideoGrid(3, 4, 4))  # the tensors have 2 text tokens more
    with pytest.raises(stsa.InvalidArgument):
        stsa.VideoGrid(0, 4, 4)
    with pytest.raises(stsa.InvalidArgument, match="text_placement"):
        stsa.VideoGrid(3, 4, 4, text=2, text_placement="middle")
    with pytest.raises(stsa.InvalidArgument, match="grid must be"):
        stsa.attention(*qkv, "21x45x80")
    for bad in ((3.0, 4, 4), (3, True, 4), (3, 4, "4")):
        with pytest.raises(stsa.InvalidArgument, match="must be an integer"):
            stsa.VideoGrid(*bad)
    with pytest.raises(stsa.InvalidArgument, match="text_placement"):
        stsa.VideoGrid(3, 4, 4, text_placement=None)
    assert stsa.VideoGrid(3, 4, 4, 2) == GRID and "text=2" in repr(GRID)
    assert (GRID.tokens, GRID.video_tokens) == (50, 48) and stsa.VideoGrid(np.int64(3), 4, 4).tokens == 48


@pytest.mark.parametrize("settings", [{"dense_steps": 1.5}, {"dense_layers": -1}, {"reuse_steps": 0},
                                      {"reuse_steps": True}, {"dense_steps": 2**63}])
def test_bad_policy_counts_are_named(settings):
    with pytest.raises(stsa.InvalidArgument, match=f"{next(iter(settings))} must be an integer"):
        stsa.Policy(**settings)


@pytest.mark.parametrize("step, layer, name", [(2**63, 0, "step"), (0, 1.0, "layer"), (-1, 0, "step"),
                                               (0, np.float32(2), "layer")])
def test_bad_steps_and_layers_are_named(qkv, step, layer, name):
    policy = stsa.Policy()
    out = np.full_like(qkv[0], 7.0)
    for call in (lambda: policy.dense(step, layer), lambda: policy.route(*qkv, GRID, step, layer),
                 lambda: policy.attention(*qkv, GRID, step, layer, out=out)):
        with pytest.raises(stsa.InvalidArgument, match=f"{name} must be an integer"):
            call()
    assert policy.cached_count == 0 and (out == 7.0).all()
    assert policy.dense(np.int64(0), 2**63 - 1) is False  # any integral type, the whole int64 range


def test_density_and_mask_errors_name_the_argument_not_the_router(qkv):
    """No router is involved in a given mask's call: its refusals use the caller's words."""
    for call in (lambda: stsa.attention(*qkv, GRID, density=2.0), lambda: stsa.plan(GRID, "temporal", 1.5),
                 lambda: stsa.tile_lists(GRID, "frames", -1.0)):
        with pytest.raises(stsa.InvalidArgument, match=r"^density must be in \[0, 1\], got"):
            call()
    for call in (lambda: stsa.attention(*qkv, GRID, mask="bogus"), lambda: stsa.plan(GRID, "bogus")):
        with pytest.raises(stsa.InvalidArgument, match="^mask must be 'dense', 'spatial', 'temporal' or 'frames', got"):
            call()


def test_grids_are_values():
    import pickle

    same = stsa.VideoGrid(3, 4, 4, text=2)
    assert same == GRID and hash(same) == hash(GRID) and len({same, GRID}) == 1
    assert GRID != stsa.VideoGrid(3, 4, 4) and GRID != stsa.VideoGrid(3, 4, 4, 2, "before")
    assert GRID != None and GRID != (3, 4, 4) and GRID not in [None, "3x4x4"]  # noqa: E711
    assert pickle.loads(pickle.dumps(stsa.VideoGrid(5, 2, 3, 7, "before"))) == stsa.VideoGrid(5, 2, 3, 7, "before")


def test_routing_alone_checks_its_inputs(qkv):
    q, k, v = qkv
    with pytest.raises(stsa.InvalidArgument, match="q must have 4 dimensions"):
        stsa.route(q.tolist(), k, v, GRID)
    with pytest.raises(stsa.InvalidArgument, match="k has shape"):
        stsa.route(q, k[:, 1:], v, GRID)
    with pytest.raises(stsa.InvalidArgument, match="samples"):
        stsa.Policy(samples=0)


def test_arguments_that_are_not_what_they_should_be(qkv):
    q, k, v = qkv
    with pytest.raises(stsa.InvalidArgument, match="k must be an array"):
        stsa.attention(q, k.tolist(), v, GRID)
    with pytest.raises(stsa.InvalidArgument, match="out must be an array"):
        stsa.attention(q, k, v, GRID, out=[0.0])
    with pytest.raises(stsa.InvalidArgument, match="lse must be an array"):
        stsa.attention(q, k, v, GRID, lse=[0.0])
    with pytest.raises(stsa.InvalidArgument, match="seed must be a non-negative integer"):
        stsa.routed_attention(q, k, v, GRID, seed=-1)
    with pytest.raises(stsa.InvalidArgument, match="samples must be an integer"):
        stsa.route(q, k, v, GRID, samples=2**40)
    with pytest.raises(stsa.InvalidArgument, match="tile must be"):
        stsa.attention(q, k, v, GRID, tile=64.5)
    assert stsa.plan(GRID, tile=np.int64(64))["tile"] == (64, 64)


def test_bad_router_and_policy_options(qkv):
    with pytest.raises(stsa.InvalidArgument, match="samples"):
        stsa.routed_attention(*qkv, GRID, samples=0)
    with pytest.raises(stsa.InvalidArgument, match="reuse"):
        stsa.Policy(reuse_steps=0)
    with pytest.raises(stsa.InvalidArgument):
        stsa.Policy().attention(*qkv, GRID, step=-1, layer=0)
    with pytest.raises(stsa.InvalidArgument, match="timed must be True or False"):
        stsa.routed_attention(*qkv, GRID, timed="no")
    with pytest.raises(stsa.InvalidArgument, match="timed must be True or False"):
        stsa.Policy().attention(*qkv, GRID, step=0, layer=0, timed=0)


def test_refused_calls_write_nothing(qkv):
    q, k, v = qkv
    out = np.full_like(q, 3.0)
    lse = np.full((1, 2, GRID.tokens), 5.0, dtype=np.float32)
    for bad in ({"mask": "causal"}, {"density": -0.1}, {"backend": "tpu"}):
        with pytest.raises(stsa.InvalidArgument):
            stsa.attention(q, k, v, GRID, out=out, lse=lse, **bad)
    with pytest.raises(stsa.InvalidArgument):
        stsa.attention(q, k, v[:, :-1], GRID, out=out, lse=lse)
    assert np.all(out == 3.0) and np.all(lse == 5.0)


def test_outputs_must_be_writable_and_apart_from_the_inputs(qkv):
    q, k, v = qkv
    read_only = np.empty_like(q)
    read_only.flags.writeable = False
    with pytest.raises(stsa.InvalidArgument, match="out is read-only"):
        stsa.attention(q, k, v, GRID, out=read_only)
    with pytest.raises(stsa.InvalidArgument, match="overlaps"):
        stsa.attention(q, k, v, GRID, out=q)
    for dtype in (np.float64, np.float16):  # named as what lse must be, not as what q may be
        with pytest.raises(stsa.InvalidArgument, match=r"^lse must be float32 \(DLPack type code 2, "):
            stsa.attention(q, k, v, GRID, lse=np.empty((1, 2, GRID.tokens), dtype=dtype))
    with pytest.raises(stsa.InvalidArgument, match="out is read-only"):  # the buffer protocol's own view
        stsa.attention(q, k, v, GRID, out=memoryview(np.empty_like(q)).toreadonly())
    with pytest.raises(stsa.InvalidArgument, match="lse must have 3 dimensions"):
        stsa.attention(q, k, v, GRID, lse=np.empty((2, GRID.tokens), dtype=np.float32))
    with pytest.raises(stsa.InvalidArgument, match="out must be float32"):
        stsa.attention(q, k, v, GRID, out=np.empty(q.shape, dtype=np.int32))


def test_buffer_protocol_arrays_are_read_in_place(qkv):
    """A memoryview (the buffer protocol, without NumPy's dtype) is an array like any other: its
    output is allocated from its format, as NumPy's would be from its dtype."""
    q, k, v = qkv
    out = stsa.attention(memoryview(q), memoryview(k), memoryview(v), GRID, "spatial", 0.5)
    assert isinstance(out, np.ndarray) and out.dtype == q.dtype
    assert np.array_equal(out, stsa.attention(q, k, v, GRID, "spatial", 0.5))


def test_unsupported_head_dim(rng):
    q, k, v = (rng.standard_normal((1, GRID.tokens, 1, 129)).astype(np.float32) for _ in range(3))
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(stsa.Unsupported, match="head dims 1 to 128, got 129"):
        stsa.attention(q, k, v, GRID, out=out)
    assert (out == 7.0).all()  # refused before anything ran


def test_backend_must_reach_the_arrays(qkv):
    # Host arrays: "cuda" is refused by name (a build without it does not know it; one with it takes CUDA arrays).
    with pytest.raises(stsa.InvalidArgument, match="cuda"):
        stsa.attention(*qkv, GRID, backend="cuda")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"density": None}, "density must be a number, got None"),
        ({"density": "0.3"}, "density must be a number, got '0.3'"),
        ({"anchor": "no"}, "anchor must be True or False"),
        ({"return_lse": "no"}, "return_lse must be True or False"),  # not taken as true
        ({"mask": None}, "mask must be a mask name"),
        ({"mask": [1, 2]}, "mask must be a mask name"),
        ({"scale": "x"}, "scale must be a number"),
        ({"stream": -1}, "stream must be"),
    ],
)
def test_arguments_of_the_wrong_type_are_named(qkv, kwargs, message):
    """One stsa error naming the argument, not nanobind's TypeError listing the module's signatures."""
    with pytest.raises(stsa.InvalidArgument, match=message):
        stsa.attention(*qkv, GRID, **kwargs)


def test_router_and_plan_arguments_of_the_wrong_type_are_named(qkv):
    for kwargs, message in (({"density": None}, "density must be a number"),
                            ({"temporal_density": "0.3"}, "temporal_density must be a number"),
                            ({"try_frames": "no"}, "try_frames must be True or False"),
                            ({"anchor": 1}, "anchor must be True or False"),
                            ({"seed": 2**64}, "seed must be a non-negative integer")):
        with pytest.raises(stsa.InvalidArgument, match=message):
            stsa.routed_attention(*qkv, GRID, **kwargs)
        with pytest.raises(stsa.InvalidArgument, match=message):
            stsa.Policy(**kwargs)
    with pytest.raises(stsa.InvalidArgument, match="mask must be a mask name"):
        stsa.plan(GRID, None)
    with pytest.raises(stsa.InvalidArgument, match="density must be a number"):
        stsa.tile_lists(GRID, "spatial", None)
    assert stsa.plan(GRID, "spatial", np.float32(0.5))["kept_fraction"] > 0  # NumPy's numbers are numbers


def test_arrays_neither_dlpack_nor_the_buffer_protocol_carries(qkv):
    import ml_dtypes

    q, k, v = qkv
    swapped = q.astype(q.dtype.newbyteorder())
    with pytest.raises(stsa.InvalidArgument, match="q is byte-swapped"):
        stsa.attention(swapped, k, v, GRID)
    out = np.empty_like(q).astype(q.dtype.newbyteorder())
    with pytest.raises(stsa.InvalidArgument, match="out is byte-swapped"):
        stsa.attention(q, k, v, GRID, out=out)
    e5m2 = tuple(x.astype(ml_dtypes.float8_e5m2) for x in qkv)
    with pytest.raises(stsa.InvalidArgument, match="q is float8_e5m2: stsa takes float32, float16, bfloat16 or f"):
        stsa.attention(*e5m2, GRID)
    with pytest.raises(stsa.InvalidArgument, match="k is object"):
        stsa.route(q, k.astype(object), v, GRID)


def test_a_grid_the_tensors_do_not_have_is_refused_before_any_plan_is_built(qkv):
    """The shapes are checked first: a wrong grid of millions (or billions) of tokens is
    refused at once, not after building (or failing to allocate) its plan."""
    import time

    cached = stsa._stsa.plan_cache_size()
    start = time.perf_counter()
    for grid in (stsa.VideoGrid(100, 100, 200), stsa.VideoGrid(1000, 1000, 2000)):
        for mask in ("dense", "spatial"):
            with pytest.raises(stsa.InvalidArgument, match="q has shape"):
                stsa.attention(*qkv, grid, mask=mask)
        with pytest.raises(stsa.InvalidArgument, match="q has shape"):
            stsa.routed_attention(*qkv, grid)
        with pytest.raises(stsa.InvalidArgument, match="q has shape"):
            stsa.Policy().attention(*qkv, grid, step=5, layer=5)
    assert time.perf_counter() - start < 1.0
    assert stsa._stsa.plan_cache_size() == cached


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="AddressSanitizer reserves the address space")
def test_host_memory_running_out_is_a_resource_error():
    """std::bad_alloc in the library: stsa.ResourceError (a MemoryError and a stsa.Error)."""
    script = """
import resource, stsa
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
try:
    stsa.plan(stsa.VideoGrid(100, 100, 200), "dense")  # about 2 GB of plan
except stsa.ResourceError as error:
    print(isinstance(error, MemoryError), error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True out of host memory (std::bad_alloc)"
