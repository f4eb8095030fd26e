"""Resuming a regime map: reusing its finished cells only with the settings they ran with.

A finished cell (its ``study.json`` and ``noise.json`` both written) is reused by ``lit-prunedpo-study-map
--resume``. Its settings are read back from its records (:func:`cell_settings`: the ``lit-prunedpo-study``
command in ``study.json``, parsed as the study parses it, and the noise model's seed, pairs and draws in
``noise.json``) and compared with the ones this run would give it (:func:`resume_conflicts`): reused cells would
otherwise be reported under settings they did not run with. Options that change no result (:data:`NOT_RESULTS`)
are left out of the comparison. A resumed map keeps its first run's training budget (:func:`recorded_budget`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo_lab.study.outputs import Refused, read_journal, read_json

#: ``lit-prunedpo-study`` options that change no result of a cell: where it writes and how much it says.
NOT_RESULTS = frozenset({"out", "work_dir", "quiet", "overwrite"})


def cell_settings(study_args: Sequence[str], noise: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a cell's results: its ``lit-prunedpo-study`` arguments as that command parses them (so ``0.2``
    and ``0.20`` agree; options that change no result left out: :data:`NOT_RESULTS`; the sweep's seeds and factors
    only with the sweep), and the noise model's seed, pairs and draws.

    Raises:
        ValueError: if the arguments cannot be parsed.
    """
    from lit_prunedpo_lab.study.arguments import build_parser

    parsed = parse_recorded(build_parser(), study_args, "its arguments", known_only=True)
    settings = {k: v for k, v in vars(parsed).items() if k not in NOT_RESULTS}
    if not settings["sweep"]:
        del settings["tune_seeds"], settings["lr_factors"]
    return {**settings, "noise_seed": noise.get("seed"), "noise_pairs": noise.get("pairs"),
            "noise_draws": noise.get("draws")}


def _option(key: str) -> str:
    """How a setting of :func:`cell_settings` is named to the user."""
    names = {"sweep": "the learning-rate sweep", "noise_seed": "the noise model's seed (the first of --seeds)",
             "memory_budget_mb": "the cell's memory budget (--memory-budget-mb, from the spec)"}
    return names.get(key, "--" + key.replace("_", "-"))


def _shown(key: str, value: Any) -> str:
    if key == "sweep":
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def parse_recorded(parser: argparse.ArgumentParser, argv: Sequence[str], what: str,
                   known_only: bool = False) -> argparse.Namespace:
    """``argv``, a recorded command's arguments, parsed by ``parser`` without printing or exiting (a bad recorded
    command is reported by the caller); ``known_only`` leaves arguments ``parser`` does not know aside.

    Raises:
        ValueError: ``{what} cannot be parsed (...)``.
    """
    parser.exit_on_error = False
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            if known_only:
                return parser.parse_known_args(list(argv))[0]
            return parser.parse_args(list(argv))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"{what} cannot be parsed ({exc})") from None


def setting_changes(had: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each setting that differs between ``had`` (a finished run's) and ``now`` (this run's), as
    ``--option OLD -> NEW``, in the order of the keys (``had``'s first)."""
    keys = dict.fromkeys([*had, *now])
    return [f"{_option(k)} {_shown(k, had.get(k))} -> {_shown(k, now.get(k))}"
            for k in keys if had.get(k) != now.get(k)]


def reused_record(cell_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A finished cell's ``study.json`` and ``noise.json`` (``None``: not finished, it runs again), every JSON record
    of it checked readable.

    Raises:
        Refused: naming a file that is not valid JSON (or a ``study.json`` without its command), and that deleting
            the cell's folder runs the cell again.
    """
    if not ((cell_dir / "study.json").exists() and (cell_dir / "noise.json").exists()):
        return None
    remedy = f"delete the folder {cell_dir} to run that cell again"
    study, noise = read_json(cell_dir / "study.json", remedy), read_json(cell_dir / "noise.json", remedy)
    for name in ("auto.json", "cpu_s.json"):
        if (cell_dir / name).exists():
            read_json(cell_dir / name, remedy)
    if not isinstance(study, dict) or not str(study.get("command", "")).startswith("lit-prunedpo-study "):
        raise Refused(f"{cell_dir / 'study.json'} is corrupt (no lit-prunedpo-study command recorded); {remedy}")
    if not isinstance(noise, dict):
        raise Refused(f"{cell_dir / 'noise.json'} is corrupt (not a JSON object); {remedy}")
    return study, noise


def resume_conflicts(cells: Sequence[Any], out: Path, wanted: Mapping[str, dict[str, Any]]) -> str | None:
    """Why the finished cells under ``out`` cannot be reused with this run's settings (``wanted``: per cell name,
    :func:`cell_settings` of the arguments it would run with), as one line; ``None`` when every one matches.

    Raises:
        Refused: a cell's record is corrupt (:func:`reused_record`).
    """
    diffs: dict[str, None] = {}
    differing = []
    for cell in cells:
        cell_dir = out / "cells" / cell.name
        record = reused_record(cell_dir)
        if record is None:
            continue
        study, noise = record
        try:
            had = cell_settings(study["command"].split()[1:], noise)
        except ValueError as exc:
            raise Refused(f"{cell_dir / 'study.json'}: {exc}; delete the folder {cell_dir} to run that cell "
                          "again") from None
        changed = setting_changes(had, wanted[cell.name])
        if changed:
            differing.append(cell.name)
            diffs.update(dict.fromkeys(changed))
    if not differing:
        return None
    names = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
    return (f"--resume: {len(differing)} finished cell(s) under {out} ran with other settings than this run's: "
            f"{'; '.join(diffs)} (cells {names}); reusing them would report their results under settings they did not "
            "run with. Resume with the first run's settings, or choose another --out to run the map afresh with these")


def recorded_budget(out: Path) -> float | None:
    """The training budget of the last plan in ``out``'s ``progress.jsonl`` (``None``: no plan recorded)."""
    records, _ = read_journal(out / "progress.jsonl")
    budgets = [r.get("budget_s") for r in records
               if r.get("kind") == "plan" and isinstance(r.get("budget_s"), (int, float))]
    return float(budgets[-1]) if budgets else None
