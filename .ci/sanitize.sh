#!/usr/bin/env bash
# Runs the test suite again built with AddressSanitizer + UndefinedBehaviorSanitizer,
# and the threaded tests under ThreadSanitizer. Any report fails (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
# -g1: line tables are all a sanitizer's stack trace reads, at a fifth less compile time than -g.
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DSTSA_CUDA=OFF)

export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The Python module too, with the interpreter bootstrap made, where it has nanobind and
# the tests' packages (bootstrap leaves them out without the network).
python_module=()
if build/python-env/bin/python -c "import nanobind, pytest, numpy, ml_dtypes" 2>/dev/null; then
  python_module=(-DSTSA_PYTHON=ON "-DPython_EXECUTABLE=$PWD/build/python-env/bin/python")
fi
# Built with clang, whose UBSan instrumentation compiles faster than gcc's: this build took 164 s
# on 2 cores against gcc's 231 s, its tests as long (154 s, 155 s). gcc builds the release.
CC=clang CXX=clang++ cmake -S . -B build-asan "${common[@]}" -DSTSA_SANITIZE=address,undefined "${python_module[@]}" >/dev/null
cmake --build build-asan -j "$jobs"
# OpenMPI's own allocations (some in plugins it unloads, so no suppression can name
# them) and CPython's (kept until exit) are reported as leaks: the tests that start
# MPI (dist, and the CLI tests that run `bench --dist`) and the Python tests keep
# every ASan/UBSan check but leak detection.
ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "dist|cli|python"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE "dist|cli|python"

export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
cmake -S . -B build-tsan "${common[@]}" -DSTSA_SANITIZE=thread -DSTSA_MPI=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target stsa_threaded_tests  # the CLI and single-threaded tests add nothing here
# The long correctness matrices and the statistical tests (accuracy, rounding bias, decisions)
# add no thread interleavings the others lack and take minutes under TSan's instrumentation,
# most of it in the fp64 reference; every other threaded test runs. Their threads run in the
# tests that compare thread counts bit for bit: CpuThreads.* (every ISA and dtype) and
# Router.*ErrorsAreBitIdenticalForAnyThreadCount (the fp32 and the pair paths).
# Each name must still be a threaded test: a renamed test would silently run again
# (one did, for 72 s, after its rename).
not_under_tsan=(CpuBackend.MatchesReferenceOnAwkwardShapes CpuBackend.RoundedPlansComputeWhatTheyClaim
                RoutedAttention.GivenDecisionsMatchTheReferenceOnAwkwardShapes
                CpuBackend.AmxTileKernelMatchesReferenceOnBf16AndF16Inputs
                Router.SampledErrorsMatchTheReferenceOnEveryPath Backends.EveryBackendMatchesTheReference
                CpuBackend.AnyHeadDimUpTo128RunsPadded
                CpuBackend.AmxBf16OutputRoundsPToBf16Unbiased CpuBackend.Avx512Bf16OutputRoundsPToBf16Unbiased
                CpuBackend.LongRowsKeepTheirFp32Accuracy
                CpuBackend.StridedChannelsMatchTheReference Router.SampledErrorsMatchTheReference
                Router.PairPathsDecideLikeTheFp32Path Router.FindsTheKnownKindOfSyntheticHeads)
for name in "${not_under_tsan[@]}"; do
  ctest --test-dir build-tsan -N -L threads -R "^${name}\$" | grep -q "Total Tests: 1$" ||
    { echo "sanitize: $name is not one threaded test: update not_under_tsan" >&2; exit 1; }
done
ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L threads \
  -E "^($(IFS='|'; echo "${not_under_tsan[*]}"))\$"
