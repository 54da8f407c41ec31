#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan/UBSan and runs each for a
# bounded time from the seed corpus in tests/fuzz/corpus (findings fail CI).
set -euo pipefail
cd "$(dirname "$0")/.."
# The parsers and the plan builder run fast (thousands of inputs a second); the attention
# call runs the fp64 reference on every input, so it gets the longest share.
seconds="${STSA_FUZZ_SECONDS:-20}"
attention_seconds="${STSA_FUZZ_ATTENTION_SECONDS:-40}"
dir=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTSA_FUZZ=ON -DSTSA_TESTS=OFF \
  -DSTSA_CUDA=OFF -DSTSA_MPI=OFF -DSTSA_SANITIZE=address,undefined >/dev/null
cmake --build "$dir" -j "$(nproc)" --target plan_fuzz npy_fuzz safetensors_fuzz attention_fuzz
for target in plan npy safetensors attention; do
  work="$dir/corpus-$target"
  rm -rf "$work" && mkdir -p "$work"
  budget=$seconds
  if [ "$target" = attention ]; then budget=$attention_seconds; fi
  echo "fuzz: $target for ${budget}s"
  "$dir/tests/fuzz/${target}_fuzz" -max_total_time="$budget" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    "$work" "tests/fuzz/corpus/$target" 2>&1 | tail -n 5
  test "${PIPESTATUS[0]}" -eq 0
done
echo "fuzz: no findings"
