#!/usr/bin/env python3
"""Checks the JSON of `stsa bench --backend cuda` (bench/gpu/check.sh step 7):
rows were checked, and both runs match the fp64 reference on them within bf16
rounding (the output's and P's; LSE is fp32 throughout). Timings are printed,
never asserted. Exit 1 on a failed check."""
import json
import sys

r = json.load(open(sys.argv[1]))
keys = ("kernel", "dense_ms", "sparse_ms", "speedup", "tile_density", "check_rows", "rel_l2_err", "max_abs_err",
        "lse_max_abs_err", "dense_rel_l2_err", "dense_max_abs_err", "dense_lse_max_abs_err")
print({k: r.get(k) for k in keys})


def below(key, bound):
    value = r.get(key)
    return isinstance(value, (int, float)) and value == value and value < bound


# bf16: unit roundoff 2^-9 = 2e-3 for the stored output, the same again for P
# before P V: about 1.6e-3 rel L2 expected on random inputs, 1e-2 allowed.
checks = {"rows checked": r.get("check_rows", 0) > 0,
          "sparse rel L2 < 1e-2": below("rel_l2_err", 1e-2), "dense rel L2 < 1e-2": below("dense_rel_l2_err", 1e-2),
          "sparse LSE < 1e-3": below("lse_max_abs_err", 1e-3), "dense LSE < 1e-3": below("dense_lse_max_abs_err", 1e-3)}
failed = [name for name, ok in checks.items() if not ok]
print("failed: " + ", ".join(failed) if failed else "all checks passed")
sys.exit(1 if failed else 0)
