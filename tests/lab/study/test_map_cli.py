"""The regime map end to end, on a grid smaller than ``--quick``'s (one 8-token cell, 2 seeds, no sweep, budgets of
0.2 CPU-s): the plan, the noise model, the cell's study, map.json / map.md with one row per (cell, mode) carrying
the verdict, interval, k, head share and prediction, progress.jsonl, and --resume reusing a finished cell through
the worker pool. The
``--quick`` map itself (two cells) plans about 2 minutes; it runs the same code with bigger numbers.

Then what a map refuses or stops on, each one ``error:`` line: a resume with settings that change a cell's results
(options that do not, and an omitted ``--budget``, resume), an earlier map's folder without ``--resume``, a folder
locked by another running process, a corrupt record under ``--resume`` (a stopped cell and a cut-off journal line
are run again / dropped), a batch of 1, and a full disk (injected: stops the map at the cell that found it)."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import socket
import subprocess
import sys

import pytest

import lit_prunedpo_lab.study.map_cells as map_cells
from lit_prunedpo_lab.study.map_cli import main
from lit_prunedpo_lab.study.outputs import OutputError, folder_lock

pytestmark = pytest.mark.slow  # regime maps of tiny trainings: `pytest -m slow` (CI runs it)

SPEC = {"modes": ["position-coupled"], "blocks": [
    {"task": "generated", "length": 8, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": 4}]}
ARGS = ["--quick", "--budget", "0.2", "--steps", "2", "--evals", "2", "--seeds", "0,1", "--no-sweep", "--noise-pairs",
        "4",
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
    assert (row["name"], row["mode"], row["length"], row["batch_size"]) == ("near-duplicate-L8-head0.25-B4",
                                                                            "position-coupled", 8, 4)
    assert row["loss_verdict"] in ("WIN", "TIE", "LOSS") and row["loss_reference"].startswith("vanilla@")
    assert row["head_share"] == pytest.approx(0.25, abs=0.02)
    assert row["k"] > 0 and 1 <= row["cost_matched_batch"] <= 4
    assert row["between"] > 0 and row["within"] > 0
    assert row["variance_budget"] == pytest.approx((row["k"] - 1) * row["between"])
    assert row["prediction"] == ("prune better" if row["within"] < row["variance_budget"] else "vanilla better")
    assert payload["plan"]["budget_s"] == 0.2 and payload["unfinished"] == []
    md = (out / "map.md").read_text()
    assert (f"| {row['name']} | position-coupled |" in md and f"predicted {row['prediction']}; measured "
                                                              f"{row['loss_verdict']}" in md)
    kinds = [json.loads(line)["kind"] for line in (out / "progress.jsonl").read_text().splitlines()]
    assert kinds[:2] == ["study", "plan"] and "noise" in kinds and kinds[-1] == "cell"
    cell = out / "cells" / row["name"]
    assert (cell / "study.json").exists() and (cell / "noise.json").exists()
    # auto: the callback's calibration on the cell, and its time against same-batch vanilla
    (auto,) = payload["auto_rows"]
    decision = json.loads((cell / "auto.json").read_text())
    assert (auto["name"] == row["name"]
            and auto["calibrated_choice"] == decision["choice"] in ("vanilla", "position-coupled"))
    assert [a["mode"] for a in decision["arms"]] == ["vanilla", "position-coupled"] and decision["batch_size"] == 4
    assert auto["forced_calibration_s"] == decision["calibration_cpu_s"] > 0
    # a 0.2-CPU-s run is far too short to repay a calibration: auto trains vanilla, exactly vanilla's times
    assert (auto["choice"], auto["calibrated"], auto["calibration_s"], auto["loss_ratio"],
            auto["met"]) == ("vanilla", False, 0.0, 1.0, True)
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
    assert (kinds.count("study") == 2 and "noise" in kinds[:second] and "noise" not in kinds[second:]
            and kinds[-1] == "cell")
    last = json.loads((out / "progress.jsonl").read_text().splitlines()[-1])
    assert last["cpu_s"] == first_cpu_s


CELL = "near-duplicate-L8-head0.25-B4"


def _copy(finished, tmp_path):
    """A copy of the finished map's folder, for a test that changes it."""
    spec, out = finished
    shutil.copytree(out, tmp_path / "out")
    return spec, tmp_path / "out"


def _error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_resume_with_other_settings_is_refused(finished, tmp_path, capsys):
    spec, out = _copy(finished, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    changed = [a for a in ARGS if a not in ("--quiet",)]
    changed[changed.index("--steps") + 1] = "3"
    changed[changed.index("--seeds") + 1] = "0,2"
    changed[changed.index("--noise-draws") + 1] = "3"
    assert main(["--spec", str(spec), "--out", str(out), "--resume", "--jobs", "1", *changed, "--quiet"]) == 2
    assert _error(capsys) == (
        f"error: --resume: 1 finished cell(s) under {out} ran with other settings than this run's: --seeds 0,1 -> 0,2; "
        f"--steps 2 -> 3; --noise-draws 2 -> 3 (cells {CELL}); reusing them would report their results under settings "
        "they did not run with. Resume with the first run's settings, or choose another --out to run the map afresh "
        "with these")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing written
    # the memory budget of a cell (from the spec) is one of its settings too
    mem = tmp_path / "mem.json"
    mem.write_text(json.dumps({**SPEC, "blocks": [{**SPEC["blocks"][0], "memory_budget_mb": 500}]}))
    shutil.copytree(out / "cells" / CELL, out / "cells" / f"{CELL}-mem500MB")
    assert main(["--spec", str(mem), "--out", str(out), "--resume", *ARGS]) == 2
    assert "the cell's memory budget (--memory-budget-mb, from the spec) none -> 500" in _error(capsys)


def test_resume_ignores_settings_that_change_no_result_and_keeps_the_budget(finished, tmp_path, capsys):
    # no --budget: the first run's (its plan in progress.jsonl), not a new fit; the sweep's factors without the sweep,
    # --jobs, --limit-minutes and the progress lines change nothing a cell computes
    spec, out = _copy(finished, tmp_path)
    rows = json.loads((out / "map.json").read_text())["rows"]
    args = [a for a in ARGS if a != "--quiet"]
    del args[args.index("--budget"):args.index("--budget") + 2]
    assert main(["--spec", str(spec), "--out", str(out), "--resume", "--jobs", "1", "--lr-factors", "1,3",
                 "--limit-minutes",
                 "4", *args]) == 0
    assert "resume: budget 0.2 CPU-s per run, the first run's" in capsys.readouterr().err
    payload = json.loads((out / "map.json").read_text())
    assert payload["rows"] == rows and payload["plan"]["budget_s"] == 0.2


def test_a_folder_with_an_earlier_map_needs_resume(finished, capsys):
    spec, out = finished
    journal = (out / "progress.jsonl").read_bytes()
    assert main(["--spec", str(spec), "--out", str(out), "--jobs", "1", *ARGS]) == 2
    assert _error(capsys) == (f"error: --out {out} holds an earlier map (progress.jsonl, map.json, map.md, map.png, "
                              "cells): pass --resume to go on with it (with its settings), or choose another --out")
    assert (out / "progress.jsonl").read_bytes() == journal


HOLD = """import sys
from pathlib import Path
from lit_prunedpo_lab.study.outputs import folder_lock

with folder_lock(Path(sys.argv[1]), sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def hold_lock(folder, what):
    """A second process holding ``folder``'s lock (as a running study or map does) until its stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), what], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "locked"
    return child


def test_a_map_folder_in_use_by_another_process_is_refused(tmp_path, capsys):
    spec, out = tmp_path / "tiny.json", tmp_path / "out"
    spec.write_text(json.dumps(SPEC))
    out.mkdir()
    child = hold_lock(out, "map")
    try:
        assert main(["--spec", str(spec), "--out", str(out), *ARGS]) == 2
        assert _error(capsys) == (f"error: --out {out} is in use by another running map (process {child.pid} on host "
                                  f"{socket.gethostname()}; lock file {out / '.lock'}): wait for it to finish, or "
                                  "choose another --out")
        assert not (out / "progress.jsonl").exists()
    finally:
        child.send_signal(signal.SIGKILL)  # killed, not closed: the kernel drops its lock
        child.wait()
    with folder_lock(out, "map"):  # nothing stale left behind
        pass


def test_a_corrupt_record_is_named_and_a_stopped_cell_runs_again(finished, tmp_path, capsys):
    spec, out = _copy(finished, tmp_path)
    cell = out / "cells" / CELL
    good = (cell / "study.json").read_text()
    for name in ("study.json", "noise.json"):
        kept = (cell / name).read_text()
        (cell / name).write_text(kept[: len(kept) // 2])  # cut off, as by a tool that does not write whole files
        assert main(["--spec", str(spec), "--out", str(out), "--resume", *ARGS]) == 2
        err = _error(capsys)
        assert err.startswith(f"error: {cell / name} is corrupt or unreadable (not valid JSON: ")
        assert err.endswith(f"); delete the folder {cell} to run that cell again")
        (cell / name).write_text(kept)
    # a cell stopped before its study finished (noise.json and a partial progress.jsonl, no study.json) runs again,
    # its partial records replaced; the map's journal line cut off by the kill is dropped, not glued to the next
    (cell / "study.json").unlink()
    with (out / "progress.jsonl").open("a") as f:
        f.write('{"kind": "cell", "cel')
    assert main(["--spec", str(spec), "--out", str(out), "--resume", "--jobs",
                 "1", *[a for a in ARGS if a != "--quiet"]]) == 0
    assert "resume: dropped the cut-off last line of" in capsys.readouterr().err
    assert all(json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines())
    study = json.loads((cell / "study.json").read_text())
    assert study["command"].endswith("--overwrite") and good != (cell / "study.json").read_text()
    kinds = [json.loads(line)["kind"] for line in (cell / "progress.jsonl").read_text().splitlines()]
    assert kinds.count("study") == 1  # the stopped run's lines are gone


def test_a_batch_of_one_pair_is_refused(tmp_path, capsys):
    spec = tmp_path / "one.json"
    spec.write_text(json.dumps({**SPEC, "blocks": [{**SPEC["blocks"][0], "batch_size": 1}]}))
    with pytest.raises(SystemExit) as exit_:
        main(["--spec", str(spec), "--out", str(tmp_path / "out"), *ARGS])
    assert exit_.value.code == 2
    assert "batch_size must be an integer >= 2, got 1 (at 1 pair a step no vanilla batch is smaller" in _error(capsys)


def test_a_full_disk_stops_the_map_naming_the_file(tmp_path, capsys, monkeypatch):
    # two cells; the first cannot write its noise.json (ENOSPC, injected): the map records it and stops, the second
    # cell never starts, and the error names the file and the full disk
    spec, out = tmp_path / "two.json", tmp_path / "out"
    spec.write_text(json.dumps({**SPEC, "blocks": [{**SPEC["blocks"][0], "length": [8, 12]}]}))
    real = map_cells.write_atomic

    def full(path, text):
        if path.name == "noise.json":
            raise OutputError.of(path, OSError(errno.ENOSPC, "No space left on device"))
        return real(path, text)

    monkeypatch.setattr(map_cells, "write_atomic", full)
    assert main(["--spec", str(spec), "--out", str(out), "--jobs", "1", *ARGS]) == 1
    first = out / "cells" / CELL / "noise.json"  # with --jobs 1 the cells run in the spec's order
    assert _error(capsys) == (f"error: cannot write {first}: disk full (ENOSPC: No space left on device); the map "
                              "stopped: the finished cells are kept, rerun the same command with --resume once the "
                              "file can be written")
    records = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["study", "plan", "cell_failed"] and records[-1]["cell"] == CELL
    assert not (out / "cells" / "near-duplicate-L12-head0.25-B4").exists()


def test_a_full_journal_write_leaves_no_half_line(tmp_path, capsys, monkeypatch):
    # the plan's line hits a full disk half-way (ENOSPC from the write itself): it is cut back off the file
    import lit_prunedpo_lab.study.outputs as outputs

    spec, out = tmp_path / "tiny.json", tmp_path / "out"
    spec.write_text(json.dumps(SPEC))
    real = outputs._write_all

    def half_then_full(fd, data):
        if b'"kind": "plan"' in data:
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(outputs, "_write_all", half_then_full)
    assert main(["--spec", str(spec), "--out", str(out), "--jobs", "1", *ARGS]) == 1
    assert _error(capsys).startswith(f"error: cannot write {out / 'progress.jsonl'}: disk full (ENOSPC")
    text = (out / "progress.jsonl").read_text()
    assert text.endswith("\n") and [json.loads(line)["kind"] for line in text.splitlines()] == ["study"]
