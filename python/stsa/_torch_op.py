"""stsa.attention, stsa.routed_attention and stsa.Policy.attention as PyTorch operators
(torch.ops.stsa.attention, .routed_attention, .policy_attention), which is what they
call while torch.compile traces them: the compiled graph holds one opaque call each,
whose shapes come from the fake implementations below, instead of breaking at the
extension module. Watched (a TorchDispatchMode, torch's profiler, torch.jit.trace) or given
a tensor subclass that dispatches (DTensor) they call them too: FlopCounterMode counts each by
the formulas below, DTensor shards them by the strategies at the end. Imported with stsa where
torch already is, else by the first of those calls."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from . import (InvalidArgument, VideoGrid, _batch_tokens_heads, _operator_call, _policies, _require_torch_operators,
               _stsa, attention, routed_attention)

_require_torch_operators(torch)


class _Recorded(threading.local):
    """What a routed or policy operator's call has measured and its caller reads right after it,
    on the same thread: the call's info (its caller returns it) and FLOPs (the mode's formula
    takes them). None where the call ran without data (a fake implementation)."""
    info: Optional[dict] = None
    flops: Optional[float] = None


_recorded = _Recorded()


@contextlib.contextmanager
def _operator_running():
    """Marks this thread as inside an operator's implementation: the eager call it makes stays eager."""
    outer, _operator_call.active = _operator_call.active, True
    try:
        yield
    finally:
        _operator_call.active = outer


# stsa's FlopCounterMode formulas: (op, formula, get_raw) as counted() declares them, and as
# torch's registry holds them once torch.utils.flop_counter is loaded (importing it here would
# add 0.2 s to `import stsa`; whoever counts FLOPs has loaded it).
_declared: list = []
_registered: dict = {}
_registering = threading.Lock()  # torch refuses a formula registered twice; DTensor's strategies once is enough


def counted(op, get_raw: bool = False):
    """Declares the decorated function ``op``'s FLOP formula."""

    def declare(formula):
        _declared.append((op, formula, get_raw))
        return formula

    return declare


def _formulas_to_counters() -> None:
    """Registers the formulas declared so far with torch's, and gives them to the active
    FlopCounterModes: a mode copies torch's formulas when it is made, so one made before they
    were registered (before stsa's first call under it) would count stsa's calls as 0."""
    flop_counter = sys.modules.get("torch.utils.flop_counter")
    if flop_counter is None:
        return
    with _registering:
        for op, formula, get_raw in _declared[len(_registered):]:
            _registered[op] = flop_counter.register_flop_formula(op, get_raw=get_raw)(formula)
    for mode in _get_current_dispatch_mode_stack():
        counter = getattr(mode, "counter", None)
        if isinstance(counter, flop_counter.FlopCounterMode):
            for op, formula in _registered.items():
                counter.flop_registry.setdefault(op, formula)


def _record(info: dict) -> None:
    _recorded.info, _recorded.flops = info, info["kept_flops"] + info["routing_flops"]


# Not captured into CUDA graphs (torch.compile's "reduce-overhead" keeps it out): a
# GPU call allocates its scratch and uploads a new plan as it runs, which a capture
# refuses (the C++ API records calls with a CudaRoutedWorkspace made beforehand).
@torch.library.custom_op("stsa::attention", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: list[int], text_before: bool, masks: str,
                 density: float, anchor: bool, scale: Optional[float], layout: str, tile: list[int], align: str,
                 backend: str, q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                 v_descale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of ``stsa.attention``; ``grid`` is (frames, height, width, text), ``masks``
    the mask names joined by commas, ``backend`` "" for where the tensors are."""
    with _operator_running():
        return attention(q, k, v, _grid(grid, text_before), masks.split(","), density, anchor=anchor, layout=layout,
                         scale=scale, tile=(tile[0], tile[1]), align=align, backend=backend or None, return_lse=True,
                         q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def _outputs_like(q, layout):
    # As the calls allocate them: out like q (contiguous; bfloat16 for float8 q), lse [B, H, N] float32.
    batch, tokens, heads = _batch_tokens_heads(q.shape, layout)
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return (torch.empty(q.shape, dtype=out_dtype, device=q.device),
            torch.empty((batch, heads, tokens), dtype=torch.float32, device=q.device))


@attention_op.register_fake
def _(q, k, v, grid, text_before, masks, density, anchor, scale, layout, tile, align, backend, q_descale, k_descale,
      v_descale):
    return _outputs_like(q, layout)


def _grid(grid: list[int], text_before: bool) -> VideoGrid:
    frames, height, width, text = grid
    return VideoGrid(frames, height, width, text, "before" if text_before else "after")


def _grid_args(grid: VideoGrid) -> tuple[list[int], bool]:
    return [grid.frames, grid.height, grid.width, grid.text], grid.text_placement == "before"


def _descale_tensors(descales, q, layout) -> list:
    """q, k and v descales as the operators take them: None or a tensor (a number becomes a
    [B, H] float32 tensor of it, any other array a tensor; the call checks shapes and values)."""
    batch, _, heads = _batch_tokens_heads(q.shape, layout)

    def tensor(d):
        if d is None or isinstance(d, torch.Tensor):
            return d
        if isinstance(d, (int, float)):
            return torch.full((batch, heads), float(d), dtype=torch.float32)
        return torch.as_tensor(d, dtype=torch.float32)  # a 0-d one is taken as a number by the call

    return [tensor(d) for d in descales]


# The router's settings travel as the keyword names and values of stsa._router's dict.
@torch.library.custom_op("stsa::routed_attention", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def routed_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: list[int], text_before: bool,
                        samples: int, densities: list[float], try_frames: bool, max_rel_l2: float, anchor: bool,
                        seed: int, scale: Optional[float], layout: str, tile: list[int], align: str, backend: str,
                        timed: bool, q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                        v_descale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of ``stsa.routed_attention``; ``densities`` spatial, temporal, frames; ``seed``
    as _signed_seed passes it."""
    with _operator_running():
        out, lse, info = routed_attention(q, k, v, _grid(grid, text_before), spatial_density=densities[0],
                                          temporal_density=densities[1], frames_density=densities[2],
                                          try_frames=try_frames, samples=samples, seed=seed % 2**64,
                                          max_rel_l2=max_rel_l2, anchor=anchor, layout=layout, scale=scale,
                                          tile=(tile[0], tile[1]), align=align, backend=backend or None,
                                          return_lse=True, timed=timed, q_descale=q_descale, k_descale=k_descale,
                                          v_descale=v_descale)
    _record(info)
    return out, lse


@routed_attention_op.register_fake
def _(q, k, v, grid, text_before, samples, densities, try_frames, max_rel_l2, anchor, seed, scale, layout, tile, align,
      backend, timed, q_descale, k_descale, v_descale):
    return _outputs_like(q, layout)


# The policy by number, its step and layer as ints the compiled graph passes when it runs
# (each turns dynamic when it first changes: one recompile each, not one per value).
@torch.library.custom_op("stsa::policy_attention", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def policy_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: int, grid: list[int],
                        text_before: bool, step: int, layer: int, scale: Optional[float], layout: str, tile: list[int],
                        align: str, backend: str, timed: bool, q_descale: Optional[torch.Tensor],
                        k_descale: Optional[torch.Tensor],
                        v_descale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of ``Policy.attention``; its info in the policy's ``last_info``."""
    found = _policies.get(policy)
    if found is None:  # was a KeyError
        raise InvalidArgument(f"the stsa.Policy this compiled or exported call was traced with (number {policy}) no "
                              "longer exists: keep the Policy alive while the program that calls it runs")
    with _operator_running():
        out, lse, info = found.attention(q, k, v, _grid(grid, text_before), step, layer, layout=layout, scale=scale,
                                         tile=(tile[0], tile[1]), align=align, backend=backend or None,
                                         return_lse=True, timed=timed, q_descale=q_descale, k_descale=k_descale,
                                         v_descale=v_descale)
    _record(info)
    return out, lse


@policy_attention_op.register_fake
def _(q, k, v, policy, grid, text_before, step, layer, scale, layout, tile, align, backend, timed, q_descale, k_descale,
      v_descale):
    return _outputs_like(q, layout)


def traced_attention(q, k, v, grid: VideoGrid, masks: list[str], density, anchor, layout, scale, tile, align, backend,
                     descales):
    """The operator's call for one ``stsa.attention`` call being traced or watched."""
    if not torch.compiler.is_compiling():
        _before_eager_call()
    return torch.ops.stsa.attention(q, k, v, *_grid_args(grid), ",".join(masks), float(density), bool(anchor),
                                    None if scale is None else float(scale), layout, [tile[0], tile[1]], align,
                                    backend or "", *_descale_tensors(descales, q, layout))


def _before_eager_call() -> None:
    _formulas_to_counters()
    _shardings_to_dtensor()
    _recorded.info = _recorded.flops = None  # what an earlier call recorded and nobody read


def _signed_seed(seed: int) -> int:
    # An operator's int is int64, the router's seed any integer below 2^64: a seed from 2^63 on is
    # passed as the int64 of its bits, and the operator takes it back modulo 2^64.
    return seed - 2**64 if seed >= 2**63 else seed


def traced_routed_attention(q, k, v, grid: VideoGrid, router: dict, layout, scale, tile, align, backend, timed,
                            descales):
    """The operator's call for one ``stsa.routed_attention`` call being traced or watched:
    ((out, lse), info), info None unless it ran now with data."""
    densities = [float(router[name]) for name in ("spatial_density", "temporal_density", "frames_density")]
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _before_eager_call()
    results = torch.ops.stsa.routed_attention(q, k, v, *_grid_args(grid), router["samples"], densities,
                                           bool(router["try_frames"]), float(router["max_rel_l2"]),
                                           bool(router["anchor"]), _signed_seed(router["seed"]),
                                           None if scale is None else float(scale), layout, [tile[0], tile[1]], align,
                                           backend or "", timed, *_descale_tensors(descales, q, layout))
    if compiling:
        return results, None
    info, _recorded.info = _recorded.info, None
    return results, info


def traced_policy_attention(policy: int, q, k, v, grid: VideoGrid, step, layer, layout, scale, tile, align, backend,
                            timed, descales):
    """The operator's call for one ``Policy.attention`` call being traced or watched."""
    if not torch.compiler.is_compiling():
        _before_eager_call()
    return torch.ops.stsa.policy_attention(q, k, v, policy, *_grid_args(grid), step, layer,
                                           None if scale is None else float(scale), layout, [tile[0], tile[1]], align,
                                           backend or "", timed, *_descale_tensors(descales, q, layout))


# FlopCounterMode's formulas: args as the operators take them, tensors as their shapes. What a
# call computes by definition (stsa.attention_flops' "kept"), plus a routed call's sampled rows.
def _kept_flops(shape, layout: str, grid: list[int], text_before: bool, masks: list[str], density: float,
                anchor: bool, tile: list[int], align: str) -> float:
    batch, _, heads = _batch_tokens_heads(shape, layout)
    return _stsa.attention_flops(_grid(grid, text_before)._native(), masks, density, anchor, int(batch), int(heads),
                                 int(shape[-1]), tile[0], tile[1], align)["kept"]


def _measured_or(estimate) -> int:
    """The FLOPs the call just recorded; without data (a fake implementation ran) ``estimate()``:
    every routed head at its spatial candidate's pairs, the routing's sampled rows not counted.
    An int, as torch's own formulas give (the library's doubles hold these counts exactly)."""
    flops, _recorded.flops = _recorded.flops, None
    return int(estimate() if flops is None else flops)


@counted(torch.ops.stsa.attention)
def _attention_flops(q, k, v, grid, text_before, masks, density, anchor, scale, layout, tile, align, *args,
                     **kwargs) -> int:
    return int(_kept_flops(q, layout, grid, text_before, masks.split(","), density, anchor, tile, align))


@counted(torch.ops.stsa.routed_attention)
def _routed_attention_flops(q, k, v, grid, text_before, samples, densities, try_frames, max_rel_l2, anchor, seed,
                            scale, layout, tile, align, *args, **kwargs) -> int:
    return _measured_or(lambda: _kept_flops(q, layout, grid, text_before, ["spatial"], densities[0], anchor, tile,
                                            align))


@counted(torch.ops.stsa.policy_attention)
def _policy_attention_flops(q, k, v, policy, grid, text_before, step, layer, scale, layout, tile, align, *args,
                            **kwargs) -> int:
    return _measured_or(lambda: _policy_estimate(_policies.get(policy), q, layout, grid, text_before, step, layer,
                                                 tile, align))


def _policy_estimate(policy: Any, shape, layout: str, grid: list[int], text_before: bool, step: int, layer,
                     tile: list[int], align: str) -> float:
    """A policy's call without data: dense in its warm-up (``layer`` None: unknown, the step's
    alone decides), else every head at the spatial candidate's pairs."""
    if policy is None:
        return 0.0
    settings = policy.settings
    if policy.dense(step, 2**31 - 1 if layer is None else layer):
        return _kept_flops(shape, layout, grid, text_before, ["dense"], 1.0, settings["anchor"], tile, align)
    density = settings["density"] if settings["spatial_density"] is None else settings["spatial_density"]
    return _kept_flops(shape, layout, grid, text_before, ["spatial"], density, settings["anchor"], tile, align)


# DTensor's sharding strategies (a DTensor reaches these operators by dispatch; with no strategy it
# refused them): each batch entry and each head is attended on its own, so q, k and v sharded
# alike over the batch or the heads give out (and lse) sharded the same way, and a DTensor
# sharded otherwise (over the tokens, context parallelism's layout) is redistributed to one of
# these first (an all-to-all to the heads: Ulysses). Routing samples rows across the batch, so a
# routed call is sharded over the heads only; one mask per head, over the batch only. Registered
# once torch.distributed.tensor is loaded (whoever made a DTensor has loaded it).
_sharded = False


def _shardings_to_dtensor() -> None:
    tensor_module = sys.modules.get("torch.distributed.tensor")
    if _sharded or tensor_module is None:
        return
    with _registering:
        if not _sharded:
            _register_shardings(tensor_module)


def _register_shardings(tensor_module) -> None:
    global _sharded
    from torch.distributed.tensor.experimental import register_sharding

    def strategies(layout: str, descales, middle: int, batch: bool, heads: bool) -> list:
        """([out, lse], [q, k, v, ``middle`` plain arguments, the descales]) placements."""
        def one(data, lse, descale):  # q, k, v and out placed as ``data``
            given = [None if d is None else descale for d in descales]
            return [data, lse], [data] * 3 + [None] * middle + given

        replicate = tensor_module.Replicate()
        options = [one(replicate, replicate, replicate)]
        if batch:
            options.append(one(tensor_module.Shard(0), tensor_module.Shard(0), tensor_module.Shard(0)))
        if heads:
            options.append(one(tensor_module.Shard(2 if layout == "bnhd" else 1), tensor_module.Shard(1),
                               tensor_module.Shard(1)))
        return options

    def groups_kept(q, k, layout: str) -> bool:
        """Whether q and k sharded over the heads keep each query head with its K/V head. With
        fewer K/V heads than query heads (grouped-query attention) only shards that split both
        counts evenly do: DTensor shards as torch.chunk does, so 12 query heads and 3 K/V heads
        over 2 ranks are 6 + 6 and 2 + 1, and a rank would group its query heads by 3, not 4,
        reading the wrong K/V heads. Where that could happen no head sharding is offered, and
        DTensor redistributes to one the call can take. Any mesh dimensions may shard the heads
        together, so the count that must divide is the whole mesh's."""
        axis = 2 if layout == "bnhd" else 1
        return k.shape[axis] == q.shape[axis] or k.shape[axis] % q.mesh.size() == 0

    # DTensor caches a strategy by the tensors' specs and the arguments from the first int one on,
    # which this operator has none of: its masks and layout, which the strategy reads, must be in
    # the key too (else a call with one mask per head reused one mask's sharding over the heads).
    propagator = tensor_module.DTensor._op_dispatcher.sharding_propagator
    if hasattr(propagator, "op_to_schema_info"):
        @register_sharding(torch.ops.stsa.attention.default)
        def _(q, k, v, grid, text_before, masks, density, anchor, scale, layout, tile, align, backend, *descales):
            return strategies(layout, descales, 10, batch=True, heads="," not in masks and groups_kept(q, k, layout))

        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        propagator.op_to_schema_info[torch.ops.stsa.attention.default] = RuntimeSchemaInfo(3, needs_pytree=True)

    @register_sharding(torch.ops.stsa.routed_attention.default)
    def _(q, k, v, grid, text_before, samples, densities, try_frames, max_rel_l2, anchor, seed, scale, layout, tile,
          align, backend, timed, *descales):
        return strategies(layout, descales, 14, batch=False, heads=groups_kept(q, k, layout))

    @register_sharding(torch.ops.stsa.policy_attention.default)
    def _(q, k, v, policy, grid, text_before, step, layer, scale, layout, tile, align, backend, timed, *descales):
        return strategies(layout, descales, 11, batch=False, heads=groups_kept(q, k, layout))

    _sharded = True
