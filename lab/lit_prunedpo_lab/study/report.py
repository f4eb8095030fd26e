"""The study's outputs: ``study.json`` (every evaluation of every run, the calibration, the sweep and the
summary), ``study.md`` (the tables and the verdicts), ``study.png`` (held-out loss and accuracy against
training seconds and against steps, mean over seeds with the min-max band; needs matplotlib, a dependency
of the lab), and ``progress.jsonl``, written as the study goes (:class:`Journal`): a study stopped late keeps what
it measured. :func:`check_writable` proves the output folder usable before any training starts. Reports are
written whole (a temporary file renamed into place) and journal lines are never left half-written
(:mod:`lit_prunedpo_lab.study.outputs`); a file that cannot be written raises an ``OutputError`` naming it (``the disk
is full`` for ENOSPC).

The summary (:mod:`lit_prunedpo_lab.study.report_summary`) applies the protocol of :mod:`lit_prunedpo_lab.study.curves`
(target, censoring, intervals, win rule); ``study.md`` is written by :mod:`lit_prunedpo_lab.study.report_markdown`,
``study.png`` by :mod:`lit_prunedpo_lab.study.report_figure`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo_lab.study.outputs import OutputError, append_line, drop_cut_off_tail, write_atomic
from lit_prunedpo_lab.study.report_figure import plot
from lit_prunedpo_lab.study.report_markdown import to_markdown
from lit_prunedpo_lab.study.report_summary import summarise
from lit_prunedpo_lab.study.runner import Clock, Run


def check_writable(out: Path) -> None:
    """Create ``out`` (and its parents) and write and delete a probe file in it.

    Raises:
        OSError: naming the folder, if it cannot be created or written.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OSError(f"output folder {str(out)!r} cannot be created or written: {exc.strerror or exc}") from exc


class Journal:
    """``progress.jsonl`` under the output folder: one JSON object per line, appended and flushed as each
    thing is measured (the calibration, every evaluation of the sweep and of the study, every finished run).
    Started afresh for each study, its first line naming the command (``keep``: appended to, for a resumed run);
    ``replaced`` says whether an earlier study's file was replaced (the command logs it), ``dropped`` how many bytes
    of a cut-off last line a kept file lost (a run killed while appending it: the next line would be glued on).

    Raises:
        OutputError: naming the file, when a line cannot be written (never left half-written in the file).
    """

    def __init__(self, out: Path, command: str, keep: bool = False) -> None:
        self.path = Path(out) / "progress.jsonl"
        self.replaced = self.path.exists() and not keep
        self.dropped = drop_cut_off_tail(self.path) if keep else 0
        if not keep:
            try:
                self.path.write_text("")
            except OSError as exc:
                raise OutputError.of(self.path, exc) from exc
        self.append("study", command=command)

    def append(self, kind: str, **record: Any) -> None:
        append_line(self.path, json.dumps({"kind": kind, **record}))

    def point(self, phase: str, run: Run, point: Any) -> None:
        self.append("point", phase=phase, arm=run.arm.name, seed=run.seed,
                    lr=run.lr,
                    **vars(point))

    def run(self, phase: str, run: Run) -> None:
        self.append("run", phase=phase, **run.summary())


def warm_start_summary(runs: Sequence[Run]) -> dict[str, Any] | None:
    """Per seed, what its warm start cost and did (``None`` when the study had none)."""
    out: dict[str, Any] = {}
    for run in runs:
        w = run.warm_start
        if w is not None and str(run.seed) not in out:
            out[str(run.seed)] = {"steps": w["steps"], "cpu_s": w["cpu_s"], "wall_s": w["wall_s"],
                                  "reused": w["reused"],
                                  "nll_first": sum(w["losses"][:10]) / len(w["losses"][:10]),
                                  "nll_last": sum(w["losses"][-10:]) / len(w["losses"][-10:]), "path": w["path"]}
    return out or None


def write_report(payload: dict[str, Any], out: Path) -> list[Path]:
    """Write study.json, study.md and (with matplotlib) study.png under ``out``, each whole; returns the paths written.

    Raises:
        OutputError: naming the file that could not be written (the others already written stay).
    """
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "study.json", out / "study.md"]
    write_atomic(written[0], json.dumps(payload, indent=1))
    write_atomic(written[1], to_markdown(payload))
    if plot(payload, out / "study.png"):
        written.append(out / "study.png")
    return written


def payload_of(runs: Sequence[Run], task: dict[str, Any], clock: Clock, budget_s: float, steps: int, evals: int,
               seeds: Sequence[int], eval_pairs: int, command: str, extra: dict[str, Any] | None = None,
               protocol: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole report; ``protocol`` holds :func:`~lit_prunedpo_lab.study.report_summary.summarise`'s keyword arguments
    (share, bootstrap, controls)."""
    return {
        "task": task, "clock": clock, "budget_s": budget_s, "steps": steps, "evals": evals, "seeds": list(seeds),
        "eval_pairs": eval_pairs, "command": command, **(extra or {}),
        "summary": summarise(runs, clock, budget_s, evals, **(protocol or {})),
        "runs": [r.summary() for r in runs],
    }
