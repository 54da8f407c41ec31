#!/usr/bin/env bash
# Run HERE (the development machine), before a GPU session: collects the C++
# build dependencies that the GPU machine's image may lack (CLI11 and
# nlohmann-json headers with their CMake configs, libpng and zlib headers and
# shared libraries, GoogleTest sources) into build-gpu-deps/, which .gitignore
# covers (/build*/), and the pure-Python packages the Python package's build and
# tests need (nanobind, pytest and its imports; pip, so this needs the network)
# into build-gpu-deps/python. Name it in the device tool's `carry`; check.sh uses
# it when present. About 16 MB.
#
# Also diffusers and what it imports (for tests/python/test_diffusers.py, stsa in
# diffusers' video transformers, and bench/gpu/wan_forward.py) into build-gpu-diffusers/, carried on its own so that
# ab.sh's carry stays small: pure-Python wheels kept zipped (Python imports from
# them), compiled ones (Pillow, safetensors, PyYAML, charset-normalizer) unpacked
# for the GPU image's CPython (STSA_GPU_PYTHON, 3.12 there), without NumPy (the
# image has it), hf_xet (downloads only) and regex (tokenizers only): 34 MB, so
# that both folders and the working tree stay under the device tool's 64 MiB.
# With them ml_dtypes (2 MB unpacked; compiled): test_attention.py, test_cpu_settings.py
# and test_descales.py import it, and the GPU image's torch does not bring it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEPS="$ROOT/build-gpu-deps"
DIFFUSERS="$ROOT/build-gpu-diffusers"
LIB=/usr/lib/x86_64-linux-gnu
rm -rf "$DEPS"
mkdir -p "$DEPS/src" "$DEPS/prefix/include" "$DEPS/prefix/lib" "$DEPS/prefix/share/cmake"
cp -r /usr/src/googletest "$DEPS/src/googletest"
cp -r /usr/include/CLI /usr/include/nlohmann "$DEPS/prefix/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$DEPS/prefix/share/cmake/"
cp -r /usr/include/png.h /usr/include/pngconf.h /usr/include/pnglibconf.h /usr/include/libpng16 \
  /usr/include/zlib.h /usr/include/zconf.h "$DEPS/prefix/include/"
# Plain copies under every name the linker or loader asks for (links may not travel).
for name in libpng16.so.16 libpng16.so libpng.so; do cp -L "$LIB/libpng16.so.16" "$DEPS/prefix/lib/$name"; done
for name in libz.so.1 libz.so; do cp -L "$LIB/libz.so.1" "$DEPS/prefix/lib/$name"; done
# Wheels for any Python 3 (the GPU image's version is not known here), unpacked for PYTHONPATH.
python3 -m pip download -q --only-binary :all: --python-version 3.10 --implementation py --abi none \
  --platform any -d "$DEPS/wheels" "nanobind>=2.2,<4" pytest exceptiongroup tomli
for wheel in "$DEPS"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$DEPS/python"; done
rm -rf "$DEPS/wheels"
du -sh "$DEPS"

rm -rf "$DIFFUSERS"
python3 -m pip download -q --only-binary :all: --python-version "${STSA_GPU_PYTHON:-3.12}" \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$DIFFUSERS/wheels" diffusers \
  ml_dtypes
mkdir -p "$DIFFUSERS/zips" "$DIFFUSERS/python"
for wheel in "$DIFFUSERS"/wheels/*.whl; do
  case "$(basename "$wheel")" in
    numpy-* | hf_xet-* | regex-*) ;;
    *-none-any.whl) mv "$wheel" "$DIFFUSERS/zips/" ;;
    *) python3 -m zipfile -e "$wheel" "$DIFFUSERS/python" ;;
  esac
done
rm -rf "$DIFFUSERS/wheels"
du -sh "$DIFFUSERS"
