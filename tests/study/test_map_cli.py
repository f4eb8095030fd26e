"""The regime map end to end, on a grid smaller than ``--quick``'s (one 8-token cell, 2 seeds, no sweep, budgets of
0.2 CPU-s): the plan, the noise model, the cell's study, map.json / map.md with one row per (cell, mode) carrying
the verdict, interval, k, head share and prediction, progress.jsonl, and --resume reusing a finished cell through
the worker pool. The
``--quick`` map itself (two cells) plans about 2 minutes; it runs the same code with bigger numbers."""

from __future__ import annotations

import json

import pytest

from lit_prunedpo.study.map_cli import main

SPEC = {"modes": ["position-coupled"], "blocks": [
    {"task": "generated", "length": 8, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": 4}]}
ARGS = ["--quick", "--budget", "0.2", "--steps", "2", "--evals", "2", "--seeds", "0,1", "--no-sweep", "--noise-pairs", "4",
        "--noise-draws", "2", "--calibration-steps", "1", "--max-eval-pairs", "8", "--bootstrap", "100", "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("map")
    spec = root / "tiny.json"
    spec.write_text(json.dumps(SPEC))
    out = root / "out"
    assert main(["--spec", str(spec), "--out", str(out), "--jobs", "1", *ARGS]) == 0
    return spec, out


def test_map_outputs(finished):
    _, out = finished
    payload = json.loads((out / "map.json").read_text())
    (row,) = payload["rows"]
    assert (row["name"], row["mode"], row["length"], row["batch_size"]) == ("near-duplicate-L8-head0.25-B4", "position-coupled", 8, 4)
    assert row["loss_verdict"] in ("WIN", "TIE", "LOSS") and row["loss_reference"].startswith("vanilla@")
    assert row["head_share"] == pytest.approx(0.25, abs=0.02)
    assert row["k"] > 0 and 1 <= row["cost_matched_batch"] <= 4
    assert row["between"] > 0 and row["within"] > 0
    assert row["variance_budget"] == pytest.approx((row["k"] - 1) * row["between"])
    assert row["prediction"] == ("prune better" if row["within"] < row["variance_budget"] else "vanilla better")
    assert payload["plan"]["budget_s"] == 0.2 and payload["unfinished"] == []
    md = (out / "map.md").read_text()
    assert f"| {row['name']} | position-coupled |" in md and f"predicted {row['prediction']}; measured {row['loss_verdict']}" in md
    kinds = [json.loads(line)["kind"] for line in (out / "progress.jsonl").read_text().splitlines()]
    assert kinds[:2] == ["study", "plan"] and "noise" in kinds and kinds[-1] == "cell"
    cell = out / "cells" / row["name"]
    assert (cell / "study.json").exists() and (cell / "noise.json").exists()
    # auto: the callback's calibration on the cell, and its time against same-batch vanilla
    (auto,) = payload["auto_rows"]
    decision = json.loads((cell / "auto.json").read_text())
    assert auto["name"] == row["name"] and auto["calibrated_choice"] == decision["choice"] in ("vanilla", "position-coupled")
    assert [a["mode"] for a in decision["arms"]] == ["vanilla", "position-coupled"] and decision["batch_size"] == 4
    assert auto["forced_calibration_s"] == decision["calibration_cpu_s"] > 0
    # a 0.2-CPU-s run is far too short to repay a calibration: auto trains vanilla, exactly vanilla's times
    assert (auto["choice"], auto["calibrated"], auto["calibration_s"], auto["loss_ratio"], auto["met"]) == ("vanilla", False, 0.0, 1.0, True)
    assert "## auto" in md and f"| {row['name']} | vanilla (skipped, {auto['run_steps']} steps) |" in md
    assert (out / "map.png").stat().st_size > 0
    assert json.loads((cell / "study.json").read_text())["task"]["length"] == 8


def test_resume_reuses_finished_cells(finished):
    # through the worker pool (--jobs 2): the cell goes to a spawned process and comes back as plain data
    spec, out = finished
    before = (out / "cells" / "near-duplicate-L8-head0.25-B4" / "study.json").stat().st_mtime_ns
    rows = json.loads((out / "map.json").read_text())["rows"]
    cell = out / "cells" / "near-duplicate-L8-head0.25-B4"
    first_cpu_s = json.loads((cell / "cpu_s.json").read_text())["cpu_s"]
    (cell / "auto.json").unlink()  # a cell finished before auto was measured: calibrated on resume, not re-run
    assert main(["--spec", str(spec), "--out", str(out), "--resume", "--jobs", "2", *ARGS]) == 0
    payload = json.loads((out / "map.json").read_text())
    assert payload["rows"] == rows and len(payload["auto_rows"]) == 1 and (cell / "auto.json").exists()
    assert (cell / "study.json").stat().st_mtime_ns == before
    # the journal goes on after the first run's lines; the resumed run measured no noise; the cell's CPU time is
    # the one it took when it ran
    kinds = [json.loads(line)["kind"] for line in (out / "progress.jsonl").read_text().splitlines()]
    second = len(kinds) - 1 - kinds[::-1].index("study")
    assert kinds.count("study") == 2 and "noise" in kinds[:second] and "noise" not in kinds[second:] and kinds[-1] == "cell"
    last = json.loads((out / "progress.jsonl").read_text().splitlines()[-1])
    assert last["cpu_s"] == first_cpu_s
