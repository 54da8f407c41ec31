"""Test inputs that need stsa itself (reference.py stays free of it): the masks a
call runs, sized as the library sizes them, and heads with a known structure."""

import numpy as np

import reference
import stsa


def real_mask(route, plan):
    """Whether a route's mask keeps more than the anchor, and differs from the other
    routes': a band of at least 1 (band 0, the diagonal, is the same in both token
    orders), a frame radius of at least 0 (the frame itself)."""
    if route in ("spatial", "temporal"):
        return plan["band"] >= 1
    return route == "dense" or plan["frame_radius"] >= 0


def masks_for(grid, routes, density, anchor=True):
    """The [N, N] masks `routes` name at `density`: stsa.plan reports the band or
    radius it sized each to; the mask itself is evaluated from its definition. A
    mask that keeps only what the anchor keeps (see real_mask) would make a test
    of it vacuous, so it is refused on grids that have more than one frame."""
    masks = []
    for route in routes:
        p = stsa.plan(grid, route, density, anchor=anchor)
        assert grid.frames == 1 or not anchor or real_mask(route, p), (
            f"{route} at density {density} on {grid} keeps only the anchor: choose more frames or a higher density")
        masks.append(reference.allowed(grid, route, p["band"], p["frame_radius"], anchor))
    return masks


def structured_heads(rng, grid, head_dim, kinds, sharpness=6.0, batch=1):
    """q = k per head from smooth features of the token's position in frame-major
    order (a spatial head: neighbours in the same frame) or spatial-major order (a
    temporal head: the same patch in nearby frames); v random. Text tokens get noise.
    With 9 frames or more the frame-0 anchor keeps at most 21% of the pairs, so a
    kept density of 0.4 leaves the bands room."""
    is_text, frame, patch = reference.coordinates(grid.frames, grid.height, grid.width, grid.text,
                                                  grid.text_placement == "before")
    per_frame = grid.height * grid.width
    positions = {
        "spatial": frame * per_frame + patch,
        "temporal": patch * grid.frames + frame,
    }
    q = np.empty((batch, grid.tokens, len(kinds), head_dim), dtype=np.float32)
    for b in range(batch):
        for h, kind in enumerate(kinds):
            freqs = rng.uniform(0, 2 * np.pi / 24, head_dim // 2)
            angle = positions[kind][:, None] * freqs[None, :]
            features = np.concatenate([np.cos(angle), np.sin(angle)], axis=1) * sharpness
            features[is_text] = rng.standard_normal((int(is_text.sum()), head_dim))
            q[b, :, h, :] = features
    k = q.copy()
    v = rng.standard_normal(q.shape).astype(np.float32)
    return q, k, v
