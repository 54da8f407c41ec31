"""stsa.attention as one PyTorch operator, torch.ops.stsa.attention, which is what
``stsa.attention`` calls while torch.compile traces it: the compiled graph holds
one opaque call, whose shapes come from the fake implementation below, instead
of breaking at the extension module. Imported only once torch is (by that path)."""

from __future__ import annotations

from typing import Optional

import torch

from . import VideoGrid, _batch_tokens_heads, attention


# Not captured into CUDA graphs (torch.compile's "reduce-overhead" keeps it out): a
# GPU call allocates its scratch and uploads a new plan as it runs, which a capture
# refuses (the C++ API records calls with a CudaRoutedWorkspace made beforehand).
@torch.library.custom_op("stsa::attention", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: list[int], text_before: bool, masks: str,
                 density: float, anchor: bool, scale: Optional[float], layout: str, tile: list[int], align: str,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of ``stsa.attention``; ``grid`` is (frames, height, width, text), ``masks``
    the mask names joined by commas, ``backend`` "" for where the tensors are."""
    frames, height, width, text = grid
    return attention(q, k, v, VideoGrid(frames, height, width, text, "before" if text_before else "after"),
                     masks.split(","), density, anchor=anchor, layout=layout, scale=scale, tile=(tile[0], tile[1]),
                     align=align, backend=backend or None, return_lse=True)


@attention_op.register_fake
def _(q, k, v, grid, text_before, masks, density, anchor, scale, layout, tile, align, backend):
    # As stsa.attention allocates them: out like q (contiguous), lse [B, H, N] float32.
    batch, tokens, heads = _batch_tokens_heads(q.shape, layout)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty((batch, heads, tokens), dtype=torch.float32, device=q.device))


def traced_attention(q, k, v, grid: VideoGrid, masks: list[str], density, anchor, layout, scale, tile, align, backend):
    """The operator's call for one ``stsa.attention`` call being traced."""
    return torch.ops.stsa.attention(q, k, v, [grid.frames, grid.height, grid.width, grid.text],
                                    grid.text_placement == "before", ",".join(masks), float(density), bool(anchor),
                                    None if scale is None else float(scale), layout, [tile[0], tile[1]], align,
                                    backend or "")
