"""PyTorch tensors in and out (where torch is installed; CI's venv has none, the GPU
machine's image has it): CPU tensors are read in place through DLPack, the output
comes back as a tensor, and a CUDA tensor is refused."""

import ml_dtypes
import numpy as np
import pytest

import reference
import stsa

torch = pytest.importorskip("torch")

NUMPY_TWIN = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_tensors(dtype, rng):
    grid = stsa.VideoGrid(3, 4, 6, text=5)
    arrays = [rng.standard_normal((1, grid.tokens, 2, 64)).astype(np.float32) for _ in range(3)]
    q, k, v = (torch.from_numpy(a).to(dtype) for a in arrays)
    out, lse = stsa.attention(q, k, v, grid, ["temporal", "spatial"], 0.3, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (1, 2, grid.tokens)
    masks = []
    for route in ("temporal", "spatial"):
        p = stsa.plan(grid, route, 0.3)
        masks.append(reference.allowed(grid, route, p["band"], p["frame_radius"]))
    rounded = [x.float().numpy() for x in (q, k, v)]  # the inputs as the kernel saw them
    reference.check(out.float().numpy().astype(NUMPY_TWIN[dtype]), *rounded, masks, lse=lse.numpy())


def test_head_major_view_of_a_tensor(rng):
    grid = stsa.VideoGrid(4, 4, 4)
    q, k, v = (torch.randn(1, 3, grid.tokens, 64) for _ in range(3))  # [B, H, N, D]
    out = stsa.attention(q, k, v, grid, "spatial", 0.5, layout="bhnd")
    same = stsa.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), grid, "spatial", 0.5)
    assert torch.equal(out.transpose(1, 2), same)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_refused():
    grid = stsa.VideoGrid(2, 4, 4)
    q = torch.randn(1, grid.tokens, 1, 64, device="cuda")
    with pytest.raises(stsa.Unsupported, match="not in host memory"):
        stsa.attention(q, q, q, grid, out=torch.empty(q.shape))
