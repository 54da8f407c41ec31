"""bench/cpu/peers.py, the CPU comparison with PyTorch, on small shapes: the
plan it hands the error check (and FlexAttention) is the mask's definition, and
a whole run's results are what it reports (where torch is installed)."""

import json
import pathlib
import sys

import numpy as np
import pytest

import reference
import stsa

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "cpu"))
import peers  # noqa: E402  (from the bench folder)


@pytest.mark.parametrize("density", [0.1, 0.4, 1.0])
def test_the_plans_predicate_is_the_masks_definition(density):
    grid = stsa.VideoGrid(4, 6, 10)  # 240 tokens: a ragged last tile of 64
    lists = stsa.tile_lists(grid, "spatial", density, tile=64)
    band = stsa.plan(grid, "spatial", density, tile=64)["band"]
    rows = torch.arange(grid.tokens)
    got = peers.allowed_rows(torch, peers.plan_tiles(torch, lists), rows, grid.tokens).numpy()
    np.testing.assert_array_equal(got, reference.allowed(grid, "spatial", band=band))


def run(tmp_path, *extra):
    out = tmp_path / "peers.json"
    args = ["--frames", "2", "--height", "4", "--width", "10", "--heads", "2", "--head-dim", "64",
            "--rounds", "2", "--densities", "0.3,0.6", "--out", str(out), *extra]
    assert peers.main(args) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("dtype, bound", [("fp32", 1e-5), ("bf16", 1e-2)])
def test_a_run_reports_every_implementation(tmp_path, capsys, dtype, bound):
    results = run(tmp_path, "--no-flex", "--dtype", dtype)
    names = {"stsa dense", "sdpa dense", "stsa sparse 0.3", "stsa sparse 0.6"}
    assert set(results["impls"]) == names
    for name, rec in results["impls"].items():
        assert len(rec["ms"]) == 2 and rec["median_ms"] > 0, name
        assert 0 < rec["rel_l2"] < bound, name
        dense = name.endswith("dense")
        assert rec["kept_pairs"] == (80 * 80 if dense else stsa.plan(stsa.VideoGrid(2, 4, 10), "spatial",
                                                                         float(name.split()[-1]))["kept_pairs"])
    assert results["impls"]["sdpa dense"]["vs_sdpa_dense"] == 1.0
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in names)


def test_flex_attention_runs_on_the_same_plan(tmp_path):
    results = run(tmp_path, "--dtype", "fp32")
    for density in ("0.3", "0.6"):
        flex, ours = results["impls"][f"flex sparse {density}"], results["impls"][f"stsa sparse {density}"]
        assert flex["rel_l2"] < 1e-5 and ours["rel_l2"] < 1e-5  # both against fp64 under the plan's mask
        assert ours["vs_flex"] == pytest.approx(flex["median_ms"] / ours["median_ms"])


def test_bad_arguments_are_refused_and_no_file_is_replaced(tmp_path):
    existing = tmp_path / "kept.json"
    existing.write_text("mine")
    for bad in (["--densities", "0.2,x"], ["--densities", "0"], ["--rounds", "0"], ["--out", str(existing)],
                ["--densities", "0.25,0.2500001"], ["--out", str(tmp_path / "missing" / "peers.json")]):
        with pytest.raises(SystemExit) as refused:
            peers.main(bad)
        assert refused.value.code == 2, bad
    assert existing.read_text() == "mine"
