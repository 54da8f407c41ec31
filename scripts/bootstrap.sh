#!/usr/bin/env bash
# Installs what stsa needs to build (Debian packages, only the missing ones),
# then configures and builds it into build/ (or $STSA_BUILD_DIR).
# Extra CMake arguments: STSA_CMAKE_ARGS="-DSTSA_CUDA=OFF" bash scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# ccache: what compiles again (a rebuild after a checkout, CI's `pip install .`) comes from its cache.
packages=(cmake ninja-build g++ clang ccache libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          libpng-dev libopenmpi-dev openmpi-bin pkgconf libclang-rt-14-dev python3-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nvcc lives outside PATH on a stock CUDA install; the CUDA backend builds when it is found.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

build_dir="${STSA_BUILD_DIR:-build}"

# The Python package builds against a venv of its own (nanobind, and the tests'
# pytest, NumPy, ml_dtypes and mypy); without the network to fill it, the rest still builds.
python_env="$build_dir/python-env"
python_args=()
if ! "$python_env/bin/python" -c "import nanobind, pytest, numpy, ml_dtypes, mypy" 2>/dev/null; then
  { python3 -m venv "$python_env" && "$python_env/bin/pip" install -q -r python/requirements-test.txt; } ||
    echo "bootstrap: $python_env could not be filled (pip needs the network)" >&2
fi
if "$python_env/bin/python" -c "import nanobind" 2>/dev/null; then
  python_args=(-DPython_EXECUTABLE="$(cd "$python_env" && pwd)/bin/python")
else
  echo "bootstrap: the Python package is left out: $python_env has no nanobind" >&2
fi

# ccache where it can write its cache (it fails every compile where it cannot).
ccache_args=()
if cache_dir=$(ccache --get-config cache_dir 2>/dev/null) && mkdir -p "$cache_dir" 2>/dev/null &&
   [ -w "$cache_dir" ]; then
  ccache_args=(-DSTSA_CCACHE=ON)
fi

# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${python_args[@]}" "${ccache_args[@]}" \
  ${STSA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
