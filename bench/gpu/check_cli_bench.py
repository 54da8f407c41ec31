#!/usr/bin/env python3
"""Checks the JSON of `stsa bench --backend cuda` (bench/gpu/check.sh step 7):
rows were checked, and both runs match the fp64 reference on them within bf16
rounding (the output's and P's; LSE is fp32 throughout). fp16 (2^-11) is held to
the same bounds. Timings are printed,
never asserted. Exit 1 on a failed check."""
import json
import sys

r = json.load(open(sys.argv[1]))
keys = ("kernel", "dense_ms", "sparse_ms", "speedup", "tile_density", "check_rows", "rel_l2_err", "max_abs_err",
        "lse_max_abs_err", "dense_rel_l2_err", "dense_max_abs_err", "dense_lse_max_abs_err")
print({k: r.get(k) for k in keys})
print("clocks:", r.get("clocks"))  # the SM clock over each kernel's runs (NVML), or why it was not read


def below(key, bound):
    value = r.get(key)
    return isinstance(value, (int, float)) and value == value and value < bound


# bf16 (8 significant bits, unit roundoff 2^-8 = 3.9e-3) for the stored output
# and for P before P V: a host model of the kernel's arithmetic on these shapes
# gives rel L2 about 2.2e-3 (1.5e-3 from P, 1.7e-3 from the output) and LSE
# errors about 2e-7, so 1e-2 and 1e-4 leave room without hiding a wrong tile.
checks = {"rows checked": r.get("check_rows", 0) > 0,
          "sparse rel L2 < 1e-2": below("rel_l2_err", 1e-2), "dense rel L2 < 1e-2": below("dense_rel_l2_err", 1e-2),
          "sparse LSE < 1e-4": below("lse_max_abs_err", 1e-4), "dense LSE < 1e-4": below("dense_lse_max_abs_err", 1e-4)}
failed = [name for name, ok in checks.items() if not ok]
print("failed: " + ", ".join(failed) if failed else "all checks passed")
sys.exit(1 if failed else 0)
