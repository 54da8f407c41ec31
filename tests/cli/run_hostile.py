#!/usr/bin/env python3
"""Runs every line of hostile_inputs.txt against the stsa binary.

Each case must end with exit code 2, exactly one non-empty line on stderr, no
signal and no hang (5 s), and leave no new file in the scratch folder. A case
that starts with @FSIZE=<bytes>@ runs under that file size limit (ulimit -f),
with SIGXFSZ at its default, as a shell gives it. The list must mention every
flag that `stsa <command> --help` lists, so a new flag without a hostile case
fails here.
"""
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile

TIMEOUT_S = 5


def flags_of(binary, command):
    out = subprocess.run([binary, command, "--help"], capture_output=True, text=True, timeout=TIMEOUT_S).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out)) - {"--help"}


def files_under(folder):
    return {os.path.join(root, name) for root, _, names in os.walk(folder) for name in names}


def file_size_limit(size):
    """A preexec_fn: the child may write at most `size` bytes into any file."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def main():
    binary, listing = sys.argv[1], sys.argv[2]
    workdir = tempfile.mkdtemp(prefix="stsa-hostile-")
    # Files the cases can point at: an existing output (must not be overwritten) and broken inputs.
    existing = os.path.join(workdir, "existing.png")
    with open(existing, "wb") as f:
        f.write(b"keep me")
    with open(os.path.join(workdir, "garbage.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\xff\xffnot a header")
    with open(os.path.join(workdir, "empty.npy"), "wb"):
        pass
    with open(os.path.join(workdir, "garbage.safetensors"), "wb") as f:
        f.write(b"\xff" * 8 + b"{")
    cases, covered, failures = 0, set(), []
    for raw in open(listing):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        args = [a.replace("@DIR@", workdir) for a in shlex.split(line)]
        limit = re.fullmatch(r"@FSIZE=(\d+)@", args[0])
        if limit:
            args = args[1:]
        covered.update((args[0], a.split("=")[0]) for a in args[1:] if a.startswith("--"))
        cases += 1
        before = files_under(workdir)
        try:
            # (Python ignores SIGXFSZ; subprocess restores it to the default in the child.)
            r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=workdir,
                               preexec_fn=file_size_limit(int(limit.group(1))) if limit else None)
        except subprocess.TimeoutExpired:
            failures.append(f"{line}: no answer within {TIMEOUT_S} s")
            continue
        left = files_under(workdir) - before
        for path in left:
            os.remove(path)
        if left:
            failures.append(f"{line}: left files behind: {sorted(os.path.relpath(p, workdir) for p in left)}")
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        if r.returncode < 0:
            failures.append(f"{line}: killed by signal {-r.returncode}")
        elif r.returncode != 2:
            failures.append(f"{line}: exit code {r.returncode}, expected 2 (stderr: {r.stderr.strip()[:200]})")
        elif len(lines) != 1:
            failures.append(f"{line}: expected one line on stderr, got {len(lines)}: {r.stderr.strip()[:300]}")
    with open(existing, "rb") as f:
        if f.read() != b"keep me":
            failures.append("an existing file was overwritten")
    # Output that cannot be written (a full disk) is an error too, not exit code 0 with the output cut short.
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([binary, "plan", "--frames", "3", "--height", "4", "--width", "4", "--json"],
                               stdout=full, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
        cases += 1
        if r.returncode != 2 or "standard output" not in r.stderr or len(r.stderr.splitlines()) != 1:
            failures.append(f"stdout on /dev/full: exit code {r.returncode}, stderr {r.stderr.strip()[:200]!r}")
    for command in sorted({c for c, _ in covered}):
        missing = flags_of(binary, command) - {f for c, f in covered if c == command}
        if missing:
            failures.append(f"`stsa {command}` flags without a hostile case: {' '.join(sorted(missing))}")
    for f in failures:
        print("FAIL", f)
    passed = cases - sum(1 for f in failures if not f.startswith("`") and "overwritten" not in f)
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
