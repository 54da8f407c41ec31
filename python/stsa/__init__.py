"""stsa: spatio-temporal sparse attention for video diffusion transformers.

Arrays are NumPy arrays or PyTorch tensors (anything that speaks DLPack or the
buffer protocol), float32, float16 or bfloat16, addressed as [B, N, H, D]
(``layout="bnhd"``) or [B, H, N, D] (``layout="bhnd"``), with any strides; tokens
come in frame-major order (frame, row, column), text tokens before or after the
video as the grid says. q, k and v may also be float8_e4m3fn (torch's, or
ml_dtypes' in NumPy) on the host, with ``out`` then bfloat16 (or float32, float16),
and their per-(batch, head) descales given as ``q_descale``, ``k_descale`` and
``v_descale`` ([B, H] arrays or numbers, as FlashAttention-3 takes them).
Nothing is copied: the library reads the inputs where they are and writes ``out``
(allocated like ``q`` in its own framework when not given; bfloat16 for float8); a
torch input with its negative or conjugate bit set (``z.conj().imag``) is the one
exception, resolved into a copy first. Accumulation is fp32; ``lse`` is the
natural-log sum of exp per row, [B, H, N] float32. Host arrays run on the CPU
backend, CUDA arrays on the CUDA backend (bf16 or fp16, head dims 64 and 128;
routing, permutation and attention all on the GPU, enqueued on torch's current
stream or ``stream``: ``attention`` returns once enqueued, as torch's own
operators do; a routed call waits for its routing decisions, and for its outputs
when it times itself, ``timed=True``); ``backend`` names another ("reference":
fp64 loops).

    import stsa
    grid = stsa.VideoGrid(frames=21, height=30, width=52)          # Wan2.1 480p latents
    o = stsa.attention(q, k, v, grid, mask="spatial", density=0.25)
    o, info = stsa.routed_attention(q, k, v, grid, density=0.25)    # each head routed online
    policy = stsa.Policy.from_preset("wan2.1-480p")                  # warm-up, reuse, densities
    o, info = policy.attention(q, k, v, grid, step=step, layer=layer)

A diffusers video transformer (Wan, SkyReels-V2, LTX-Video, CogVideoX, HunyuanVideo 1.0/1.5, Mochi)
takes stsa without other changes: ``import stsa.diffusers`` (needs torch and
diffusers), then ``stsa.diffusers.enable(pipe, "wan2.1-720p")``.

Errors are ``stsa.Error`` subclasses that are also the built-in kind:
``stsa.InvalidArgument`` is a ValueError, ``stsa.Unsupported`` a
NotImplementedError, ``stsa.ResourceError`` a MemoryError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import numbers
import sys
import threading
import weakref
from typing import Any, Sequence

from . import _stsa
from ._stsa import Error, InvalidArgument, IoError, ResourceError, Unsupported
from ._stsa import __version__  # the library's, from CMakeLists.txt (pip's metadata reads the same)

__all__ = [
    "Error", "InvalidArgument", "IoError", "ResourceError", "Unsupported", "VideoGrid", "Policy", "attention",
    "routed_attention", "route", "plan", "tile_lists", "attention_flops", "token_order", "model_presets",
    "model_preset", "backends", "clear_plan_cache", "set_num_threads", "get_num_threads", "set_isa", "get_isa",
    "register_torch_operators",
]

_DEFAULT_TILE = (128, 128)


@dataclasses.dataclass(frozen=True)
class VideoGrid:
    """Latent frames x token rows x token columns, and text tokens before or after
    the video. A value (compares, hashes and pickles by its fields) and plain Python,
    so torch.compile reads it (and guards on it) without a graph break, and a model may
    make one inside the compiled code, from its latents' shape (sizes traced as SymInts)."""

    frames: int
    height: int
    width: int
    text: int = 0
    text_placement: str = "after"

    def __post_init__(self):
        for name in ("frames", "height", "width", "text"):
            value = getattr(self, name)
            if _symbolic_int(value):  # a size traced from a shape (torch.export): int() would fix its value
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise InvalidArgument(f"VideoGrid {name} must be an integer, got {value!r}")
            # Held as a Python int: a NumPy integer failed torch.compile's trace (an operator's int
            # argument) and made tokens and video_tokens NumPy integers.
            object.__setattr__(self, name, int(value))
        if not isinstance(self.text_placement, str) or self.text_placement not in ("before", "after"):
            raise InvalidArgument(f"VideoGrid text_placement must be 'before' or 'after', got {self.text_placement!r}")
        # The library checks the values (stsa.InvalidArgument). While torch.compile traces, the
        # extension's call would break the graph: the operator the grid goes to makes the library's
        # grid, with the same checks, each time it runs.
        if not _torch_compiling():
            self._native()

    @property
    def video_tokens(self) -> int:
        return self.frames * self.height * self.width

    @property
    def tokens(self) -> int:
        return self.video_tokens + self.text

    def _native(self):
        return _stsa.VideoGrid(self.frames, self.height, self.width, self.text, self.text_placement)


def attention(q, k, v, grid, mask: str | Sequence[str] = "spatial", density: float = 0.25, *, anchor: bool = True,
              layout: str = "bnhd", out=None, lse=None, return_lse: bool = False, scale: float | None = None,
              backend: str | None = None, stream: int | None = None, tile: int | tuple[int, int] = _DEFAULT_TILE,
              align: str = "exact", q_descale=None, k_descale=None, v_descale=None):
    """Sparse attention with the mask you name, for every head or one per head.

    mask: "dense", "spatial" (a band in frame-major order), "temporal" (a band in
    spatial-major order: the head's tokens are gathered into that order and its
    output stored back) or "frames" (a window of whole frames); ``density`` is
    the kept fraction each mask is sized to. With ``anchor`` frame 0 attends to
    all keys and every query attends to frame 0; text tokens are dense.
    align="round" turns every partial tile full or empty (``plan()`` reports
    how many pairs that changed). Returns ``out``, or ``(out, lse)`` when
    ``return_lse`` or ``lse`` is given. ``backend``: "cpu" or "reference" for host
    arrays, "cuda" for CUDA arrays (None: where the arrays are); ``stream``: the
    cudaStream_t of a GPU call (None: torch's current stream, else the default).
    ``q_descale``, ``k_descale``, ``v_descale``: FlashAttention-3's per-(batch, head)
    dequantization factors of quantized (float8) inputs, [B, H] float32 host arrays or
    numbers: the scores are scaled by q's times k's, the output by v's (host backends).
    ``k`` and ``v`` may hold fewer heads than ``q`` (grouped-query attention), a count
    dividing q's: query head h reads K/V head h // (H // Hkv), as torch's ``enable_gqa``,
    without a copy (host backends; the CUDA backend refuses it for now).
    Under torch.compile (torch tensors, a VideoGrid, no ``out``, ``lse`` or
    ``stream``) the call is one operator in the compiled graph,
    ``torch.ops.stsa.attention``, not a graph break. Watched (a TorchDispatchMode such as
    ``FlopCounterMode``, which counts ``attention_flops``' "kept"; torch's profiler;
    torch.jit.trace) or given a dispatching tensor subclass (DTensor), it is the same
    operator, with the eager call's outputs.
    """
    masks, density = _masks(mask), _number("density", density)
    anchor, return_lse = _flag("anchor", anchor), _flag("return_lse", return_lse)
    _refuse_autograd(q, k, v, out, lse)
    if _through_operator(q, k, v, out, lse, stream):
        from ._torch_op import traced_attention

        want_lse = return_lse or lse is not None
        out, lse = _into_given(out, lse, traced_attention(q, k, v, _video_grid(grid), masks, density, anchor, layout,
                                                          scale, _tile(tile), align, backend,
                                                          (q_descale, k_descale, v_descale)))
        return (out, lse) if want_lse else out
    out, lse, want_lse = _outputs(q, out, lse, return_lse, layout)
    descales = _descales(q, layout, q_descale, k_descale, v_descale)
    with _device_of(q), _written(out, lse):
        _stsa.attention(**_arrays(q, k, v, out, lse, stream), **descales,
                        **_where(q, grid, scale, backend, stream, tile, align, layout), masks=masks, density=density,
                        anchor=anchor)
    return (out, lse) if want_lse else out


def routed_attention(q, k, v, grid, density: float = 0.25, *, spatial_density: float | None = None,
                     temporal_density: float | None = None, frames_density: float | None = None,
                     try_frames: bool = False, samples: int = 64, seed: int = 1, max_rel_l2: float = 0.5,
                     anchor: bool = True, layout: str = "bnhd", out=None, lse=None, return_lse: bool = False,
                     scale: float | None = None, backend: str | None = None, stream: int | None = None,
                     tile: int | tuple[int, int] = _DEFAULT_TILE, align: str = "exact", timed: bool = True,
                     q_descale=None, k_descale=None, v_descale=None):
    """Routes every head online, then runs each with its mask.

    For each head, ``samples`` query rows spread over all frames (every row of a
    call with fewer tokens) get their exact
    attention and their attention under each candidate mask (spatial, temporal,
    and frames with ``try_frames``) at the kept density; the candidate with the
    lowest MSE wins, unless even its relative L2 error exceeds ``max_rel_l2``,
    which keeps the head dense. Returns ``(out, info)`` or ``(out, lse, info)``;
    ``info`` has each head's route, mask and candidates' errors, and the
    routing, permutation and attention times in ms. ``timed=False``: no permutation
    and attention times (None), and a GPU call returns once its work is enqueued
    instead of waiting to time it (it still waits for its routing decisions).
    Descales, and K and V with fewer heads than Q, as ``attention`` takes them; the routing
    errors are then the dequantized outputs'.
    ``info["kept_flops"]`` counts the attention the masks keep, ``info["routing_flops"]``
    the router's sampled rows (both what FlopCounterMode counts for the call).
    Under torch.compile (torch tensors, no ``out``, ``lse`` or ``stream``) the call
    is one operator, ``torch.ops.stsa.routed_attention``, and ``info`` is None; watched or
    given a subclass (as ``attention``), the same operator, with ``info`` as eager (None without data).
    """
    router = _router(density, spatial_density, temporal_density, frames_density, try_frames, samples, seed, max_rel_l2,
                     anchor)
    return_lse = _flag("return_lse", return_lse)
    _refuse_autograd(q, k, v, out, lse)
    if _through_operator(q, k, v, out, lse, stream):
        from ._torch_op import traced_routed_attention

        want_lse = return_lse or lse is not None
        results, info = traced_routed_attention(q, k, v, _video_grid(grid), router, layout, scale, _tile(tile), align,
                                                backend, _flag("timed", timed), (q_descale, k_descale, v_descale))
        out, lse = _into_given(out, lse, results)
        return (out, lse, info) if want_lse else (out, info)
    out, lse, want_lse = _outputs(q, out, lse, return_lse, layout)
    descales = _descales(q, layout, q_descale, k_descale, v_descale)
    with _device_of(q), _written(out, lse):
        info = _stsa.routed_attention(**_arrays(q, k, v, out, lse, stream), **descales,
                                      **_where(q, grid, scale, backend, stream, tile, align, layout), **router,
                                      timed=_flag("timed", timed))
    return (out, lse, info) if want_lse else (out, info)


def route(q, k, v, grid, density: float = 0.25, *, spatial_density: float | None = None,
          temporal_density: float | None = None, frames_density: float | None = None, try_frames: bool = False,
          samples: int = 64, seed: int = 1, max_rel_l2: float = 0.5, anchor: bool = True, layout: str = "bnhd",
          scale: float | None = None, stream: int | None = None, q_descale=None, k_descale=None,
          v_descale=None) -> dict[str, Any]:
    """Routing alone, for attention run elsewhere: each head's decision as
    ``routed_attention`` makes it (on the GPU for CUDA arrays), without computing
    the attention. Returns ``routes``, ``heads`` (route, mask, band, candidates'
    errors), ``sampled_rows``, ``routing_ms``, ``flops``, ``product_units`` (what
    the CPU router computed on: ``"amx"`` tiles for bf16, fp16 or fp8 inputs on a CPU
    with AMX, ``"bf16_dot"`` (the scores) for bf16 or fp8 inputs on one with AVX-512 alone, else
    ``"fma"``; ``None`` from the GPU router) and ``tile_products``
    (``product_units == "amx"``);
    ``tile_lists(grid, route, density)`` gives each route's plan."""
    router = _router(density, spatial_density, temporal_density, frames_density, try_frames, samples, seed, max_rel_l2,
                     anchor)
    with _device_of(q):
        return _stsa.route(**_arrays(q, k, v, stream=stream), **_descales(q, layout, q_descale, k_descale, v_descale),
                           grid=_grid(grid), scale=_scale(scale), stream=_stream(q, stream), layout=layout, **router)


class Policy:
    """When to route and with what, across the denoising steps and layers of one generation.

    The first ``dense_steps`` steps and the first ``dense_layers`` layers of every
    step run dense; elsewhere each head is routed, and its decision is reused
    for ``reuse_steps`` steps of the same layer (1: route every step), and by the same
    video with a prompt of another length. A step lower than the one a decision was
    made at (a new generation), or another video grid, routes again.
    Router settings as in ``routed_attention``.
    """

    def __init__(self, dense_steps: int = 0, dense_layers: int = 0, reuse_steps: int = 1, *, density: float = 0.25,
                 spatial_density: float | None = None, temporal_density: float | None = None,
                 frames_density: float | None = None, try_frames: bool = False, samples: int = 64, seed: int = 1,
                 max_rel_l2: float = 0.5, anchor: bool = True):
        self._policy = _stsa.Policy(dense_steps=_count("dense_steps", dense_steps, 0),
                                    dense_layers=_count("dense_layers", dense_layers, 0),
                                    reuse_steps=_count("reuse_steps", reuse_steps, 1),
                                    **_router(density, spatial_density, temporal_density, frames_density, try_frames,
                                              samples, seed, max_rel_l2, anchor))
        self.last_info: dict[str, Any] | None = None  # the latest attention call's info (under torch.compile too)
        self._id = next(_policy_ids)  # how the compiled path's operator finds this policy
        _policies[self._id] = self
        self._settings = {"dense_steps": dense_steps, "dense_layers": dense_layers, "reuse_steps": reuse_steps,
                          "density": density, "spatial_density": spatial_density,
                          "temporal_density": temporal_density, "frames_density": frames_density,
                          "try_frames": try_frames, "samples": samples, "seed": seed, "max_rel_l2": max_rel_l2,
                          "anchor": anchor}

    def __reduce__(self):
        # Pickled (torch.save of a model that holds one) or deep-copied (copy.deepcopy of such a
        # model): the settings, as Policy(**p.settings) takes them; the decisions, a generation's
        # state, stay with this one. Its native policy could be neither, which raised TypeError.
        return _policy_with, (self._settings,)

    @property
    def settings(self) -> dict[str, Any]:
        """The arguments this policy was made with: ``Policy(**p.settings)`` is another
        policy with the same settings and no decisions (one per model, say)."""
        return dict(self._settings)

    @classmethod
    def from_preset(cls, name: str) -> "Policy":
        """The starting policy of a model preset (``model_presets()`` lists them). One density
        for every mask kind is its ``density``, which the kinds follow (theirs None), so
        ``Policy(**{**p.settings, "density": 0.3})`` changes them all."""
        settings = model_preset(name)["policy"]
        kinds = {kind: settings.pop(kind) for kind in ("spatial_density", "temporal_density", "frames_density")}
        if len(set(kinds.values())) == 1:
            settings["density"] = next(iter(kinds.values()))
        else:
            settings.update(kinds)
        return cls(**settings)

    def dense(self, step: int, layer: int) -> bool:
        """Whether (step, layer) is in the dense warm-up."""
        return self._policy.dense(_count("step", step, 0), _count("layer", layer, 0))

    def route(self, q, k, v, grid, step: int, layer: int, *, layout: str = "bnhd", scale: float | None = None,
              stream: int | None = None, q_descale=None, k_descale=None, v_descale=None) -> dict[str, Any]:
        """Every head's decision at (step, layer), for attention run elsewhere: dense in
        the warm-up, reused where a decision holds, routed (and remembered) otherwise.
        Returns ``routes``, ``heads``, and ``routing`` (what ``route()`` returns for the
        heads routed now; None when none was)."""
        with _device_of(q):
            return self._policy.route(**_arrays(q, k, v, stream=stream),
                                      **_descales(q, layout, q_descale, k_descale, v_descale), grid=_grid(grid),
                                      step=_count("step", step, 0), layer=_count("layer", layer, 0),
                                      scale=_scale(scale), stream=_stream(q, stream), layout=layout)

    @property
    def cached_count(self) -> int:
        """How many (layer, head) decisions are held for reuse."""
        return self._policy.cached_count

    def clear(self) -> None:
        """Forgets every decision (a new prompt or grid)."""
        self._policy.clear()

    def attention(self, q, k, v, grid, step: int, layer: int, *, layout: str = "bnhd", out=None, lse=None,
                  return_lse: bool = False, scale: float | None = None, backend: str | None = None,
                  stream: int | None = None, tile: int | tuple[int, int] = _DEFAULT_TILE, align: str = "exact",
                  timed: bool = True, q_descale=None, k_descale=None, v_descale=None):
        """One layer's self-attention at one step; returns ``(out, info)`` or ``(out, lse, info)``.
        ``timed=False``: no permutation and attention times (None), and a GPU call that
        routes no head (dense, or decisions reused) returns once enqueued, never waiting
        for the device, so a model's next layers queue behind it. Under torch.compile
        (torch tensors, no ``out``, ``lse`` or ``stream``) the call is one operator,
        ``torch.ops.stsa.policy_attention``, whose ``step`` and ``layer`` are read when it
        runs; ``info`` is then None and ``last_info`` holds it after the call. Watched or given
        a subclass (as ``stsa.attention``) it is that operator too, with ``info`` as eager."""
        return_lse = _flag("return_lse", return_lse)
        _refuse_autograd(q, k, v, out, lse)
        if _through_operator(q, k, v, out, lse, stream):
            from ._torch_op import traced_policy_attention

            want_lse = return_lse or lse is not None
            compiling = _torch_compiling()
            if not compiling:
                self.last_info = None  # the operator's call sets it when it runs now
            results = traced_policy_attention(self._id, q, k, v, _video_grid(grid), step, layer, layout, scale,
                                              _tile(tile), align, backend, _flag("timed", timed),
                                              (q_descale, k_descale, v_descale))
            out, lse = _into_given(out, lse, results)
            info = None if compiling else self.last_info
            return (out, lse, info) if want_lse else (out, info)
        out, lse, want_lse = _outputs(q, out, lse, return_lse, layout)
        descales = _descales(q, layout, q_descale, k_descale, v_descale)
        with _device_of(q), _written(out, lse):
            info = self._policy.attention(**_arrays(q, k, v, out, lse, stream), **descales,
                                          **_where(q, grid, scale, backend, stream, tile, align, layout),
                                          step=_count("step", step, 0), layer=_count("layer", layer, 0),
                                          timed=_flag("timed", timed))
        self.last_info = info
        return (out, lse, info) if want_lse else (out, info)


def _policy_with(settings: dict[str, Any]) -> Policy:
    return Policy(**settings)


# Every Policy by number, for the compiled path's operator (it takes tensors and plain
# values); a policy nobody holds is gone from here too.
_policy_ids = itertools.count()
_policies: "weakref.WeakValueDictionary[int, Policy]" = weakref.WeakValueDictionary()


def plan(grid, mask: str = "spatial", density: float = 0.25, *, anchor: bool = True,
         tile: int | tuple[int, int] = _DEFAULT_TILE, align: str = "exact") -> dict[str, Any]:
    """The tile plan of one mask on ``grid``: tiles full / partial / empty, kept pairs
    (exact, and what the plan computes), pairs rounding changed, size and build time."""
    return _stsa.plan(_grid(grid), _mask_name(mask), _number("density", density), _flag("anchor", anchor),
                      *_tile(tile), align, lists=False)


def attention_flops(grid, mask: str | Sequence[str] = "spatial", density: float = 0.25, *, heads: int, head_dim: int,
                    batch: int = 1, anchor: bool = True, tile: int | tuple[int, int] = _DEFAULT_TILE,
                    align: str = "exact") -> dict[str, float]:
    """The floating-point operations of an ``attention`` call with these masks (Q K^T and
    P V, two per multiply-add): ``kept``, the masks' kept pairs, which is what torch's
    ``FlopCounterMode`` counts for the call; ``kept_tiles``, what the kernels' tiles compute
    (a partial tile whole); ``dense``, every pair."""
    tile_q, tile_k = _tile(tile)
    return _stsa.attention_flops(_grid(grid), _masks(mask), _number("density", density), _flag("anchor", anchor),
                                 _count("batch", batch, 1), _count("heads", heads, 1), _count("head_dim", head_dim, 1),
                                 tile_q, tile_k, align)


def tile_lists(grid, mask: str = "spatial", density: float = 0.25, *, anchor: bool = True,
               tile: int | tuple[int, int] = _DEFAULT_TILE, align: str = "exact") -> dict[str, Any]:
    """The same plan as NumPy arrays, for attention run elsewhere, in the layout of
    FlexAttention's ``BlockMask.from_kv_blocks`` (add the batch and head axes):

    - ``kv_num_blocks`` [Qt], ``kv_indices`` [Qt, Kt]: per query tile, its partial key tiles;
    - ``full_kv_num_blocks``, ``full_kv_indices``: its full key tiles (no mask needed);
    - ``mask_ids`` [Qt, Kt]: the partial tile's element mask in ``masks`` [M, tile_q, tile_k]
      (bool; -1 where the tile is not partial);
    - ``order``: the token order the tiles are in ("spatial-major" for a temporal mask:
      gather the tokens with ``token_order(grid, order)`` first), and ``tile``.
    """
    lists = _stsa.plan(_grid(grid), _mask_name(mask), _number("density", density), _flag("anchor", anchor),
                       *_tile(tile), align, lists=True)
    lists["masks"] = lists["masks"].view(bool)  # bytes of 0 or 1 from the module
    return lists


def token_order(grid, order: str = "spatial-major"):
    """[N] int64: the frame-major position of the token at each position of ``order``, so
    ``x[:, token_order(grid)]`` gathers a frame-major [B, N, ...] tensor into spatial-major
    order (frame 0 kept in front; text tokens stay where they are) and
    ``y[:, token_order(grid)] = x_permuted`` scatters it back."""
    return _stsa.token_order(_grid(grid), order)


def model_presets() -> list[dict[str, Any]]:
    """The models stsa has shapes and starting policies for."""
    presets = _stsa.model_presets()
    for preset in presets:
        native = preset["grid"]
        preset["grid"] = VideoGrid(native.frames, native.height, native.width, native.text, native.text_placement)
    return presets


def model_preset(name: str) -> dict[str, Any]:
    presets = model_presets()
    for preset in presets:
        if preset["name"] == name:
            return preset
    raise InvalidArgument(f"unknown model preset '{name}' (available: {', '.join(p['name'] for p in presets)})")


def backends() -> list[str]:
    """The backends of this build: "reference" (fp64 loops), "cpu", and "cuda" where built."""
    return _stsa.backends()


# set_num_threads and set_isa each change one of the two process defaults by reading both and
# writing both back; Python threads can switch between the read and the write, and the field the
# other call had just set was then written back as it was before (a lost update).
_cpu_defaults_lock = threading.Lock()


def set_num_threads(threads: int) -> None:
    """The threads of host calls (the CPU backend, the router, the permutation) from the next
    call on, before ``STSA_THREADS``, as ``torch.set_num_threads`` is before ``OMP_NUM_THREADS``;
    0 goes back to ``STSA_THREADS``, then all cores. For the whole process, in [0, 4096]."""
    if not isinstance(threads, numbers.Integral) or isinstance(threads, bool) or not 0 <= threads <= 4096:
        raise InvalidArgument(f"threads must be an int in [0, 4096] (0: STSA_THREADS, then all), got {threads!r}")
    with _cpu_defaults_lock:  # the other field read and written back at once: a set_isa between is kept
        isa, _ = _stsa.cpu_defaults()
        _stsa.set_cpu_defaults(isa, int(threads))


def get_num_threads() -> int:
    """The threads a host call starting now runs with (``set_num_threads``, ``STSA_THREADS``, all cores)."""
    return _stsa.resolved_cpu()[1]


def set_isa(isa: str) -> None:
    """The instruction set of host calls (the CPU backend's kernels, the router's products)
    from the next call on, before ``STSA_ISA``: "scalar", "avx2", "avx512" or "amx", or "auto"
    (back to ``STSA_ISA``, then the best this CPU has). ``stsa.Unsupported`` for one it lacks."""
    if not isinstance(isa, str):
        raise InvalidArgument(f"isa must be a str (auto, scalar, avx2, avx512 or amx), got {isa!r}")
    with _cpu_defaults_lock:
        _, threads = _stsa.cpu_defaults()
        _stsa.set_cpu_defaults(isa, threads)


def get_isa() -> str:
    """The instruction set a host call starting now runs with (``set_isa``, ``STSA_ISA``, this CPU's best);
    the CPU backend runs a call the AMX tiles cannot take (fp32 inputs, say) on AVX-512 under "amx"."""
    return _stsa.resolved_cpu()[0]


def clear_plan_cache() -> None:
    """Frees the tile plans kept for reuse across calls (they are rebuilt on demand)."""
    _stsa.clear_plan_cache()


def _video_grid(grid) -> VideoGrid:
    if isinstance(grid, VideoGrid):
        return grid
    if isinstance(grid, (tuple, list)) and len(grid) == 3:
        return VideoGrid(*grid)
    raise InvalidArgument(f"grid must be a stsa.VideoGrid or (frames, height, width), got {grid!r}")


def _grid(grid):
    """The module's grid for a VideoGrid or (frames, height, width)."""
    return _video_grid(grid)._native()


def _tile(tile) -> tuple[int, int]:
    """(query rows, key columns) per tile; one int for both."""
    if isinstance(tile, numbers.Integral):
        tile = (tile, tile)
    if (isinstance(tile, (tuple, list)) and len(tile) == 2 and all(isinstance(t, numbers.Integral) for t in tile)
            and all(1 <= t <= 2**31 - 1 for t in tile)):
        return int(tile[0]), int(tile[1])
    raise InvalidArgument(f"tile must be (rows, columns) or one int, positive integers, got {tile!r}")


def _count(name: str, value, minimum: int) -> int:
    """A whole-number argument the module takes as a 64-bit integer (a step, a layer, a count of
    them): a float, a bool or a value past 2^63 - 1 is refused here, with its name."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not minimum <= int(value) < 2**63:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, 2^63 - 1], got {value!r}")
    return int(value)


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


def _number(name: str, value) -> float:
    """A real-valued argument as a float; None, a str or a bool is refused (the module's
    float would take "0.3" nowhere and True as 1)."""
    if value is not None and not isinstance(value, (str, bytes, bool)):
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: a torch tensor of several values
            pass
    raise InvalidArgument(f"{name} must be a number, got {value!r}")


def _mask_name(mask) -> str:
    if not isinstance(mask, str):
        raise InvalidArgument(f"mask must be a mask name ('dense', 'spatial', 'temporal' or 'frames'), got {mask!r}")
    return mask


def _masks(mask) -> list[str]:
    """One mask name for every head, or a sequence of them, one per head."""
    if isinstance(mask, str):
        return [mask]
    try:
        masks = list(mask)
    except TypeError:
        masks = None
    if masks is None or not all(isinstance(m, str) for m in masks):
        raise InvalidArgument(f"mask must be a mask name ('dense', 'spatial', 'temporal' or 'frames') or a sequence "
                              f"of them, one per head, got {mask!r}")
    return masks


def _or(value, default):
    return default if value is None else value


def _scale(scale: float | None) -> float:
    # The library reads 0 as "1 / sqrt(D)"; a caller's own 0 would be taken for that.
    if scale is None:
        return 0.0
    scale = _number("scale", scale)
    if scale == 0:
        raise InvalidArgument("scale must be non-zero (None means 1 / sqrt(head_dim))")
    return scale


def _is_torch_cuda(array) -> bool:
    return _framework(array) == "torch" and array.device.type == "cuda"


def _device_of(array):
    """The CUDA device of a torch tensor made current for the call (the library
    works on the current device); nothing to do for other arrays."""
    if _is_torch_cuda(array):
        import torch

        return torch.cuda.device(array.device)
    return contextlib.nullcontext()


def _stream(array, stream: int | None) -> int:
    """The stream a GPU call is enqueued on: the one given, else torch's current
    stream for a torch CUDA tensor, else the default stream (0)."""
    if stream is not None:
        if not isinstance(stream, numbers.Integral) or isinstance(stream, bool) or not 0 <= stream < 2**64:
            raise InvalidArgument(f"stream must be a cudaStream_t as an int (torch.cuda.Stream's cuda_stream), "
                                  f"got {stream!r}")
        return int(stream)
    if _is_torch_cuda(array):
        import torch

        return torch.cuda.current_stream(array.device).cuda_stream
    return 0


# NumPy (ml_dtypes) types that neither DLPack nor the buffer protocol carries: their
# arrays go to the module as unsigned-integer views, with the type named in ``bit_views``.
_NUMPY_BIT_VIEWS = {"bfloat16": ("uint16", "bf16"), "float8_e4m3fn": ("uint8", "fp8_e4m3")}


def _arrays(q, k, v, out=None, lse=None, stream: int | None = None) -> dict[str, Any]:
    """The arrays as the module takes them (keywords), NumPy bfloat16 and float8_e4m3fn
    (ml_dtypes) passed as unsigned-integer views named in ``bit_views``; routing alone
    takes no ``out`` or ``lse``. What the module could not take is refused here by name
    (it would raise nanobind's TypeError listing its signatures), and a torch input with
    its negative or conjugate bit set is resolved into a copy (DLPack hands over the
    storage without the bit: the values would be read negated)."""
    _check_rank(q)
    arrays = {"q": q, "k": k, "v": v} if out is None else {"q": q, "k": k, "v": v, "out": out, "lse": lse}
    bit_views = {}
    for name, array in arrays.items():
        if array is None and name == "lse":  # none asked for
            continue
        if not hasattr(array, "shape"):
            raise InvalidArgument(f"{name} must be an array (NumPy, PyTorch or any DLPack array), got {type(array)}")
        if _framework(array) == "numpy":
            arrays[name], bit_views[name] = _numpy_array(name, array)
        elif _framework(array) == "torch":
            arrays[name] = _torch_array(name, array, stream)
    return {**arrays, "bit_views": {name: view for name, view in bit_views.items() if view}}


def _numpy_array(name: str, array):
    """A NumPy array as the module takes it, and the type it is a bit view of ("" for none)."""
    if not array.dtype.isnative:
        raise InvalidArgument(f"{name} is byte-swapped (dtype {array.dtype.str}): stsa reads values in this machine's "
                              f"byte order (convert with {name}.astype({name}.dtype.newbyteorder('=')))")
    view = _NUMPY_BIT_VIEWS.get(array.dtype.name)
    if view is not None:
        return array.view(view[0]), view[1]
    # What neither DLPack nor the buffer protocol carries (ml_dtypes' other types, objects, strings);
    # NumPy's other numbers go on, for the library to name the types it takes.
    if array.dtype.kind not in "biufc" or array.dtype.isbuiltin != 1:
        raise InvalidArgument(f"{name} is {array.dtype.name}: stsa takes float32, float16, bfloat16 or float8_e4m3fn")
    return array, ""


def _torch_array(name: str, tensor, stream: int | None):
    """A torch tensor as the module takes it: dense, in host or CUDA memory, with no negative
    or conjugate bit (an input's resolved into a copy; an output's refused)."""
    import torch

    if tensor.layout != torch.strided:
        raise Unsupported(f"{name} is a {tensor.layout} tensor: stsa takes dense (strided) tensors")
    if tensor.device.type not in ("cpu", "cuda"):
        raise Unsupported(f"{name} is on {tensor.device}: stsa takes host (CPU) and CUDA tensors")
    if torch._C._functorch.is_functorch_wrapped_tensor(tensor):  # its data is not the values (vmap's, grad's)
        raise Unsupported(f"{name} is a torch.func transform's tensor (vmap, grad, jvp): stsa takes plain tensors "
                          "(for vmap, put its dimension into B)")
    # Read (routing) or written (under no_grad) through the same memory, detached: a subclass's
    # __dlpack__ refuses a tensor that requires grad, which came out as nanobind's TypeError.
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not (tensor.is_neg() or tensor.is_conj()):
        return tensor
    if name in ("out", "lse"):
        raise InvalidArgument(f"{name} has torch's negative or conjugate bit set ({name}.is_neg()): stsa cannot write "
                              "through it in place; give a tensor without it")
    if tensor.device.type == "cuda" and stream is not None:
        # On the call's own stream: the copy is made before stsa reads it, and its memory not reused until then.
        with torch.cuda.stream(torch.cuda.ExternalStream(_stream(tensor, stream), device=tensor.device)):
            return tensor.resolve_conj().resolve_neg()
    return tensor.resolve_conj().resolve_neg()


@contextlib.contextmanager
def _written(*outputs):
    """Bumps the autograd version counter of the torch tensors among ``outputs`` once the call has
    run (or failed part-way), as torch's in-place operators do: a tensor saved for a backward pass
    and then overwritten by stsa is then refused by that backward pass, not used with the new values.
    A refused call (its arguments checked before anything is written) leaves them as they were."""
    def bump():
        tensors = [x for x in outputs if _framework(x) == "torch"]
        if tensors:
            import torch

            torch.autograd.graph.increment_version(tensors)

    try:
        yield
    except (InvalidArgument, Unsupported, TypeError):
        raise
    except BaseException:
        bump()
        raise
    bump()


def _descales(q, layout: str, q_descale, k_descale, v_descale) -> dict[str, Any]:
    """The descales as the module takes them: each None or a [B, H] float32 host array
    (a number: that value for every (batch, head)). The caller's own arrays are read, never written."""
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if all(value is None for value in given.values()):
        return given
    import numpy as np

    batch, _, heads = _batch_tokens_heads(_check_rank(q), layout)
    converted: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            converted[name] = None
            continue
        if _framework(value) == "torch":
            if value.device.type != "cpu":
                raise Unsupported(f"{name} is on {value.device}: descales are taken on the host only, by the host "
                                  "backends (the cuda backend takes none yet)")
            if value.requires_grad and sys.modules["torch"].is_grad_enabled():  # as q, k and v (_refuse_autograd)
                raise Unsupported(f"stsa computes no gradients, and {name} requires grad: call it under "
                                  f"torch.no_grad() or torch.inference_mode(), or give {name}.detach()")
            value = _torch_array(name, value.detach(), None).float().numpy()  # a copy where a bit was set
        try:
            array = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError) as error:
            raise InvalidArgument(f"{name} must be a number or a [B, H] array, got {type(value).__name__}") from error
        if array.ndim == 0:
            array = np.full((batch, heads), array, dtype=np.float32)
        if array.shape != (batch, heads):
            raise InvalidArgument(f"{name} must be [B, H] = [{batch}, {heads}] (or a number), got shape "
                                  f"{list(array.shape)}")
        converted[name] = np.ascontiguousarray(array)
    return converted


def _where(q, grid, scale, backend, stream, tile, align, layout) -> dict[str, Any]:
    """The module's keywords for where and how a call runs."""
    tile_q, tile_k = _tile(tile)
    return {"grid": _grid(grid), "scale": _scale(scale), "backend": backend or "", "stream": _stream(q, stream),
            "tile_q": tile_q, "tile_k": tile_k, "align": align, "layout": layout}


def _router(density, spatial_density, temporal_density, frames_density, try_frames, samples, seed, max_rel_l2,
            anchor) -> dict[str, Any]:
    """The module's keywords for the router; the densities of each kind default to ``density``."""
    if not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise InvalidArgument(f"seed must be a non-negative integer below 2^64, got {seed!r}")
    if not isinstance(samples, numbers.Integral) or not 1 <= int(samples) <= 2**31 - 1:
        raise InvalidArgument(f"samples must be an integer in [1, 2^31 - 1], got {samples!r}")

    def kind(name, value):  # a kind's own density, else ``density``, named as given
        return _number("density", density) if value is None else _number(name, value)

    return {"samples": int(samples), "spatial_density": kind("spatial_density", spatial_density),
            "temporal_density": kind("temporal_density", temporal_density),
            "frames_density": kind("frames_density", frames_density), "try_frames": _flag("try_frames", try_frames),
            "max_rel_l2": _number("max_rel_l2", max_rel_l2), "anchor": _flag("anchor", anchor), "seed": int(seed)}


def _traced(q, k, v) -> bool:
    """Whether this call goes through its operator (torch.ops.stsa.attention and the others, _torch_op.py): while
    torch.compile or torch.export traces it (it stays in the graph), and when q, k and v have no
    data (the meta device, FakeTensorMode: a model run for its shapes), whose outputs its fake
    implementation gives. One of them alone without data is refused by name, as eager."""
    return _framework(q) == "torch" and (_torch_compiling() or _without_data(q, k, v))


def _observed(q, k, v) -> bool:
    """Whether torch watches its operators for this call of torch tensors: a TorchDispatchMode
    (FlopCounterMode, DebugMode, a user's own) is active, torch's profiler records, or
    torch.jit.trace or torch.fx.symbolic_trace traces; or one of q, k, v is a tensor subclass
    that dispatches operators itself (DTensor, a wrapper subclass: its data is not its values).
    The call then goes through its operator, which they see or handle (an eager call reaches no
    dispatcher: the profiler had no event for it, a jit-traced graph kept the output's
    torch.empty alone, and a subclass was refused as "q is null"). Not inside an operator's own
    call, which would loop."""
    if _framework(q) != "torch" or _operator_call.active:
        return False
    torch_c = sys.modules["torch"]._C  # its own checks, not their Python wrappers: ~1 us a call, not ~5
    return (torch_c._len_torch_dispatch_stack() > 0 or torch_c._autograd._profiler_enabled() or torch_c._is_tracing()
            or _fx_traced(q) or any(type(x).__torch_dispatch__ is not torch_c._disabled_torch_dispatch_impl
                                    for x in (q, k, v) if isinstance(x, torch_c.TensorBase)))


def _fx_traced(q) -> bool:
    """Whether q is torch.fx.symbolic_trace's stand-in: the call becomes a node of its graph (it
    failed on control flow over q's attributes)."""
    fx = sys.modules.get("torch.fx")
    return fx is not None and isinstance(q, fx.Proxy)


def _through_operator(q, k, v, out, lse, stream) -> bool:
    """Whether this call goes through its torch operator: while traced or without data (then
    without ``out`` or ``lse``, which it cannot write in place), or watched (_observed: an
    ``out`` or ``lse`` given is then filled from the operator's). A call given a ``stream`` is eager."""
    if stream is not None:
        return False
    return (out is None and lse is None and _traced(q, k, v)) or _observed(q, k, v)


def _into_given(out, lse, results) -> tuple:
    """The operator's (out, lse), copied into the ``out`` and ``lse`` the caller gave, which must
    be torch tensors of exactly the operator's shapes, dtypes and device."""
    pairs = (("out", out, results[0]), ("lse", lse, results[1]))
    for name, mine, theirs in pairs:  # both checked before either is written: a refused call writes nothing
        expected = (theirs.shape, theirs.dtype, theirs.device)
        if mine is not None and (_framework(mine) != "torch" or (mine.shape, mine.dtype, mine.device) != expected):
            raise InvalidArgument(f"{name} must be a torch tensor of shape {list(theirs.shape)}, {theirs.dtype}, "
                                  f"on {theirs.device} (got {_described(mine)})")
    given = []
    for _, mine, theirs in pairs:
        if mine is not None:
            mine.copy_(theirs)
        given.append(theirs if mine is None else mine)
    return tuple(given)


def _described(array) -> str:
    return (f"{type(array).__name__} of shape {list(getattr(array, 'shape', ()))}, {getattr(array, 'dtype', None)}"
            + (f", on {array.device}" if hasattr(array, "device") else ""))


class _OperatorCall(threading.local):
    active = False  # an operator's implementation is running on this thread (_torch_op.py)


_operator_call = _OperatorCall()


def _without_data(*arrays) -> bool:
    """Whether every one is a torch tensor without data: on the meta device, or a FakeTensor."""
    torch = sys.modules.get("torch")
    return torch is not None and all(
        isinstance(x, torch.Tensor) and (x.device.type == "meta" or isinstance(x, torch._subclasses.FakeTensor))
        for x in arrays)


def _symbolic_int(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.SymInt)


def _torch_compiling() -> bool:
    torch = sys.modules.get("torch")  # not imported: nothing can be compiling
    return torch is not None and torch.compiler.is_compiling()


def register_torch_operators() -> None:
    """Registers stsa's PyTorch operators (``torch.ops.stsa.*``; torch >= 2.8), which a program
    exported with stsa's calls needs to load (``torch.export.load``). Importing stsa in a process
    that has imported torch already registers them; one that imports stsa first calls this."""
    import torch

    _require_torch_operators(torch)
    from . import _torch_op  # noqa: F401  (registers them)


def _require_torch_operators(torch) -> None:
    """stsa's PyTorch operators (torch.compile's path, stsa.diffusers) are custom ops tagged
    cudagraph_unsafe, which torch has from 2.8 on; an older one gets this, not an AttributeError."""
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        raise Unsupported(f"stsa's PyTorch operators (under torch.compile, and stsa.diffusers) need torch >= 2.8 "
                          f"(custom operators tagged cudagraph_unsafe); this is torch {torch.__version__}. "
                          "Eager calls on torch tensors work with it.")


def _refuse_autograd(q, k, v, out=None, lse=None) -> None:
    """stsa computes no gradients: an output detached from tensors that need them would
    train the rest of the model as if attention were a constant, without a word. An
    ``out`` or ``lse`` that requires grad is refused too, as torch's own out= operators
    refuse it (written in place, it would hold values autograd knows nothing of)."""
    if all(_framework(x) != "torch" for x in (q, k, v, out, lse)) or _fx_traced(q):
        return
    import torch

    # Forward-mode AD works under no_grad too: a tangent on q, k or v was dropped without a word (the
    # output had none, so a JVP saw attention as a constant), and one on out or lse left stale.
    forward_ad = sys.modules.get("torch.autograd.forward_ad")
    if forward_ad is not None and forward_ad._current_level >= 0:
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
            if isinstance(x, torch.Tensor) and forward_ad.unpack_dual(x).tangent is not None:
                raise Unsupported(f"stsa computes no forward-mode derivatives, and {name} has a tangent "
                                  "(torch.autograd.forward_ad): give its primal (unpack_dual(x).primal)")
    if not torch.is_grad_enabled():
        return
    if any(getattr(x, "requires_grad", False) for x in (q, k, v)):
        raise Unsupported("stsa computes no gradients: call it under torch.no_grad() or torch.inference_mode(), "
                          "or pass tensors that do not require grad (.detach())")
    for name, x in (("out", out), ("lse", lse)):
        if getattr(x, "requires_grad", False):
            raise Unsupported(f"stsa computes no gradients, and {name} requires grad: call it under torch.no_grad() "
                              f"or torch.inference_mode(), or give an {name} that does not require grad")


def _framework(array) -> str:
    """The package an array comes from ("numpy", "torch", ...). A subclass of torch.Tensor or
    numpy.ndarray defined elsewhere (a user's own, another library's) is its base's: by its
    module alone it was no torch tensor, and lost the checks (gradients, negative bit) made for one."""
    for name, base in (("torch", "Tensor"), ("numpy", "ndarray")):
        module = sys.modules.get(name)  # not imported: none of its arrays can exist
        if module is not None and isinstance(array, getattr(module, base, ())):
            return name
    return type(array).__module__.split(".")[0]


def _check_rank(q) -> tuple:
    shape = tuple(getattr(q, "shape", ()))
    if len(shape) != 4:
        raise InvalidArgument(f"q must have 4 dimensions ([B, N, H, D] or [B, H, N, D]), got shape {shape}")
    return shape


def _outputs(q, out, lse, return_lse: bool, layout: str):
    """``out`` and ``lse`` as given, or allocated like ``q`` in its framework."""
    shape = _check_rank(q)
    if layout not in ("bnhd", "bhnd"):
        raise InvalidArgument(f"layout must be 'bnhd' or 'bhnd', got '{layout}'")
    batch, tokens, heads = _batch_tokens_heads(shape, layout)
    if out is None:
        out = _empty_like(q, shape, None)
    elif not _writable(out):
        raise InvalidArgument("out is read-only")
    want_lse = return_lse or lse is not None
    if want_lse and lse is None:
        lse = _empty_like(q, (batch, heads, tokens), "float32")
    elif lse is not None and not _writable(lse):
        raise InvalidArgument("lse is read-only")
    return out, lse, want_lse


def _batch_tokens_heads(shape, layout: str) -> tuple:
    return (shape[0], shape[1], shape[2]) if layout == "bnhd" else (shape[0], shape[2], shape[1])


def _writable(array) -> bool:
    if isinstance(array, memoryview):  # the buffer protocol's own view
        return not array.readonly
    flags = getattr(array, "flags", None)  # NumPy's; a torch tensor is always writable
    return flags is None or bool(getattr(flags, "writeable", True))


def _is_float8(array) -> bool:
    return str(getattr(array, "dtype", "")).split(".")[-1] == "float8_e4m3fn"


def _empty_like(array, shape, dtype: str | None):
    """An array of ``shape`` in ``array``'s framework and place, of ``dtype`` or else of
    ``array``'s own type (bfloat16 for float8, which is no output type)."""
    if dtype is None and _is_float8(array):
        dtype = "bfloat16"
    if _framework(array) == "torch":
        import torch

        return torch.empty(shape, dtype=array.dtype if dtype is None else getattr(torch, dtype), device=array.device)
    import numpy

    if dtype == "bfloat16":
        import ml_dtypes

        return numpy.empty(shape, dtype=ml_dtypes.bfloat16)
    if dtype is not None:
        return numpy.empty(shape, dtype=dtype)
    # A buffer-protocol array without a dtype (a memoryview): its format's, read in place.
    return numpy.empty(shape, dtype=array.dtype if hasattr(array, "dtype") else numpy.asarray(array).dtype)


# With torch here already, its operators are registered now (13 ms): a program exported with
# them then loads with no more than `import stsa` (before, their first traced call did it).
if "torch" in sys.modules and hasattr(getattr(sys.modules["torch"], "Tag", None), "cudagraph_unsafe"):
    from . import _torch_op  # noqa: F401,E402
