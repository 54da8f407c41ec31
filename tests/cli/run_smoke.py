#!/usr/bin/env python3
"""Runs the documented CLI commands on small shapes and checks their JSON keys."""
import array
import json
import math
import os
import re
import subprocess
import sys
import tempfile


def run(binary, args, timeout=240):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"FAIL stsa {' '.join(map(os.fsdecode, args))}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


FILE_CHECKS = 5


def read_npy_f32(path, descr="<f4"):
    """(shape, values as floats) of a C-order .npy file (version 1 or 2 header) of
    '<f4', or of '<V2' (bfloat16 as ml_dtypes saves it: the upper half of an fp32)."""
    data = open(path, "rb").read()
    if data[:6] != b"\x93NUMPY":
        raise SystemExit(f"FAIL {path} is not a .npy file")
    size_bytes = 2 if data[6] == 1 else 4
    header_len = int.from_bytes(data[8:8 + size_bytes], "little")
    begin = 8 + size_bytes + header_len
    header = data[8 + size_bytes:begin].decode("latin1")
    if f"'descr': '{descr}'" not in header or "'fortran_order': False" not in header:
        raise SystemExit(f"FAIL {path}: unexpected header {header!r}")
    shape = tuple(int(x) for x in re.search(r"'shape': \(([^)]*)\)", header).group(1).split(",") if x.strip())
    values = array.array("f")
    if descr == "<V2":
        halves = array.array("H")
        halves.frombytes(data[begin:])
        values.frombytes(b"".join(int(h << 16).to_bytes(4, "little") for h in halves))
    else:
        values.frombytes(data[begin:])
    return shape, values


def with_heads(path, out_path, heads):
    """Writes out_path: the [B, N, H, D] .npy file at `path` (version 1 header, any element type)
    with heads `heads` of each token, in that order (a head may come twice)."""
    data = open(path, "rb").read()
    header_len = int.from_bytes(data[8:10], "little")
    header = data[10:10 + header_len].decode("latin1")
    b_count, n_count, h_count, d_count = (int(x) for x in re.search(r"'shape': \(([^)]*)\)", header).group(1)
                                          .split(",") if x.strip())
    body = data[10 + header_len:]
    row = len(body) // (b_count * n_count * h_count)
    picked = b"".join(body[(token * h_count + h) * row:(token * h_count + h + 1) * row]
                      for token in range(b_count * n_count) for h in heads)
    new_header = header.replace(f"({b_count}, {n_count}, {h_count}, {d_count})",
                                f"({b_count}, {n_count}, {len(heads)}, {d_count})").rstrip()
    new_header += " " * ((64 - (10 + len(new_header) + 1) % 64) % 64) + "\n"
    with open(out_path, "wb") as f:
        f.write(data[:8] + len(new_header).to_bytes(2, "little") + new_header.encode("latin1") + picked)


def as_bnhd(shape, values):
    """[B, H, N, D] values reordered to [B, N, H, D]."""
    b_count, h_count, n_count, d_count = shape
    out = array.array("f", bytes(4 * len(values)))
    for b in range(b_count):
        for h in range(h_count):
            for n in range(n_count):
                src = ((b * h_count + h) * n_count + n) * d_count
                dst = ((b * n_count + n) * h_count + h) * d_count
                out[dst:dst + d_count] = values[src:src + d_count]
    return out


def check_inputs_from_files(binary):
    """Synthetic heads saved with --save-inputs (both axis orders) and routed from the
    files give the synthetic run's decisions and errors bit for bit; files in the
    other axis order are refused with a hint; saving over them is refused and leaves
    them as they were. Returns the number of failed checks."""
    failures = 0
    folder = tempfile.mkdtemp()
    grid = ["--frames", "13", "--height", "6", "--width", "8", "--text", "5", "--seed", "3", "--json"]
    synthetic = ["route", "--synthetic", "--dtype", "bf16", "--heads", "6", "--head-dim", "64"] + grid

    def files(order):
        return [arg for t in "qkv" for arg in (f"--{t}", os.path.join(folder, order, f"{t}.npy"))]

    runs = []
    for order in ("bnhd", "bhnd"):
        runs.append(json.loads(run(binary, synthetic + ["--memory", order, "--save-inputs",
                                                        os.path.join(folder, order)])))
        runs.append(json.loads(run(binary, ["route", "--memory", order] + files(order) + grid + [
            "--save-output", os.path.join(folder, f"o_{order}.npy")])))
    first = runs[0]
    # The saved O: the same values in either axis order, and the fp64 reference's routed
    # output (same decisions, same masks) within the CPU kernel's fp32 error.
    reference = json.loads(run(binary, ["route", "--backend", "reference"] + files("bnhd") + grid + [
        "--save-output", os.path.join(folder, "o_reference.npy")]))
    shape, o_bnhd = read_npy_f32(os.path.join(folder, "o_bnhd.npy"))
    shape_bhnd, o_bhnd = read_npy_f32(os.path.join(folder, "o_bhnd.npy"))
    _, o_ref = read_npy_f32(os.path.join(folder, "o_reference.npy"))
    rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(o_bnhd, o_ref)) / sum(y * y for y in o_ref))
    if (shape != (1, 629, 6, 64) or shape_bhnd != (1, 6, 629, 64) or as_bnhd(shape_bhnd, o_bhnd) != o_bnhd
            or reference["decisions"] != first["decisions"] or not rel < 1e-5):
        print(f"FAIL --save-output: shapes {shape} / {shape_bhnd}, orders agree "
              f"{as_bnhd(shape_bhnd, o_bhnd) == o_bnhd}, rel L2 vs the reference backend {rel:.3g}")
        failures += 1

    # --out-dtype bf16: O saved as bfloat16, each value the fp32 run's rounded (to
    # within the kernels' own difference), the decisions unchanged.
    bf16_run = json.loads(run(binary, ["route"] + files("bnhd") + grid + [
        "--out-dtype", "bf16", "--save-output", os.path.join(folder, "o_bf16.npy")]))
    shape_bf16, o_bf16 = read_npy_f32(os.path.join(folder, "o_bf16.npy"), "<V2")
    # (P rounded to bf16 and the output's own rounding: a few 2^-9 of the largest |O|.)
    worst = max(abs(x - y) for x, y in zip(o_bf16, o_bnhd)) / max(abs(y) for y in o_bnhd)
    if (bf16_run["out_dtype"] != "bf16" or first["out_dtype"] != "fp32" or shape_bf16 != shape
            or bf16_run["decisions"] != first["decisions"] or not worst < 2 ** -7):
        print(f"FAIL --out-dtype bf16: out_dtype {bf16_run['out_dtype']} / {first['out_dtype']}, shape {shape_bf16}, "
              f"decisions {bf16_run['decisions']} vs {first['decisions']}, worst difference {worst:.3g} of the largest |O|")
        failures += 1

    # --isa scalar --threads 1 (every host has it): the router's fp32 path (no tile products) and
    # the scalar kernel on one thread: the same decisions, candidate errors within the paths' difference.
    vectors = json.loads(run(binary, ["route"] + files("bnhd") + grid + ["--isa", "scalar", "--threads", "1"]))
    errors = [[c["rel_l2"] for c in h["candidates"]] for h in first["per_head"]]
    vector_errors = [[c["rel_l2"] for c in h["candidates"]] for h in vectors["per_head"]]
    if (vectors["isa"] != "scalar" or vectors["routing_tile_products"] or vectors["routing_product_units"] != "fma"
            or vectors["decisions"] != first["decisions"]
            or any(abs(a - b) > 1e-3 * b for row, vrow in zip(errors, vector_errors) for a, b in zip(vrow, row))):
        print(f"FAIL --isa scalar: isa {vectors['isa']}, units {vectors['routing_product_units']}, decisions "
              f"{vectors['decisions']} vs {first['decisions']}, candidate errors {vector_errors} vs {errors}")
        failures += 1

    def outcome(r):
        return r["decisions"], r["rel_l2_err"], [h["candidates"] for h in r["per_head"]]

    if not {"spatial", "temporal"} <= set(first["decisions"]) or any(outcome(r) != outcome(first) for r in runs):
        print("FAIL route from saved files differs from the synthetic run: "
              f"{[(r['source'], r['memory'], r['decisions'], r['rel_l2_err']) for r in runs]}")
        failures += 1
    # Grouped-query attention from files: K and V with 3 heads for the 6 query heads give the
    # decisions and errors of the files with each K/V head repeated for its query heads.
    for name in "kv":
        source = os.path.join(folder, "bnhd", f"{name}.npy")
        with_heads(source, os.path.join(folder, f"{name}3.npy"), [0, 2, 4])
        with_heads(source, os.path.join(folder, f"{name}6.npy"), [0, 0, 2, 2, 4, 4])
    q_file = ["--q", os.path.join(folder, "bnhd", "q.npy")]
    grouped, repeated = (json.loads(run(binary, ["route"] + q_file + [
        "--k", os.path.join(folder, f"k{heads}.npy"), "--v", os.path.join(folder, f"v{heads}.npy")] + grid))
        for heads in (3, 6))
    if outcome(grouped) != outcome(repeated) or not grouped["rel_l2_err"] < 1:
        print(f"FAIL route with 3 K/V heads for 6 query heads: {outcome(grouped)} vs repeated {outcome(repeated)}")
        failures += 1
    wrong = subprocess.run([binary, "route"] + files("bhnd") + grid, capture_output=True, text=True, timeout=60)
    if wrong.returncode != 2 or "--memory bhnd" not in wrong.stderr or len(wrong.stderr.splitlines()) != 1:
        print(f"FAIL [B, H, N, D] files read as bnhd: exit {wrong.returncode}, {wrong.stderr.strip()!r}")
        failures += 1
    # Options of the synthetic data are refused with files, not ignored (--heads 5 ran with the files' 6).
    ignored = subprocess.run([binary, "route"] + files("bnhd") + grid + ["--heads", "5"], capture_output=True,
                             text=True, timeout=60)
    if ignored.returncode != 2 or "--heads" not in ignored.stderr or len(ignored.stderr.splitlines()) != 1:
        print(f"FAIL --heads with --q/--k/--v: exit {ignored.returncode}, {ignored.stderr.strip()!r}")
        failures += 1
    saved = open(os.path.join(folder, "bnhd", "q.npy"), "rb").read()
    again = subprocess.run([binary] + synthetic + ["--seed", "4", "--save-inputs", os.path.join(folder, "bnhd")],
                           capture_output=True, text=True, timeout=60)
    if again.returncode != 2 or open(os.path.join(folder, "bnhd", "q.npy"), "rb").read() != saved:
        print(f"FAIL --save-inputs over existing files: exit {again.returncode}, files changed or not refused")
        failures += 1
    # Only v.npy there: refused before q.npy and k.npy are written.
    partial = os.path.join(folder, "partial")
    os.makedirs(partial)
    open(os.path.join(partial, "v.npy"), "wb").close()
    third = subprocess.run([binary] + synthetic + ["--save-inputs", partial], capture_output=True, text=True,
                           timeout=60)
    if third.returncode != 2 or sorted(os.listdir(partial)) != ["v.npy"]:
        print(f"FAIL --save-inputs with v.npy present: exit {third.returncode}, folder {sorted(os.listdir(partial))}")
        failures += 1
    return failures


def check_fp8(binary):
    """fp8 (E4M3FN) inputs: the bench gives a bf16 O within bf16's rounding of the fp64
    reference; synthetic fp8 heads saved with --save-inputs ('<V1' files) and routed
    from them give the synthetic run's decisions and errors bit for bit, against the
    reference backend's routed output within the CPU kernel's fp32 error. Returns the
    number of failed checks."""
    failures = 0
    bench = json.loads(run(binary, ["bench", "--frames", "3", "--height", "7", "--width", "9", "--text", "5",
                                    "--heads", "2", "--head-dim", "128", "--mask", "spatial", "--density", "0.3",
                                    "--dtype", "fp8_e4m3", "--repeats", "1", "--json"]))
    # (bf16's rounding of O, 2^-9 relative at most, bounds the error.)
    if (bench["dtype"], bench["out_dtype"]) != ("fp8_e4m3", "bf16") or not (
            bench["rel_l2_err"] <= 4e-3 and bench["dense_rel_l2_err"] <= 4e-3):
        print(f"FAIL fp8 bench: {bench['dtype']} -> {bench['out_dtype']}, rel_l2_err {bench['rel_l2_err']} / "
              f"{bench['dense_rel_l2_err']}")
        failures += 1
    folder = tempfile.mkdtemp()
    grid = ["--frames", "13", "--height", "6", "--width", "8", "--text", "5", "--seed", "3", "--json"]
    files = [arg for t in "qkv" for arg in (f"--{t}", os.path.join(folder, "in", f"{t}.npy"))]
    synthetic = json.loads(run(binary, ["route", "--synthetic", "--dtype", "fp8", "--heads", "4", "--head-dim", "64",
                                        "--save-inputs", os.path.join(folder, "in")] + grid))
    from_files = json.loads(run(binary, ["route"] + files + grid + ["--save-output", os.path.join(folder, "o.npy")]))
    reference = json.loads(run(binary, ["route", "--backend", "reference"] + files + grid + [
        "--save-output", os.path.join(folder, "o_reference.npy")]))
    with open(os.path.join(folder, "in", "q.npy"), "rb") as f:
        header = f.read(128)
    _, o = read_npy_f32(os.path.join(folder, "o.npy"))
    _, o_ref = read_npy_f32(os.path.join(folder, "o_reference.npy"))
    rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(o, o_ref)) / sum(y * y for y in o_ref))
    same = (from_files["decisions"], from_files["rel_l2_err"]) == (synthetic["decisions"], synthetic["rel_l2_err"])
    if (synthetic["dtype"] != "fp8_e4m3" or b"'<V1'" not in header or not same
            or reference["decisions"] != synthetic["decisions"] or not rel < 1e-5
            or not {"spatial", "temporal"} <= set(synthetic["decisions"])):
        print(f"FAIL fp8 route: dtype {synthetic['dtype']}, header {header[:60]!r}, from files the same {same}, "
              f"decisions {synthetic['decisions']} / {reference['decisions']}, rel L2 vs the reference {rel:.3g}")
        failures += 1
    return failures


def check_memory_counted_together(binary):
    """Synthetic inputs that fit in memory, with an output that does not fit beside them: refused
    before any buffer is made (each alone fits: the OOM killer used to end the run instead)."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    values = physical // 8  # bf16 Q/K/V 6 bytes a value (3/4 of memory), with the fp32 output 10 (5/4)
    frames = -(-values // (16 * 64 * 256 * 256))
    r = subprocess.run([binary, "route", "--synthetic", "--frames", str(frames), "--height", "256", "--width", "256",
                        "--heads", "16", "--head-dim", "64", "--dtype", "bf16", "--out-dtype", "fp32"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 2 or "the synthetic Q/K/V, the output and its LSE needs" not in r.stderr:
        print(f"FAIL route on {frames} frames of 256x256 x 16 heads: exit {r.returncode}, {r.stderr[-300:]!r}")
        return 1
    return 0


def refused(binary, args, timeout=10):
    """(ok, why): `stsa args` exits 2 with one line on stderr within `timeout` s."""
    try:
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout} s", ""
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    return r.returncode == 2 and len(lines) == 1, f"exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}", r.stderr


BENCH_CHECKS = 6


def check_bench_figures(binary, ragged_bench):
    """What `stsa bench` and `stsa plan` print about work and rates. Returns the number of failed checks."""
    failures = 0
    # More threads than hardware threads share the cores: the CPU-time rates are spread over the
    # cores, as the peak is (over the threads, they were threads/cores times too high: above 1 of peak).
    cores = os.cpu_count() or 1
    threads = min(4096, 4 * cores)
    r = json.loads(run(binary, ["bench", "--frames", "4", "--height", "16", "--width", "16", "--heads", "8",
                                "--head-dim", "64", "--threads", str(threads), "--repeats", "3", "--json"]))
    spread = r["dense_flops"] / (r["dense_cpu_ms"] * 1e-3 / min(threads, cores)) / 1e9
    if (r["threads"] != threads or not abs(r["dense_gflops_cpu_time"] - spread) <= 1e-6 * spread
            or not r["peak_fraction_cpu_time"] <= 1.2 or not r["sparse_peak_fraction_cpu_time"] <= 1.2):
        print(f"FAIL bench --threads {threads} on {cores} cores: dense {r['dense_gflops_cpu_time']} GFLOP/s in CPU "
              f"time, expected {spread} (CPU time over the cores); fractions of peak {r['peak_fraction_cpu_time']}, "
              f"{r['sparse_peak_fraction_cpu_time']}")
        failures += 1
    # A shape typo (--frames 2100 for 21: ~7,000 TFLOP, hours of silence) is refused at once.
    ok, why, err = refused(binary, ["bench", "--frames", "2100"], timeout=5)
    if not ok or "TFLOP" not in err or "--max-tflop" not in err:
        print(f"FAIL bench --frames 2100 not refused for its work: {why}")
        failures += 1
    # fp8 inputs have bf16 outputs, and the LSE take 4 bytes a row: at head dim 1 that is 15 bytes a
    # value, not the 5 of five one-byte tensors. A shape needing 3/4 of memory is refused as such
    # (--max-tflop out of the way: the work guard comes first).
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    frames = -(-physical // 20 // (64 * 256 * 256))
    ok, why, err = refused(binary, ["bench", "--frames", str(frames), "--height", "256", "--width", "256",
                                    "--heads", "64", "--head-dim", "1", "--dtype", "fp8_e4m3", "--max-tflop", "1e30"])
    if not ok or "the benchmark tensors need" not in err:
        print(f"FAIL bench fp8 on {frames} frames of 256x256 x 64 heads of dim 1 not refused for memory: {why}")
        failures += 1
    # The ideal speedup is the work the kept tiles save, ragged last tiles by their area (3x8x8
    # tokens: one full and one 64-row tile; by tile count it was 1.33, the FLOP counts give 1.125).
    ideal = ragged_bench["dense_flops"] / ragged_bench["kept_tile_flops"]
    if not abs(ragged_bench["ideal_speedup"] - ideal) <= 1e-9 * ideal:
        print(f"FAIL bench ideal_speedup {ragged_bench['ideal_speedup']}, dense / kept tile FLOPs {ideal}")
        failures += 1
    # Nothing kept: said so (it was "7.5e26x less"); small grids' work in significant digits, not 0.00.
    text = run(binary, ["plan", "--frames", "3", "--height", "8", "--width", "8", "--mask", "spatial", "--density",
                        "0", "--no-anchor", "--tile", "64"])
    work = [l for l in text.splitlines() if l.startswith("work per call")]
    if work != ["work per call: 0.000755 TFLOP dense, none on kept tiles (no kept tiles)"]:
        print(f"FAIL plan keeping nothing: {work}")
        failures += 1
    # fp8 runs on AMX too (the --isa help said bf16 and fp16 only).
    isa = run(binary, ["bench", "--help"]).split("--isa", 1)[-1].split("--repeats", 1)[0]
    if "fp8" not in isa:
        print(f"FAIL bench --help: --isa does not say fp8 runs on AMX: {isa.strip()!r}")
        failures += 1
    return failures


def main():
    binary = sys.argv[1]
    failures = 0
    # The version is written once, in CMakeLists.txt's project() (stsa/version.hpp is generated from it).
    cmakelists = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "CMakeLists.txt")
    written = re.search(r"project\(stsa VERSION ([0-9]+\.[0-9]+\.[0-9]+)", open(cmakelists).read()).group(1)
    if run(binary, ["--version"]).strip() != f"stsa {written}":
        print(f"FAIL stsa --version is not 'stsa {written}'")
        failures += 1
    checks = [
        (["plan", "--frames", "21", "--height", "90", "--width", "160", "--heads", "40", "--head-dim", "128",
          "--mask", "spatial", "--density", "0.25", "--tile", "128", "--json"],
         ["tokens", "tiles_full", "tiles_partial", "tiles_empty", "kept_pairs", "total_pairs", "changed_pairs",
          "build_ms", "plan_bytes"]),
        (["plan", "--frames", "5", "--height", "7", "--width", "9", "--text", "13", "--text-placement", "before",
          "--mask", "temporal", "--density", "0.3", "--tile", "64", "--align", "round", "--json"],
         ["changed_pairs", "kept_pairs"]),
        (["bench", "--frames", "3", "--height", "8", "--width", "8", "--heads", "2", "--head-dim", "64",
          "--mask", "spatial", "--density", "0.25", "--dtype", "fp32", "--repeats", "1", "--json",
          # The CUDA options' defaults given explicitly are accepted without --backend cuda.
          "--kernel", "auto", "--work-order", "auto", "--persistent-blocks", "0", "--block-schedule", "round-robin"],
         ["dense_ms", "sparse_ms", "speedup", "tile_density", "dense_gflops", "sparse_gflops_on_kept_tiles",
          "peak_gflops", "peak_fraction", "rel_l2_err", "max_abs_err"]),
        # bf16 heads that route to both sparse kinds (check.sh runs the same on the GPU).
        (["route", "--synthetic", "--dtype", "bf16", "--frames", "13", "--height", "12", "--width", "16", "--heads", "8",
          "--head-dim", "64", "--density", "0.25", "--seed", "1", "--json"],
         ["heads", "accuracy", "decisions", "rel_l2_err", "rel_l2_err_first_block_anchor", "routing_ms",
          "attention_ms", "device", "routing_device_ms", "scatter_fused", "gather_fused", "repeats"]),
        # bf16: where the CPU has AMX the tile kernel runs, and the rates are fractions of its peak (of VDPBF16PS's on
        # AVX-512 alone).
        (["bench", "--frames", "3", "--height", "8", "--width", "8", "--heads", "2", "--head-dim", "64",
          "--mask", "spatial", "--density", "0.25", "--dtype", "bf16", "--repeats", "1", "--json"],
         ["isa", "kernel", "peak_of", "peak_gflops", "peak_fraction", "rel_l2_err"]),
        # fp16 inputs and output, a head dim no kernel is built for (run padded with zeros), text tokens.
        (["bench", "--frames", "2", "--height", "5", "--width", "7", "--text", "9", "--heads", "2", "--head-dim", "72",
          "--mask", "temporal", "--density", "0.4", "--dtype", "fp16", "--repeats", "1", "--json"],
         ["dtype", "rel_l2_err", "dense_rel_l2_err", "kernel_head_dim"]),
        # Grouped-query attention: 4 query heads reading 1 K/V head, checked against the fp64 reference.
        (["bench", "--frames", "3", "--height", "8", "--width", "8", "--heads", "4", "--kv-heads", "1",
          "--head-dim", "64", "--mask", "temporal", "--density", "0.3", "--dtype", "bf16", "--repeats", "1", "--json"],
         ["kv_heads", "rel_l2_err", "dense_rel_l2_err"]),
        # Medians of warm calls: the same decisions as one cold call.
        (["route", "--synthetic", "--dtype", "bf16", "--frames", "13", "--height", "12", "--width", "16", "--heads", "8",
          "--head-dim", "64", "--density", "0.25", "--seed", "1", "--repeats", "3", "--json"],
         ["repeats", "routing_ms", "attention_ms", "routing_share", "decisions"]),
    ]
    records = []  # each check's output, read again below (each run costs seconds under the sanitizers)
    for args, keys in checks:
        records.append(json.loads(run(binary, args)))
        missing = [k for k in keys if k not in records[-1]]
        if missing:
            print(f"FAIL stsa {' '.join(args)}: missing keys {missing}")
            failures += 1
    plan = records[0]
    if plan["tiles_full"] + plan["tiles_partial"] + plan["tiles_empty"] != 2363 * 2363:
        print("FAIL 1440p plan tile counts do not add up")
        failures += 1
    cold, warm = records[3], records[-1]
    if warm["repeats"] != 3 or warm["decisions"] != cold["decisions"] or cold["repeats"] != 1:
        print(f"FAIL route --repeats 3: repeats {warm['repeats']}, decisions {warm['decisions']} vs {cold['decisions']}")
        failures += 1
    # Each group's error is there exactly when the group has heads (a group with none was reported as 0).
    for kind in ("temporal", "spatial"):
        for record in (cold, warm):
            has_heads = kind in record["decisions"]
            for key in (f"rel_l2_err_{kind}", f"rel_l2_err_first_block_anchor_{kind}"):
                if (record[key] is not None) != has_heads:
                    print(f"FAIL route: {key} is {record[key]} with decisions {record['decisions']}")
                    failures += 1
    one_kind = json.loads(run(binary, ["route", "--synthetic", "--frames", "2", "--height", "3", "--width", "4",
                                       "--heads", "2", "--json"]))
    if "temporal" in one_kind["decisions"] or one_kind["rel_l2_err_temporal"] is not None:
        print(f"FAIL route without temporal heads: decisions {one_kind['decisions']}, temporal error "
              f"{one_kind['rel_l2_err_temporal']}")
        failures += 1
    grouped = records[-2]
    if (grouped["heads"], grouped["kv_heads"]) != (4, 1) or not (
            grouped["rel_l2_err"] <= 4e-3 and grouped["dense_rel_l2_err"] <= 4e-3):
        print(f"FAIL bench --kv-heads 1: heads {grouped['heads']} / {grouped['kv_heads']}, rel_l2_err "
              f"{grouped['rel_l2_err']} / {grouped['dense_rel_l2_err']}")
        failures += 1
    bench = records[2]
    if not bench["rel_l2_err"] <= 1e-5:
        print(f"FAIL bench rel_l2_err {bench['rel_l2_err']} > 1e-5 in fp32")
        failures += 1
    route = records[3]
    # The CPU backend: no device, no GPU routing kernels, the temporal heads' O stored in place.
    if "temporal" not in route["decisions"]:
        print(f"FAIL route: no temporal head to permute ({route['decisions']})")
        failures += 1
    if (route["device"] is not None or route["routing_device_ms"] is not None or route["scatter_fused"] is not True
            or route["gather_fused"] is not True or route["permutation_ms"] != 0):
        print("FAIL route on the CPU reports GPU fields or a permutation pass: "
              f"{route['device']}, {route['routing_device_ms']}, {route['scatter_fused']}, {route['gather_fused']}, "
              f"{route['permutation_ms']}")
        failures += 1
    # The scatter as a pass of its own: the same output (bit for bit, so the same errors).
    two_step = json.loads(run(binary, checks[3][0] + ["--scatter", "pass"]))
    if (two_step["scatter_fused"] is not False or two_step["gather_fused"] is not False
            or two_step["rel_l2_err"] != route["rel_l2_err"]):
        print(f"FAIL route --scatter pass: fused {two_step['scatter_fused']}, "
              f"rel_l2_err {two_step['rel_l2_err']} vs {route['rel_l2_err']} fused")
        failures += 1
    bf16 = records[4]
    # The peak of the units both products ran on: the tile unit's, VDPBF16PS's (the AVX-512 kernel,
    # bf16 in and out), else the FMAs'.
    want_peak = {"amx": "amx", "avx512": "bf16_dot"}.get(bf16["isa"], "fma")
    if (bf16["isa"] == "amx") != (bf16["kernel"] == "amx") or bf16["peak_of"] != want_peak:
        print(f"FAIL bf16 bench on {bf16['isa']} reports the {bf16['kernel']} kernel and the {bf16['peak_of']} peak")
        failures += 1
    fp16 = records[5]
    # The fp16 output's rounding (2^-11 relative at most) bounds the error; fp32 math underneath.
    if fp16["dtype"] != "fp16" or not (fp16["rel_l2_err"] <= 1e-3 and fp16["dense_rel_l2_err"] <= 1e-3):
        print(f"FAIL fp16 bench: dtype {fp16['dtype']}, rel_l2_err {fp16['rel_l2_err']} / {fp16['dense_rel_l2_err']}")
        failures += 1
    # Head dim 72 runs padded: to 96 on the AMX kernel, to 80 on the SIMD ones.
    if fp16["kernel_head_dim"] != (96 if fp16["kernel"] == "amx" else 80):
        print(f"FAIL fp16 bench at head dim 72: the {fp16['kernel']} kernel at {fp16['kernel_head_dim']}")
        failures += 1
    # Each --mask name runs its own kind of mask (what the plan's "mask" field describes).
    for name, kind in (("dense", "dense"), ("spatial", "spatial band"), ("temporal", "temporal band"),
                       ("frames", "frame window")):
        plan = json.loads(run(binary, ["plan", "--frames", "3", "--height", "4", "--width", "4", "--mask", name,
                                       "--density", "0.5", "--json"]))
        if not plan["mask"].startswith(kind):
            print(f"FAIL --mask {name} gave the mask '{plan['mask']}', expected a {kind} mask")
            failures += 1
    # --preset: a model's grid, heads and head dim; the shape options given win over it.
    preset = json.loads(run(binary, ["plan", "--preset", "cogvideox1.5", "--json"]))
    expected = ("11x48x85 (+226 text before)", 44880 + 226, 48, 64)
    if (preset["grid"], preset["tokens"], preset["heads"], preset["head_dim"]) != expected:
        print(f"FAIL plan --preset cogvideox1.5: {preset['grid']}, {preset['tokens']}, {preset['heads']} x "
              f"{preset['head_dim']}, expected {expected}")
        failures += 1
    given = json.loads(run(binary, ["plan", "--preset", "wan2.1-720p", "--frames", "3", "--text", "4",
                                    "--head-dim", "64", "--json"]))
    if (given["grid"], given["heads"], given["head_dim"]) != ("3x45x80 (+4 text after)", 40, 64):
        print(f"FAIL plan --preset with shape options: {given['grid']}, {given['heads']} x {given['head_dim']}")
        failures += 1
    # Cosmos 3's 8 K/V heads come with its 32 heads on the CPU backend; --heads given, K and V have as many.
    grouped = [json.loads(run(binary, ["bench", "--preset", "cosmos3-720p", "--frames", "2", "--height", "4",
                                       "--width", "8", "--repeats", "1", "--check-rows", "4", "--json"] + extra))
               for extra in ([], ["--heads", "4"])]
    if [(r["heads"], r["kv_heads"]) for r in grouped] != [(32, 8), (4, 4)]:
        print(f"FAIL bench --preset cosmos3-720p: heads / K/V heads {[(r['heads'], r['kv_heads']) for r in grouped]}")
        failures += 1
    route = json.loads(run(binary, ["route", "--synthetic", "--preset", "ltx-video", "--frames", "3", "--heads", "2",
                                    "--json"]))
    if route["heads"] != 2 or route["head_dim"] != 64 or route["tokens"] != 3 * 16 * 22:
        print(f"FAIL route --preset ltx-video: {route['heads']} heads of {route['head_dim']}, {route['tokens']} tokens")
        failures += 1
    # A video with fewer tokens than the 64 default samples is routed on every row.
    tiny = json.loads(run(binary, ["route", "--synthetic", "--frames", "1", "--height", "3", "--width", "4", "--heads",
                                   "2", "--head-dim", "64", "--json"]))
    if (tiny["tokens"], tiny["samples"], tiny["sampled_rows"]) != (12, 64, 12):
        print(f"FAIL route on 12 tokens: {tiny['sampled_rows']} of {tiny['samples']} samples, {tiny['tokens']} tokens")
        failures += 1
    failures += check_inputs_from_files(binary)
    failures += check_fp8(binary)
    failures += check_memory_counted_together(binary)
    failures += check_bench_figures(binary, records[2])
    png = os.path.join(tempfile.mkdtemp(), "tiles.png")
    run(binary, ["plan", "--frames", "3", "--height", "8", "--width", "8", "--png", png])
    with open(png, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            print("FAIL --png did not write a PNG")
            failures += 1
    # A file name that is not UTF-8 (Linux allows any bytes): written, and named in the JSON
    # with U+FFFD for the bad byte instead of the JSON failing after the file was written.
    odd = os.path.join(os.fsencode(tempfile.mkdtemp()), b"tiles\xff.png")
    record = json.loads(run(binary, ["plan", "--frames", "3", "--height", "8", "--width", "8", "--png", odd, "--json"]))
    if not os.path.exists(odd) or not record["png"].endswith("tiles\ufffd.png"):
        print(f"FAIL --png with a non-UTF-8 name and --json: written {os.path.exists(odd)}, png {record['png']!r}")
        failures += 1
    # --no-demo: the sanitizer builds (10 s under ASan), whose CI runs the release build's demo anyway.
    with_demo = "--no-demo" not in sys.argv[2:]
    if with_demo:
        demo = run(binary, [])
        if "CPU kernel" not in demo or "Tile plans" not in demo:
            print("FAIL the demo did not print its two parts")
            failures += 1
    total = len(checks) + 12 + with_demo + FILE_CHECKS + BENCH_CHECKS
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
