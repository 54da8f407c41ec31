"""PyTorch tensors in and out, where torch is installed (CI's venv has none; the GPU
machine's image has it and bench/gpu/check.sh runs this file there): CPU tensors on
the CPU backend, CUDA tensors on the CUDA backend, read in place through DLPack,
the output a tensor on the inputs' device, checked against the fp64 reference."""

import contextlib
import subprocess
import sys
import types

import numpy as np
import pytest

import reference
import stsa
from helpers import masks_for, structured_heads

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from torch_helpers import check, require_gpu  # noqa: E402  (needs torch)

# stsa's operators (the torch.compile path) need torch >= 2.8; eager calls do not.
OPERATORS = hasattr(torch.Tag, "cudagraph_unsafe")
needs_operators = pytest.mark.skipif(not OPERATORS, reason=f"torch {torch.__version__}: the operators need >= 2.8")


def random_qkv(rng, grid, heads, head_dim, dtype, device="cpu"):
    arrays = [rng.standard_normal((1, grid.tokens, heads, head_dim)).astype(np.float32) for _ in range(3)]
    return tuple(torch.from_numpy(a).to(device=device, dtype=dtype) for a in arrays)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_tensors(dtype, rng):
    grid = stsa.VideoGrid(9, 4, 6, text=5)
    q, k, v = random_qkv(rng, grid, 2, 64, dtype)
    out, lse = stsa.attention(q, k, v, grid, ["temporal", "spatial"], 0.5, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (1, 2, grid.tokens)
    check(out, q, k, v, masks_for(grid, ["temporal", "spatial"], 0.5), lse)


def test_cpu_float8_tensors(rng):
    grid = stsa.VideoGrid(9, 4, 6, text=5)
    q, k, v = random_qkv(rng, grid, 2, 128, torch.float8_e4m3fn)
    out, lse = stsa.attention(q, k, v, grid, ["temporal", "spatial"], 0.5, return_lse=True)
    assert out.dtype == torch.bfloat16  # float8 is no output type
    check(out, q, k, v, masks_for(grid, ["temporal", "spatial"], 0.5), lse)
    routed, info = stsa.routed_attention(q, k, v, grid, density=0.5)
    assert routed.dtype == torch.bfloat16
    check(routed, q, k, v, reference.head_masks(grid, info["heads"]))
    with pytest.raises(stsa.InvalidArgument, match="float8_e4m3fn"):  # another float8 is refused by name
        stsa.attention(*(x.to(torch.float8_e5m2) for x in (q, k, v)), grid)


def test_head_major_view_of_a_tensor():
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = (torch.randn(1, 3, grid.tokens, 64) for _ in range(3))  # [B, H, N, D]
    out = stsa.attention(q, k, v, grid, "spatial", 0.5, layout="bhnd")
    same = stsa.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), grid, "spatial", 0.5)
    assert torch.equal(out.transpose(1, 2), same)


def test_tensors_that_need_gradients_are_refused(rng):
    """No backward pass: an output silently cut off from the graph would train the
    model around a constant. Under no_grad (inference) the same tensors run."""
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    k.requires_grad_(True)
    calls = {
        "attention": lambda: stsa.attention(q, k, v, grid),
        "routed_attention": lambda: stsa.routed_attention(q, k, v, grid, samples=8),
        "Policy.attention": lambda: stsa.Policy().attention(q, k, v, grid, step=0, layer=0),
    }
    if OPERATORS:  # not fullgraph: torch.compile would wrap the refusal in its own exception type
        calls["compiled"] = lambda: torch.compile(lambda *x: stsa.attention(*x, grid), backend="aot_eager")(q, k, v)
    for name, call in calls.items():
        torch._dynamo.reset()
        with pytest.raises(stsa.Unsupported, match="no gradients"):
            call()
        with torch.no_grad():
            out = call()
        assert isinstance(out, (torch.Tensor, tuple)), name
    with torch.no_grad():
        assert torch.equal(stsa.attention(q, k, v, grid), stsa.attention(q, k.detach(), v, grid))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit's, from importing forward_ad
def test_tensors_with_forward_mode_tangents_are_refused(rng):
    """Forward-mode AD (torch.autograd.forward_ad) works under no_grad too: q's tangent was
    dropped and the output had none, so a JVP through the model saw attention as a constant."""
    import torch.autograd.forward_ad as forward_ad

    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    out = torch.empty_like(q)
    calls = {
        "attention": lambda q, out=None: stsa.attention(q, k, v, grid, out=out),
        "routed_attention": lambda q, out=None: stsa.routed_attention(q, k, v, grid, samples=8, out=out),
        "Policy.attention": lambda q, out=None: stsa.Policy().attention(q, k, v, grid, step=0, layer=0, out=out),
    }
    with torch.no_grad(), forward_ad.dual_level():
        dual = forward_ad.make_dual(q, torch.randn_like(q))
        dual_out = forward_ad.make_dual(out, torch.zeros_like(out))
        for name, call in calls.items():
            with pytest.raises(stsa.Unsupported, match="no forward-mode derivatives, and q has a tangent"):
                call(dual)
            with pytest.raises(stsa.Unsupported, match="and out has a tangent"):
                call(q, dual_out)
            call(forward_ad.unpack_dual(dual).primal)  # the primal alone runs
        primal_out = stsa.attention(forward_ad.unpack_dual(dual).primal, k, v, grid)
    assert torch.equal(primal_out, stsa.attention(q, k, v, grid))


def with_negative_bit(x):
    """x's values in a view with torch's negative bit set (``z.conj().imag``)."""
    view = torch.complex(torch.zeros_like(x), -x).conj().imag
    assert view.is_neg() and torch.equal(view, x)
    return view


def test_a_negative_bit_is_applied_to_inputs_and_refused_on_outputs(rng):
    """DLPack hands over a tensor's storage without torch's negative (or conjugate) bit: an
    input with it is read through a resolved copy, the caller's tensor left as it was; an
    ``out`` or ``lse`` with it, which stsa cannot write through in place, is refused."""
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    nq, nk, nv = (with_negative_bit(x) for x in (q, k, v))
    assert torch.equal(stsa.attention(nq, k, nv, grid), stsa.attention(q, k, v, grid))
    assert torch.equal(stsa.routed_attention(q, nk, v, grid, samples=8)[0],
                       stsa.routed_attention(q, k, v, grid, samples=8)[0])
    assert stsa.route(nq, nk, nv, grid)["heads"] == stsa.route(q, k, v, grid)["heads"]
    assert torch.equal(stsa.attention(q, k, v, grid, q_descale=with_negative_bit(torch.full((1, 2), 0.5))),
                       stsa.attention(q, k, v, grid, q_descale=0.5))
    assert all(x.is_neg() for x in (nq, nk, nv)) and torch.equal(nq, q)  # the caller's tensors as they were
    out = torch.zeros(q.shape, dtype=torch.complex64).conj().imag
    lse = torch.zeros((1, 2, grid.tokens), dtype=torch.complex64).conj().imag
    with pytest.raises(stsa.InvalidArgument, match="out has torch's negative or conjugate bit set"):
        stsa.attention(q, k, v, grid, out=out)
    with pytest.raises(stsa.InvalidArgument, match="lse has torch's negative or conjugate bit set"):
        stsa.Policy().attention(q, k, v, grid, step=0, layer=0, lse=lse)
    assert not out.any() and not lse.any()


class _Subclass(torch.Tensor):
    """A torch.Tensor subclass of the caller's own module (a quantization or tracing library's, say)."""


def test_tensor_subclasses_from_other_modules_are_torch_tensors(rng):
    """A torch.Tensor subclass defined outside torch is a torch tensor: its output allocated
    by torch, its negative bit resolved, its gradients refused (it was taken by its module's
    name for another framework: NumPy's TypeError, the values read negated, no refusal)."""
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    expected = stsa.attention(q, k, v, grid)
    sq, sk, sv = (x.as_subclass(_Subclass) for x in (q, k, v))
    assert torch.equal(stsa.attention(sq, sk, sv, grid), expected)
    out = torch.empty_like(q).as_subclass(_Subclass)
    assert stsa.attention(with_negative_bit(q).as_subclass(_Subclass), sk, sv, grid, out=out) is out
    assert torch.equal(out.as_subclass(torch.Tensor), expected)
    with pytest.raises(stsa.Unsupported, match="no gradients"):
        stsa.attention(q.clone().requires_grad_().as_subclass(_Subclass), sk, sv, grid, out=out)
    assert stsa.route(sq, sk, sv, grid)["heads"] == stsa.route(q, k, v, grid)["heads"]
    # Routing reads tensors that require grad, a subclass's too (nanobind's TypeError before).
    needs_grad = q.clone().requires_grad_().as_subclass(_Subclass)
    assert stsa.route(needs_grad, sk, sv, grid)["heads"] == stsa.Policy().route(q, k, v, grid, 0, 0)["heads"]
    out = torch.zeros_like(q).requires_grad_().as_subclass(_Subclass)
    with torch.no_grad():  # and writes an out that does, under no_grad
        stsa.attention(q, k, v, grid, out=out)
    assert torch.equal(out.detach().as_subclass(torch.Tensor), expected)


def test_tensors_stsa_cannot_read_are_refused_by_name(rng):
    """Tensors that DLPack cannot hand over (meta, sparse): one stsa error naming the argument,
    not nanobind's TypeError listing the module's signatures."""
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    with pytest.raises(stsa.Unsupported, match="v is on meta: stsa takes host"):  # all three: their shapes
        stsa.attention(q, k, v.to("meta"), grid)
    with pytest.raises(stsa.Unsupported, match="q is on meta: stsa takes host"):
        stsa.route(q.to("meta"), k.to("meta"), v.to("meta"), grid)
    with pytest.raises(stsa.Unsupported, match="out is on meta"):
        stsa.attention(q, k, v, grid, out=torch.empty(q.shape, device="meta"))
    with pytest.raises(stsa.Unsupported, match="k is a torch.sparse_coo tensor"):
        stsa.route(q, k.to_sparse(), v, grid)
    with pytest.raises(stsa.Unsupported, match="k_descale is a torch.sparse_coo tensor"):
        stsa.attention(q, k, v, grid, k_descale=torch.ones(1, 2).to_sparse())
    with pytest.raises(stsa.Unsupported, match=r"q is a torch.func transform's tensor \(vmap"):
        torch.func.vmap(lambda q: stsa.attention(q, k, v, grid))(q.unsqueeze(0))


@needs_operators
def test_tensors_without_data_get_the_outputs_shapes(rng):
    """A model run on the meta device or under FakeTensorMode (for its shapes, its memory): the
    calls give outputs of the shapes, dtypes and device a real call gives (the operators' fake
    implementations); it was "q is on meta" and, for fake tensors, "q is null"."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    grid = stsa.VideoGrid(4, 4, 4, text=3)
    real = random_qkv(rng, grid, 2, 64, torch.bfloat16)
    real_f8 = tuple(x.to(torch.float8_e4m3fn) for x in real)

    def calls(q, k, v):
        yield stsa.attention(q, k, v, grid, ["spatial", "temporal"], 0.5, return_lse=True)
        yield stsa.attention(*(x.transpose(1, 2) for x in (q, k, v)), grid, layout="bhnd", return_lse=True)
        yield stsa.routed_attention(q, k, v, grid, samples=8, return_lse=True)[:2]
        yield stsa.Policy(density=0.5).attention(q, k, v, grid, step=5, layer=1, return_lse=True)[:2]

    expected = [[(tuple(t.shape), t.dtype) for t in pair] for inputs in (real, real_f8) for pair in calls(*inputs)]
    meta = [[(tuple(t.shape), t.dtype, t.device.type) for t in pair]
            for inputs in (real, real_f8) for pair in calls(*(x.to("meta") for x in inputs))]
    assert meta == [[(*e, "meta") for e in pair] for pair in expected]
    assert expected[0] == [((1, grid.tokens, 2, 64), torch.bfloat16), ((1, 2, grid.tokens), torch.float32)]
    assert expected[-1][0][1] == torch.bfloat16  # float8 in, bfloat16 out
    with FakeTensorMode() as mode:
        fake = [[(tuple(t.shape), t.dtype) for t in pair]
                for inputs in (real, real_f8) for pair in calls(*(mode.from_tensor(x) for x in inputs))]
    assert fake == expected


def test_outputs_autograd_tracks_are_refused_or_marked_written(rng):
    """As torch's own out= operators: an ``out`` (or ``lse``) that requires grad is refused
    while grad mode is on, and one written bumps its version counter, so a backward pass
    that saved it before stsa overwrote it is refused instead of using the new values."""
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    needs_grad = torch.zeros(q.shape, requires_grad=True)
    with pytest.raises(stsa.Unsupported, match="out requires grad"):
        stsa.attention(q, k, v, grid, out=needs_grad)
    with pytest.raises(stsa.Unsupported, match="lse requires grad"):
        stsa.routed_attention(q, k, v, grid, lse=torch.zeros((1, 2, grid.tokens), requires_grad=True))
    assert not needs_grad.detach().any()
    with torch.no_grad():
        stsa.attention(q, k, v, grid, out=needs_grad)  # not recorded: as torch's out= ops under no_grad
    out, lse = torch.empty(q.shape), torch.empty((1, 2, grid.tokens))
    for call in (lambda: stsa.attention(q, k, v, grid, out=out, lse=lse),
                 lambda: stsa.routed_attention(q, k, v, grid, out=out, lse=lse),
                 lambda: stsa.Policy().attention(q, k, v, grid, step=0, layer=0, out=out, lse=lse)):
        versions = out._version, lse._version
        call()
        assert out._version > versions[0] and lse._version > versions[1]
    w = torch.randn(q.shape, requires_grad=True)
    saved = torch.exp(w)  # exp keeps its output for the backward pass
    # A refused call writes nothing, so it leaves the version alone (and that backward pass intact),
    # also while a dispatch mode watches, where the output was copied into out before lse was checked.
    bad_lse = torch.empty((1, 2, grid.tokens), dtype=torch.float16)
    for watched in (False, True):
        kept = saved.detach().clone()
        with torch.no_grad(), (FlopCounterMode(display=False) if watched else contextlib.nullcontext()):
            with pytest.raises(stsa.InvalidArgument, match="lse must be"):
                stsa.attention(q, k, v, grid, out=saved, lse=bad_lse)
        assert torch.equal(saved, kept) and saved._version == 0, watched
    with torch.no_grad():
        stsa.attention(q, k, v, grid, out=saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()
    # Nor does stsa take a descale that requires grad: its gradient would be dropped without a word.
    with pytest.raises(stsa.Unsupported, match="v_descale requires grad"):
        stsa.attention(q, k, v, grid, v_descale=torch.full((1, 2), 0.5, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_tensors(dtype, head_dim, rng):
    require_gpu()
    grid = stsa.VideoGrid(10, 9, 7, text=11, text_placement="before")  # ragged tiles, text first, real bands at 0.5
    routes = ["temporal", "dense", "spatial", "frames"]
    q, k, v = random_qkv(rng, grid, 4, head_dim, dtype, "cuda")
    out, lse = stsa.attention(q, k, v, grid, routes, 0.5, return_lse=True)
    assert out.device == q.device and out.dtype == dtype and lse.device == q.device
    check(out, q, k, v, masks_for(grid, routes, 0.5), lse)
    # The CPU backend on the same tensors, copied: the same masks, within the same bound.
    cpu_out = stsa.attention(q.cpu(), k.cpu(), v.cpu(), grid, routes, 0.5)
    check(cpu_out, q, k, v, masks_for(grid, routes, 0.5))


def test_cuda_call_shapes_a_model_makes(rng):
    """Batch 2 (classifier-free guidance) with q, k, v as views of one fused projection,
    head-major tensors with out and lse given, and an fp32 output for bf16 inputs."""
    require_gpu()
    grid = stsa.VideoGrid(9, 6, 7, text=5)
    routes = ["spatial", "temporal"]
    qkv = torch.from_numpy(rng.standard_normal((2, grid.tokens, 3, 2, 64)).astype(np.float32))
    q, k, v = qkv.to(device="cuda", dtype=torch.bfloat16).unbind(2)  # [B, N, H, D], token stride 3 H D
    out = stsa.attention(q, k, v, grid, routes, 0.5)
    check(out, q, k, v, masks_for(grid, routes, 0.5))

    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, H, N, D]
    out = torch.empty(qh.shape, dtype=torch.float32, device="cuda")
    lse = torch.empty((2, 2, grid.tokens), dtype=torch.float32, device="cuda")
    returned = stsa.attention(qh, kh, vh, grid, routes, 0.5, layout="bhnd", out=out, lse=lse)
    assert returned[0] is out and returned[1] is lse
    check(out.transpose(1, 2), q, k, v, masks_for(grid, routes, 0.5), lse)


def test_cuda_routing_and_policy_on_a_side_stream(rng):
    require_gpu()
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["spatial", "temporal", "temporal", "spatial"]
    arrays = structured_heads(rng, grid, 64, kinds)
    q, k, v = (torch.from_numpy(a).to(device="cuda", dtype=torch.bfloat16) for a in arrays)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out, info = stsa.routed_attention(q, k, v, grid, density=0.4)
    side.synchronize()
    # The GPU router finds the structure, and the temporal heads run gathered, their output stored in place.
    assert info["routes"] == kinds and info["temporal_heads"] == [1, 2] and info["scatter_fused"]
    assert info["routing_ms"] > 0 and info["permutation_ms"] > 0
    check(out, q, k, v, reference.head_masks(grid, info["heads"]))
    decided = stsa.route(q, k, v, grid, density=0.4)  # routing alone, on the GPU router
    assert decided["routes"] == kinds and decided["routing_device_ms"] > 0
    assert stsa.route(q.cpu(), k.cpu(), v.cpu(), grid, density=0.4)["routes"] == kinds  # the CPU router agrees
    policy = stsa.Policy(dense_steps=1, density=0.4)
    out, info = policy.attention(q, k, v, grid, step=0, layer=0)
    assert info["routes"] == ["dense"] * 4
    check(out, q, k, v, reference.head_masks(grid, info["heads"]))
    out, info = policy.attention(q, k, v, grid, step=1, layer=0)
    assert info["routes"] == kinds and policy.cached_count == 4
    check(out, q, k, v, reference.head_masks(grid, info["heads"]))


def test_untimed_cuda_calls_return_without_waiting_for_the_device(rng):
    """stsa.attention, and Policy.attention with timed=False at a step that routes nothing,
    return while the stream is still busy with earlier work (a spin kernel of about
    0.25 s); a timed call waits for its outputs. Warmed up first: a plan's first upload
    waits by design."""
    require_gpu()
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["spatial", "temporal"]
    arrays = structured_heads(rng, grid, 64, kinds)
    q, k, v = (torch.from_numpy(a).to(device="cuda", dtype=torch.bfloat16) for a in arrays)
    policy = stsa.Policy(density=0.4, reuse_steps=10)
    _, routed = policy.attention(q, k, v, grid, step=0, layer=0)  # decisions held for the calls below
    reused = reference.head_masks(grid, routed["heads"])
    calls = {"attention": (lambda: stsa.attention(q, k, v, grid, kinds, 0.4), masks_for(grid, kinds, 0.4)),
             "reused, untimed": (lambda: policy.attention(q, k, v, grid, step=1, layer=0, timed=False)[0], reused),
             "reused, timed": (lambda: policy.attention(q, k, v, grid, step=1, layer=0)[0], reused)}
    for name, (call, masks) in calls.items():
        call()
        torch.cuda.synchronize()
        torch.cuda._sleep(500_000_000)  # cycles
        out = call()
        busy = not torch.cuda.current_stream().query()
        assert busy == (name != "reused, timed"), name
        check(out, q, k, v, masks)


def test_cuda_refusals(rng):
    require_gpu()
    grid = stsa.VideoGrid(2, 4, 4)
    q, k, v = random_qkv(rng, grid, 1, 64, torch.bfloat16, "cuda")
    with pytest.raises(stsa.InvalidArgument, match="must all be in one place"):
        stsa.attention(q, k.cpu(), v, grid)
    with pytest.raises(stsa.InvalidArgument, match="backend 'cpu' takes host arrays"):
        stsa.attention(q, k, v, grid, backend="cpu")
    with pytest.raises(stsa.Unsupported):  # the CUDA backend takes bf16 and fp16
        stsa.attention(q.float(), k.float(), v.float(), grid)
    with pytest.raises(stsa.Unsupported, match="fp8_e4m3"):  # no FP8 kernel yet
        stsa.attention(*(x.to(torch.float8_e4m3fn) for x in (q, k, v)), grid)
    out = torch.full_like(q, 7.0)
    # Nor descales: refused before anything is routed or written, on the host or the device.
    for call in (lambda **d: stsa.attention(q, k, v, grid, out=out, **d),
                 lambda **d: stsa.routed_attention(q, k, v, grid, out=out, **d),
                 lambda **d: stsa.route(q, k, v, grid, **d)):
        with pytest.raises(stsa.Unsupported, match="descales"):
            call(q_descale=0.5)
        with pytest.raises(stsa.Unsupported, match="descales"):
            call(v_descale=torch.ones(1, 1, device="cuda"))
    assert torch.all(out == 7.0)
    # Nor grouped-query attention yet (the host backends take it).
    q4 = torch.cat([q, q], dim=2)
    for mask in ("spatial", "temporal"):  # every head temporal: its K/V copies made no ungrouped call pass
        with pytest.raises(stsa.Unsupported, match="no grouped-query attention"):
            stsa.attention(q4, k, v, grid, mask=mask)
    with pytest.raises(stsa.Unsupported, match="no grouped-query attention"):
        stsa.route(q4, k, v, grid)
    with pytest.raises(stsa.InvalidArgument):
        stsa.attention(q, k, v, grid, mask="causal", out=out)
    assert torch.all(out == 7.0)


def compiled_graph_ops(fn, *args):
    """fn compiled whole (fullgraph: a graph break raises) through AOT autograd, which
    runs the operator's fake implementation; returns its outputs and the graph's ops."""
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)(*args), ops


def test_a_torch_without_tagged_custom_operators_is_told_the_version_it_needs():
    """torch < 2.8 cannot tag a custom operator cudagraph_unsafe: stsa's operators (the
    torch.compile path, stsa.diffusers) then refuse with the version, not an AttributeError."""
    if OPERATORS:
        stsa._require_torch_operators(torch)
    older = types.SimpleNamespace(Tag=types.SimpleNamespace(), __version__="2.7.1")
    with pytest.raises(stsa.Unsupported, match=r"need torch >= 2\.8 .* this is torch 2\.7\.1"):
        stsa._require_torch_operators(older)


@needs_operators
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_compiled_attention_is_one_operator(layout, rng):
    grid = stsa.VideoGrid(9, 4, 6, text=5, text_placement="before")
    routes = ["temporal", "spatial"]
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    if layout == "bhnd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))

    def layer(q, k, v):
        out, lse = stsa.attention(q, k, v, grid, routes, 0.5, layout=layout, return_lse=True)
        return out * 2, lse

    (out, lse), ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.attention") == 1, ops
    eager_out, eager_lse = layer(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    heads_first = out.transpose(1, 2) if layout == "bhnd" else out
    inputs = [x.transpose(1, 2) if layout == "bhnd" else x for x in (q, k, v)]
    check(heads_first / 2, *inputs, masks_for(grid, routes, 0.5))


@needs_operators
def test_compiled_grouped_query_attention_is_one_operator_per_call(rng):
    """K and V with fewer heads than Q pass through the operators' fake implementations
    (outputs shaped by Q) and give the eager bytes, which are the repeated call's."""
    grid = stsa.VideoGrid(5, 4, 6, text=3)
    q, _, _ = random_qkv(rng, grid, 4, 64, torch.bfloat16)
    k, v = (x[:, :, :2].contiguous() for x in random_qkv(rng, grid, 4, 64, torch.bfloat16)[1:])
    policy = stsa.Policy(density=0.5, samples=16)

    def layer(q, k, v):
        a = stsa.attention(q, k, v, grid, ["temporal", "spatial", "dense", "temporal"], 0.5)
        b, _ = stsa.routed_attention(q, k, v, grid, 0.5, samples=16)
        c, _ = policy.attention(q, k, v, grid, 0, 0)
        return a, b, c

    compiled, ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.attention") == 1 and ops.count("stsa.routed_attention") == 1, ops
    policy.clear()
    repeated = layer(q, k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2))
    for got, expected in zip(compiled, repeated):
        assert got.shape == q.shape and torch.equal(got, expected)


@needs_operators
def test_kv_expanded_over_the_heads_is_multi_query_attention(rng):
    """K and V expanded over the heads (stride 0), eager and through the operators, are the
    grouped call with one K/V head, bit for bit: no copy is made of them."""
    grid = stsa.VideoGrid(5, 4, 6, text=3)
    q, k, v = random_qkv(rng, grid, 4, 64, torch.bfloat16)
    k1, v1 = k[:, :, :1], v[:, :, :1]
    routes = ["temporal", "spatial", "dense", "temporal"]

    def layer(q, k1, v1):
        kb, vb = (x.expand(-1, -1, 4, -1) for x in (k1, v1))
        a = stsa.attention(q, kb, vb, grid, routes, 0.5)
        b, _ = stsa.routed_attention(q, kb, vb, grid, 0.5, samples=16)
        return a, b

    grouped = (stsa.attention(q, k1, v1, grid, routes, 0.5), stsa.routed_attention(q, k1, v1, grid, 0.5, samples=16)[0])
    compiled, ops = compiled_graph_ops(layer, q, k1, v1)
    assert ops.count("stsa.attention") == 1 and ops.count("stsa.routed_attention") == 1, ops
    for got in (*layer(q, k1, v1), *compiled):
        assert got.shape == q.shape
    for got, expected in zip((*layer(q, k1, v1), *compiled), grouped * 2):
        assert torch.equal(got, expected)
    with pytest.raises(stsa.InvalidArgument, match=r"k is broadcast over the heads \(stride 0\) and v is not"):
        stsa.attention(q, k1.expand(-1, -1, 4, -1), v, grid)


@needs_operators
def test_compiled_float8_attention_gives_the_eager_bfloat16_out(rng):
    """The operator's fake implementation allocates what the call does: bfloat16 for float8 inputs."""
    grid = stsa.VideoGrid(5, 4, 6)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float8_e4m3fn)

    def layer(q, k, v):
        return stsa.attention(q, k, v, grid, "spatial", 0.5)

    out, ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.attention") == 1, ops
    assert out.dtype == torch.bfloat16 and torch.equal(out, layer(q, k, v))


@needs_operators
def test_compiled_calls_take_descales(rng):
    """Descales as tensors (and numbers, made [B, H] tensors in the trace) reach the operators:
    every compiled call gives the eager call's bytes."""
    grid = stsa.VideoGrid(5, 4, 6)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float8_e4m3fn)
    qd, vd = torch.rand(1, 2) + 0.5, torch.rand(1, 2) + 0.5
    policy = stsa.Policy(density=0.5, samples=16)

    kd = np.full((1, 2), 0.75, np.float32)  # a NumPy array, a constant of the trace

    def layer(q, k, v, qd, vd):
        a = stsa.attention(q, k, v, grid, "spatial", 0.5, q_descale=qd, k_descale=kd, v_descale=vd)
        b, _ = stsa.routed_attention(q, k, v, grid, 0.5, samples=16, q_descale=qd, v_descale=vd)
        c, _ = policy.attention(q, k, v, grid, 0, 0, q_descale=qd, k_descale=0.75)
        return a, b, c

    compiled, ops = compiled_graph_ops(layer, q, k, v, qd, vd)
    assert ops.count("stsa.attention") == 1 and ops.count("stsa.routed_attention") == 1, ops
    policy.clear()
    for got, expected in zip(compiled, layer(q, k, v, qd, vd)):
        assert torch.equal(got, expected)
    assert not torch.equal(compiled[0], stsa.attention(q, k, v, grid, "spatial", 0.5))  # the descales counted


@needs_operators
def test_a_compiled_call_follows_its_grid_and_batch(rng):
    """The trace reads the grid's fields and guards on them: another grid (here two
    fewer text tokens) recompiles instead of reusing the first one's constants, and
    dynamic shapes take any batch."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, g: stsa.attention(q, k, v, g, "spatial", 0.5), fullgraph=True,
                             dynamic=True, backend="aot_eager")
    for grid, batch in ((stsa.VideoGrid(9, 4, 6, text=5), 1), (stsa.VideoGrid(9, 4, 6, text=3), 2),
                        (stsa.VideoGrid(9, 4, 6, text=5), 3)):
        q, k, v = (torch.from_numpy(rng.standard_normal((batch, grid.tokens, 2, 64)).astype(np.float32))
                   for _ in range(3))
        assert torch.equal(compiled(q, k, v, grid), stsa.attention(q, k, v, grid, "spatial", 0.5))


@needs_operators
def test_a_grid_of_numpy_integers_compiles(rng):
    """A grid whose sizes come from NumPy (np.prod of a shape, a config array) holds them as ints:
    the trace failed on NumPy integers (an internal dynamo error at the operator's int arguments)."""
    grid = stsa.VideoGrid(np.int64(5), np.int32(4), np.uint16(6), text=np.int64(3))
    assert all(type(getattr(grid, name)) is int for name in ("frames", "height", "width", "text"))
    assert type(grid.tokens) is int and grid == stsa.VideoGrid(5, 4, 6, text=3)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    out, ops = compiled_graph_ops(lambda q, k, v: stsa.attention(q, k, v, grid, "spatial", 0.5), q, k, v)
    assert ops.count("stsa.attention") == 1 and torch.equal(out, stsa.attention(q, k, v, grid, "spatial", 0.5))


@needs_operators
def test_a_grid_made_inside_compiled_code_stays_in_the_graph(rng):
    """A model makes its grid from the latents' shape inside its compiled forward. That grid
    (or a (frames, height, width) tuple) broke the graph at the extension's check (fullgraph
    raised); now one compile with dynamic shapes serves every video length, and the library
    checks the traced sizes when the operator runs."""
    per_frame = 4 * 6
    compiles, ops = [], []

    def backend(gm, example_inputs):
        compiles.append(1)
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    def with_grid(q, k, v, shrink):
        grid = stsa.VideoGrid(q.shape[1] // per_frame - shrink, 4, 6)
        return stsa.attention(q, k, v, grid, "spatial", 0.5)

    def with_tuple(q, k, v, shrink):
        return stsa.attention(q, k, v, (q.shape[1] // per_frame - shrink, 4, 6), "spatial", 0.5)

    for forward in (with_grid, with_tuple):
        torch._dynamo.reset()
        compiles.clear(), ops.clear()
        compiled = torch.compile(forward, fullgraph=True, dynamic=True, backend=backend)
        for frames in (5, 7, 9):
            q, k, v = random_qkv(rng, stsa.VideoGrid(frames, 4, 6), 2, 64, torch.float32)
            assert torch.equal(compiled(q, k, v, 0), forward(q, k, v, 0)), (forward.__name__, frames)
        assert len(compiles) == 1 and ops.count("stsa.attention") == 1, forward.__name__
        with pytest.raises(stsa.InvalidArgument, match="frames must be >= 1, got 0"):
            compiled(q, k, v, 9)

    def placed_in_the_middle(q, k, v):
        return stsa.attention(q, k, v, stsa.VideoGrid(q.shape[1] // per_frame, 4, 6, text_placement="middle"))

    with pytest.raises(Exception, match="text_placement must be 'before' or 'after', got 'middle'"):
        torch.compile(placed_in_the_middle, fullgraph=True, backend="aot_eager")(q, k, v)


@needs_operators
def test_an_exported_block_takes_any_video_length(rng):
    """torch.export with the frame count dynamic: the grid made from q's shape keeps its size
    symbolic (a SymInt was refused as "not an integer"), the program holds one stsa operator,
    and it returns the eager bytes at every length."""

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            grid = stsa.VideoGrid(q.shape[1] // 24, 4, 6, text=0)
            return stsa.attention(q, k, v, grid, ["spatial", "temporal"], 0.5) * 2

    frames = torch.export.Dim("frames", min=1, max=64)
    q, k, v = random_qkv(rng, stsa.VideoGrid(5, 4, 6), 2, 64, torch.float32)
    program = torch.export.export(Block(), (q, k, v), dynamic_shapes=[{1: 24 * frames}] * 3)
    ops = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert ops.count("stsa.attention.default") == 1, ops
    for length in (5, 8, 1):
        q, k, v = random_qkv(rng, stsa.VideoGrid(length, 4, 6), 2, 64, torch.float32)
        assert torch.equal(program.module()(q, k, v), Block()(q, k, v)), length


@needs_operators
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_torch_jit_trace_records_the_operators(rng):
    """torch.jit.trace saw the output's torch.empty and not stsa's writes into it: the traced
    module returned uninitialized memory for new inputs, silently. Traced calls go through the
    operators now, which the graph records, and new inputs get the eager bytes."""
    grid = stsa.VideoGrid(5, 4, 6, text=3)
    policy = stsa.Policy(density=0.5, samples=16)

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            routed, _ = stsa.routed_attention(q, k, v, grid, 0.5, samples=16)
            ruled, _ = policy.attention(routed, k, v, grid, step=0, layer=0)
            return stsa.attention(ruled, k, v, grid, ["spatial", "temporal"], 0.5)

    traced = torch.jit.trace(Block(), random_qkv(rng, grid, 2, 64, torch.float32))
    ops = [node.kind() for node in traced.graph.nodes() if node.kind().startswith("stsa::")]
    assert ops == ["stsa::routed_attention", "stsa::policy_attention", "stsa::attention"]
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    assert torch.equal(traced(q, k, v), Block()(q, k, v))


@needs_operators
def test_torch_fx_symbolic_trace_records_the_operators(rng):
    """torch.fx.symbolic_trace failed on control flow over q's attributes ("symbolically traced
    variables cannot be used as inputs to control flow"); each call is now a node of the graph."""
    grid = stsa.VideoGrid(5, 4, 6, text=3)
    policy = stsa.Policy(density=0.5, samples=16)

    def block(q, k, v):
        routed, _ = stsa.routed_attention(q, k, v, grid, 0.5, samples=16)
        ruled, _ = policy.attention(routed, k, v, grid, step=0, layer=0)
        return stsa.attention(ruled, k, v, grid, ["spatial", "temporal"], 0.5)

    traced = torch.fx.symbolic_trace(block)
    ops = [str(node.target) for node in traced.graph.nodes if str(node.target).startswith("stsa.")]
    assert ops == ["stsa.routed_attention", "stsa.policy_attention", "stsa.attention"]
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    assert torch.equal(traced(q, k, v), block(q, k, v))


@needs_operators
def test_a_saved_program_loads_in_a_process_that_imported_stsa(tmp_path):
    """torch.export.save, then torch.export.load in a fresh process: stsa's operators were
    registered by the first traced call only, so loading failed ("failed to resolve
    torch.ops.stsa.attention.default") unless that process had made one. Importing stsa
    after torch registers them; a process that imports stsa first calls register_torch_operators."""
    save = (
        "import sys, torch, stsa\n"
        "grid = stsa.VideoGrid(5, 4, 6, text=3)\n"
        "class Block(torch.nn.Module):\n"
        "    def forward(self, q, k, v):\n"
        "        out, info = stsa.routed_attention(q, k, v, grid, 0.5, samples=16)\n"
        "        return stsa.attention(out, k, v, grid, ['spatial', 'temporal'], 0.5)\n"
        "q, k, v = (torch.randn(1, grid.tokens, 2, 64) for _ in range(3))\n"
        "torch.export.save(torch.export.export(Block(), (q, k, v)), sys.argv[1] + '/block.pt2')\n"
        "torch.save({'qkv': (q, k, v), 'out': Block()(q, k, v)}, sys.argv[1] + '/io.pt')\n")
    load = (
        "import sys\n"
        "{imports}\n"
        "saved = torch.load(sys.argv[1] + '/io.pt')\n"
        "program = torch.export.load(sys.argv[1] + '/block.pt2').module()\n"
        "assert torch.equal(program(*saved['qkv']), saved['out'])\n")

    def run(script):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    run(save)
    run(load.format(imports="import torch, stsa"))
    run(load.format(imports="import stsa, torch\nstsa.register_torch_operators()"))


@needs_operators
def test_an_exported_policy_call_whose_policy_is_gone_says_so(rng):
    """An exported program calls its Policy by number; once nobody holds that Policy, the
    call is refused by name (it was a KeyError), and while it lives, it routes as eager."""
    import gc

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.policy = stsa.Policy(density=0.5, dense_steps=0)

        def forward(self, q, k, v):
            return self.policy.attention(q, k, v, stsa.VideoGrid(5, 4, 6), step=3, layer=1)[0]

    q, k, v = random_qkv(rng, stsa.VideoGrid(5, 4, 6), 2, 64, torch.float32)
    block = Block()
    program = torch.export.export(block, (q, k, v)).module()
    assert torch.equal(program(q, k, v), Block()(q, k, v))
    del block
    gc.collect()
    with pytest.raises(stsa.InvalidArgument, match=r"stsa.Policy this compiled or exported call .* no longer exists"):
        program(q, k, v)


@needs_operators
def test_the_operators_pass_torch_opcheck(rng):
    import stsa._torch_op  # noqa: F401  (registers torch.ops.stsa.*)

    grid = stsa.VideoGrid(9, 4, 6, text=3)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.bfloat16)
    where = ("bnhd", [128, 128], "exact", "")
    descales = [torch.rand(q.shape[0], q.shape[2]) + 0.5 for _ in range(3)]  # [B, H]
    torch.library.opcheck(torch.ops.stsa.attention.default,
                          (q, k, v, [9, 4, 6, 3], False, "temporal,spatial", 0.5, True, None, *where, *descales))
    torch.library.opcheck(torch.ops.stsa.routed_attention.default,
                          (q, k, v, [9, 4, 6, 3], False, 16, [0.5, 0.5, 0.5], False, 0.5, True, 1, None, *where, True,
                           None, descales[1], None))
    policy = stsa.Policy(density=0.5)
    torch.library.opcheck(torch.ops.stsa.policy_attention.default,
                          (q, k, v, policy._id, [9, 4, 6, 3], False, 0, 0, None, *where, False, None, None, None))


@needs_operators
@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cuda", torch.bfloat16)])
def test_a_compiled_policy_is_one_operator_for_every_step_and_layer(device, dtype, rng):
    """Policy.attention in a compiled block (fullgraph): one operator, the step and layer
    passed when it runs (one recompile each, when it first changes and turns dynamic, not
    one per value), the eager decisions and bytes at every step: warm-up, routed, reused."""
    if device == "cuda":
        require_gpu()
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    kinds = ["temporal", "spatial"]
    q, k, v = (torch.from_numpy(a).to(device, dtype) for a in structured_heads(rng, grid, 64, kinds))
    graphs = []

    def backend(gm, example_inputs):
        ops = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        graphs.append(ops.count("stsa.policy_attention"))
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    def block(policy, q, k, v, step, layer):
        out, info = policy.attention(q, k, v, grid, step, layer, timed=False)
        return out * 2, info  # exact in any type

    settings = {"dense_steps": 1, "reuse_steps": 2, "density": 0.4}
    compiled_policy, eager_policy = stsa.Policy(**settings), stsa.Policy(**settings)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    for step in range(4):
        for layer in range(2):
            out, info = compiled(compiled_policy, q, k, v, step, layer)
            eager_out, eager_info = block(eager_policy, q, k, v, step, layer)
            assert info is None and torch.equal(out, eager_out), (step, layer)
            assert compiled_policy.last_info["heads"] == eager_info["heads"] == eager_policy.last_info["heads"]
            assert (compiled_policy.last_info["routing_ms"] > 0) == (eager_info["routing_ms"] > 0)
    assert compiled_policy.last_info["routes"] == kinds  # past the warm-up, routed
    assert graphs and set(graphs) == {1} and len(graphs) <= 3, graphs
    check(out / 2, q, k, v, reference.head_masks(grid, compiled_policy.last_info["heads"]))


@needs_operators
def test_compiled_routed_attention_is_one_operator(rng):
    grid = stsa.VideoGrid(9, 6, 6, text=4)
    q, k, v = (torch.from_numpy(a) for a in structured_heads(rng, grid, 64, ["spatial", "temporal"]))

    def layer(q, k, v):
        out, lse, info = stsa.routed_attention(q, k, v, grid, density=0.4, temporal_density=0.3, samples=32,
                                               return_lse=True)
        return out * 2, lse, info

    (out, lse, info), ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.routed_attention") == 1 and info is None, ops
    eager_out, eager_lse, eager_info = layer(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert eager_info["routes"] == ["spatial", "temporal"]


@needs_operators
@pytest.mark.parametrize("seed", [2**63 - 1, 2**63, 2**64 - 1])
def test_compiled_routed_attention_takes_every_seed(seed, rng, monkeypatch):
    """Seeds run up to 2^64 - 1, the operator's ints to 2^63 - 1: a seed past that reaches the
    router intact (it failed the trace: an int64 cannot hold it)."""
    import stsa._torch_op

    grid = stsa.VideoGrid(5, 4, 6)
    q, k, v = random_qkv(rng, grid, 2, 64, torch.float32)
    seeds = []
    routed = stsa._torch_op.routed_attention
    monkeypatch.setattr(stsa._torch_op, "routed_attention",
                        lambda *args, **kwargs: seeds.append(kwargs["seed"]) or routed(*args, **kwargs))

    def layer(q, k, v):
        return stsa.routed_attention(q, k, v, grid, 0.5, samples=8, seed=seed)[0]

    out, ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.routed_attention") == 1 and seed in seeds, (ops, seeds)
    assert torch.equal(out, layer(q, k, v))


@needs_operators
def test_compiled_attention_on_the_gpu(rng):
    require_gpu()
    grid = stsa.VideoGrid(10, 9, 7, text=11)
    routes = ["temporal", "dense", "spatial", "frames"]
    q, k, v = random_qkv(rng, grid, 4, 128, torch.bfloat16, "cuda")

    def layer(q, k, v):
        return stsa.attention(q, k, v, grid, routes, 0.5) * 2  # exact in bf16

    out, ops = compiled_graph_ops(layer, q, k, v)
    assert ops.count("stsa.attention") == 1 and out.device == q.device, ops
    assert torch.equal(out, layer(q, k, v))
    check(out / 2, q, k, v, masks_for(grid, routes, 0.5))
