#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan/UBSan and runs each for a
# bounded time from the seed corpus in tests/fuzz/corpus (findings fail CI).
set -euo pipefail
cd "$(dirname "$0")/.."
# The parsers and the plan builder run fast (thousands of inputs a second); the attention
# call runs the fp64 reference on every input, so it gets the longest share.
seconds="${STSA_FUZZ_SECONDS:-15}"
attention_seconds="${STSA_FUZZ_ATTENTION_SECONDS:-45}"
dir=build-fuzz
# -g1: line tables are what a finding's stack trace reads (as in .ci/sanitize.sh; ~7% less compile time).
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DSTSA_FUZZ=ON -DSTSA_TESTS=OFF \
  -DSTSA_CUDA=OFF -DSTSA_MPI=OFF -DSTSA_SANITIZE=address,undefined >/dev/null
cmake --build "$dir" -j "$(nproc)" --target plan_fuzz npy_fuzz safetensors_fuzz attention_fuzz
# One libFuzzer run: its whole output to $dir/<target>.log, its exit status to <target>.status.
run_target() {
  local target=$1 budget=$2 work="$dir/corpus-$1" status=0
  rm -rf "$work" && mkdir -p "$work"
  "$dir/tests/fuzz/${target}_fuzz" -max_total_time="$budget" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    "$work" "tests/fuzz/corpus/$target" >"$dir/$target.log" 2>&1 || status=$?
  echo "$status" >"$dir/$target.status"
}
# Each run is one process on one core: the attention call in one lane and the three parsers in the
# other take 45 s, not 90 (the lanes were 60 and 40 s before: one core idled for 20 s).
declare -A budgets=([attention]="$attention_seconds" [safetensors]="$seconds" [plan]="$seconds" [npy]="$seconds")
lanes=("attention" "safetensors plan npy")
rm -f "$dir"/*.status
for lane in "${lanes[@]}"; do
  (for target in $lane; do run_target "$target" "${budgets[$target]}"; done) &
done
wait
failed=0
for lane in "${lanes[@]}"; do
  for target in $lane; do
    status=$(cat "$dir/$target.status" 2>/dev/null || echo "none")
    if [ "$status" = 0 ]; then
      echo "fuzz: $target for ${budgets[$target]}s"
      tail -n 5 "$dir/$target.log"
    else
      echo "fuzz: $target failed (status $status):" >&2
      cat "$dir/$target.log" >&2
      failed=1
    fi
  done
done
if [ "$failed" -ne 0 ]; then exit 1; fi
echo "fuzz: no findings"
