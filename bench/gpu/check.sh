#!/usr/bin/env bash
# The GPU check of stsa's CUDA backend, in one run on a machine with an NVIDIA
# GPU (written for one H200; no network needed):
#   1. configure and build the CUDA backend, its GPU tests and stsa_gpu_bench
#      into build-gpu/ (C++ dependencies from build-gpu-deps/ when present:
#      bench/gpu/prepare_deps.sh collects them on a machine that has them);
#   2. smoke-test each Hopper kernel (sm90-pingpong, sm90-overlap, sm90) alone
#      under a hard timeout: one that fails or hangs is left out of the later
#      steps (its GPU tests too), so one run still yields every other result;
#      the simplest that fails (sm90 first) also runs once under memcheck, for the log;
#   3. run the GPU tests (ctest -L gpu: every kernel, the probe, routing, permutation);
#   4. time routing + permutation against routed attention at 1440p
#      (stsa_gpu_route_bench; the issue's < 3% target; then, at 720p, the
#      routed call eager against its CUDA graph replay), also in head-by-head
#      order when STSA_CHECK_EXTRA_KERNELS asks for the first kernel in that order;
#   5. benchmark at Wan2.1 shapes against cuDNN, FlashAttention-2 and
#      FlexAttention on the identical tile plan (bench/gpu/compare.py, after
#      compare_selfcheck.py has checked its plan -> BlockMask path on the CPU),
#      then bench/gpu/targets.py: issue 4's targets and bench/gpu/predictions.json
#      (NOTES' predictions) against this run's figures, met / missed / inside;
#   6. run compute-sanitizer memcheck, racecheck and synccheck on small cases,
#      and initcheck on the routing call (after the benchmarks, with the time
#      they left, at least 80 s in all);
#   7. if time is left: the CLI's `stsa bench --backend cuda` (checked against
#      the fp64 reference) and `stsa route --backend cuda` (against the CPU
#      backend on the same heads; its figures go to check.log), the Python package with torch
#      tensors on the GPU and NumPy arrays on this host's CPU (tests/python; nanobind and pytest from
#      build-gpu-deps/python, diffusers and ml_dtypes from build-gpu-diffusers: bench/gpu/carried.py), one whole
#      Wan2.1-1.3B forward with its own attention and with stsa.diffusers (bench/gpu/wan_forward.py),
#      Nsight Compute (when ncu is there) on one sparse
#      call (STSA_CHECK_PROFILE_SHAPE, 45x80 = 720p; STSA_CHECK_PROFILE_DENSITY,
#      0.5) of the first kernel and of each of its variants in the table (e.g.
#      +heavy-first+snake, +balanced) and on the routing kernels, and the demo
#      (built in the background meanwhile).
# $OUT (default build-gpu/out) receives check.log (everything this prints),
# build.log (configure and compiler output), build_cli.log, gpu_route_bench.json
# (step 4; gpu_route_bench_head_by_head.json too when asked), gpu_bench.json and
# gpu_bench.txt (step 5), cli_bench.json (step 7): at most the 8 files the
# device tool returns. It keeps going after a failed
# step and exits 1 if any step failed. Everything fits an 8-minute budget (STSA_CHECK_BUDGET_S),
# measured from the start of this script: the benchmark gets what is left
# minus the sanitizers' reserve (STSA_CHECK_SANITIZER_S, 80 s).
#
# Usage: bash bench/gpu/check.sh            (everything)
#        STSA_CHECK_SKIP_BENCH=1 bash ...    (build, tests, sanitizers only)
#        STSA_CHECK_EXTRA_KERNELS=sm90-overlap+balanced bash ...   (the table's extra rows per case:
#            a kernel, then + a work order and/or + a block schedule, as stsa_gpu_bench --kernels takes them;
#            default sm90-pingpong+balanced,sm90-pingpong+heavy-first+snake; empty: none)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${STSA_GPU_BUILD:-$ROOT/build-gpu}"
OUT="${OUT:-$BUILD/out}"
DEPS="$ROOT/build-gpu-deps"
BUDGET_S="${STSA_CHECK_BUDGET_S:-480}"
# Nothing optional starts that could run past this mark: the device tool's
# limit (timeout_s, 600) minus 30 s, so the summary at the end is always printed.
HARD_S="${STSA_CHECK_HARD_S:-570}"
START=$(date +%s)
FAILED=()
# A GPU test that finds no usable device fails here instead of passing as skipped.
export STSA_GPU_REQUIRED=1
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1

elapsed() { echo $(( $(date +%s) - START )); }
step() { echo; echo "=== [$(elapsed) s] $*"; }
# Runs one step; records a failure instead of exiting.
run_step() {
  local name=$1
  shift
  echo "\$ $*"
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then echo "--- $name: ok"; else echo "--- $name: FAILED (exit $rc)"; FAILED+=("$name"); fi
}

step "GPU and toolchain"
nvidia-smi
# The CUDA tools may be off the PATH: look in the toolkit too.
find_tool() { command -v "$1" || ls /usr/local/cuda/bin/"$1" /usr/local/cuda*/bin/"$1" /usr/local/cuda/"$1"/"$1" \
  /usr/local/cuda*/"$1"/"$1" 2> /dev/null | head -n 1 || true; }
NVCC="$(find_tool nvcc)"
SANITIZER="$(find_tool compute-sanitizer)"
"$NVCC" --version | tail -n 2
cmake --version | head -n 1
c++ --version | head -n 1
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' || echo "(torch not usable here)"

step "dependencies"
PREFIX_ARGS=()
if [ -d "$DEPS" ]; then
  if [ ! -f "$DEPS/prefix/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$DEPS/prefix/lib64/cmake/GTest/GTestConfig.cmake" ]; then
    echo "building GoogleTest from build-gpu-deps/src/googletest"
    cmake -S "$DEPS/src/googletest" -B "$DEPS/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$DEPS/prefix" -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON > "$OUT/build.log" 2>&1
    cmake --build "$DEPS/gtest-build" -j"$(nproc)" >> "$OUT/build.log" 2>&1
    cmake --install "$DEPS/gtest-build" >> "$OUT/build.log" 2>&1
  fi
  PREFIX_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS/prefix")
  echo "using $DEPS/prefix"
else
  echo "no build-gpu-deps/: using the system's packages"
fi

step "configure and build (CUDA on)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTSA_CUDA=ON -DSTSA_MPI=OFF -DSTSA_PYTHON=OFF \
  -DCMAKE_CUDA_COMPILER="$NVCC" "${PREFIX_ARGS[@]}" >> "$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; echo "configure failed"; exit 1; }
# Only what this script runs: the GPU machine need not have every package the CLI uses.
# Every test of tests/gpu (ctest only sees tests whose executables exist), and the two benchmark tools.
GPU_TARGETS=(stsa_gpu_bench stsa_gpu_route_bench)
for TEST_SOURCE in "$ROOT"/tests/gpu/*_test.cpp; do GPU_TARGETS+=("$(basename "$TEST_SOURCE" .cpp)"); done
cmake --build "$BUILD" -j"$(nproc)" --target "${GPU_TARGETS[@]}" >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" -A5 "$OUT/build.log" | head -n 80; echo "build failed"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target dist_nccl_check >> "$OUT/build.log" 2>&1 ||
  echo "(no NCCL test target: NCCL not found here)"
grep -E "spill|warning" "$OUT/build.log" | head -n 20 || true
echo "built in $(elapsed) s"
# What the compiler made of the Hopper kernels (information): wgmma must show as
# HGMMA, and local memory (LDL/STL) would mean an array left the registers.
CUOBJDUMP="$(find_tool cuobjdump)"
SM90_OBJECT="$BUILD/src/cuda/CMakeFiles/stsa_cuda.dir/attention_sm90_launch.cu.o"
if [ -n "$CUOBJDUMP" ] && [ -f "$SM90_OBJECT" ]; then
  echo "SASS of the sm90 kernels (per instantiation: HGMMA, LDL/STL instructions):"
  # (The object holds sm_80 code too, with the same names: only the sm_90a section counts.)
  "$CUOBJDUMP" --dump-sass "$SM90_OBJECT" 2> /dev/null | awk '/code for sm_/ { arch = $3 }
    arch != "sm_90a" { next }
    /Function :/ { name = $3; h[name] = 0; l[name] = 0 }
    /HGMMA/ { h[name]++ } /LDL|STL/ { l[name]++ }
    END { for (n in h) printf "  %s: %d HGMMA, %d LDL/STL\n", n, h[n], l[n] }' | sort | head -n 12 || true
fi
# The Python package, in a configure of its own that may fail alone (then it is
# switched off again; the first configure left it off). Its nanobind comes from
# build-gpu-deps/python, the version tested, given to this command alone.
PYTHON_TARGET=""
rm -f "$BUILD"/python/stsa/_stsa*.so "$BUILD/python_build.rc"  # a module left by an earlier run is not this one
if [ -d "$DEPS/python" ]; then
  if PYTHONPATH="$DEPS/python" cmake -S "$ROOT" -B "$BUILD" -DSTSA_PYTHON=AUTO \
    -DPython_EXECUTABLE="$(command -v python3)" > "$BUILD/build_python.log" 2>&1 &&
    grep -q "stsa_python" "$BUILD/build.ninja"; then
    PYTHON_TARGET=stsa_python
  else
    echo "THE PYTHON PACKAGE IS NOT CONFIGURED: $(grep -m1 "Python package" "$BUILD/build_python.log" || echo "cmake failed")"
    cmake -S "$ROOT" -B "$BUILD" -DSTSA_PYTHON=OFF >> "$BUILD/build_python.log" 2>&1 || true
  fi
else
  echo "THE PYTHON PACKAGE IS NOT BUILT: no build-gpu-deps/python (bench/gpu/prepare_deps.sh makes it)"
fi
# The CLI (the README's main job, `stsa bench --backend cuda`) builds in the
# background while the tests run, then the Python module (its status to
# python_build.rc); they are checked last, with the time left. The job's
# status is the CLI's.
# (The subshell inherits set -e: each status is caught with ||, or a failed CLI build
# would end it before the module's build, and a failed module build before its status.)
( rc=0
  timeout 300 cmake --build "$BUILD" -j8 --target stsa_cli > "$OUT/build_cli.log" 2>&1 || rc=$?
  if [ -n "$PYTHON_TARGET" ]; then
    python_rc=0
    timeout 120 cmake --build "$BUILD" -j8 --target stsa_python >> "$BUILD/build_python.log" 2>&1 || python_rc=$?
    echo "$python_rc" > "$BUILD/python_build.rc"
  fi
  exit $rc ) &
CLI_BUILD_PID=$!

step "Hopper kernels smoke test (60 s limit each)"
# A protocol bug in a warp-specialized kernel shows up as a hang; the kernel traps
# after 5 s in one barrier wait, and `timeout` covers anything else. A Hopper
# kernel that fails here is left out of the sanitizer and benchmark steps.
KERNELS=""
DROPPED=""
DROPPED_NAMES=()
# The expected fastest first: it leads the benchmark's kernels, should time run short.
for KERNEL in sm90_pingpong sm90_overlap sm90; do
  # One item per block, ragged edges, the persistent loop over many items, and
  # every item through one block (item after item, the K/V ring wrapping).
  run_step "smoke_$KERNEL" timeout 60 "$BUILD/tests/gpu/gpu_attention_test" \
    --gtest_filter="Kernels/GpuAttention.ExactTileMultiple/$KERNEL:Kernels/GpuAttention.RaggedVideoWithTextAfter/$KERNEL:Kernels/GpuAttention.MoreQueryTilesThanMultiprocessors/$KERNEL:Kernels/GpuAttention.FewPersistentBlocksRunEveryItem/$KERNEL"
  if [[ " ${FAILED[*]} " != *" smoke_$KERNEL "* ]]; then
    KERNELS="$KERNELS${KERNEL//_/-},"
  else
    # ctest names parameterized tests "Suite.Test/sm90  # GetParam() = sm90".
    DROPPED="${DROPPED:+$DROPPED|}/$KERNEL( |\$)"
    DROPPED_NAMES+=("$KERNEL")
  fi
done
KERNELS="${KERNELS}sm80"
echo "kernels for the GPU tests, the sanitizers and the benchmark: $KERNELS"

# One Hopper kernel that failed gets one diagnosis (not a step: it cannot fail
# the run): the simplest of those that failed (the last in the loop above: the
# others build on sm90's code). memcheck on its smallest call says whether it
# touched memory out of bounds (global or shared) or died in a barrier; the smoke
# test's output above already says where its answers are wrong
# (tests/support/error_pattern.hpp), and a trap names its barrier (barrier_timeout.hpp).
DIAGNOSED=""
if [ "${#DROPPED_NAMES[@]}" -gt 0 ]; then DIAGNOSED="${DROPPED_NAMES[-1]}"; fi
if [ -n "$DIAGNOSED" ] && [ -n "$SANITIZER" ]; then
  step "diagnosis of $DIAGNOSED: compute-sanitizer memcheck, one small call (45 s limit)"
  timeout 45 "$SANITIZER" --error-exitcode 1 --print-limit 10 "$BUILD/tests/gpu/gpu_attention_test" \
    --gtest_filter="Kernels/GpuSanitize.OneSmallCall/$DIAGNOSED" 2>&1 | tail -n 60 || true
fi

step "GPU tests"
# A kernel that failed its smoke test would fail (or hang until the timeout) in
# every one of its tests: they are left out, its smoke failure already counts.
EXCLUDE=()
if [ -n "$DROPPED" ]; then EXCLUDE=(-E "$DROPPED"); echo "left out: $DROPPED"; fi
# Eight test processes at a time share the GPU: the tests are small, and each
# spends most of its time in the single-threaded fp64 reference on the host
# (one at a time if the GPU only takes one process). Each test has a 120 s limit
# (tests/gpu/CMakeLists.txt); the step as a whole gets what the benchmark and
# the sanitizers can spare.
JOBS=8
COMPUTE_MODE="$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2> /dev/null | head -n 1 || true)"
if [ -n "$COMPUTE_MODE" ] && [ "$COMPUTE_MODE" != "Default" ]; then
  JOBS=1
  echo "compute mode $COMPUTE_MODE: one test at a time; compare.py will likely fail (torch and stsa_gpu_bench each hold a context)"
fi
TESTS_LIMIT=$(( BUDGET_S - $(elapsed) - 300 ))
if [ "$TESTS_LIMIT" -lt 150 ]; then TESTS_LIMIT=150; fi
run_step gpu_tests timeout "$TESTS_LIMIT" ctest --test-dir "$BUILD" -L gpu "${EXCLUDE[@]}" -j "$JOBS" \
  --output-on-failure

step "NCCL communicator, one rank (issue 5)"
run_step nccl_one_rank ctest --test-dir "$BUILD" -R '^dist_nccl_one_rank$' --output-on-failure --timeout 120

# The benchmarks come before the sanitizers so that a slow sanitizer cannot
# starve them; the sanitizers get what is left, at least SANITIZER_RESERVE_S.
# The eight runs took 10-12 s in all on each H200 run so far (their timeouts are 20 s or more each).
SANITIZER_RESERVE_S="${STSA_CHECK_SANITIZER_S:-80}"
if [ -z "${STSA_CHECK_SKIP_BENCH:-}" ]; then
  step "routing + permutation vs attention, 1440p, s = 0.1 (90 s limit)"
  ROUTE_KERNEL="${KERNELS%%,*}"
  run_step route_bench sh -c "timeout 90 '$BUILD/stsa_gpu_route_bench' --kernel $ROUTE_KERNEL --repeats 3 \
    > '$OUT/gpu_route_bench.json' && cat '$OUT/gpu_route_bench.json'"
  # The same with the other work order when the table will have it (its attention is the denominator).
  if [[ ",${STSA_CHECK_EXTRA_KERNELS:-}," == *",$ROUTE_KERNEL+head-by-head,"* ]]; then
    run_step route_bench_head_by_head sh -c "timeout 60 '$BUILD/stsa_gpu_route_bench' --kernel $ROUTE_KERNEL \
      --work-order head-by-head --repeats 3 > '$OUT/gpu_route_bench_head_by_head.json' && \
      cat '$OUT/gpu_route_bench_head_by_head.json'"
  fi

  # What a CUDA graph saves a routed call on the host, where the attention is
  # short enough for it to show (720p, s = 0.1); the replay must write the eager
  # call's output to the bit (exit 1 otherwise). Figures go to check.log only.
  step "routed call eager vs CUDA graph replay, 720p, s = 0.1 (45 s limit)"
  run_step route_graph timeout 45 "$BUILD/stsa_gpu_route_bench" --kernel "$ROUTE_KERNEL" --height 45 --width 80 \
    --graph --repeats 50

  step "compare.py self-check: plan -> FlexAttention BlockMask, on the CPU (60 s limit)"
  run_step compare_selfcheck timeout 60 python3 "$ROOT/bench/gpu/compare_selfcheck.py"

  # compare.py needs about 150 s for both shapes and every kernel (a dense 1440p
  # call alone is about 1 s); less than that loses 1440p rows, so the floor
  # wins over the 8-minute budget. Its own deadline is soft: the timeout is hard.
  LEFT=$(( BUDGET_S - $(elapsed) - SANITIZER_RESERVE_S - 10 ))
  if [ "$LEFT" -lt 150 ]; then LEFT=150; fi
  step "benchmark vs PyTorch ($LEFT s)"
  # STSA_CHECK_EXTRA_KERNELS adds variants to the table only, right after the
  # default kernel (compare.py drops the last kernels first when time runs
  # short, and sm90, sm80 and sm90-overlap have four runs of figures already),
  # e.g. "sm90-pingpong+across-heads" (a fixed work order, bench/NOTES.md); by
  # default the two block schedules that beat round-robin for sm90-overlap in
  # the fourth run (NOTES: "Fourth GPU run"), now on the default kernel; empty for none.
  # A variant of a kernel that failed its smoke test is left out.
  BENCH_KERNELS="${KERNELS%%,*}"
  EXTRAS="${STSA_CHECK_EXTRA_KERNELS-sm90-pingpong+balanced,sm90-pingpong+heavy-first+snake}"
  for EXTRA in ${EXTRAS//,/ }; do
    if [[ ",$KERNELS," == *",${EXTRA%%+*},"* && ",$BENCH_KERNELS," != *",$EXTRA,"* ]]; then
      BENCH_KERNELS="$BENCH_KERNELS,$EXTRA"
    else
      echo "extra kernel $EXTRA left out (its kernel failed the smoke test, or it is listed already)"
    fi
  done
  for KERNEL in ${KERNELS//,/ }; do
    if [[ ",$BENCH_KERNELS," != *",$KERNEL,"* ]]; then BENCH_KERNELS="$BENCH_KERNELS,$KERNEL"; fi
  done
  run_step bench timeout $(( LEFT + 60 )) env PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu/compare.py" \
    --build "$BUILD" --out "$OUT" --deadline-s "$LEFT" --kernels "$BENCH_KERNELS"
fi
if [ -f "$OUT/gpu_bench.json" ]; then
  # Issue 4's targets and NOTES' predictions, read off this run's files (under a
  # second; into check.log only: the device tool returns at most 8 files).
  step "targets and predictions (targets.py)"
  python3 "$ROOT/bench/gpu/targets.py" --bench "$OUT/gpu_bench.json" --predictions "$ROOT/bench/gpu/predictions.json" \
    $([ -f "$OUT/gpu_route_bench.json" ] && echo --route "$OUT/gpu_route_bench.json") || true
fi

step "compute-sanitizer (small cases)"
if [ -n "$SANITIZER" ]; then
  # Eight runs share what is left of the budget (at least 20 s each).
  EACH=$(( (BUDGET_S - $(elapsed)) / 8 ))
  if [ "$EACH" -lt 20 ]; then EACH=20; fi
  SAN=(timeout "$EACH" "$SANITIZER" --error-exitcode 1 --print-limit 20)
  MIXED="" ONE=""
  for KERNEL in ${KERNELS//,/ }; do
    MIXED="${MIXED}Kernels/GpuSanitize.SmallMixedCalls/${KERNEL//-/_}:"
    ONE="${ONE}Kernels/GpuSanitize.OneSmallCall/${KERNEL//-/_}:"
  done
  ATTN_TEST="$BUILD/tests/gpu/gpu_attention_test"
  PERM=("$BUILD/tests/gpu/gpu_permute_test" --gtest_filter='GpuPermute.MatchesTheCpuPermutationBitForBit')
  ROUTE=("$BUILD/tests/gpu/gpu_router_test" --gtest_filter='GpuRouterSanitize.OneSmallRoute')
  echo "each sanitizer run: at most $EACH s"
  run_step memcheck "${SAN[@]}" --tool memcheck "$ATTN_TEST" --gtest_filter="$MIXED"
  run_step memcheck_permute "${SAN[@]}" --tool memcheck "${PERM[@]}"
  run_step racecheck "${SAN[@]}" --tool racecheck --racecheck-report hazard "$ATTN_TEST" --gtest_filter="$ONE"
  run_step synccheck "${SAN[@]}" --tool synccheck "$ATTN_TEST" --gtest_filter="$ONE"
  run_step memcheck_route "${SAN[@]}" --tool memcheck "${ROUTE[@]}"
  run_step racecheck_route "${SAN[@]}" --tool racecheck --racecheck-report hazard "${ROUTE[@]}"
  run_step synccheck_route "${SAN[@]}" --tool synccheck "${ROUTE[@]}"
  # The routing scratch comes from a pool and is never cleared: a partial slot
  # the combine reads but no block wrote would read stale memory unnoticed.
  run_step initcheck_route "${SAN[@]}" --tool initcheck "${ROUTE[@]}"
else
  echo "compute-sanitizer not found"
  FAILED+=("sanitizer-missing")
fi

step "CLI on the GPU: stsa bench and stsa route --backend cuda, a profile, then the demo (with the time left)"
echo "failed so far: ${FAILED[*]:-none}"
# The CLI's default kernel is sm90-pingpong on an H200: if it failed its smoke
# test, the bench runs the first kernel left and the demo (which takes the
# default) is not run.
CLI_KERNEL=auto
if [[ "$DROPPED" == *"/sm90_pingpong("* ]]; then CLI_KERNEL="${KERNELS%%,*}"; fi
CLI_BUILT=0
if wait "$CLI_BUILD_PID"; then
  CLI_BUILT=1
  if [ $(( HARD_S - $(elapsed) )) -ge 20 ]; then
    # Ragged tiles, text tokens, D = 64; all 1,207 rows against the fp64 reference; then fp16 (D = 128).
    run_step cli_bench timeout $(( HARD_S - $(elapsed) )) sh -c "'$BUILD/stsa' bench --backend cuda \
      --kernel $CLI_KERNEL --frames 5 --height 12 --width 20 --text 7 --heads 4 --head-dim 64 --dtype bf16 \
      --density 0.3 --check-rows 1207 --json > '$OUT/cli_bench.json' && python3 '$ROOT/bench/gpu/check_cli_bench.py' \
      '$OUT/cli_bench.json' && '$BUILD/stsa' bench --backend cuda --kernel $CLI_KERNEL --frames 5 --height 12 \
      --width 20 --text 7 --heads 4 --head-dim 128 --dtype fp16 --density 0.3 --check-rows 400 --json \
      > '$OUT/cli_bench_fp16.json' && python3 '$ROOT/bench/gpu/check_cli_bench.py' '$OUT/cli_bench_fp16.json'"
  else
    echo "cli_bench skipped: $(elapsed) s used"
  fi
  # The whole routed call from the CLI (GPU routing, gather, the default kernel
  # with the scatter fused), against the CPU backend on the same synthetic heads.
  ROUTE_ARGS="route --synthetic --dtype bf16 --frames 13 --height 12 --width 16 --heads 8 --head-dim 64 --eval-rows 0 --json"
  if [ "$CLI_KERNEL" != auto ]; then
    echo "cli_route skipped: sm90-pingpong (the default kernel) failed its smoke test"
  elif [ $(( HARD_S - $(elapsed) )) -ge 20 ]; then
    run_step cli_route timeout $(( HARD_S - $(elapsed) )) sh -c "'$BUILD/stsa' $ROUTE_ARGS --backend cuda \
      > '$BUILD/cli_route.json' && '$BUILD/stsa' $ROUTE_ARGS --backend cpu > '$BUILD/cli_route_cpu.json' && \
      python3 '$ROOT/bench/gpu/check_cli_route.py' '$BUILD/cli_route.json' '$BUILD/cli_route_cpu.json'"
  else
    echo "cli_route skipped: $(elapsed) s used"
  fi
else
  tail -n 20 "$OUT/build_cli.log"
  FAILED+=("cli_build")
fi
# The Python package on this machine: its whole suite (tests/python), NumPy arrays
# on this host's CPU and torch tensors on the CPU and CUDA backends against the
# fp64 NumPy reference (test_torch.py: routing, gather, fused scatter and attention
# on the GPU, on a side stream too, and calls that do not wait for the device;
# test_diffusers.py: stsa in diffusers' Wan, SkyReels-V2, LTX-Video, CogVideoX and
# HunyuanVideo 1.0 / 1.5 transformers, where build-gpu-diffusers/ was carried). Its exports first: a module exporting more
# than PyInit__stsa crashed here once (src/python/CMakeLists.txt).
if [ -z "$PYTHON_TARGET" ]; then
  echo "python_tests skipped: the Python package was not configured (see above)"
elif [ "$(cat "$BUILD/python_build.rc" 2> /dev/null || echo none)" != 0 ]; then
  echo "the Python module did not build (status $(cat "$BUILD/python_build.rc" 2> /dev/null || echo none)):"
  grep -E "error|Error" -A3 "$BUILD/build_python.log" | head -n 40 || tail -n 20 "$BUILD/build_python.log"
  FAILED+=("python_build")
elif [ $(( HARD_S - $(elapsed) )) -ge 40 ]; then
  MODULE="$(ls "$BUILD"/python/stsa/_stsa*.so)"
  LIBSTDCXX="$(ldd "$MODULE" | awk '/libstdc\+\+/ { print $3; exit }')"
  echo "module: $(nm -D --defined-only "$MODULE" | wc -l) exported symbol(s); libstdc++: ${LIBSTDCXX:-linked statically}"
  [ -d "$ROOT/build-gpu-diffusers" ] || echo "no build-gpu-diffusers/ carried: test_diffusers.py will skip"
  # test_torch.py (the GPU calls) first, so a suite cut short by the clock keeps them; a
  # file that cannot be imported fails alone instead of ending the run at collection; a
  # cut-off run still prints its failures (carried.py: SIGTERM as KeyboardInterrupt).
  PY_TESTS=("$ROOT/tests/python/test_torch.py")
  for PY_TEST in "$ROOT"/tests/python/test_*.py; do
    if [ "$PY_TEST" != "${PY_TESTS[0]}" ]; then PY_TESTS+=("$PY_TEST"); fi
  done
  run_step python_tests timeout -k 10 $(( HARD_S - $(elapsed) - 10 )) env PYTHONPATH="$BUILD/python" \
    PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/bench/gpu/carried.py" -m pytest -q -p no:cacheprovider -rs \
    --durations=15 --continue-on-collection-errors "${PY_TESTS[@]}"
  # One whole Wan2.1-1.3B forward at 480p (random weights), the model's own attention
  # against stsa.diffusers, and one video's time from it; its JSON into this log (the
  # device tool returns 8 files).
  if [ -d "$ROOT/build-gpu-diffusers" ] && [ $(( HARD_S - $(elapsed) )) -ge 70 ]; then
    run_step wan_forward timeout -k 10 $(( HARD_S - $(elapsed) - 10 )) env PYTHONPATH="$BUILD/python" \
      PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/bench/gpu/carried.py" "$ROOT/bench/gpu/wan_forward.py" \
      --presets wan2.1-1.3b-480p --repeats 2 --out "$BUILD"
    cat "$BUILD/wan_forward.json" 2> /dev/null || true
  else
    echo "wan_forward skipped: no build-gpu-diffusers/ or $(elapsed) s used"
  fi
else
  echo "python_tests skipped: $(elapsed) s used"
fi
# What the next optimisation should aim at: Nsight Compute on one sparse call
# of the first kernel left (the expected fastest) and of each of its variants
# in the table, then on the routing kernels; before the demo, which they may
# leave without time. Information, not steps: missing ncu or counters it may
# not read fail nothing. 720p at s = 0.5 by default: the walks differ most in
# L2 hits there (bench/NOTES.md, "Heavy first, snake": 0.62 round-robin, 0.96
# snake, 0.98 balanced in the model), and a 25 ms launch replays in seconds
# where 1440p s = 0.5 (0.58 s, and the host filling 1440p inputs) ran out of 60 s.
NCU="$(find_tool ncu)"
if [ -z "$NCU" ]; then NCU="$(ls /usr/local/cuda*/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1 || true)"; fi
# --clock-control none: the card's clocks are left as they are (and as they were seen to work here).
NCU_SECTIONS=(--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy)
PROFILE_DENSITY="${STSA_CHECK_PROFILE_DENSITY:-0.5}"
PROFILE_SHAPE="${STSA_CHECK_PROFILE_SHAPE:-45x80}"  # latent height x width: 720p (1440p: 90x160)
PROFILED=("${KERNELS%%,*}")
BENCH_LIST="${BENCH_KERNELS:-}"
for EXTRA in ${BENCH_LIST//,/ }; do
  if [[ "$EXTRA" == "${PROFILED[0]}+"* ]]; then PROFILED+=("$EXTRA"); fi
done
for KERNEL in "${PROFILED[@]}"; do
  if [ -n "$NCU" ] && [ $(( HARD_S - $(elapsed) )) -ge 65 ]; then
    step "profile: ncu on one sparse ${PROFILE_SHAPE} call (s = $PROFILE_DENSITY) of $KERNEL (60 s limit)"
    # One untimed launch (--warmup 0 --repeats 1): ncu replays it with the caches flushed.
    timeout 60 "$NCU" "${NCU_SECTIONS[@]}" --kernel-name regex:attention --launch-count 1 "$BUILD/stsa_gpu_bench" \
      --height "${PROFILE_SHAPE%x*}" --width "${PROFILE_SHAPE#*x}" --densities "$PROFILE_DENSITY" --kernels "$KERNEL" \
      --warmup 0 --repeats 1 --permutation false --json "$BUILD/profile_bench.json" 2>&1 | tail -n 150 || true
  else
    echo "profile of $KERNEL skipped: ${NCU:-no ncu}, $(elapsed) s used"
  fi
done
if [ -n "$NCU" ] && [ $(( HARD_S - $(elapsed) )) -ge 45 ]; then
  step "profile: ncu on the routing kernels (partials, combine, reduce), 1440p (40 s limit)"
  timeout 40 "$NCU" "${NCU_SECTIONS[@]}" --kernel-name regex:routing_ --launch-count 3 \
    "$BUILD/stsa_gpu_route_bench" --kernel "${KERNELS%%,*}" --warmup 0 --repeats 1 2>&1 | tail -n 330 || true
fi
# The demo's 720p step alone takes 15-20 s (mostly drawing the inputs and the fp64 check on the host).
if [ "$CLI_BUILT" -eq 0 ]; then
  echo "demo skipped: the CLI did not build"
elif [ "$CLI_KERNEL" != auto ]; then
  echo "demo skipped: sm90-pingpong (the default kernel) failed its smoke test"
elif [ $(( HARD_S - $(elapsed) )) -ge 60 ]; then
  run_step cli_demo timeout $(( HARD_S - $(elapsed) )) "$BUILD/stsa"
else
  echo "demo skipped: $(elapsed) s used"
fi

step "done"
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "FAILED steps: ${FAILED[*]}"
  exit 1
fi
echo "all steps passed"
