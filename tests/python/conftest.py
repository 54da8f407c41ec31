"""Fresh random inputs for every test; the seed is printed (pytest shows it with a
failure) and STSA_TEST_SEED replays one."""

import os

import numpy as np
import pytest


@pytest.fixture
def rng():
    seed = int(os.environ.get("STSA_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"seed {seed} (STSA_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)
