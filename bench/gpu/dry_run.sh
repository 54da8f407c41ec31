#!/usr/bin/env bash
# A rehearsal of bench/gpu/check.sh on a machine WITHOUT a GPU: a fake
# nvidia-smi, its own build and output folders, benchmarks skipped. Every step
# that needs the GPU fails (STSA_GPU_REQUIRED), so what it checks is the
# script's plumbing: configure, the targeted build, which kernels and tests the
# failed smoke tests leave out, the step order and the time accounting.
#
#   bash bench/gpu/dry_run.sh                      build against this machine's packages
#   sudo bash bench/gpu/dry_run.sh --hide-system   hide CLI11, nlohmann-json, GoogleTest and
#       libpng (overlay whiteouts in a private mount namespace, needs root), so the build
#       must come from build-gpu-deps/ alone, as on the GPU machine's image
#       (run bench/gpu/prepare_deps.sh first).
#
# Output: the log on stdout; check.sh's files under /tmp/stsa-dry-run/out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK=/tmp/stsa-dry-run
# A bare machine every time, as the GPU machine is: a CMake cache left by an earlier
# rehearsal keeps the libraries it found then (a /usr libpng that --hide-system now
# hides failed the configure: "IMPORTED_LOCATION not set for imported target PNG::PNG").
rm -rf "$WORK/build" "$WORK/out"
mkdir -p "$WORK/bin"
printf '#!/bin/sh\necho "fake nvidia-smi (no GPU here)"\n' > "$WORK/bin/nvidia-smi"
chmod +x "$WORK/bin/nvidia-smi"

run_check() {
  PATH="$WORK/bin:$PATH" OUT="$WORK/out" STSA_GPU_BUILD="$WORK/build" STSA_CHECK_SKIP_BENCH=1 \
    bash "$ROOT/bench/gpu/check.sh" || true
}

if [ "${1:-}" != "--hide-system" ]; then
  run_check
  exit 0
fi
[ -d "$ROOT/build-gpu-deps" ] || { echo "run bench/gpu/prepare_deps.sh first" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "--hide-system needs root (a mount namespace and overlay mounts)" >&2; exit 2; }
export -f run_check
export ROOT WORK
unshare -m bash -euo pipefail -c '
  mount --make-rprivate /
  lib=/usr/lib/x86_64-linux-gnu
  # Mounts `dir` again with whiteouts for `names`: they vanish inside this namespace only.
  hide() {
    local dir=$1; shift
    local layer="$WORK/overlay/$(echo "$dir" | tr / _)"
    rm -rf "$layer"; mkdir -p "$layer/upper" "$layer/work"
    for name in "$@"; do mknod "$layer/upper/$name" c 0 0; done
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$layer/upper,workdir=$layer/work" "$dir"
  }
  hide /usr/include CLI nlohmann gtest gmock libpng16 png.h pngconf.h pnglibconf.h
  hide "$lib" libgtest.a libgtest_main.a libgmock.a libgmock_main.a libpng.a libpng.so libpng16.a libpng16.so \
    libpng16.so.16 $(cd "$lib" && ls libpng16.so.16.* 2> /dev/null)
  hide "$lib/cmake" GTest
  hide /usr/share/cmake CLI11 nlohmann_json
  hide /usr/src googletest
  echo "hidden: CLI11, nlohmann-json, GoogleTest, libpng (headers, libraries, CMake configs)"
  run_check
'
