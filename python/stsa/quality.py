"""How far one video is from another: PSNR and SSIM, the figures the sparse-attention
literature reports for a sparse generation against the dense one (NumPy only).

Videos are arrays [F, H, W, C] (or [F, H, W]) of values in [0, ``peak``], as a diffusers
pipeline returns them with ``output_type="np"`` (``peak`` 1).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import InvalidArgument

__all__ = ["psnr", "frame_psnr", "ssim"]

# SSIM as Wang et al. (2004) define it, with scikit-image's defaults: a 7 x 7 uniform
# window, the sample covariance, K1 = 0.01, K2 = 0.03; the mean over the windows that fit.
_WINDOW = 7
_K1, _K2 = 0.01, 0.03


def psnr(reference, other, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB over the whole video; inf when they are equal."""
    a, b = _pair(reference, other)
    return _decibels(float(np.mean(np.square(a - b))), _peak(peak))


def frame_psnr(reference, other, peak: float = 1.0) -> list[float]:
    """PSNR of each frame, in dB (the worst frame is what a viewer sees first)."""
    a, b = _pair(reference, other)
    peak = _peak(peak)
    return [_decibels(float(np.mean(np.square(x - y))), peak) for x, y in zip(a, b)]


def ssim(reference, other, peak: float = 1.0) -> float:
    """Structural similarity, the mean over frames and channels (1 when they are equal)."""
    a, b = _pair(reference, other)
    peak = _peak(peak)
    if a.shape[1] < _WINDOW or a.shape[2] < _WINDOW:
        raise InvalidArgument(f"ssim needs frames of at least {_WINDOW} x {_WINDOW} pixels, got {a.shape[1:3]}")
    c1, c2 = (_K1 * peak) ** 2, (_K2 * peak) ** 2
    sample = _WINDOW * _WINDOW / (_WINDOW * _WINDOW - 1)  # the sample covariance, as scikit-image's default
    total = 0.0
    for x, y in zip(a, b):  # a frame at a time: [C, H, W], in float64 for the window sums
        x, y = np.moveaxis(x, -1, 0), np.moveaxis(y, -1, 0)
        mx, my = _window_mean(x), _window_mean(y)
        vx = (_window_mean(x * x) - mx * mx) * sample
        vy = (_window_mean(y * y) - my * my) * sample
        cxy = (_window_mean(x * y) - mx * my) * sample
        index = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        total += float(index.mean())
    return total / a.shape[0]


def _pair(reference, other) -> tuple[np.ndarray, np.ndarray]:
    """Both videos as float64 [F, H, W, C], checked."""
    a, b = np.asarray(reference), np.asarray(other)
    if a.shape != b.shape:
        raise InvalidArgument(f"the videos differ in shape: {a.shape} and {b.shape}")
    if a.ndim not in (3, 4) or a.size == 0:
        raise InvalidArgument(f"a video must be [frames, height, width] or [frames, height, width, channels], "
                              f"got shape {a.shape}")
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InvalidArgument("the videos must hold finite values")
    return (a[..., None], b[..., None]) if a.ndim == 3 else (a, b)


def _peak(peak) -> float:
    """The peak value, checked: 0, a negative or a non-finite one gave -inf or NaN, not an error."""
    if isinstance(peak, numbers.Real) and not isinstance(peak, bool) and math.isfinite(peak) and float(peak) > 0:
        return float(peak)
    raise InvalidArgument(f"peak must be a positive finite number, got {peak!r}")


def _decibels(mse: float, peak: float) -> float:
    return float("inf") if mse == 0 else 10.0 * float(np.log10(peak * peak / mse))


def _window_mean(x: np.ndarray) -> np.ndarray:
    """[C, H, W] -> [C, H - 6, W - 6]: the mean of each 7 x 7 window that fits (summed-area table)."""
    table = np.zeros((x.shape[0], x.shape[1] + 1, x.shape[2] + 1))
    table[:, 1:, 1:] = x.cumsum(axis=1).cumsum(axis=2)
    w = _WINDOW
    return (table[:, w:, w:] - table[:, :-w, w:] - table[:, w:, :-w] + table[:, :-w, :-w]) / (w * w)
