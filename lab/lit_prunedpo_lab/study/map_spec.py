"""The regime map's grid: which cells to run and for which modes, read from a small YAML or JSON spec.

A spec names the pruning modes and lists **blocks**; each block is a factorial product of its fields' values
(a scalar is a one-value list), and the map is the union of its blocks' cells::

    modes: [position-coupled, antithetic]
    blocks:
      - {task: generated, length: [16, 64, 256], head_share: [0.03, 0.25, 0.97], similarity: near-duplicate, batch_size:
        8}
      - {task: generated, length: [16, 64, 256], head_share: 0.25, similarity: unrelated, batch_size: 8}
      - {task: hh-rlhf, length: 64, batch_size: 8}

Fields: ``task`` (``generated``: :class:`~lit_prunedpo_lab.study.map_tasks.CellTask`; ``hh-rlhf``: the real pairs,
:func:`~lit_prunedpo_lab.study.map_tasks.hh_cell`), ``length`` (tokens per response), ``batch_size`` (at least 2: at 1
pair a step a cell has no cost-matched control, the noise model no vanilla batch to compare with and
``AutoPruning`` nothing to calibrate on), and for generated cells ``head_share`` (the LM head's share of a vanilla
step's FLOPs) and ``similarity`` (``near-duplicate`` or ``unrelated``); optional for both, ``memory_budget_mb``: a
cap on every arm's measured peak step memory (MiB above the step's start; ``null``: none), the memory axis (the
cell's study runs with ``--memory-budget-mb``: vanilla fitted its fastest exact way,
:mod:`lit_prunedpo_lab.study.memory`). Every cell's task
is built while the spec is read, so an unreachable head share or a bad length is refused before anything runs, with
the spec, block and field in the message. :data:`SPECS` holds the built-in maps, chosen by name: ``default`` (the
regime map, 15 generated cells, 2 with a memory budget), ``quick`` (two small cells) and ``hh-rlhf`` (the real pairs
with 64-token responses).
"""

from __future__ import annotations

import itertools
import math
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from lit_prunedpo_lab.study.arms import MODES
from lit_prunedpo_lab.study.map_tasks import SIMILARITIES, CellTask, hh_cell
from lit_prunedpo_lab.study.tasks import StudyTask

TASK_KINDS = ("generated", "hh-rlhf")
FIELDS = {"generated": ("task", "length", "batch_size", "head_share", "similarity"),
          "hh-rlhf": ("task", "length", "batch_size")}
OPTIONAL = ("memory_budget_mb",)  # fields a block may leave out (every kind)
#: Why a cell needs 2 pairs a step: what a map cell at batch 1 could not conclude.
ONE_PAIR = (" (at 1 pair a step no vanilla batch is smaller, so the cell has no cost-matched control and the noise "
            "model's prediction compares with an impossible batch of 1/k pairs; AutoPruning needs 2 pairs to "
            "calibrate)")

DEFAULT_SPEC: dict[str, Any] = {
    "modes": ["position-coupled", "antithetic"],
    "blocks": [
        # length x head share, near-duplicate pairs: where token sampling should pay (long, light head) and where not;
        # the head-heavy regime is the old HH-RLHF one: at 16 and 64 tokens only (at 256 its evaluations alone cost
        # more than the rest of the map)
        {"task": "generated", "length": [16, 64, 256], "head_share": [0.03, 0.25], "similarity": "near-duplicate",
         "batch_size": 8},
        {"task": "generated", "length": [16, 64], "head_share": 0.97, "similarity": "near-duplicate", "batch_size": 8},
        # pair similarity: unrelated responses, where dropping a whole branch costs least
        {"task": "generated", "length": [16, 64, 256], "head_share": 0.25, "similarity": "unrelated", "batch_size": 8},
        # batch size around the middle cell
        {"task": "generated", "length": 64, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": [4, 32]},
        # memory budgets that bind (the paper's regime): vanilla's peak step memory above the budget, position pruning's
        # near or below it. Peaks measured on this project's CPU machine (peak RSS above the step's start, batch 8):
        # L256 head 0.25: vanilla 104 MB, position-coupled 97, vanilla + accumulation x2 61, chunked 97;
        # L64 head 0.97: vanilla 134 MB, position-coupled 61, vanilla + chunked scorer 36
        {"task": "generated", "length": 256, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": 8,
         "memory_budget_mb": 80},
        {"task": "generated", "length": 64, "head_share": 0.97, "similarity": "near-duplicate", "batch_size": 8,
         "memory_budget_mb": 100},
    ],
}
QUICK_SPEC: dict[str, Any] = {
    "modes": ["position-coupled"],
    "blocks": [
        {"task": "generated", "length": 16, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": 8},
        {"task": "generated", "length": 32, "head_share": 0.25, "similarity": "unrelated", "batch_size": 8},
    ],
}
HH_SPEC: dict[str, Any] = {
    # real pairs with responses 4x the study's hh-rlhf task's (its model: the LM head ~97 % of a step); its warm
    # start (200 steps per seed) and evaluations make it a map of its own
    "modes": ["position-coupled", "antithetic"],
    "blocks": [{"task": "hh-rlhf", "length": 64, "batch_size": 8}],
}
SPECS: dict[str, dict[str, Any]] = {"default": DEFAULT_SPEC, "quick": QUICK_SPEC, "hh-rlhf": HH_SPEC}


@dataclass(frozen=True)
class Cell:
    """One cell of the map: its settings and the study task they make."""

    kind: str
    length: int
    batch_size: int
    head_share: float | None
    similarity: str | None
    task: StudyTask
    memory_budget_mb: float | None = None

    @property
    def name(self) -> str:
        return self.task.name + (f"-mem{self.memory_budget_mb:g}MB" if self.memory_budget_mb is not None else "")

    def settings(self) -> dict[str, Any]:
        return {"task": self.kind, "length": self.length, "batch_size": self.batch_size, "head_share": self.head_share,
                "similarity": self.similarity, "memory_budget_mb": self.memory_budget_mb}


@dataclass(frozen=True)
class MapSpec:
    """The parsed spec: the pruned modes and the cells, in order."""

    modes: list[str]
    cells: list[Cell]


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def number_text(value: Any) -> str:
    """For a string that is a number (``1.0e12``, which YAML 1.1 reads as a string, or a quoted ``"80"``): why it
    is a string and how to write the number; else ``""``."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if "e" in value.lower() and math.isfinite(number):
        return (f": YAML reads {value} as a string (its exponents need a dot in the number and a sign: 1.0e+12, "
                f"not 1e12 or 1.0e12); write {number:.1e}")
    return f": a string; write {value.strip()} without quotes"


def _cell(where: str, settings: Mapping[str, Any]) -> Cell:
    kind = settings["task"]
    length, batch = settings.get("length"), settings.get("batch_size")
    for name, value, low in (("length", length, 2), ("batch_size", batch, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            why = ONE_PAIR if name == "batch_size" else ""
            raise ValueError(f"{where}: {name} must be an integer >= {low}, got {value!r}{why}")
    budget = settings.get("memory_budget_mb")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not 0 < budget < float("inf")):
        raise ValueError(f"{where}: memory_budget_mb must be a number > 0 (MiB of peak step memory) or null, got "
                         f"{budget!r}{number_text(budget)}")
    budget = None if budget is None else float(budget)
    try:
        if kind == "hh-rlhf":
            return Cell(kind, length, batch, None, None, hh_cell(length, batch), budget)
        share, similarity = settings.get("head_share"), settings.get("similarity")
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise ValueError(f"head_share must be a number in (0, 1), got {share!r}{number_text(share)}")
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {similarity!r}")
        task = CellTask(length=length, similarity=similarity, target_head_share=float(share), batch_size=batch)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return Cell(kind, length, batch, float(share), similarity, task, budget)


def parse_spec(spec: Mapping[str, Any], source: str = "the spec") -> MapSpec:
    """Check ``spec`` (see the module docstring) and build its cells.

    Raises:
        ValueError: naming ``source``, the block and the field, on an unknown key, task or mode, a missing or
            bad value, an unreachable head share, or a cell listed twice.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"{source}: expected a mapping with 'modes' and 'blocks', got {type(spec).__name__}")
    unknown = sorted(set(spec) - {"modes", "blocks"})
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown}; a spec has 'modes' and 'blocks'")
    modes = _values(spec.get("modes", []))
    bad = [m for m in modes if m not in MODES or m == "vanilla"]
    if not modes or bad:
        raise ValueError(f"{source}: modes: unknown or empty {bad or modes}; choose pruned modes from "
                         f"{','.join(m for m in MODES if m != 'vanilla')} (vanilla and its controls always run)")
    blocks = spec.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise ValueError(f"{source}: blocks must be a non-empty list of mappings")
    cells: dict[str, tuple[Cell, str]] = {}
    for b, block in enumerate(blocks, 1):
        where = f"{source}, block {b}"
        if not isinstance(block, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {block!r}")
        kind = block.get("task")
        if kind not in TASK_KINDS:
            raise ValueError(f"{where}: task must be one of {', '.join(TASK_KINDS)}, got {kind!r}")
        extra = sorted(set(block) - set(FIELDS[kind]) - set(OPTIONAL))
        missing = sorted(set(FIELDS[kind]) - set(block))
        if extra or missing:
            raise ValueError(f"{where}: a {kind} block has the fields {', '.join(FIELDS[kind])} (optional: "
                             f"{', '.join(OPTIONAL)}); "
                             + (f"unknown {extra}" if extra else "") + ("; " if extra and missing else "")
                             + (f"missing {missing}" if missing else ""))
        axes = {k: _values(v) for k, v in block.items() if k != "task"}
        for k, vs in axes.items():
            if not vs:
                raise ValueError(f"{where}: {k} has no value")
        for combo in itertools.product(*axes.values()):
            settings = {"task": kind, **dict(zip(axes, combo))}
            cell = _cell(f"{where}, cell {settings}", settings)
            if cell.name in cells:
                raise ValueError(f"{where}: cell {cell.name} is already in {cells[cell.name][1]}")
            cells[cell.name] = (cell, f"block {b}")
    return MapSpec(modes, [c for c, _ in cells.values()])


def load_spec(path: str | Path) -> MapSpec:
    """A built-in map by name (:data:`SPECS`), or a YAML or JSON spec file, parsed.

    Raises:
        ValueError: naming the file, if it cannot be read or parsed, or on a bad spec (:func:`parse_spec`).
    """
    if str(path) in SPECS:
        return parse_spec(SPECS[str(path)], f"the built-in map {str(path)!r}")
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"map spec {str(path)!r}: cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text) if path.suffix != ".json" else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValueError(f"map spec {str(path)!r}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{exc}") from None
    return parse_spec(data, f"map spec {str(path)!r}")
