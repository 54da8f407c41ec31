#!/usr/bin/env bash
# A/B of the attention kernels between this tree and an older commit on one GPU,
# in one device call: both trees' stsa_gpu_bench built side by side, run in
# turns (old, new, old, new) on the same shapes so that clock drift under the
# power cap falls on both, then Nsight Compute's cycles and instructions of one
# launch each (the clock taken out). Written for the sm90-overlap slowdown the
# fourth H200 run left unexplained (bench/NOTES.md, "Fourth GPU run").
#
#   here:  bash bench/gpu/ab.sh prepare OLD_COMMIT
#          (the old tree into build-ab/old; carry build-ab and build-gpu-deps)
#   GPU:   bash bench/gpu/ab.sh run [KERNELS] [SHAPES] [DENSITIES]
#          defaults: sm90-overlap+head-by-head,sm90-pingpong+head-by-head  45x80,90x160  1,0.2
#
# $OUT (default build-ab/out) gets ab.log (everything printed) and ab.json (every
# run's records: tree, turn, shape, then stsa_gpu_bench's own JSON).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/build-ab"

if [ "${1:-}" = prepare ]; then
  OLD="${2:?usage: ab.sh prepare OLD_COMMIT}"
  rm -rf "$AB" && mkdir -p "$AB/old"  # nothing else: all of build-ab travels
  git -C "$ROOT" archive "$OLD" | tar -x -C "$AB/old"
  git -C "$ROOT" rev-parse "$OLD" > "$AB/old/COMMIT"
  echo "build-ab/old holds $(cat "$AB/old/COMMIT") ($(du -sh "$AB/old" | cut -f1)); carry build-ab and build-gpu-deps"
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: ab.sh prepare OLD_COMMIT | ab.sh run [KERNELS] [SHAPES] [DENSITIES]" >&2; exit 2; }
[ -f "$AB/old/COMMIT" ] || { echo "ab.sh: no build-ab/old (run 'ab.sh prepare OLD_COMMIT' here first)" >&2; exit 2; }
KERNELS="${2:-sm90-overlap+head-by-head,sm90-pingpong+head-by-head}"
SHAPES="${3:-45x80,90x160}"
DENSITIES="${4:-1,0.2}"
OUT="${OUT:-$AB/out}"
mkdir -p "$OUT" "$AB/runs"
rm -f "$AB"/runs/*.json
exec > >(tee "$OUT/ab.log") 2>&1
START=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - START )) s] $*"; }

NVCC="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)"
PREFIX=()
[ -d "$ROOT/build-gpu-deps/prefix" ] && PREFIX=(-DCMAKE_PREFIX_PATH="$ROOT/build-gpu-deps/prefix")
step "build stsa_gpu_bench: new (this tree) and old ($(cat "$AB/old/COMMIT"))"
build() {  # $1 source tree, $2 build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTSA_CUDA=ON -DSTSA_MPI=OFF -DSTSA_TESTS=OFF \
    -DSTSA_CLI=OFF -DSTSA_PYTHON=OFF -DCMAKE_CUDA_COMPILER="$NVCC" "${PREFIX[@]}" > "$2.log" 2>&1 &&
    cmake --build "$2" -j8 --target stsa_gpu_bench >> "$2.log" 2>&1
}
build "$ROOT" "$AB/build-new" & NEW_PID=$!
build "$AB/old" "$AB/build-old" & OLD_PID=$!
BUILD_FAILED=0
wait "$NEW_PID" || { tail -n 30 "$AB/build-new.log"; BUILD_FAILED=1; }
wait "$OLD_PID" || { tail -n 30 "$AB/build-old.log"; BUILD_FAILED=1; }
[ "$BUILD_FAILED" -eq 0 ] || { echo "a build failed"; exit 1; }

step "turns: old, new, old, new; kernels $KERNELS, shapes $SHAPES, densities $DENSITIES"
for TURN in 1 2; do
  for TREE in old new; do
    for SHAPE in ${SHAPES//,/ }; do
      timeout 120 "$AB/build-$TREE/stsa_gpu_bench" --height "${SHAPE%x*}" --width "${SHAPE#*x}" \
        --densities "$DENSITIES" --kernels "$KERNELS" --permutation false \
        --json "$AB/runs/${TREE}_${TURN}_${SHAPE}.json" > /dev/null || echo "($TREE turn $TURN $SHAPE failed)"
    done
  done
done
python3 - "$AB/runs" "$OUT/ab.json" <<'EOF'
import glob, json, os, sys
runs, out = sys.argv[1], sys.argv[2]
records, ms = [], {}
for path in sorted(glob.glob(os.path.join(runs, "*.json"))):
    tree, turn, shape = os.path.basename(path)[:-5].split("_")
    run = json.load(open(path))
    records.append({"tree": tree, "turn": int(turn), "shape": shape, "run": run})
    for case in run.get("cases", []):
        if case.get("ms"):
            ms.setdefault((shape, case["kernel"], case["label"]), {}).setdefault(tree, []).append(case["ms"])
json.dump(records, open(out, "w"), indent=1)
print("shape | kernel | case | old ms (turns) | new ms (turns) | new / old")
for (shape, kernel, label), by_tree in sorted(ms.items()):
    old, new = by_tree.get("old", []), by_tree.get("new", [])
    ratio = f"{min(new) / min(old):.3f}" if old and new else "-"
    print(f"{shape} | {kernel} | {label} | {', '.join(f'{x:.2f}' for x in old)} | {', '.join(f'{x:.2f}' for x in new)} | {ratio}")
EOF

NCU="$(command -v ncu || ls /usr/local/cuda*/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1 || true)"
if [ -z "$NCU" ]; then echo "no ncu: no cycle counts"; exit 0; fi
METRICS=sm__cycles_elapsed.max,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_wait
SHAPE="${SHAPES%%,*}"
for KERNEL in ${KERNELS//,/ }; do
  for TREE in old new; do
    step "ncu: $TREE $KERNEL, $SHAPE, dense (one launch, clocks left alone)"
    timeout 60 "$NCU" --clock-control none --metrics "$METRICS" --kernel-name regex:attention --launch-count 1 \
      "$AB/build-$TREE/stsa_gpu_bench" --height "${SHAPE%x*}" --width "${SHAPE#*x}" --densities 1 --kernels "$KERNEL" \
      --warmup 0 --repeats 1 --permutation false --json "$AB/runs/ncu.json" 2>&1 | grep -E "^\s+(sm__|smsp__|lts__)" || true
  done
done
step done
