"""Reproducing a published cell: the stored command re-run with other seeds, one line per figure saying whether the
new interval overlaps the published one (exit 1 when one does not), and the load each cell was timed under."""

from __future__ import annotations

import json

import pytest

from lit_prunedpo_lab.study.paper_cli import main
from lit_prunedpo_lab.study.paper_report import summarise_cell, to_markdown
from lit_prunedpo_lab.study.paper_reproduce import reproduction_argv, stored_argv

QUIET = {"wall_per_cpu": 1.01, "loadavg_mean": 1.1, "loadavg_max": 1.3, "torch_threads": 1, "cpus": 2, "turn_steps": 1}


def _record(design, seed, cpu, accuracy, load=QUIET):
    record = {"design": design, "seed": seed, "train_cpu_s": cpu, "train_wall_s": cpu, "median_step_cpu_s": cpu / 10,
              "peak_step_mb": 100.0, "final_accuracy": accuracy, "final_loss": 0.6}
    return {**record, "load": load} if load is not None else record


def _cell(folder, records, seeds=(0, 1, 2), command="lit-prunedpo-paper cell --task edited --max-rows 48 --out x"):
    folder.mkdir()
    cell = {"name": "c", "task": {}, "vanilla": "vanilla@8", "designs": ["vanilla@8", "branch@8"],
            "provenance": {"command": command, "seeds": list(seeds)}}
    (folder / "cell.json").write_text(json.dumps(cell))
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _records(branch_cpu, seeds=(0, 1, 2), load=QUIET):
    return ([_record("vanilla@8", s, 10.0 + 0.1 * s, 0.6, load) for s in seeds]
            + [_record("branch@8", s, branch_cpu + 0.1 * s, 0.6, load) for s in seeds])


def test_the_stored_command_is_rerun_with_only_seeds_output_and_designs_replaced(tmp_path):
    stored = ["cell", "--task", "hh-rlhf", "--max-rows", "1536", "--designs", "branch;sequence", "--seeds=0,1,2",
              "--out", "/old", "--quiet", "--pareto"]
    assert reproduction_argv(stored, [30, 31], tmp_path, None, resume=False) == [
        "cell", "--task", "hh-rlhf", "--max-rows", "1536", "--designs", "branch;sequence", "--pareto", "--seeds",
        "30,31", "--out", str(tmp_path)]
    assert reproduction_argv(stored, [30, 31], tmp_path, "branch", resume=True) == [
        "cell", "--task", "hh-rlhf", "--max-rows", "1536", "--seeds", "30,31", "--out", str(tmp_path),
        "--designs", "branch", "--resume"]
    folder = _cell(tmp_path / "c", [], command="lit-prunedpo-paper report a --out b")
    with pytest.raises(ValueError, match="holds no 'lit-prunedpo-paper cell' command"):
        stored_argv(folder)


def test_compare_says_for_each_figure_whether_the_intervals_overlap(tmp_path, capsys):
    published = _cell(tmp_path / "published", _records(7.0))
    same = _cell(tmp_path / "same", _records(7.05))
    moved = _cell(tmp_path / "moved", _records(9.0))
    assert main(["compare", str(published), str(same)]) == 0
    out = capsys.readouterr()
    assert "c branch@8 time saved: published 30 % [" in out.out and out.out.count("overlaps") == 5
    assert "5 of 5 comparable figures overlap" in out.err
    assert main(["compare", str(published), str(moved)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[-1] for line in lines[:2]] == ["DOES NOT OVERLAP"] * 2  # time saved, step speedup
    tensors = [{**r, "memory_measure": "peak CPU tensor storage", "peak_step_mb": 50.0 if "branch" in r["design"] else
                100.0} for r in _records(7.05)]
    old = _cell(tmp_path / "old", _records(7.0, load=None))  # before the interleaved schedule: peak RSS
    assert main(["compare", str(old), str(_cell(tmp_path / "tensors", tensors))]) == 0
    out = capsys.readouterr()
    assert ("peak memory: published 1.00x [1.00, 1.00], now 0.50x [0.50, 0.50]: not comparable (published: peak RSS "
            "(VmHWM reset by clear_refs); now: peak CPU tensor storage)") in out.out
    assert "4 of 4 comparable figures overlap" in out.err
    assert main(["compare", str(published), str(tmp_path)]) == 2
    assert "not a cell folder (no cell.json)" in capsys.readouterr().err


def test_the_report_says_how_each_cell_was_timed_and_names_records_taken_under_load(tmp_path):
    loaded = {**QUIET, "wall_per_cpu": 1.8}
    cell = json.loads((_cell(tmp_path / "c", []) / "cell.json").read_text())
    old = [{**r,
            "train_wall_s": r["train_cpu_s"] * (2.0 if r["seed"] == 1 else 1.05)} for r in _records(7.0, load=None)]
    for records, machine, words in (
            (_records(7.0), "",
             "timed in turns of 1 step(s), designs interleaved; wall/CPU median 1.01; load average 1.1"),
            (old, "x86_64 2 CPUs, 1 torch thread(s)", "6 record(s) timed one design after another (before the "
             "interleaved schedule): their ratios move with the load; wall/CPU median 1.05; **taken under load**: 2 "
             "record(s), e.g. vanilla@8 seed 1: wall 2.00x its CPU time"),
            (old, "", "6 record(s) timed one design after another (before the interleaved schedule): their ratios "
             "move with the load\n"),
            (_records(7.0)[:-1] + [_record("branch@8", 2, 7.2, 0.6, loaded)], "",
             "**taken under load**: 1 record(s), e.g. branch@8 seed 2: wall 1.80x its CPU time")):
        summary = summarise_cell({**cell, "records": records, "provenance": {**cell["provenance"], "machine": machine}})
        assert words in to_markdown({"cells": [summary], "table_modes": ["vanilla", "branch"]})


@pytest.mark.slow
def test_reproduce_reruns_a_tiny_cell_on_new_seeds_and_continues_a_stopped_one(tmp_path, capsys):
    published = tmp_path / "published"
    assert main(["cell", "--task", "edited", "--max-rows", "48", "--seeds", "0,1", "--designs", "branch",
                 "--evals", "1", "--probe-steps", "2", "--out", str(published), "--quiet"]) == 0
    again = tmp_path / "again"
    code = main(["reproduce", str(published), "--seeds", "2,3", "--out", str(again)])
    captured = capsys.readouterr()
    assert code in (0, 1) and "running: lit-prunedpo-paper cell --task edited --max-rows 48" in captured.err
    assert len([line for line in captured.out.splitlines() if "edited branch@16 " in line]) == 5
    cell = json.loads((again / "cell.json").read_text())
    assert cell["provenance"]["seeds"] == [2, 3] and cell["steps"] == {"vanilla@16": 3, "branch@16": 3}
    records = [json.loads(line) for line in (again / "records.jsonl").read_text().splitlines()]
    assert sorted({r["seed"] for r in records}) == [2, 3] and all(r["load"]["turn_steps"] == 1 for r in records)
    assert main(["reproduce", str(published), "--seeds", "2,3", "--out", str(again)]) == code
    assert len((again / "records.jsonl").read_text().splitlines()) == 4  # finished: nothing ran again
    assert main(["reproduce", str(published), "--seeds", "2,3", "--out", str(published)]) == 2
    assert "is the published cell itself" in capsys.readouterr().err
