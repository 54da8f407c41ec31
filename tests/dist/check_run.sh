#!/usr/bin/env bash
# Runs a command (an mpirun job) and checks how it ended:
#   check_run.sh pass|fail MAX_SECONDS REGEX MIN_MATCHES -- COMMAND...
# pass: exit code 0; fail: non-zero. REGEX (grep -E) must match at least
# MIN_MATCHES lines of stdout+stderr, and the job must end within MAX_SECONDS.
set -u
expect=$1 max_seconds=$2 regex=$3 min_matches=$4
shift 5
start=$(date +%s%N)
output=$(timeout --kill-after=5 "$max_seconds" "$@" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
printf '%s\n' "$output"
echo "check_run: exit code $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "check_run: FAILED: did not end within ${max_seconds}s (hang)"; exit 1; fi
if [ "$expect" = pass ] && [ "$rc" -ne 0 ]; then echo "check_run: FAILED: expected exit code 0"; exit 1; fi
if [ "$expect" = fail ] && [ "$rc" -eq 0 ]; then echo "check_run: FAILED: expected a non-zero exit code"; exit 1; fi
matches=$(printf '%s\n' "$output" | grep -E -c -- "$regex")
if [ "$matches" -lt "$min_matches" ]; then
  echo "check_run: FAILED: /$regex/ matched $matches lines, expected at least $min_matches"; exit 1
fi
echo "check_run: ok"
