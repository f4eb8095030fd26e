"""``lit-prunedpo-paper reproduce`` and ``compare``: re-run a published cell on other seeds, say which figures hold.

``reproduce CELL --seeds 30,31,32,33,34 --out NEW`` runs the command stored in ``CELL/cell.json`` again, with only
the seeds and the output folder replaced (and, with ``--designs``, only some of its designs: a cheaper check of
the figures that matter), then compares. ``compare PUBLISHED NEW`` compares two finished cells.

A figure is a design's time saved, step speedup, peak-memory ratio, accuracy change or exact-loss change against
its cell's vanilla (:func:`lit_prunedpo_lab.study.paper_report.compare`), each a mean over seeds with a 95 % interval.
One line per figure both cells hold: the published interval, the new one, and whether they overlap. A figure whose
intervals do not overlap did not reproduce: the exit status is then 1 (0 when every figure overlaps).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: (key in a summarised row, words, format, scale, suffix)
FIGURES = (("time_saved", "time saved", ".0f", 100.0, " %"), ("step_speedup", "step speedup", ".2f", 1.0, "x"),
           ("memory_ratio", "peak memory", ".2f", 1.0, "x"), ("accuracy_change", "accuracy change", "+.3f", 1.0, ""),
           ("loss_change", "exact loss change", "+.4f", 1.0, ""))
#: ``cell`` options the reproduction always replaces (with a value) or drops (flags).
_REPLACED, _DROPPED = ("--seeds", "--out"), ("--resume", "--overwrite", "--quiet")


def stored_argv(cell: Path) -> list[str]:
    """The ``cell`` arguments ``cell/cell.json`` was made with.

    Raises:
        ValueError: naming the file, when it records no ``lit-prunedpo-paper cell`` command.
    """
    from lit_prunedpo_lab.study.outputs import read_json

    stored = read_json(cell / "cell.json", "rerun the cell (lit-prunedpo-paper cell ... --overwrite)")
    command = stored.get("provenance", {}).get("command", "") if isinstance(stored, dict) else ""
    words = shlex.split(command)
    if words[:2] != ["lit-prunedpo-paper", "cell"]:
        raise ValueError(f"{cell / 'cell.json'}: its provenance holds no 'lit-prunedpo-paper cell' command "
                         f"({command!r}); run the cell again by hand on other seeds and use 'compare'")
    return words[1:]


def without_options(argv: Sequence[str], replaced: Sequence[str], dropped: Sequence[str]) -> list[str]:
    """``argv`` less the ``replaced`` options (each with its value, ``--x v`` or ``--x=v``) and the ``dropped`` flags:
    what a reproduction keeps of a stored command before adding its own values."""
    kept, skip = [], False
    for word in argv:
        name = word.split("=", 1)[0]
        if skip:
            skip = False
        elif name in replaced:
            skip = "=" not in word
        elif name not in dropped:
            kept.append(word)
    return kept


def reproduction_argv(argv: Sequence[str], seeds: Sequence[int], out: Path, designs: str | None,
                      resume: bool) -> list[str]:
    """``argv`` (a stored ``cell`` command) with its seeds and output folder replaced, and, when ``designs`` is
    given, its designs (``--pareto`` dropped)."""
    replaced, dropped = _REPLACED + (("--designs",) if designs is not None else ()), _DROPPED + (
        ("--pareto",) if designs is not None else ())
    kept = without_options(argv, replaced, dropped)
    kept += ["--seeds", ",".join(str(s) for s in seeds), "--out", str(out)]
    kept += ["--designs", designs] if designs is not None else []
    return kept + (["--resume"] if resume else [])


#: what the epoch cells' memory probe read on the CPU before the interleaved schedule (records without ``load``)
OLD_MEASURE = "peak RSS (VmHWM reset by clear_refs)"
#: ... and after it (the tensor meter came with the same commits), until records named their measure (2026-12-06)
TENSOR_MEASURE = ("peak CPU tensor storage allocated and held (the CPU allocator's events, as cuda "
                  "max_memory_allocated)")


def memory_measures(cell: Mapping[str, Any]) -> set[str]:
    """The memory measures a cell's records hold; a record that does not name its own was measured on the CPU by
    :data:`OLD_MEASURE` without a ``load`` (before the interleaved schedule), else by :data:`TENSOR_MEASURE`."""
    return {r.get("memory_measure") or (TENSOR_MEASURE if r.get("load") else OLD_MEASURE)
            for r in cell["records"] if r.get("peak_step_mb") is not None}


def figure_lines(published: Mapping[str, Any], new: Mapping[str, Any],
                 measures: tuple[set[str], set[str]] = (set(), set())) -> tuple[list[str], int]:
    """One line per figure both summarised cells hold, and how many did not overlap. Peak-memory figures of
    cells whose ``measures`` differ are shown as not comparable and not counted."""
    from lit_prunedpo_lab.study.paper_report import format_interval

    lines, misses = [], 0
    for label, row in new["rows"].items():
        old = published["rows"].get(label)
        if old is None or label == new["vanilla"]:
            continue
        for key, words, fmt, scale, suffix in FIGURES:
            a, b = old.get(key), row.get(key)
            if a is None or b is None:
                continue
            overlap = b[1] <= a[2] and a[1] <= b[2]
            verdict = "overlaps" if overlap else "DOES NOT OVERLAP"
            if key == "memory_ratio" and measures[0] != measures[1]:
                verdict = (f"not comparable (published: {', '.join(sorted(measures[0]))}; now: "
                           f"{', '.join(sorted(measures[1]))})")
            else:
                misses += not overlap
            lines.append(f"{new['name']} {label} {words}: published {format_interval(a, fmt, scale, suffix)}, now "
                         f"{format_interval(b, fmt, scale, suffix)}: {verdict}")
    return lines, misses


def compare_cells(published: Path, new: Path) -> int:
    """Print the figure lines of two cell folders; 1 if a figure did not reproduce (or none is shared), 2 when a
    folder is not a readable cell, else 0."""
    from lit_prunedpo_lab.study.paper_report import load_cell, summarise_cell

    from lit_prunedpo_lab.study.outputs import Refused

    missing = [str(f) for f in (published, new) if not (f / "cell.json").is_file()]
    if missing:
        print(f"error: not a cell folder (no cell.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        cells = [load_cell(folder) for folder in (published, new)]
        summaries = [summarise_cell(cell) for cell in cells]
    except (Refused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    lines, misses = figure_lines(*summaries, measures=(memory_measures(cells[0]), memory_measures(cells[1])))
    for line in lines:
        print(line)
    if not lines:
        print(f"error: {published} and {new} hold no figure in common (no design of both beside vanilla)",
              file=sys.stderr)
        return 1
    compared = sum(1 for line in lines if ": not comparable (" not in line)
    print(f"{compared - misses} of {compared} comparable figures overlap their published interval", file=sys.stderr)
    return 1 if misses else 0
