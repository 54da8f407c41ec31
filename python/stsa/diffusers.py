"""stsa inside a diffusers video transformer: every block's self-attention runs through a
``stsa.Policy`` (dense warm-up, heads routed online, decisions reused), nothing else changes.

    import stsa.diffusers
    sparse = stsa.diffusers.enable(pipe, "wan2.1-720p")               # a preset name or a stsa.Policy
    video = pipe(prompt, height=720, width=1280, num_frames=81).frames[0]
    print(sparse.summary())                                           # routes taken, stsa's time
    sparse.disable()                                                  # the model's own processors back

Models: ``WanTransformer3DModel`` (Wan2.1 and Wan2.2, text- and image-to-video; text joins
by cross-attention, left as it was), ``WanVACETransformer3DModel`` and ``WanAnimateTransformer3DModel``,
``SkyReelsV2Transformer3DModel``, ``ChronoEditTransformer3DModel`` and ``AnyFlowTransformer3DModel``
(Wan's self-attention),
``LTXVideoTransformer3DModel`` and ``LTX2VideoTransformer3DModel`` (packed tokens; the grid from the
forward's num_frames, height and width; LTX-2's audio stream left as it was),
``Kandinsky5Transformer3DModel`` (its visual blocks; text by cross-attention) and
``Kandinsky6Transformer3DModel`` (its fused blocks' video self-attention; audio left as it was),
``CosmosTransformer3DModel`` (Cosmos Predict2 and 2.5, Transfer2.5), ``Cosmos3OmniTransformer``
(Cosmos 3: the generated tokens' attention, its K and V heads repeated for their query heads;
the prompt's own causal attention left as it was), ``AllegroTransformer3DModel``,
``CogVideoXTransformer3DModel`` (CogVideoX 1.0 and 1.5; joint attention, the text tokens
before the video's), ``ConsisIDTransformer3DModel`` (CogVideoX's blocks; its face features
by cross-attention between them, left as they were), ``EasyAnimateTransformer3DModel`` (joint
attention, the text before the video) and
``HunyuanVideoTransformer3DModel`` (joint attention, the prompt after the video, padded:
each sample runs with the prompt tokens its mask keeps) and
``HunyuanVideo15Transformer3DModel`` and ``MochiTransformer3DModel`` (likewise; the padding
hidden both ways), ``HunyuanVideoFramepackTransformer3DModel`` and ``HeliosTransformer3DModel``
(their history, past frames before the video's tokens, goes after them for stsa: global
tokens, as a prompt's), from
diffusers 0.35 or later (each family from the release whose processor stsa reproduces, up to
0.42 for Kandinsky 6; docs/python.md), whose self-attention still has diffusers' own processor. The
latent grid of each forward comes from the transformer's input (over its patch size, and
the prompt's length); the step from its timestep: a lower timestep than the last
forward's is the next step, an equal one the same step (the unconditional pass of
classifier-free guidance), a higher one a new generation (step 0, decisions forgotten);
Mochi's timesteps rise over a generation (its pipeline inverts the scheduler's sigmas),
so there a higher one is the next step and a lower one a new generation.
A generation whose steps all fall in the policy's dense warm-up (a distilled model at a
few steps under a preset made for fifty), or a model whose layers all fall in its dense
layers, saved nothing: ``DenseWarning`` says so, with the numbers.
Layer i is the model's i-th block. Given a pipeline, every transformer it holds takes
stsa, with one step count across them: Wan2.2 A14B's two experts (``transformer`` for the
high-noise steps, ``transformer_2`` for the rest) share the pipeline's steps, each with a
policy of its own. Under diffusers' Ulysses context parallelism each rank runs its share
of the heads over every token.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import itertools
import operator
import warnings
import weakref
from typing import Any, Callable, Optional, cast

import torch

from . import (InvalidArgument, Policy, Unsupported, VideoGrid, _flag, _require_torch_operators, _tile,
               _without_data)
from ._torch_op import _formulas_to_counters, _policy_estimate, counted

_require_torch_operators(torch)

__all__ = ["enable", "SparseTransformer", "SparsePipeline", "CallRecord", "DenseWarning"]

# A pipeline's transformers, in the order its denoising loop uses them (Wan2.2 A14B:
# high-noise expert, then low-noise expert; either may be absent).
_PIPELINE_TRANSFORMERS = ("transformer", "transformer_2")


def enable(model, policy: str | Policy, *, backend: str | None = None, tile: int | tuple[int, int] = (128, 128),
           align: str = "exact", timed: bool = True,
           max_records: int = 100_000) -> "SparseTransformer | SparsePipeline":
    """Runs the self-attention of every block of ``model`` through ``policy`` (a
    ``stsa.Policy`` or a preset name, ``stsa.model_presets()``) until ``disable()``.

    ``model``: a transformer (returns a ``SparseTransformer``) or a pipeline (returns a
    ``SparsePipeline``: its ``transformer`` and, where it has one, ``transformer_2``,
    counting the pipeline's steps together). ``backend``, ``tile`` and ``align`` as in
    ``stsa.attention``; ``timed`` as in ``Policy.attention`` (False: the records have no
    attention times, and on a GPU the layers that route nothing never wait for the
    device); the latest ``max_records`` calls are kept (a long-running server's memory
    stays bounded)."""
    options: dict[str, Any] = {"backend": backend, "tile": tile, "align": align, "timed": _flag("timed", timed),
                               "max_records": max_records}
    model = _uncompiled(model)
    if type(model).__name__ not in _FAMILIES and any(hasattr(model, name) for name in _PIPELINE_TRANSFORMERS):
        return SparsePipeline(model, policy, **options)
    return SparseTransformer(model, policy, **options)


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One self-attention call: where it was, what each head ran and what it cost."""

    step: int
    layer: int
    grid: VideoGrid
    routes: tuple[str, ...]  # per head: "dense", "spatial", "temporal" or "frames"
    routing_ms: float        # the router, for the heads routed in this call (0 when reused or dense)
    attention_ms: float | None  # stsa's attention, permutation included (None: enabled with timed=False)
    model: str = "transformer"  # which of a pipeline's transformers ("transformer_2": Wan2.2's low-noise expert)


def _summary(records) -> dict[str, Any]:
    routes: dict[str, int] = {}
    for record in records:
        for route in record.routes:
            routes[route] = routes.get(route, 0) + 1
    timed = [r.attention_ms for r in records if r.attention_ms is not None]
    return {"calls": len(records), "head_routes": routes, "routing_ms": sum(r.routing_ms for r in records),
            "attention_ms": sum(timed) if timed else None}


class DenseWarning(UserWarning):
    """The policy's dense warm-up covered a whole generation, or every layer of a model:
    stsa ran it dense and saved nothing there."""


class _StepClock:
    """The denoising step, read from the timesteps of the forwards of one or more
    transformers: lower than the last is the next step, equal the same step, higher
    (or the first after reset()) a new generation; the other way round for a model
    whose timesteps rise (``rising``: Mochi's). ``on_generation_end`` gets each
    generation's step count once, when the next one begins or at ``finish()``.

    ``loop_timestep``: the pipeline's own timestep for this forward, where it keeps one
    (diffusers' ``_current_timestep``, the scheduler's value before the pipeline casts it
    for the model). It tells apart steps whose timesteps the cast made equal: HunyuanVideo
    1.5's and Cosmos Predict2's pipelines hand the model bfloat16 timesteps, and at shift 9
    three of 50 steps rounded to their neighbours' values and were counted as their
    guidance passes."""

    def __init__(self, on_generation_end: Callable[[int], None]):
        self.step = 0
        self.generation = 0
        self._last_timestep: float | None = None
        self._last_loop_timestep: float | None = None
        self._on_generation_end = on_generation_end
        self._open = False  # a generation has begun and not been reported

    def observe(self, timestep: float, rising: bool = False, loop_timestep: float | None = None) -> None:
        # Compared as falling timesteps: a rising one, negated, falls as the steps go on.
        timestep = -timestep if rising else timestep
        if self._last_timestep is None or timestep > self._last_timestep:
            self.finish()
            self.step = 0
            self.generation += 1
            self._open = True
        elif timestep < self._last_timestep or (
                loop_timestep is not None and self._last_loop_timestep is not None
                and loop_timestep != self._last_loop_timestep):
            self.step += 1
        self._last_timestep = timestep
        self._last_loop_timestep = loop_timestep

    def reset(self) -> None:
        self._last_timestep = None
        self._last_loop_timestep = None

    def finish(self) -> None:
        """Ends the generation under way, if any (the model is being disabled)."""
        if self._open:
            self._open = False
            self._on_generation_end(self.step + 1)


def _reference(obj) -> Callable[[], Any]:
    """A weak reference to ``obj``, or a strong one where it takes none (a SimpleNamespace)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _warn_if_dense_throughout(policy: Policy, steps: int) -> None:
    dense_steps = policy.settings["dense_steps"]
    if steps <= dense_steps:
        warnings.warn(f"stsa ran a whole generation dense: its {steps} denoising step(s) all fall in the "
                      f"policy's dense warm-up (dense_steps={dense_steps}); for a model run at few steps, give a "
                      "policy with fewer (a preset made for it, such as 'anyflow-14b-480p', or a quarter of "
                      f"the steps: stsa.Policy(**{{**policy.settings, 'dense_steps': {steps // 4}}}))", DenseWarning,
                      stacklevel=2)


def _refuse_copy():
    # Reached from the model (its processors and hook hold stsa's objects): a deep copy ran the
    # original's hook and failed in its forward, and pickle failed on the hook's function.
    raise Unsupported("a model with stsa.diffusers enabled cannot be copied or pickled (copy.deepcopy, torch.save "
                      "of the model): save its state_dict, or disable stsa, copy, and enable it on each")


class _ForwardHook:
    """The transformer's forward pre-hook: its SparseTransformer's _before_forward, kept eager."""

    def __init__(self, owner: "SparseTransformer"):
        self._before_forward = torch.compiler.disable(owner._before_forward)

    def __call__(self, module, args, kwargs):
        return self._before_forward(module, args, kwargs)

    def __reduce__(self):
        _refuse_copy()


class SparseTransformer:
    """What ``enable`` returns: the installed processors and hook, the step count and
    a record of every call. A context manager (``with stsa.diffusers.enable(...):``)."""

    def __init__(self, transformer, policy: str | Policy, *, backend: str | None, tile, align: str, timed: bool,
                 max_records: int, name: str = "transformer", clock: _StepClock | None = None,
                 records: collections.deque | None = None, pipeline=None):
        self.policy = _policy(policy)
        transformer = _uncompiled(transformer)
        self._family = _family_of(transformer)
        attentions = self._family.self_attentions(transformer)
        self.transformer = transformer
        self.name = name
        self.records: collections.deque[CallRecord] = _records(max_records) if records is None else records
        self.last_info: dict[int, dict[str, Any]] = {}  # per layer, the latest call's info from stsa
        self.grid: VideoGrid | None = None
        self.text_counts: list[int] | None = None
        self._options = {"backend": backend, "tile": tile, "align": align, "timed": timed}
        # A pipeline's transformers share one clock, which the pipeline finishes.
        self._owns_clock = clock is None
        self._clock = _StepClock(functools.partial(_warn_if_dense_throughout, self.policy)) if clock is None else clock
        self._generation = self._clock.generation  # the generation the policy's decisions belong to
        # The pipeline enabled with this transformer, if any: its loop's timestep breaks the ties of
        # the model's (weak where it can be: the pipeline holds the transformer, which holds this).
        self._pipeline = None if pipeline is None else _reference(pipeline)
        self._forwards = 0  # forwards begun; the prompt counts read from a layer's mask hold for one
        self._mask_counts: tuple[int, list[int]] | None = None  # (forward, per sample, the prompt tokens kept)
        # The class's forward, not the instance's: hooks may have replaced that one by a wrapper
        # whose signature is (module, *args, **kwargs), as diffusers < 0.40's hook registry did
        # (context parallelism among its users, enabled before stsa).
        self._signature = _forward_signature(transformer)
        self._id = next(_ids)
        _owners[self._id] = self
        self._originals = [attn.processor for attn in attentions]
        dense_layers = self.policy.settings["dense_layers"]
        if dense_layers >= len(attentions):
            # Before anything is installed: under warnings-as-errors this raises, leaving the model as it was.
            warnings.warn(f"stsa will run {type(transformer).__name__} dense: its {len(attentions)} self-attention "
                          f"layer(s) all fall in the policy's dense layers (dense_layers={dense_layers})",
                          DenseWarning, stacklevel=3)
        # Read on the host once per forward (the step is the timestep's value): under a
        # whole-model torch.compile this is the one graph break, taken on purpose.
        self._hook = transformer.register_forward_pre_hook(_ForwardHook(self), with_kwargs=True)
        self._attentions = attentions
        try:
            for layer, attn in enumerate(attentions):
                _set_processor(attn, self._family.processor(self, layer))
        except BaseException:
            self.disable()  # the hook and the processors set so far go: the model as it was
            raise

    def disable(self) -> None:
        """Puts the model's own processors back and removes the hook; the records stay."""
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        for attn, original in zip(self._attentions, self._originals):
            _set_processor(attn, original)
        if self._owns_clock:
            self._clock.finish()

    def __reduce__(self):
        _refuse_copy()

    def __enter__(self) -> "SparseTransformer":
        return self

    def __exit__(self, *exc) -> None:
        self.disable()

    @property
    def step(self) -> int:
        """The denoising step of the latest forward."""
        return self._clock.step

    def reset(self) -> None:
        """Starts a new generation at the next forward (step 0), whatever its timestep."""
        self._clock.reset()

    def summary(self) -> dict[str, Any]:
        """Totals over the records kept: calls, head-calls per route, stsa's routing and attention ms."""
        return _summary(self.records)

    def _before_forward(self, module, args, kwargs) -> None:
        self._forwards += 1
        bound = self._signature.bind(*args, **kwargs).arguments
        self.grid = self._family.grid(module, bound)
        timestep = torch.as_tensor(self._family.timestep(bound))
        if _without_data(timestep):
            self.text_counts = None  # a forward for shapes (meta device, FakeTensorMode): nothing to read
            return
        # Per sample, the prompt tokens its mask keeps (HunyuanVideo pads every prompt to one length).
        self.text_counts = self._family.text_counts(bound)
        # One host read per forward: the step is what the policy is keyed by.
        self._clock.observe(float(timestep.max()), self._family.rising_timesteps, self._loop_timestep())
        if self._generation != self._clock.generation:
            # A new video (another prompt, another seed): its heads are routed afresh, not
            # given a decision made for the last one that a long reuse would still hold.
            self._generation = self._clock.generation
            self.policy.clear()

    def _loop_timestep(self) -> float | None:
        """The enabled pipeline's timestep for the forward under way (diffusers' pipelines set
        ``_current_timestep`` before each step's forwards, and None after the loop), else None."""
        pipeline = None if self._pipeline is None else self._pipeline()
        value = getattr(pipeline, "_current_timestep", None)
        if value is None or _without_data(torch.as_tensor(value)):
            return None
        return float(torch.as_tensor(value).max())

    # Eager whole, never traced in pieces: where a graph break left a caller eager inside a compiled
    # region, dynamo compiled Policy.attention's frame by itself, which took the operator's path and
    # returned no info to record (a TypeError). Traced calls reach this through _attention_op.
    @torch.compiler.disable
    def _attend(self, layer: int, q, k, v, layout: str, prompt_mask=None, history: int = 0):
        """q, k, v ([B, N, H, D] or, with layout "bhnd", [B, H, N, D]) of one layer's
        self-attention -> its output, recorded. ``prompt_mask`` [B, T]: which of the
        prompt's T tokens (after the video's) are kept, as the layer was given it.
        ``history``: the model's past frames (Framepack's, Helios's), placed by the processor
        after the video and before the prompt: global tokens, as the prompt's are."""
        if prompt_mask is not None:
            return self._run_padded_text(layer, q, k, v, self._prompt_counts(prompt_mask), padding_sees_keys=False)
        if self.text_counts is None:
            grid = self.grid
            if history and grid is not None:
                grid = dataclasses.replace(grid, text=grid.text + history)
            return self._run(layer, q, k, v, layout, grid)
        return self._run_padded_text(layer, q, k, v, [n + history for n in self.text_counts], padding_sees_keys=True)

    def _prompt_counts(self, mask) -> list[int]:
        """Per sample, the prompt tokens a layer's mask keeps (_kept_first), read once per
        forward: every layer of one forward gets the same mask."""
        if self._mask_counts is not None and self._mask_counts[0] == self._forwards:
            return self._mask_counts[1]
        counts = _kept_first(mask)
        self._mask_counts = (self._forwards, counts)
        return counts

    def _run(self, layer: int, q, k, v, layout: str, grid: VideoGrid | None, out=None):
        tokens = q.shape[1] if layout == "bnhd" else q.shape[2]
        if grid is None or grid.tokens != tokens:
            raise _grid_mismatch(layer, tokens, grid)
        out, info = self.policy.attention(q, k, v, grid, step=self.step, layer=layer, layout=layout, out=out,
                                          **self._options)
        attention_ms = None if info["attention_ms"] is None else info["permutation_ms"] + info["attention_ms"]
        self.records.append(CallRecord(self.step, layer, grid, tuple(info["routes"]), info["routing_ms"],
                                       attention_ms, self.name))
        self.last_info[layer] = info
        return out

    def _run_padded_text(self, layer: int, q, k, v, text_counts: list[int], padding_sees_keys: bool):
        """[B, N, H, D], the video then a prompt padded to one length: per sample, the video
        and the prompt tokens its mask keeps through stsa. The padding's query rows see
        those same keys, densely, where the model's mask hides the padding as keys only
        (HunyuanVideo); where it hides the padding both ways (HunyuanVideo 1.5) they see
        nothing and are zero, as PyTorch's attention leaves a row with no key."""
        if self.grid is None:
            raise _grid_mismatch(layer, q.shape[1], None)
        if len(text_counts) != q.shape[0]:
            raise Unsupported(f"layer {layer}: a batch of {q.shape[0]}, but the prompt mask has "
                              f"{len(text_counts)} rows")
        out = torch.empty_like(q)
        for sample, text in enumerate(text_counts):
            grid = dataclasses.replace(self.grid, text=text)
            kept = slice(0, grid.tokens)
            one = slice(sample, sample + 1)
            self._run(layer, q[one, kept], k[one, kept], v[one, kept], "bnhd", grid, out=out[one, kept])
            if grid.tokens < q.shape[1] and not padding_sees_keys:
                out[one, grid.tokens:] = 0
            elif grid.tokens < q.shape[1]:
                padding = torch.nn.functional.scaled_dot_product_attention(
                    *(x[one].transpose(1, 2) for x in (q[:, grid.tokens:], k[:, kept], v[:, kept])))
                out[one, grid.tokens:] = padding.transpose(1, 2)
        return out


def _kept_first(mask) -> list[int]:
    """Per row of a prompt's [B, T] mask, how many tokens it keeps, read on the host; refused
    unless they come first, which is what lets stsa drop the rest."""
    rows = mask.detach().to("cpu", torch.bool)
    counts = rows.sum(dim=1).tolist()
    if not all(bool(row[:count].all()) for row, count in zip(rows, counts)):
        raise Unsupported("the prompt's attention mask keeps tokens after padding: stsa takes the kept tokens "
                          "first, then the padding")
    return counts


def _grid_mismatch(layer: int, tokens: int, grid: VideoGrid | None) -> Unsupported:
    return Unsupported(f"layer {layer}: {tokens} query tokens, but the transformer's input makes "
                       f"{'none' if grid is None else grid.tokens} (the self-attention was called outside the "
                       "transformer's forward, or the tokens are split across devices)")


class SparsePipeline:
    """What ``enable`` returns for a pipeline: a ``SparseTransformer`` for each transformer
    it holds (``parts``, by attribute name), one step count across them (Wan2.2 A14B's
    low-noise expert takes over at the pipeline's step, not at its own step 0, so the
    warm-up and reuse count the pipeline's steps) and one record of calls. A decision is
    about one model's heads, so each transformer has a policy of its own: the one given
    (or the preset's) for the first, one with its settings for the others. A context manager."""

    def __init__(self, pipeline, policy: str | Policy, *, backend: str | None, tile, align: str, timed: bool,
                 max_records: int):
        names = [name for name in _PIPELINE_TRANSFORMERS if getattr(pipeline, name, None) is not None]
        if not names:
            raise InvalidArgument(f"{type(pipeline).__name__} holds no transformer (its "
                                  f"{' and '.join(_PIPELINE_TRANSFORMERS)} are None)")
        first = _policy(policy)
        self.records: collections.deque[CallRecord] = _records(max_records)
        self._clock = _StepClock(functools.partial(_warn_if_dense_throughout, first))
        self.parts: dict[str, SparseTransformer] = {}
        try:
            for name in names:
                own = first if not self.parts else Policy(**first.settings)
                self.parts[name] = SparseTransformer(getattr(pipeline, name), own, backend=backend, tile=tile,
                                                     align=align, timed=timed, max_records=max_records, name=name,
                                                     clock=self._clock, records=self.records, pipeline=pipeline)
        except BaseException:
            self.disable()  # the transformers enabled before the one refused get their own processors back
            raise

    @property
    def step(self) -> int:
        """The pipeline's denoising step, as of the latest forward of any of its transformers."""
        return self._clock.step

    def disable(self) -> None:
        """Puts every transformer's own processors back; the records stay."""
        for part in self.parts.values():
            part.disable()
        self._clock.finish()

    def __enter__(self) -> "SparsePipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.disable()

    def reset(self) -> None:
        """Starts a new generation at the next forward (step 0), whatever its timestep."""
        self._clock.reset()

    def summary(self) -> dict[str, Any]:
        """Totals over the records kept, all transformers together (``CallRecord.model`` tells them apart)."""
        return _summary(self.records)


def _uncompiled(module):
    """The module a torch.compile wrapper holds (its calls run it, recompiled for stsa's
    processors), else the module itself."""
    wrapped = type(module).__name__ == "OptimizedModule" and isinstance(module, torch.nn.Module)
    return module._orig_mod if wrapped and hasattr(module, "_orig_mod") else module  # no torch._dynamo import


def _set_processor(attn, processor) -> None:
    if hasattr(attn, "set_processor"):
        attn.set_processor(processor)
    else:  # an attention class without diffusers' processor mixin (Mochi's)
        attn.processor = processor


def _policy(policy) -> Policy:
    policy = Policy.from_preset(policy) if isinstance(policy, str) else policy
    if not isinstance(policy, Policy):
        raise InvalidArgument(f"policy must be a stsa.Policy or a preset name, got {type(policy).__name__}")
    return policy


def _records(max_records) -> collections.deque:
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 0:
        raise InvalidArgument(f"max_records must be a non-negative integer, got {max_records!r}")
    return collections.deque(maxlen=max_records)


class _SelfAttention:
    """A model's self-attention processor with stsa in place of its attention call; the
    subclasses reproduce each model's own processor around it."""

    layout = "bnhd"            # how the subclass hands q, k, v over
    _attention_backend = None  # set by diffusers' set_attention_backend; stsa is the backend here
    _parallel_config = None    # set by diffusers' context parallelism (enable_parallelism): see _ulysses

    def __init__(self, owner: SparseTransformer, layer: int):
        self.owner = owner
        self.layer = layer
        self._layer_tensor = torch.tensor(layer)  # what the compiled path reads (see _attention_op)

    def _check_call(self, attention_mask=None) -> None:
        if attention_mask is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention without an attention mask")

    def _attention(self, query, key, value, prompt_mask=None, history: int = 0):
        ulysses = self._ulysses(prompt_mask, history)
        if ulysses is not None:  # this rank's share of the tokens, every head -> every token, its share of the heads
            query, key, value = (_tokens_for_heads(x, *ulysses) for x in (query, key, value))
        # One opaque operator in the compiled block, not a graph break; without data, its fake implementation.
        compiling = torch.compiler.is_compiling()
        if compiling or _without_data(query, key, value):
            if not compiling:
                _formulas_to_counters()  # a FlopCounterMode counts the call by its estimate
            out = torch.ops.stsa.diffusers_attention(query, key, value, self.owner._id, self._layer_tensor,
                                                     self.layout, prompt_mask, history)
        else:
            out = self.owner._attend(self.layer, query, key, value, self.layout, prompt_mask, history)
        return out if ulysses is None else _heads_for_tokens(out, *ulysses)

    def _history(self, tokens: int, video: int) -> int:
        """How many history tokens precede the video's ``video`` among ``tokens``."""
        if tokens < video:
            raise Unsupported(f"layer {self.layer}: {tokens} tokens, fewer than the video's {video}")
        return tokens - video

    def _appended(self, hidden_states) -> int:
        """How many tokens follow the video's in a sequence of the video alone: LTX-2's keyframe
        and reference-video conditions (LTX2ConditionPipeline, LTX2ICLoraPipeline) append theirs
        while the forward's frames, height and width stay the video's. Clean frames the video is
        made to agree with: global tokens, as history is. 0 with fewer tokens than the video's
        (a rank's share under context parallelism: the call's own checks see the whole)."""
        grid, tokens = self.owner.grid, hidden_states.shape[1]
        return 0 if grid is None or tokens <= grid.video_tokens else tokens - grid.video_tokens

    def _ulysses(self, prompt_mask, history: int):
        """(group, ranks) under diffusers' Ulysses context parallelism, else None. Each rank
        holds a contiguous share of the video's frame-major tokens; an all-to-all gives it
        every token of H / ranks heads, which stsa routes, permutes and attends locally
        (the permutation needs no more communication), and another gives the shares back.
        The model's own enable_parallelism sets _parallel_config on the processors it finds;
        enabled before stsa, the transformer holds it."""
        config = self._parallel_config or getattr(self.owner.transformer, "_parallel_config", None)
        context = getattr(config, "context_parallel_config", None)
        if context is None:
            return None
        if context.ring_degree != 1 or context.ulysses_anything:
            raise Unsupported("stsa runs under diffusers' Ulysses context parallelism only (ring_degree 1, "
                              "ulysses_anything off): ring attention splits the keys, which a mask over "
                              "the whole sequence needs")
        if self.layout != "bnhd" or prompt_mask is not None or self.owner.text_counts is not None or history or (
                self.owner.grid is not None and self.owner.grid.text):
            raise Unsupported("stsa runs under diffusers' context parallelism on video-only self-attention "
                              "(Wan, SkyReels-V2, LTX-Video), not on a joint sequence with a prompt or "
                              "history frames")
        mesh = getattr(context, "_ulysses_mesh", None)
        if mesh is None:
            raise Unsupported("this diffusers' context parallel config has no Ulysses mesh stsa knows "
                              "(tested with diffusers 0.42)")
        return mesh.get_group(), context.ulysses_degree


def _all_to_all(x, group):
    """Chunk r of x's first axis to rank r; chunk r of the result from rank r."""
    import torch.distributed._functional_collectives as collectives  # traceable by torch.compile

    out = collectives.all_to_all_single(x.contiguous().flatten(), None, None, group)
    if isinstance(out, collectives.AsyncCollectiveTensor):
        out = out.wait()
    return out.view(x.shape)


def _tokens_for_heads(x, group, ranks: int):
    """[B, N / ranks, H, D], this rank's tokens -> [B, N, H / ranks, D], every rank's tokens
    (in rank order: the frame-major sequence) of this rank's heads."""
    batch, tokens, heads, dim = x.shape
    if heads % ranks:
        raise Unsupported(f"{heads} heads do not split over {ranks} Ulysses ranks")
    sent = x.unflatten(2, (ranks, heads // ranks)).permute(2, 0, 1, 3, 4)  # [ranks, B, N / ranks, H / ranks, D]
    return _all_to_all(sent, group).permute(1, 0, 2, 3, 4).reshape(batch, ranks * tokens, heads // ranks, dim)


def _heads_for_tokens(x, group, ranks: int):
    """The inverse: [B, N, H / ranks, D] -> [B, N / ranks, H, D]."""
    batch, tokens, heads, dim = x.shape
    sent = x.unflatten(1, (ranks, tokens // ranks)).permute(1, 0, 2, 3, 4)  # [ranks, B, N / ranks, H / ranks, D]
    return _all_to_all(sent, group).permute(1, 2, 0, 3, 4).reshape(batch, tokens // ranks, ranks * heads, dim)


def _rotated(x: torch.Tensor, freqs: Any, **options: Any) -> torch.Tensor:
    """diffusers' `apply_rotary_emb` on one tensor: it returns that tensor rotated, though it is
    annotated as returning a pair (which a type check of this module with diffusers installed reads)."""
    from diffusers.models.embeddings import apply_rotary_emb

    return cast(torch.Tensor, apply_rotary_emb(x, freqs, **options))


def _projections(attn, hidden_states):
    if attn.fused_projections:
        return attn.to_qkv(hidden_states).chunk(3, dim=-1)
    return attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)


class _WanSelfAttention(_SelfAttention):
    """diffusers' Wan self-attention (projections, QK RMS norm across heads, rotary
    embedding on every token, output projection)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        query, key, value = self._qkv(attn, hidden_states, rotary_emb)
        out = self._attention(query, key, value).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    def _qkv(self, attn, hidden_states, rotary_emb):
        """[B, N, H, D] q, k (normed across heads, rotated), v."""
        query, key, value = _projections(attn, hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        if rotary_emb is not None:
            query, key = self._rotary(query, key, rotary_emb)
        return query, key, value

    @staticmethod
    def _rotary(query, key, rotary_emb):
        if not (isinstance(rotary_emb, (tuple, list)) and len(rotary_emb) == 2):
            raise Unsupported("the rotary embedding is not diffusers' (cos, sin) tables: another diffusers version")
        return _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)


class _AnyFlowSelfAttention(_WanSelfAttention):
    """diffusers' AnyFlow self-attention: Wan2.1's, the rotary embedding as complex fp64
    frequencies for head-major q, k."""

    @staticmethod
    def _rotary(query, key, rotary_emb):
        if not (isinstance(rotary_emb, dict) and rotary_emb.keys() == {"query", "key"}):
            raise Unsupported("the rotary embedding is not AnyFlow's {query, key} frequencies: another diffusers "
                              "version")
        return _rotate_complex(query, rotary_emb["query"]), _rotate_complex(key, rotary_emb["key"])


class _AllegroSelfAttention(_SelfAttention):
    """diffusers' Allegro self-attention: projections, its rotary embedding (per axis, from
    each token's position) on head-major q, k, output projection; no QK norm."""

    layout = "bhnd"

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                 image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb_allegro

        if encoder_hidden_states is not None or attn.is_cross_attention:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        if attn.spatial_norm is not None or attn.group_norm is not None or hidden_states.ndim != 3:
            raise Unsupported(f"layer {self.layer}: an attention with a spatial or group norm, or 4-D input, is "
                              "not Allegro's")
        query, key, value = (x.unflatten(2, (attn.heads, -1)).transpose(1, 2)
                             for x in (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)))
        if image_rotary_emb is not None:
            query, key = (apply_rotary_emb_allegro(x, *image_rotary_emb) for x in (query, key))
        out = self._attention(query, key, value).transpose(1, 2).flatten(2, 3).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor


class _LTXSelfAttention(_SelfAttention):
    """diffusers' LTX-Video self-attention (projections, QK RMS norm across heads and the
    rotary embedding on the flat [B, N, H D] rows, output projection)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

        if encoder_hidden_states is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = apply_rotary_emb(query, image_rotary_emb), apply_rotary_emb(key, image_rotary_emb)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        out = self._attention(query, key, value, history=self._appended(hidden_states)).flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out))


class _CogVideoXSelfAttention(_SelfAttention):
    """diffusers' CogVideoX joint attention: the text tokens before the video's in one
    sequence (the grid's text, placed before), QK LayerNorm per head, the rotary
    embedding on the video tokens only; returns the video's and the text's outputs."""

    layout = "bhnd"

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        self._check_call(attention_mask)
        text = encoder_hidden_states.size(1)
        joint = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        query, key, value = (x.unflatten(2, (attn.heads, -1)).transpose(1, 2) for x in _projections(attn, joint))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = (torch.cat([x[:, :, :text], _rotated(x[:, :, text:], image_rotary_emb)], dim=2)
                          for x in (query, key))
        out = self._attention(query, key, value).transpose(1, 2).flatten(2, 3)
        out = attn.to_out[1](attn.to_out[0](out))
        text_out, video_out = out.split([text, out.size(1) - text], dim=1)
        return video_out, text_out


class _EasyAnimateSelfAttention(_SelfAttention):
    """diffusers' EasyAnimate joint attention (V5, V5.1): the prompt's tokens before the
    video's (the grid's text, placed before), with projections and QK LayerNorms of their own
    in its MMDiT blocks and through the video's in the others; QK LayerNorm per head, the
    rotary embedding on the video's tokens; each output through its own projection."""

    layout = "bhnd"

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        self._check_call(attention_mask)
        text = encoder_hidden_states.size(1)
        dual_stream = attn.add_q_proj is not None
        states = hidden_states if dual_stream else torch.cat([encoder_hidden_states, hidden_states], dim=1)
        query, key, value = (x.unflatten(2, (attn.heads, -1)).transpose(1, 2) for x in _projections(attn, states))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if dual_stream:
            prompt = [x.unflatten(2, (attn.heads, -1)).transpose(1, 2)
                      for x in (attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
                                attn.add_v_proj(encoder_hidden_states))]
            if attn.norm_added_q is not None:
                prompt[0] = attn.norm_added_q(prompt[0])
            if attn.norm_added_k is not None:
                prompt[1] = attn.norm_added_k(prompt[1])
            query, key, value = (torch.cat([p, x], dim=2) for p, x in zip(prompt, (query, key, value)))
        if image_rotary_emb is not None:
            query, key = (torch.cat([x[:, :, :text], _rotated(x[:, :, text:], image_rotary_emb)], dim=2)
                          for x in (query, key))
        out = self._attention(query, key, value).transpose(1, 2).flatten(2, 3).to(query.dtype)
        text_out, video_out = out.split([text, out.size(1) - text], dim=1)
        if getattr(attn, "to_out", None) is not None:
            video_out = attn.to_out[1](attn.to_out[0](video_out))
        if getattr(attn, "to_add_out", None) is not None:
            text_out = attn.to_add_out(text_out)
        return video_out, text_out


class _HunyuanVideoSelfAttention(_SelfAttention):
    """diffusers' HunyuanVideo joint attention, in its dual-stream blocks (the prompt with
    projections and QK RMS norms of its own) and single-stream ones (one projection for
    both): the video's tokens then the prompt's, the rotary embedding on the video's. The
    model's attention mask, which hides each prompt's padding as keys, is applied from
    the forward's encoder_attention_mask (SparseTransformer._run_padded_text). Framepack's
    history tokens (before the video's, the rotary embedding on them too) go after the
    video's for stsa, and their outputs back before."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None:
            raise Unsupported(f"layer {self.layer}: HunyuanVideo's attention without the prompt's tokens")
        self._check_call()  # the mask there is the model's padding mask, applied as described above
        text = encoder_hidden_states.shape[1]
        dual_stream = attn.add_q_proj is not None
        states = hidden_states if dual_stream else torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in _projections(attn, states))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            video = query.shape[1] if dual_stream else query.shape[1] - text
            query, key = (torch.cat([_rotated(x[:, :video], image_rotary_emb, sequence_dim=1), x[:, video:]],
                                    dim=1) for x in (query, key))
        if dual_stream:
            query, key, value = _with_prompt(attn, (query, key, value), encoder_hidden_states)
        video = self.owner.grid.video_tokens if self.owner.grid is not None else hidden_states.shape[1]
        history = self._history(hidden_states.shape[1], video)
        query, key, value = (_history_after_video(x, history, video) for x in (query, key, value))
        out = self._attention(query, key, value, history=history).flatten(2, 3).to(query.dtype)
        return _joint_outputs(attn, _history_before_video(out, history, video), text)


class _MotifVideoSelfAttention(_HunyuanVideoSelfAttention):
    """diffusers' Motif-Video joint attention: HunyuanVideo's (dual-stream blocks, then
    single-stream ones; the video's tokens, the rotary embedding on them, then the image's
    embeddings and the prompt's, whose padding the forward's mask hides as keys). Its decoder
    blocks (the last num_decoder_layers) attend to the encoder's video tokens, not to a
    prompt: they keep the model's own processor."""

    def __init__(self, owner: SparseTransformer, layer: int):
        super().__init__(owner, layer)
        model = owner.transformer
        attentions = len(model.transformer_blocks) + len(model.single_transformer_blocks)
        # Decided once: a compiled block guards on what its processor reads, and the same
        # answer for every encoder layer compiles one graph for them all.
        self._decoder = layer >= attentions - model.config.num_decoder_layers

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        if self._decoder:
            return self.owner._originals[self.layer](attn, hidden_states, encoder_hidden_states, attention_mask,
                                                     image_rotary_emb)
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)


class _HunyuanVideo15SelfAttention(_SelfAttention):
    """diffusers' HunyuanVideo 1.5 joint attention: the video's tokens (QK RMS norm per
    head, the rotary embedding) then the prompt's (projections and norms of their own;
    its image, ByT5 and LLM tokens, the kept ones first). The model's mask hides the
    padding as keys and as queries: the layer's mask goes to SparseTransformer._attend."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None or attention_mask is None:
            raise Unsupported(f"layer {self.layer}: HunyuanVideo 1.5's attention without the prompt's tokens and mask")
        self._check_call()  # the mask is the prompt's padding, handled as described above
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (attn.to_q(hidden_states),
                                                                        attn.to_k(hidden_states),
                                                                        attn.to_v(hidden_states)))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = (_rotated(x, image_rotary_emb, sequence_dim=1) for x in (query, key))
        query, key, value = _with_prompt(attn, (query, key, value), encoder_hidden_states)
        out = self._attention(query, key, value, attention_mask).flatten(2, 3).to(query.dtype)
        return _joint_outputs(attn, out, encoder_hidden_states.shape[1])


class _MochiSelfAttention(_SelfAttention):
    """diffusers' Mochi joint attention: the video's tokens (QK RMS norm per head, its
    rotary embedding on channel pairs in fp32) then the prompt's (projections and norms
    of their own). The model attends each sample over the video and the prompt tokens its
    mask keeps, its other rows zero: the layer's mask goes to SparseTransformer._attend."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb=None):
        self._check_call()  # the mask is the prompt's padding, handled as described above
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (attn.to_q(hidden_states),
                                                                        attn.to_k(hidden_states),
                                                                        attn.to_v(hidden_states)))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = _rotate_pairs_in_fp32(query, *image_rotary_emb), _rotate_pairs_in_fp32(key, *image_rotary_emb)
        query, key, value = _with_prompt(attn, (query, key, value), encoder_hidden_states)
        out = self._attention(query, key, value, attention_mask).flatten(2, 3).to(query.dtype)
        return _joint_outputs(attn, out, encoder_hidden_states.shape[1])


class _CosmosSelfAttention(_SelfAttention):
    """diffusers' Cosmos self-attention (Predict2, Predict2.5, Transfer2.5): QK RMS norm per
    head, the rotary embedding on head-major q, k (their halves as real and imaginary parts)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        query, key, value = (x.unflatten(2, (attn.heads, -1)).transpose(1, 2) for x in (attn.to_q(hidden_states),
                                                                                        attn.to_k(hidden_states),
                                                                                        attn.to_v(hidden_states)))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = (_rotated(x, image_rotary_emb, use_real=True, use_real_unbind_dim=-2)
                          for x in (query, key))
        out = self._attention(*(x.transpose(1, 2) for x in (query, key, value))).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class _Cosmos3SelfAttention(_SelfAttention):
    """diffusers' Cosmos 3 attention: one packed sequence of two pathways, the prompt's tokens
    (understanding: causal among themselves) and the generated ones after them (the video's,
    then any sound's and action's), each pathway with projections, QK RMS norm and a rotary
    embedding of its own, and K, V with fewer heads than Q (grouped-query attention). The
    prompt's causal attention stays diffusers'. The generated tokens attend to every key, and
    that attention runs through stsa: the video's rows first, then the sound's, the action's
    and the prompt's as global tokens after them (the grid's text; the prompt's rows stsa
    computes too and drops, 1 / F of dense or less). The host backends read each K and V
    head for its Q heads; for the CUDA backend, which does not yet, they are repeated."""

    def __call__(self, attn, und_seq, gen_seq, rotary_emb):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        heads, kv_heads, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        if heads % kv_heads:
            raise Unsupported(f"layer {self.layer}: {heads} query heads do not share {kv_heads} key heads evenly")
        counts = (heads, kv_heads, kv_heads)
        q_und, k_und, v_und = (x.view(-1, h, dim) for x, h in zip(
            (attn.to_q(und_seq), attn.to_k(und_seq), attn.to_v(und_seq)), counts))
        q_gen, k_gen, v_gen = (x.view(-1, h, dim) for x, h in zip(
            (attn.add_q_proj(gen_seq), attn.add_k_proj(gen_seq), attn.add_v_proj(gen_seq)), counts))
        q_und, k_und = attn.norm_q(q_und), attn.norm_k(k_und)
        k_und_for_gen = k_und if attn.k_norm_und_for_gen is None else attn.k_norm_und_for_gen(k_und)
        q_gen, k_gen = attn.norm_added_q(q_gen), attn.norm_added_k(k_gen)
        cos_und, sin_und, cos_gen, sin_gen = (x.unsqueeze(1) for x in rotary_emb)
        q_und, k_und, k_und_for_gen = (_rotate_halves(x, cos_und, sin_und) for x in (q_und, k_und, k_und_for_gen))
        q_gen, k_gen = (_rotate_halves(x, cos_gen, sin_gen) for x in (q_gen, k_gen))

        causal = dispatch_attention_fn(q_und[None], k_und[None], v_und[None], is_causal=True, enable_gqa=True,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
        query = torch.cat([q_gen, q_und])[None]
        groups = heads // kv_heads if q_gen.is_cuda else 1
        key, value = (_heads_repeated(parts, groups) for parts in ((k_gen, k_und_for_gen), (v_gen, v_und)))
        out = self._attention(query, key, value)[0, :q_gen.shape[0]].flatten(-2, -1).to(q_gen.dtype)
        return attn.to_out(causal.squeeze(0).flatten(-2, -1)), attn.to_add_out(out)


def _rotate_halves(x, cos, sin):
    """x * cos + rotate_half(x) * sin, the halves of each head as real and imaginary parts."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def _heads_repeated(parts, groups: int):
    """[N_i, H_kv, D] pieces, one after another along the tokens -> [1, sum N_i, H_kv * groups, D],
    each head repeated `groups` times in place (head h of the result is head h // groups), in one copy."""
    tokens = sum(part.shape[0] for part in parts)
    _, kv_heads, dim = parts[0].shape
    out = parts[0].new_empty(tokens, kv_heads, groups, dim)
    start = 0
    for part in parts:
        out[start:start + part.shape[0]] = part.unsqueeze(2)
        start += part.shape[0]
    return out.view(1, tokens, kv_heads * groups, dim)


class _HeliosSelfAttention(_WanSelfAttention):
    """diffusers' Helios self-attention: Wan's (QK RMS norm across heads, its rotary
    embedding) over the history's tokens then the video's, the history's keys amplified
    where the model learnt to; stsa takes the history after the video (global tokens), and
    its outputs go back before."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None,
                 original_context_length=None):
        if encoder_hidden_states is not None or attn.is_cross_attention:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        query, key, value = self._qkv(attn, hidden_states, rotary_emb)
        video = hidden_states.shape[1] if original_context_length is None else original_context_length
        history = self._history(hidden_states.shape[1], video)
        if attn.is_amplify_history and history > 0:
            scale = 1.0 + torch.sigmoid(attn.history_key_scale) * (attn.max_scale - 1.0)
            if attn.history_scale_mode == "per_head":
                scale = scale.view(1, 1, -1, 1)
            # In the keys' dtype: diffusers keeps the scales in fp32, and its own processor's keys
            # turn fp32 in a bf16 model, which its attention call then refuses.
            key = torch.cat([(key[:, :history] * scale).type_as(key), key[:, history:]], dim=1)
        query, key, value = (_history_after_video(x, history, video) for x in (query, key, value))
        out = self._attention(query, key, value, history=history).flatten(2, 3).type_as(query)
        out = _history_before_video(out, history, video)
        return attn.to_out[1](attn.to_out[0](out))

    @staticmethod
    def _rotary(query, key, rotary_emb):  # one [B, N, 2 D] table: cos, then sin
        cos, sin = rotary_emb.unsqueeze(-2).chunk(2, dim=-1)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)


class _LTX2SelfAttention(_SelfAttention):
    """diffusers' LTX-2 video self-attention (its audio stream's is left as it was): QK RMS
    norm across heads and the rotary embedding (interleaved or split) on the flat rows,
    per-head output gates where the model has them, and spatio-temporal guidance's
    perturbation (the samples it marks take the value projection instead of attention;
    all of them: no attention call at all) as LTX2PerturbedAttnProcessor does it."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None, perturbation_mask=None, all_perturbed=None):
        from diffusers.models.transformers.transformer_ltx2 import (apply_interleaved_rotary_emb,
                                                                   apply_split_rotary_emb)

        if encoder_hidden_states is not None or key_rotary_emb is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attention_mask)
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        value = attn.to_v(hidden_states)
        if all_perturbed is None:
            all_perturbed = perturbation_mask is not None and bool(torch.all(perturbation_mask == 0))
        if all_perturbed:
            out = value
        else:
            query, key = attn.norm_q(attn.to_q(hidden_states)), attn.norm_k(attn.to_k(hidden_states))
            if query_rotary_emb is not None:
                rotate = {"interleaved": apply_interleaved_rotary_emb, "split": apply_split_rotary_emb}.get(
                    attn.rope_type)
                if rotate is None:
                    raise Unsupported(f"LTX-2's rotary embedding of type {attn.rope_type!r} is not one stsa knows")
                query, key = rotate(query, query_rotary_emb), rotate(key, query_rotary_emb)
            query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
            out = self._attention(query, key, value, history=self._appended(hidden_states)).flatten(2, 3).to(
                query.dtype)
            if perturbation_mask is not None:
                out = torch.lerp(value.flatten(2, 3), out, perturbation_mask)
        if gate_logits is not None:
            out = (out.unflatten(2, (attn.heads, -1)) * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)).flatten(2, 3)
        return attn.to_out[1](attn.to_out[0](out))


class _KandinskySelfAttention(_SelfAttention):
    """diffusers' Kandinsky 5 self-attention of the visual blocks (its text blocks' and the
    cross-attention are left as they were): QK RMS norm per head in fp32, the rotary
    embedding's 2 x 2 rotations rounded to bf16 as the model rounds them."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, rotary_emb=None, sparse_params=None):
        if encoder_hidden_states is not None:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        if sparse_params is not None:
            raise Unsupported(_KANDINSKY_NABLA)
        query, key, value = (x.unflatten(-1, (attn.num_heads, -1)) for x in (attn.to_query(hidden_states),
                                                                             attn.to_key(hidden_states),
                                                                             attn.to_value(hidden_states)))
        query = attn.query_norm(query.float()).type_as(query)
        key = attn.key_norm(key.float()).type_as(key)
        if rotary_emb is not None:
            query, key = _rotate_2x2_in_bf16(query, rotary_emb), _rotate_2x2_in_bf16(key, rotary_emb)
        return attn.out_layer(self._attention(query, key, value).flatten(-2, -1))


class _Kandinsky6SelfAttention(_SelfAttention):
    """diffusers' Kandinsky 6 self-attention of the video stream (its audio stream's, text
    blocks' and cross-attentions are left as they were): QK RMS norm per head, the rotary
    embedding's 2 x 2 rotations in fp32, stored in q's and k's type."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, rotary_emb=None, rotary_emb_kv=None,
                 attn_mask=None):
        if encoder_hidden_states is not None or rotary_emb_kv is not rotary_emb:
            raise Unsupported(f"layer {self.layer}: stsa replaces self-attention only")
        self._check_call(attn_mask)
        query, key, value = (x.unflatten(-1, (attn.num_heads, -1)) for x in (attn.to_query(hidden_states),
                                                                             attn.to_key(hidden_states),
                                                                             attn.to_value(hidden_states)))
        query, key = attn.query_norm(query), attn.key_norm(key)
        if rotary_emb is not None:
            query, key = _rotate_2x2(query, rotary_emb), _rotate_2x2(key, rotary_emb)
        return attn.out_layer(self._attention(query, key, value).flatten(-2, -1))


_KANDINSKY_NABLA = ("Kandinsky 5's own sparse attention (NABLA: the model's attention_type 'nabla', the forward's "
                    "sparse_params) is on: stsa replaces the dense self-attention of attention_type 'regular'")


def _rotate_2x2_in_bf16(x, rope):
    """Kandinsky 5's rotary embedding: each channel pair times its 2 x 2 rotation in fp32,
    stored in bf16 (whatever x's type), then in x's type."""
    pairs = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
    return (rope * pairs).sum(dim=-1).reshape(*x.shape).to(torch.bfloat16).type_as(x)


def _rotate_2x2(x, rope):
    """Kandinsky 6's rotary embedding: each channel pair times its 2 x 2 rotation in fp32,
    stored in x's type."""
    pairs = x.reshape(*x.shape[:-1], -1, 1, 2).float()
    return (rope.float() * pairs).sum(dim=-1).reshape(*x.shape).to(x.dtype)


def _rotate_pairs_in_fp32(x, cos, sin):
    """Mochi's rotary embedding: channel pairs (2i, 2i+1) rotated in fp32, each half
    stored in x's type before they are interleaved again."""
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([(even * cos - odd * sin).to(x.dtype), (even * sin + odd * cos).to(x.dtype)],
                       dim=-1).flatten(-2)


def _history_after_video(x, history: int, video: int):
    """[B, N, ...] of a model that puts its history tokens (past frames) before the video's:
    the video's, then the history's, then the rest (the prompt), the order of stsa's grid,
    which keeps the history global. A copy; none without history."""
    if not history:
        return x
    return torch.cat([x[:, history:history + video], x[:, :history], x[:, history + video:]], dim=1)


def _history_before_video(x, history: int, video: int):
    """The inverse of _history_after_video."""
    if not history:
        return x
    return torch.cat([x[:, video:video + history], x[:, :video], x[:, video + history:]], dim=1)


def _with_prompt(attn, video_qkv, encoder_hidden_states):
    """HunyuanVideo's dual-stream joint attention: the prompt's q, k, v (projections and
    QK norms of their own) after the video's."""
    prompt = [x.unflatten(2, (attn.heads, -1)) for x in (attn.add_q_proj(encoder_hidden_states),
                                                          attn.add_k_proj(encoder_hidden_states),
                                                          attn.add_v_proj(encoder_hidden_states))]
    if attn.norm_added_q is not None:
        prompt[0] = attn.norm_added_q(prompt[0])
    if attn.norm_added_k is not None:
        prompt[1] = attn.norm_added_k(prompt[1])
    return tuple(torch.cat([x, p], dim=1) for x, p in zip(video_qkv, prompt))


def _joint_outputs(attn, out, text: int):
    """[B, N, H D], the video's rows then the prompt's ``text``: each through its output projection."""
    video_out, text_out = out.split([out.shape[1] - text, text], dim=1)
    if getattr(attn, "to_out", None) is not None:
        video_out = attn.to_out[1](attn.to_out[0](video_out))
    if getattr(attn, "to_add_out", None) is not None:
        text_out = attn.to_add_out(text_out)
    return video_out, text_out


# The compiled path's operator finds its SparseTransformer by number (an operator takes
# tensors and plain values); a disabled, dropped one is gone from here too.
_ids = itertools.count()
_owners: "weakref.WeakValueDictionary[int, SparseTransformer]" = weakref.WeakValueDictionary()


# The layer number reaches the operator as a 0-d tensor, an input of the compiled graph:
# as an int it would be a constant, and regional compilation (diffusers'
# compile_repeated_blocks) would compile the block once per layer, past torch.compile's
# recompile limit. Not captured into CUDA graphs: a routed GPU call reads its decisions
# back on the host, which a capture refuses.
@torch.library.custom_op("stsa::diffusers_attention", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, owner: int, layer: torch.Tensor,
                  layout: str, prompt_mask: Optional[torch.Tensor], history: int) -> torch.Tensor:
    found = _owners.get(owner)
    if found is None:  # was a KeyError
        raise InvalidArgument(f"what stsa.diffusers.enable returned when this call was compiled or exported "
                              f"(number {owner}) no longer exists: keep it while the program that calls it runs")
    return found._attend(int(layer), q, k, v, layout, prompt_mask, history)


@_attention_op.register_fake
def _(q, k, v, owner, layer, layout, prompt_mask, history):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)  # as stsa.attention allocates it


# Counted by FlopCounterMode where the model runs without data (its eager calls with data go
# through stsa.Policy's operator, which counts what they ran): the policy's estimate, the
# video's grid with every other token (prompt, history) global; the layer read where it has data.
@counted(torch.ops.stsa.diffusers_attention, get_raw=True)
def _(q, k, v, owner, layer, layout, prompt_mask, history, out_val=None) -> int:
    found = _owners.get(owner)
    if found is None or found.grid is None:
        return 0
    grid = found.grid
    tokens = q.shape[1] if layout == "bnhd" else q.shape[2]
    known_layer = None if _without_data(layer) else int(layer)
    tile_q, tile_k = _tile(found._options["tile"])
    return int(_policy_estimate(found.policy, q.shape, layout,
                                [grid.frames, grid.height, grid.width, int(tokens) - grid.video_tokens],
                                grid.text_placement == "before", found.step, known_layer, [tile_q, tile_k],
                                found._options["align"]))


def _rotate(x, cos, sin):
    """Wan's rotary embedding: channel pairs (2i, 2i+1) rotated by the position's angle,
    computed in the tables' precision (fp32) and stored in x's."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


def _rotate_complex(x, freqs):
    """AnyFlow's rotary embedding on [B, N, H, D]: channel pairs as complex numbers times the
    frequencies ([1, H or 1, N, D / 2], head-major, complex fp64 where the device has it)."""
    pairs = torch.view_as_complex(x.to(freqs.real.dtype).unflatten(3, (-1, 2)))
    return torch.view_as_real(pairs * freqs.transpose(1, 2)).flatten(3, 4).type_as(x)


def _latents(hidden_states, axes: str):
    if hidden_states.dim() != 5:
        raise InvalidArgument(f"the transformer's input must be [{axes}], got {tuple(hidden_states.shape)}")
    return hidden_states.shape


def _wan_grid(transformer, inputs) -> VideoGrid:
    _, _, frames, height, width = _latents(inputs["hidden_states"], "B, C, F, H, W")
    patch_t, patch_h, patch_w = transformer.config.patch_size
    return VideoGrid(frames // patch_t, height // patch_h, width // patch_w)  # text joins by cross-attention


def _anyflow_grid(transformer, inputs) -> VideoGrid:
    _, frames, _, height, width = _latents(inputs["hidden_states"], "B, F, C, H, W")
    patch_t, patch_h, patch_w = transformer.config.patch_size
    return VideoGrid(frames // patch_t, height // patch_h, width // patch_w)  # text joins by cross-attention


def _cogvideox_grid(transformer, inputs) -> VideoGrid:
    """CogVideoX's and ConsisID's latents over the patch (ConsisID, CogVideoX 1.0's shape, has
    no temporal patch); the prompt's tokens before the video's."""
    _, frames, _, height, width = _latents(inputs["hidden_states"], "B, F, C, H, W")
    patch, patch_t = transformer.config.patch_size, transformer.config.get("patch_size_t") or 1
    return VideoGrid(-(-frames // patch_t), height // patch, width // patch,
                     text=inputs["encoder_hidden_states"].shape[1], text_placement="before")


def _easyanimate_grid(transformer, inputs) -> VideoGrid:
    """EasyAnimate's latents over its spatial patch (each frame a token grid); the prompt's
    tokens (its first encoder's, then T5's where given) before the video's."""
    _, _, frames, height, width = _latents(inputs["hidden_states"], "B, C, F, H, W")
    patch = transformer.config.patch_size
    t5 = inputs.get("encoder_hidden_states_t5")
    text = inputs["encoder_hidden_states"].shape[1] + (0 if t5 is None else t5.shape[1])
    return VideoGrid(frames, height // patch, width // patch, text=text, text_placement="before")


def _forward_sizes(inputs, model: str) -> list[int]:
    sizes = [inputs.get(name) for name in ("num_frames", "height", "width")]
    if any(size is None for size in sizes):
        raise InvalidArgument(f"{model}'s forward was called without num_frames, height and width: stsa reads the "
                              "latent grid from them")
    return [int(size) for size in sizes]


def _ltx_grid(transformer, inputs) -> VideoGrid:
    """LTX-Video's tokens come packed ([B, N, C]); the forward's num_frames, height and width
    are their grid (the rotary embedding's, frame-major)."""
    frames, height, width = _forward_sizes(inputs, "LTX-Video")
    return VideoGrid(frames, height, width)


def _ltx2_grid(transformer, inputs) -> VideoGrid:
    """LTX-2's video tokens come packed too; its forward's sizes are the latent's, one token a
    patch (its rotary embedding steps through them by the patch sizes)."""
    frames, height, width = _forward_sizes(inputs, "LTX-2")
    patch, patch_t = transformer.config.patch_size, transformer.config.patch_size_t
    return VideoGrid(-(-frames // patch_t), -(-height // patch), -(-width // patch))


def _kandinsky_grid(transformer, inputs) -> VideoGrid:
    """Kandinsky 5's and 6's latents come as [B, F, H, W, C], their tokens frame-major over the
    patches (unless Kandinsky 5's NABLA attention reorders them into 8 x 8 blocks: refused)."""
    if inputs.get("sparse_params") is not None:
        raise Unsupported(_KANDINSKY_NABLA)
    _, frames, height, width, _ = _latents(inputs["hidden_states"], "B, F, H, W, C")
    patch_t, patch_h, patch_w = transformer.config.patch_size
    return VideoGrid(frames // patch_t, height // patch_h, width // patch_w)  # text joins by cross-attention


def _hunyuan_grid(transformer, inputs) -> VideoGrid:
    """The video's grid for latents [B, C, F, H, W] patched by an int patch_size and
    patch_size_t: HunyuanVideo 1.0, 1.5, Framepack and Allegro (no prompt tokens). A
    HunyuanVideo sample's prompt tokens come from the forward's mask
    (_hunyuan_text_counts) or, in 1.5, the one its layers get."""
    _, _, frames, height, width = _latents(inputs["hidden_states"], "B, C, F, H, W")
    patch, patch_t = transformer.config.patch_size, transformer.config.patch_size_t
    return VideoGrid(frames // patch_t, height // patch, width // patch, text_placement="after")


def _mochi_grid(transformer, inputs) -> VideoGrid:
    """The video's grid (spatial patches only); each sample's prompt tokens come from the layers' mask."""
    _, _, frames, height, width = _latents(inputs["hidden_states"], "B, C, F, H, W")
    patch = transformer.config.patch_size
    return VideoGrid(frames, height // patch, width // patch, text_placement="after")


def _cosmos3_grid(transformer, inputs) -> VideoGrid:
    """Cosmos 3's packed sequence, one video per forward: the prompt's und_len tokens, the video's
    frame-major over its patch grid (vision_token_shapes), then any sound's and action's. For stsa
    the video comes first and the other sequence_length - video tokens after it, as a prompt's."""
    if getattr(transformer, "_cp_shard_fn", None) is not None:
        raise Unsupported("Cosmos 3 with its own context parallelism (_cp_shard_fn) set: stsa needs every "
                          "token of the sequence on the device")
    shapes = inputs["vision_token_shapes"]
    if len(shapes) != 1:
        raise Unsupported(f"Cosmos 3 was given {len(shapes)} videos in one packed sequence; stsa takes one per "
                          "forward (the pipeline's)")
    frames, height, width = (int(n) for n in shapes[0])
    video, prompt = frames * height * width, int(inputs["und_len"])
    indexes = inputs["vision_sequence_indexes"]
    if not _without_data(indexes) and not torch.equal(
            indexes, torch.arange(prompt, prompt + video, device=indexes.device, dtype=indexes.dtype)):
        raise Unsupported("Cosmos 3's video tokens must directly follow the prompt's, in order (as its pipeline "
                          "packs them): stsa reads the grid from that order")
    return VideoGrid(frames, height, width, text=int(inputs["sequence_length"]) - video, text_placement="after")


def _cosmos3_timestep(inputs):
    """The step's timestep, from its noisy tokens' (the pipeline gives each modality one value a step)."""
    given = [inputs.get(f"{name}_timesteps") for name in ("vision", "sound", "action")]
    given = [t for t in given if t is not None and t.numel()]
    if not given:
        raise InvalidArgument("Cosmos 3's forward was given no noisy token: stsa reads the step from their timesteps")
    return given[0]


def _hunyuan_text_counts(inputs) -> list[int]:
    # As the model builds its attention mask: the first sum(mask) prompt tokens are kept.
    return [int(n) for n in inputs["encoder_attention_mask"].sum(dim=1).tolist()]


def _framepack_text_counts(inputs) -> list[int]:
    # Framepack puts the image's tokens (one per image embedding, all kept) before the prompt's.
    return [inputs["image_embeds"].shape[1] + n for n in _hunyuan_text_counts(inputs)]


def _motif_text_counts(inputs) -> list[int]:
    """Motif-Video: the image's embeddings (all kept) before the prompt's tokens, of which the
    forward's mask keeps the first ones. Its layers get that mask as it is, so one that keeps a
    token after padding is refused; without a mask every token is kept."""
    image = inputs.get("image_embeds")
    images = 0 if image is None else image.shape[1]
    mask = inputs.get("encoder_attention_mask")
    if mask is None:
        return [images + inputs["encoder_hidden_states"].shape[1]] * inputs["hidden_states"].shape[0]
    return [images + count for count in _kept_first(mask)]


def _forward_signature(transformer) -> inspect.Signature:
    """The arguments the transformer class's forward takes, without self."""
    signature = inspect.signature(type(transformer).forward)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


@dataclasses.dataclass(frozen=True)
class _Family:
    """What stsa.diffusers knows of one transformer class."""

    blocks: tuple[str, ...]       # the attributes holding the blocks, in the order they run
    attention: str                # each block's self-attention module (a dotted path within the block)
    replaced: tuple[str, ...]     # the processors whose computation `processor` reproduces (diffusers' own)
    processor: type
    grid: Any                     # (transformer, the forward's arguments by name) -> VideoGrid
    text_counts: Any = lambda inputs: None  # (arguments) -> per sample, the prompt tokens kept; None: all
    timestep: Any = operator.itemgetter("timestep")  # (arguments) -> the forward's timestep(s)
    since: str = "0.35"           # the first diffusers release whose `replaced` processors this reproduces (tested)
    # Timesteps that rise over a generation: Mochi's pipeline runs its scheduler with inverted
    # sigmas (invert_sigmas=True), from 0 up, where every other family's count down.
    rising_timesteps: bool = False

    def self_attentions(self, transformer) -> list:
        attentions = [(f"{name}[{i}].{self.attention}", operator.attrgetter(self.attention)(block))
                      for name in self.blocks for i, block in enumerate(getattr(transformer, name))]
        for where, attn in attentions:
            processor = type(attn.processor).__name__
            if processor not in self.replaced:
                raise InvalidArgument(f"{where} runs {processor}; stsa replaces diffusers' own "
                                      f"{' or '.join(self.replaced)} (diffusers >= {self.since}) only: disable what "
                                      "installed the other one first, or with an older diffusers (whose processor "
                                      "computes something else), upgrade it")
        return [attn for _, attn in attentions]


# Processors are matched by name: another one (a user's own, or an older diffusers'
# with another rotary embedding) computes something else and is not replaced.
_FAMILIES = {
    "WanTransformer3DModel": _Family(("blocks",), "attn1", ("WanAttnProcessor",), _WanSelfAttention, _wan_grid),
    # Wan VACE: its control blocks (on the control video's tokens, padded to the video's) run first.
    "WanVACETransformer3DModel": _Family(("vace_blocks", "blocks"), "attn1", ("WanAttnProcessor",),
                                         _WanSelfAttention, _wan_grid),
    # SkyReels-V2: Wan's self-attention under another name (its diffusion forcing's causal mask is refused).
    "SkyReelsV2Transformer3DModel": _Family(("blocks",), "attn1", ("SkyReelsV2AttnProcessor",), _WanSelfAttention,
                                            _wan_grid, since="0.36"),
    # Wan Animate: the reference image's latent frame first, then the video's; its face adapter
    # (cross-attention to the face's motion, between the blocks) left as it was.
    "WanAnimateTransformer3DModel": _Family(("blocks",), "attn1", ("WanAttnProcessor",), _WanSelfAttention,
                                            _wan_grid, since="0.36"),
    # ChronoEdit: Wan2.1's image-to-video transformer, its own copy of Wan's processor.
    "ChronoEditTransformer3DModel": _Family(("blocks",), "attn1", ("WanAttnProcessor",), _WanSelfAttention,
                                            _wan_grid, since="0.36"),
    # AnyFlow: Wan2.1's backbone distilled for flow-map sampling (its FAR variant's causal mask is not it).
    "AnyFlowTransformer3DModel": _Family(("blocks",), "attn1", ("AnyFlowAttnProcessor",), _AnyFlowSelfAttention,
                                         _anyflow_grid, since="0.39"),
    "AllegroTransformer3DModel": _Family(("transformer_blocks",), "attn1", ("AllegroAttnProcessor2_0",),
                                         _AllegroSelfAttention, _hunyuan_grid),
    "LTXVideoTransformer3DModel": _Family(("transformer_blocks",), "attn1", ("LTXVideoAttnProcessor",),
                                          _LTXSelfAttention, _ltx_grid),
    "LTX2VideoTransformer3DModel": _Family(("transformer_blocks",), "attn1",
                                           ("LTX2AudioVideoAttnProcessor", "LTX2PerturbedAttnProcessor"),
                                           _LTX2SelfAttention, _ltx2_grid, since="0.38"),
    "CogVideoXTransformer3DModel": _Family(("transformer_blocks",), "attn1",
                                           ("CogVideoXAttnProcessor2_0", "FusedCogVideoXAttnProcessor2_0"),
                                           _CogVideoXSelfAttention, _cogvideox_grid),
    # ConsisID: CogVideoX's blocks and processor; its face features join by cross-attention
    # between the blocks, left as it was.
    "ConsisIDTransformer3DModel": _Family(("transformer_blocks",), "attn1",
                                          ("CogVideoXAttnProcessor2_0", "FusedCogVideoXAttnProcessor2_0"),
                                          _CogVideoXSelfAttention, _cogvideox_grid),
    "EasyAnimateTransformer3DModel": _Family(("transformer_blocks",), "attn1", ("EasyAnimateAttnProcessor2_0",),
                                             _EasyAnimateSelfAttention, _easyanimate_grid),
    "HunyuanVideoTransformer3DModel": _Family(("transformer_blocks", "single_transformer_blocks"), "attn",
                                              ("HunyuanVideoAttnProcessor2_0",), _HunyuanVideoSelfAttention,
                                              _hunyuan_grid, _hunyuan_text_counts),
    # Framepack: HunyuanVideo's blocks over the history's tokens, then the video's, then the image's and the prompt's.
    "HunyuanVideoFramepackTransformer3DModel": _Family(("transformer_blocks", "single_transformer_blocks"), "attn",
                                                       ("HunyuanVideoAttnProcessor2_0",), _HunyuanVideoSelfAttention,
                                                       _hunyuan_grid, _framepack_text_counts),
    # Motif-Video: HunyuanVideo's blocks (its text cross-attention, another module, left as it was).
    "MotifVideoTransformer3DModel": _Family(("transformer_blocks", "single_transformer_blocks"), "attn",
                                            ("MotifVideoAttnProcessor2_0",), _MotifVideoSelfAttention, _hunyuan_grid,
                                            _motif_text_counts, since="0.42"),
    "HunyuanVideo15Transformer3DModel": _Family(("transformer_blocks",), "attn", ("HunyuanVideo15AttnProcessor2_0",),
                                                _HunyuanVideo15SelfAttention, _hunyuan_grid, since="0.36"),
    "MochiTransformer3DModel": _Family(("transformer_blocks",), "attn1", ("MochiAttnProcessor2_0",),
                                       _MochiSelfAttention, _mochi_grid, rising_timesteps=True),
    # Cosmos: its cross-attention runs the same processor class and is left as it was.
    "CosmosTransformer3DModel": _Family(("transformer_blocks",), "attn1", ("CosmosAttnProcessor2_0",),
                                        _CosmosSelfAttention, _wan_grid),
    # Helios: Wan's blocks over the history's tokens then the video's; its cross-attention, the
    # same processor class, left as it was.
    "HeliosTransformer3DModel": _Family(("blocks",), "attn1", ("HeliosAttnProcessor",), _HeliosSelfAttention,
                                        _wan_grid, since="0.37"),
    # Kandinsky 6: its fused video and audio blocks; the video stream's self-attention only.
    "Kandinsky6Transformer3DModel": _Family(("visual_transformer_blocks",), "video_dec_block.self_attention",
                                            ("Kandinsky6AttnProcessor",), _Kandinsky6SelfAttention, _kandinsky_grid,
                                            since="0.42"),
    # Cosmos 3: the generated tokens' attention (the video's, with any sound's, action's and the
    # prompt's as global tokens); the prompt's own causal attention left as it was.
    "Cosmos3OmniTransformer": _Family(("layers",), "self_attn", ("Cosmos3AttnProcessor",), _Cosmos3SelfAttention,
                                      _cosmos3_grid, timestep=_cosmos3_timestep, since="0.42"),
    "Kandinsky5Transformer3DModel": _Family(("visual_transformer_blocks",), "self_attention",
                                            ("Kandinsky5AttnProcessor",), _KandinskySelfAttention, _kandinsky_grid,
                                            since="0.36"),
}


def _family_of(transformer) -> _Family:
    name = type(transformer).__name__
    if name not in _FAMILIES:
        raise InvalidArgument(f"{name} is not a transformer stsa.diffusers knows ({', '.join(_FAMILIES)})")
    return _FAMILIES[name]
