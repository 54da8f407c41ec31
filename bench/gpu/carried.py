"""Runs a Python script, or pytest, on the GPU machine with the packages that
bench/gpu/prepare_deps.sh carried from the development machine appended after
site-packages (what the image has wins, and torch's imports never see ours):
pytest and nanobind from build-gpu-deps/python, diffusers from build-gpu-diffusers
(zipped pure-Python wheels, compiled ones unpacked).

Usage: python3 bench/gpu/carried.py -m pytest ARGS...   or   python3 bench/gpu/carried.py SCRIPT.py ARGS...
"""

import glob
import os
import runpy
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIFFUSERS = os.path.join(ROOT, "build-gpu-diffusers")
sys.path.append(os.path.join(ROOT, "build-gpu-deps", "python"))
sys.path += sorted(glob.glob(os.path.join(DIFFUSERS, "zips", "*.whl"))) + [os.path.join(DIFFUSERS, "python")]


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# check.sh's `timeout` ends a run cut short by the clock with SIGTERM: raised as a
# KeyboardInterrupt, pytest still prints the failures so far, the skips and the
# slowest tests (a plain SIGTERM ends it without a word); timeout's -k kills what
# a handler cannot reach (a call stuck in the driver).
signal.signal(signal.SIGTERM, _interrupted)

if len(sys.argv) >= 3 and sys.argv[1] == "-m":
    sys.argv = [sys.argv[2]] + sys.argv[3:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
elif len(sys.argv) >= 2:
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python3 SCRIPT` would
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    sys.exit(__doc__)
