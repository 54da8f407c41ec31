#!/usr/bin/env bash
# Runs stsa.diffusers' tests against several diffusers releases, one after another:
#   bash scripts/diffusers_compat.sh [VERSION ...]     (default: every release from 0.35.2 on that it lists)
# Needs a built tree (build/python) and a Python with torch and transformers importable (PYTHON, default
# build/python-env/bin/python; PYTHONPATH is passed on). Each release goes into build/diffusers-compat/<v>
# (pip --no-deps, so diffusers' own dependencies must be importable too) and shadows any other diffusers.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-build/python-env/bin/python}
[[ $python == */* && $python != /* ]] && python=$PWD/$python  # a relative path: the tests run from build/
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.35.2 0.36.0 0.37.1 0.38.0 0.39.0 0.40.0 0.41.0 0.42.1)
for v in "${versions[@]}"; do
  site=build/diffusers-compat/$v
  [ -d "$site/diffusers" ] || "$python" -m pip install -q --target "$site" --no-deps "diffusers==$v"
  log=build/diffusers-compat/$v.log
  if (cd build && PYTHONPATH="python:diffusers-compat/$v${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
      "$python" -m pytest -q -p no:cacheprovider ../tests/python/test_diffusers.py ../tests/python/test_evaluate.py \
      > "../$log" 2>&1); then
    echo "diffusers $v: $(tail -1 "$log")"
  else
    echo "diffusers $v: $(tail -1 "$log") (failures: $log)"
  fi
done
