"""The load a timing was taken under: the record, the rule that calls it "under load", a meter over a stretch that
only waited, and the bench's and the scaling sweep's reports saying so."""

from __future__ import annotations

import os
import time

import torch

from lit_prunedpo_lab.bench.load import LoadMeter, load_record, under_load
from lit_prunedpo_lab.bench.report import load_lines
from lit_prunedpo_lab.bench.scaling_report import load_lines as scaling_load_lines


def test_the_load_record_and_the_rule_that_says_under_load():
    quiet = load_record(10.0, 9.9, [1.0, 1.1, None], threads=1, turn_steps=1)
    assert quiet["wall_per_cpu"] == 10.0 / 9.9 and quiet["loadavg_mean"] == 1.05
    assert quiet["loadavg_max"] == 1.1 and quiet["cpus"] == os.cpu_count() and under_load(quiet) is None
    waited = load_record(20.0, 10.0, [1.0], threads=1, turn_steps=1)
    assert "wall 2.00x its CPU time" in under_load(waited)
    crowded = load_record(10.0, 10.0, [3.5], threads=1, turn_steps=1)
    assert "load average 3.5 beside its 1 thread(s)" in under_load(crowded)
    assert under_load(None) is None and load_record(1.0, 0.0, [], 1, None)["loadavg_mean"] is None
    # several threads: the wall/CPU ratio also holds the step's serial parts, so only the load average speaks
    assert under_load(load_record(20.0, 10.0, [2.5], threads=2, turn_steps=None)) is None
    assert "load average 3.5 beside its 2 thread(s)" in under_load(load_record(10.0, 10.0, [3.5], 2, None))


def test_a_meter_over_a_stretch_that_only_waited_says_it_waited():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        meter = LoadMeter()
        spin = time.process_time() + 0.02
        while time.process_time() < spin:  # some CPU time, so that the ratio is defined
            pass
        time.sleep(0.3)  # wall time that is not this process's CPU time: what a neighbour on the core causes
        meter.sample()
        record = meter.record()
    finally:
        torch.set_num_threads(threads)
    assert record["torch_threads"] == 1 and record["wall_per_cpu"] > 3 and len(meter.samples) == 2
    assert "its CPU time" in under_load(record)


def test_the_bench_report_states_the_load_and_marks_a_loaded_run():
    quiet = load_record(10.0, 20.0, [2.0], threads=2, turn_steps=None)
    (line,) = load_lines({"load": quiet})
    assert line.startswith("- load: load average 2.00 (max 2.00) beside this process's 2 torch thread(s)")
    assert "wall/CPU 0.50" in line and "under load" not in line
    (loaded,) = load_lines({"load": load_record(10.0, 20.0, [4.5], threads=2, turn_steps=None)})
    assert "**taken under load** (load average 4.5 beside its 2 thread(s)" in loaded
    assert load_lines({}) == []  # a payload from before the bench recorded its load


def test_the_scaling_report_names_the_points_taken_under_load():
    def rows(size, load):
        return [{"sweep": "size", "size": size, "response": 16, "batch": 2, "mode": mode, "load": load}
                for mode in ("vanilla", "branch")]

    quiet, busy = load_record(1.0, 2.0, [2.0], 2, None), load_record(1.0, 2.0, [5.0], 2, None)
    assert scaling_load_lines(rows("xs", quiet) + rows("2xs", None)) == []
    (line,) = scaling_load_lines(rows("xs", quiet) + rows("s", busy))
    assert line.startswith("- **taken under load**: 1 of 2 points, e.g. the size sweep's size s, 16-token responses")


def test_the_retime_script_reruns_a_stored_command_in_place_and_prints_what_moved(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    out = tmp_path / "small"
    command = ["--preset", "small", "--modes", "vanilla,branch", "--references", "online", "--scorers", "plain",
               "--steps", "1", "--warmup", "0", "--threads", "1", "--out", str(out), "--quiet"]
    from lit_prunedpo_lab.bench.cli import main
    assert main(command) == 0
    before = json.loads((out / "bench.json").read_text())
    done = subprocess.run([sys.executable, str(repo / "lab/scripts/retime-benches.py"), str(out)], cwd=repo,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    after = json.loads((out / "bench.json").read_text())
    assert after["command"] == before["command"] and "load" in after
    assert f"## {out}: load average" in done.stdout and "not the same device" not in done.stdout
    (line,) = [row for row in done.stdout.splitlines() if row.startswith("- branch/online/plain/shared: step ")]
    assert f"{before['results'][1]['step_time_s']:.3f} -> {after['results'][1]['step_time_s']:.3f} s" in line
