"""stsa.quality's PSNR and SSIM against their definitions written as plain loops."""

import math

import numpy as np
import pytest

import stsa
import stsa.quality


def ssim_by_windows(a, b, peak=1.0):
    """Wang et al.'s SSIM with a 7 x 7 uniform window and the sample (co)variance, window by
    window, frame by frame and channel by channel: the definition the module computes."""
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    values = []
    for frame in range(a.shape[0]):
        per_channel = []
        for c in range(a.shape[3]):
            x, y = a[frame, :, :, c].astype(np.float64), b[frame, :, :, c].astype(np.float64)
            windows = []
            for i in range(x.shape[0] - 6):
                for j in range(x.shape[1] - 6):
                    wx, wy = x[i:i + 7, j:j + 7].ravel(), y[i:i + 7, j:j + 7].ravel()
                    mx, my = wx.mean(), wy.mean()
                    vx, vy = wx.var(ddof=1), wy.var(ddof=1)
                    cxy = ((wx - mx) * (wy - my)).sum() / (wx.size - 1)
                    windows.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2)))
            per_channel.append(np.mean(windows))
        values.append(np.mean(per_channel))
    return float(np.mean(values))


def test_psnr_by_its_definition(rng):
    a = rng.random((3, 9, 11, 3))
    b = np.clip(a + rng.normal(0, 0.05, a.shape), 0, 1)
    mse = np.mean((a - b) ** 2)
    assert stsa.quality.psnr(a, b) == pytest.approx(10 * math.log10(1 / mse), rel=1e-12)
    assert stsa.quality.psnr(a * 255, b * 255, peak=255) == pytest.approx(stsa.quality.psnr(a, b), rel=1e-9)
    frames = stsa.quality.frame_psnr(a, b)
    assert frames == pytest.approx([10 * math.log10(1 / np.mean((x - y) ** 2)) for x, y in zip(a, b)], rel=1e-12)
    assert stsa.quality.psnr(a, a) == math.inf
    assert stsa.quality.psnr(np.zeros((1, 2, 2)), np.full((1, 2, 2), 0.1)) == pytest.approx(20.0)


def test_ssim_by_its_definition(rng):
    a = rng.random((2, 10, 12, 3)).astype(np.float32)
    b = np.clip(a + rng.normal(0, 0.1, a.shape), 0, 1).astype(np.float32)
    assert stsa.quality.ssim(a, b) == pytest.approx(ssim_by_windows(a, b), rel=1e-9)
    assert stsa.quality.ssim(a, a) == pytest.approx(1.0, abs=1e-12)
    gray = rng.random((2, 8, 7))  # [F, H, W]: one channel
    assert stsa.quality.ssim(gray, gray[::-1]) == pytest.approx(ssim_by_windows(gray[..., None], gray[::-1, ..., None]),
                                                                rel=1e-9)
    assert stsa.quality.ssim(a, b) < stsa.quality.ssim(a, np.clip(a + rng.normal(0, 0.02, a.shape), 0, 1))


def test_bad_videos_are_refused():
    with pytest.raises(stsa.InvalidArgument, match="differ in shape"):
        stsa.quality.psnr(np.zeros((1, 8, 8, 3)), np.zeros((1, 8, 8, 1)))
    with pytest.raises(stsa.InvalidArgument, match="frames, height, width"):
        stsa.quality.psnr(np.zeros((8, 8)), np.zeros((8, 8)))
    with pytest.raises(stsa.InvalidArgument, match="finite"):
        stsa.quality.ssim(np.full((1, 8, 8), np.nan), np.zeros((1, 8, 8)))
    with pytest.raises(stsa.InvalidArgument, match="at least 7 x 7"):
        stsa.quality.ssim(np.zeros((1, 6, 8)), np.zeros((1, 6, 8)))


@pytest.mark.parametrize("peak", [0, -1.0, math.nan, math.inf, "1"])
def test_a_peak_that_is_not_positive_and_finite_is_refused(peak):
    a = np.zeros((1, 8, 8))
    for metric in (stsa.quality.psnr, stsa.quality.frame_psnr, stsa.quality.ssim):
        with pytest.raises(stsa.InvalidArgument, match="peak must be a positive finite number"):
            metric(a, a + 0.1, peak=peak)
