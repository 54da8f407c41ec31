"""What the torch-facing test files share: the GPU gate and the reference check on
tensors. Imported only after pytest.importorskip("torch")."""

import os

import pytest
import torch

import reference
import stsa

TYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def require_gpu():
    """Skips a GPU test where there is no CUDA device or backend; fails it instead under
    STSA_GPU_REQUIRED=1 (bench/gpu/check.sh), where a skip would hide a broken setup."""
    if torch.cuda.is_available() and "cuda" in stsa.backends():
        return
    why = "no CUDA device, or a build without the CUDA backend"
    if os.environ.get("STSA_GPU_REQUIRED") == "1":
        pytest.fail(why + " (STSA_GPU_REQUIRED=1)")
    pytest.skip(why)


def check(out, q, k, v, masks, lse=None):
    """reference.check on host copies: the inputs as the kernel read them, the output's
    values in fp32 (exact for every output type), rounded to its type by torch."""
    host = [x.float().cpu().numpy() for x in (q, k, v)]
    reference.check(out.float().cpu().numpy(), *host, masks, lse=None if lse is None else lse.cpu().numpy(),
                    out_type=TYPE_NAMES[out.dtype],
                    round_to_out=lambda x: torch.from_numpy(x).to(out.dtype).float().numpy())
