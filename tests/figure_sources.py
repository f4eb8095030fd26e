"""How a figure the pages state is read from the stored result it came from (``tests/test_figures.py``'s table).

Each function takes the loaded result file (a JSON object, or the list of a JSONL file's records) and returns the
figure as the pages write it: a string, or a tuple of strings for a text that states several figures."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

from helpers import REPO

#: 97.5 % quantiles of Student's t by degrees of freedom (the learning script's own table)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


class Figure(NamedTuple):
    """The pages that state a figure, their text with each figure in braces, its result file, how to read it."""
    pages: tuple[str, ...]
    text: str
    source: str
    compute: Callable


@lru_cache(maxsize=None)
def load(path: Path):
    """A result file: JSON, or JSONL as a list of records."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def x(value: float, digits: int = 2) -> str:
    """A ratio as the pages write it: ``2.37x``."""
    return f"{value:.{digits}f}x"


def pct(share: float, digits: int = 0) -> str:
    """A share as a percentage without the sign: ``8`` for 0.0788."""
    return f"{100 * share:.{digits}f}"


# --- lit-prunedpo-bench: bench.json -----------------------------------------------------------------------------

def bench(data: dict, mode: str, reference: str = "online", prompt: str = "shared", scorer: str = "plain") -> dict:
    """The result row of one configuration (`position` is the mode of that name when the file was written: today's
    default since the re-measure of 2026-12-06, `position-bernoulli` in files written before 2026-12-03)."""
    rows = [r for r in data["results"] if (r["mode"], r["reference"], r["prompt"], r["scorer"])
            == (mode, reference, prompt, scorer)]
    assert len(rows) == 1, f"no single {mode}/{reference}/{prompt}/{scorer} row in {data['command']}"
    return rows[0]


def peer(data: dict, name: str = "trl") -> dict:
    """The TRL peer's record (older files keep one under ``peer``)."""
    peers = data.get("peers") or [{"name": "trl", **data["peer"]}]
    return next(p for p in peers if p["name"] == name)


def memory_ratio(data: dict, base: dict, other: dict) -> str:
    """How many times less step memory ``other`` takes than ``base``: ``3.0x``."""
    return x(base["peak_step_memory_mb"] / other["peak_step_memory_mb"], 1)


def spread(record: dict) -> tuple[str, str]:
    """The fastest and the slowest measured step of a configuration or a peer, in seconds: ``0.72``, ``7.08``."""
    return f"{min(record['step_times_s']):.2f}", f"{max(record['step_times_s']):.2f}"


def mib(value: float) -> str:
    return f"{value:,.0f}"


def threads(data: dict) -> str:
    """The torch thread count the run recorded (``... CPU, 2 torch threads``)."""
    return data["device_name"].split(", ")[-1].split()[0]


# --- lit-prunedpo-study-map: map.json, and a cell's study.json -------------------------------------------------

def map_row(data: dict, cell: str, mode: str) -> dict:
    rows = [r for r in data["rows"] if (r["name"], r["mode"]) == (cell, mode)]
    assert len(rows) == 1, f"no single row {cell}/{mode}"
    return rows[0]


def loss_text(cell: str, mode: str):
    """The loss verdict's ratio and interval, ``0.25x [0.20x-0.32x]``, of one (cell, mode)."""
    return lambda data: map_row(data, cell, mode)["loss_text"]


def verdicts(data: dict) -> tuple[str, str, str, str]:
    """Wins, losses, ties and the number of cells of a map."""
    found = [r["loss_verdict"] for r in data["rows"]]
    return (str(found.count("WIN")), str(found.count("LOSS")), str(found.count("TIE")),
            str(len({r["name"] for r in data["rows"]})))


def remeasured(published: str):
    """A re-measured map's wins, losses and ties, and how many of its verdicts' intervals overlap those of the map
    at ``published`` of how many both hold (``lit-prunedpo-study-map compare``'s count)."""
    def compute(data: dict) -> tuple[str, ...]:
        from lit_prunedpo_lab.study.map_reproduce import verdict_lines

        lines, misses = verdict_lines(load(REPO / published), data)
        return (*verdicts(data)[:3], str(len(lines) - misses), str(len(lines)))
    return compute


def ratio_only(compute):
    """The ratio alone of an interval text another helper computes: ``0.42x [0.26x-0.66x]`` -> ``0.42x``."""
    return lambda data: compute(data).split()[0]


def arm_ratio(arm: str, key: str = "loss_time_ratio"):
    """An arm's time to the loss target from a study's summary, ``0.42x [0.26x-0.66x]``."""
    def compute(data: dict) -> str:
        found = [a for a in data["summary"]["arms"] if a["arm"] == arm]
        assert len(found) == 1, f"no single arm {arm}"
        return found[0][key]["interval_text"]
    return compute


# --- lit-prunedpo-paper: paper.json ------------------------------------------------------------------------------

def paper_row(data: dict, cell: str, design: str) -> dict:
    return next(c for c in data["cells"] if c["name"] == cell)["rows"][design]


def interval(triple, fmt: str, suffix: str = "") -> str:
    """``mean [low, high]`` with one format, as the paper's report writes it (``1.51x [1.33, 1.67]``)."""
    mean, low, high = triple
    return f"{mean:{fmt}}{suffix} [{low:{fmt}}, {high:{fmt}}]"


def paper(cell: str, design: str, quantity: str):
    """One quantity of one design as the report and the hand-written tables write it."""
    formats = {"step_speedup": (".2f", "x"), "memory_ratio": (".2f", "x"), "accuracy_change": ("+.3f", ""),
               "accuracy": (".3f", ""), "loss": (".3f", "")}

    def compute(data: dict) -> str:
        row = paper_row(data, cell, design)
        if quantity == "time_saved":
            mean, low, high = (round(100 * v) for v in row["time_saved"])
            return f"{mean} % [{low}, {high}]"
        fmt, suffix = formats[quantity]
        return interval(row[quantity], fmt, suffix)
    return compute


# --- lab/scripts/real-model-learning.py: records.jsonl ---------------------------------------------------------------

def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t-interval, as the learning script computes them."""
    n = len(values)
    mean = sum(values) / n
    half = T975[n - 1] * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def learning(key: str, fmt: str):
    """``0.6676 [0.6536, 0.6816]`` of the runs' last held-out ``key``."""
    def compute(records: list[dict]) -> str:
        mean, low, high = t_interval([r[key] for r in records])
        return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"
    return compute


def reproduced(index: int, design: str, quantity: str):
    """One quantity of one design of the ``index``-th cell of docs/records/paper-results/reproduced/paper.json (two
    cells there share the name ``hh-rlhf``: two runs of it)."""
    def compute(data: dict) -> str:
        named = {"cells": [{**data["cells"][index], "name": "this"}]}
        return paper("this", design, quantity)(named)
    return compute
