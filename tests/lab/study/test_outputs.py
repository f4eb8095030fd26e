"""The study's and the map's output folders (:mod:`lit_prunedpo_lab.study.outputs`): one run at a time (a lock held by
another process is refused, naming it, and dies with it), an earlier study's records refused without --overwrite,
files written whole and journal lines never left half-written when the disk is full (injected ENOSPC everywhere; a
really full tmpfs where this machine may mount one), a cut-off journal line dropped on resume, a corrupt record
named."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import lit_prunedpo_lab.study.outputs as outputs
from helpers import fill_disk
from lit_prunedpo_lab.study.cli import main
from lit_prunedpo_lab.study.outputs import (
    FolderInUse, OutputError, Refused, append_line, folder_lock, read_journal, read_json, write_atomic,
)
from lit_prunedpo_lab.study.report import Journal

TINY_CLI = ["--task", "quickstart", "--max-rows", "120", "--batch-size", "4", "--seeds", "0,1", "--budget", "0.1",
            "--steps", "2", "--evals", "1", "--lr", "0.003", "--calibration-steps", "1", "--bootstrap", "200",
            "--quiet",
            "--modes", "vanilla", "--no-sweep"]
FULL = "disk full (ENOSPC: No space left on device)"

HOLD = """import sys
from pathlib import Path
from lit_prunedpo_lab.study.outputs import folder_lock
with folder_lock(Path(sys.argv[1]), sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path / "out"``'s lock as a running study does; killed (SIGKILL) at the end."""
    out = tmp_path / "out"
    out.mkdir()
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(out), "study"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        yield out, child
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def _error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_lock_held_by_another_process_is_refused_and_dies_with_it(holder):
    out, child = holder
    with pytest.raises(FolderInUse, match=rf"in use by another running study \(process {child.pid} on host "):
        with folder_lock(out, "study"):
            pass
    child.send_signal(signal.SIGKILL)  # a killed study: the kernel drops its lock, nothing stale is left
    child.wait()
    with folder_lock(out, "study"):
        assert (out / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]


def test_a_study_into_a_folder_in_use_is_refused(holder, capsys):
    out, child = holder
    (out / "progress.jsonl").write_text('{"kind": "study", "command": "the running one"}\n')
    assert main(TINY_CLI + ["--out", str(out)]) == 2
    assert _error(capsys) == (f"error: --out {out} is in use by another running study (process {child.pid} on host "
                              f"{socket.gethostname()}; lock file {out / '.lock'}): wait for it to finish, or choose "
                              "another --out")
    assert (out / "progress.jsonl").read_text() == '{"kind": "study", "command": "the running one"}\n'  # untouched


def test_an_earlier_study_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "progress.jsonl").write_text('{"kind": "study", "command": "the earlier one"}\n')
    (out / "study.json").write_text("{}")
    assert main(TINY_CLI + ["--out", str(out)]) == 2
    assert _error(capsys) == (f"error: --out {out} holds an earlier study (progress.jsonl, study.json): choose another "
                              "--out, or pass --overwrite to replace it")
    assert (out / "study.json").read_text() == "{}"
    assert main(TINY_CLI + ["--out", str(out), "--overwrite"]) == 0  # replaced: no record of the earlier one is left
    lines = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert lines[0]["command"].endswith("--overwrite") and [r["kind"] for r in lines].count("study") == 1
    assert json.loads((out / "study.json").read_text())["command"] == lines[0]["command"]
    assert not list(out.glob(".*.tmp*"))


def _enospc_after_half(monkeypatch):
    """``_write_all`` writes half of what it is given, then finds the disk full."""
    real = outputs._write_all

    def half_then_full(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "_write_all", half_then_full)


def test_a_whole_file_write_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "map.json"
    path.write_text('{"old": true}')
    _enospc_after_half(monkeypatch)
    with pytest.raises(OutputError) as raised:
        write_atomic(path, json.dumps({"new": list(range(1000))}))
    assert str(raised.value) == f"cannot write {path}: {FULL}" and raised.value.errno == errno.ENOSPC
    assert path.read_text() == '{"old": true}' and sorted(p.name for p in tmp_path.iterdir()) == ["map.json"]


def test_a_journal_line_on_a_full_disk_is_cut_back_off(tmp_path, monkeypatch):
    journal = Journal(tmp_path, "lit-prunedpo-study-map --out x")
    _enospc_after_half(monkeypatch)
    with pytest.raises(OutputError, match=f"cannot write {tmp_path / 'progress.jsonl'}: disk full"):
        journal.append("plan", budget_s=1.0)
    assert ((tmp_path / "progress.jsonl").read_text() == '{"kind": "study", "command": "lit-prunedpo-study-map --out '
                                                         'x"}\n')


def test_a_cut_off_journal_line_is_dropped_on_resume_and_skipped_when_read(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text('{"kind": "study", "command": "c"}\n{"kind": "plan", "budget_s": 0.5}\n{"kind": "cell", "ce')
    assert read_journal(path) == ([{"kind": "study", "command": "c"}, {"kind": "plan", "budget_s": 0.5}], 1)
    journal = Journal(tmp_path, "resumed", keep=True)
    assert journal.dropped == len('{"kind": "cell", "ce')
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == ["study", "plan", "study"]


def test_a_corrupt_record_is_named(tmp_path):
    path = tmp_path / "study.json"
    path.write_text('{"task": ')
    with pytest.raises(Refused, match=rf"^{path} is corrupt or unreadable \(not valid JSON: .*\); delete it$"):
        read_json(path, "delete it")
    with pytest.raises(Refused, match="missing.json is corrupt or unreadable \\(No such file or directory\\)"):
        read_json(tmp_path / "missing.json", "x")


# A really full disk: a 256 KiB tmpfs filled to the last page (this machine runs as root; skipped where mounting is
# not permitted).
@pytest.fixture
def full_disk(tmpfs):
    mount = tmpfs("256k")
    (mount / "out").mkdir()
    (mount / "out" / "map.json").write_text('{"old": true}')
    fill_disk(mount)
    return mount / "out"


def test_on_a_really_full_disk_files_stay_whole_and_lines_unwritten(full_disk):
    path = full_disk / "map.json"
    with pytest.raises(OutputError, match=f"^cannot write {path}: disk full"):
        write_atomic(path, json.dumps({"new": list(range(1000))}))
    assert path.read_text() == '{"old": true}' and sorted(p.name for p in full_disk.iterdir()) == ["map.json"]
    journal = full_disk / "progress.jsonl"
    journal.write_text("")
    with pytest.raises(OutputError, match="disk full"):
        append_line(journal, json.dumps({"kind": "plan", "cells": "x" * 20000}))
    assert journal.read_text() == ""


def test_a_study_on_a_really_full_disk_says_so_naming_the_file(full_disk, capsys):
    out = full_disk / "study"
    assert main(TINY_CLI + ["--out", str(out)]) == 1
    assert _error(capsys) == f"error: cannot write {out / 'progress.jsonl'}: {FULL}; the study stopped"
    assert (out / "progress.jsonl").read_text() == ""


def test_path_helpers_leave_no_temporary_behind(tmp_path):
    path = write_atomic(tmp_path / "a.json", "{}")
    append_line(tmp_path / "j.jsonl", "{}")
    assert Path(path).read_text() == "{}" and (tmp_path / "j.jsonl").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "j.jsonl"]
