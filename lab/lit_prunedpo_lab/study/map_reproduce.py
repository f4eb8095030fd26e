"""``lit-prunedpo-study-map reproduce`` and ``compare``: re-run a published map on other seeds, say which verdicts hold.

``reproduce MAP --seeds 30,31,32,33,34 --out NEW`` runs the command stored in ``MAP/map.json`` again with the
verdict seeds and the output folder replaced (the tuning seeds too with ``--tune-seeds``; the warm-start cache goes
under ``NEW``), then compares. A map run with a spec file keeps a copy beside its records (``spec.yaml``, or
``spec.json``: :func:`keep_spec`); the reproduction reads that copy, since the path the map was given (often a
scratch folder) need not exist any more. ``compare PUBLISHED NEW`` compares two finished maps.

A figure of a map is one (cell, mode) verdict: the pruned arm's time to the loss target over the better vanilla's,
with its 95 % bootstrap interval over seeds ("not reached" counts as infinite). One line per figure both maps
hold: the published verdict and interval, the new one, whether the intervals overlap, and a verdict that turned
(WIN against LOSS) said as such. The exit status is 1 when an interval does not overlap (0 when every one does),
2 when a folder is not a finished map or its stored command cannot be run again.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

#: stored options the reproduction replaces (each with its value) or drops (flags)
_REPLACED, _DROPPED = ("--seeds", "--out", "--work-dir"), ("--resume", "--quiet", "--plan-only")
_PROGRAM = "lit-prunedpo-study-map"


def keep_spec(spec: str | None, out: Path) -> Path | None:
    """Copy the spec file a map runs with into ``out`` (``spec.yaml``, ``spec.json`` for a JSON spec), so that its
    records say what ran; a built-in map (``--spec hh-rlhf``) or none needs no copy. Returns the copy's path."""
    from lit_prunedpo_lab.study.map_spec import SPECS
    from lit_prunedpo_lab.study.outputs import write_atomic

    if spec is None or spec in SPECS:
        return None
    source = Path(spec)
    copy = out / ("spec.json" if source.suffix == ".json" else "spec.yaml")
    if source.resolve() != copy.resolve():
        write_atomic(copy, source.read_text())
    return copy


def stored_argv(folder: Path) -> list[str]:
    """The arguments ``folder/map.json`` was made with, its ``--spec`` pointed at the copy kept in ``folder`` and,
    when it ran without ``--budget``, the budget its plan fitted added: a map fitted to ``--limit-minutes`` would
    otherwise fit another budget to other seeds (or another day's probes), and train other runs.

    Raises:
        ValueError: naming the file, when it records no map command, or its spec file is neither kept beside the
            records nor at the path it was given.
    """
    from lit_prunedpo_lab.study.map_spec import SPECS
    from lit_prunedpo_lab.study.outputs import read_json

    stored = read_json(folder / "map.json", f"run the map again ({_PROGRAM} ... --out {folder})")
    command = stored.get("command", "") if isinstance(stored, dict) else ""
    words = shlex.split(command)
    if words[:1] != [_PROGRAM]:
        raise ValueError(f"{folder / 'map.json'}: it records no '{_PROGRAM}' command ({command!r})")
    argv = words[1:]
    for i, word in enumerate(argv):
        name, _, value = word.partition("=")
        if name != "--spec":
            continue
        at = i if value else i + 1
        spec = value or argv[at]
        kept = [p for p in (folder / "spec.yaml", folder / "spec.json") if p.is_file()]
        if spec in SPECS:
            continue
        if kept:
            argv[at] = f"--spec={kept[0]}" if value else str(kept[0])
        elif not Path(spec).is_file():
            raise ValueError(f"{folder / 'map.json'}: its spec {spec!r} does not exist and no copy (spec.yaml) is "
                             f"kept in {folder}; put the spec there to reproduce the map")
    if not any(word.partition("=")[0] == "--budget" for word in argv):
        budget = (stored.get("plan") or {}).get("budget_s")
        if not isinstance(budget, (int, float)):
            raise ValueError(f"{folder / 'map.json'}: its command gives no --budget and its plan records none "
                             f"(plan.budget_s); add --budget to reproduce it with the same training per run")
        argv += ["--budget", repr(float(budget))]
    return argv


def reproduction_argv(argv: Sequence[str], seeds: Sequence[int], tune_seeds: Sequence[int] | None, out: Path,
                      resume: bool) -> list[str]:
    """``argv`` (a stored map command) with its seeds and output folder replaced (its tuning seeds too, when
    ``tune_seeds`` is given), the warm-start cache under ``out``; ``--resume`` when ``out`` holds a map already."""
    from lit_prunedpo_lab.study.paper_reproduce import without_options

    kept = without_options(argv, _REPLACED + (("--tune-seeds",) if tune_seeds is not None else ()), _DROPPED)
    kept += ["--seeds", ",".join(str(s) for s in seeds)]
    kept += ["--tune-seeds", ",".join(str(s) for s in tune_seeds)] if tune_seeds is not None else []
    kept += ["--out", str(out)]
    return kept + (["--resume"] if resume else [])


def _interval(row: Mapping[str, Any]) -> tuple[float, float]:
    lo, hi = row.get("loss_interval") or (None, None)
    return (math.inf if lo is None else lo, math.inf if hi is None else hi)


def verdict_lines(published: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[list[str], int]:
    """One line per (cell, mode) verdict both ``map.json`` payloads hold, and how many intervals did not overlap."""
    old_rows = {(r["name"], r["mode"]): r for r in published.get("rows", [])}
    lines, misses = [], 0
    for row in new.get("rows", []):
        old = old_rows.get((row["name"], row["mode"]))
        if old is None:
            continue
        (a_lo, a_hi), (b_lo, b_hi) = _interval(old), _interval(row)
        overlap = b_lo <= a_hi and a_lo <= b_hi
        misses += not overlap
        turned = {old["loss_verdict"], row["loss_verdict"]} == {"WIN", "LOSS"}
        lines.append(f"{row['name']} {row['mode']}: published {old['loss_verdict']} {old['loss_text']} vs "
                     f"{old['loss_reference']}, now {row['loss_verdict']} {row['loss_text']} vs "
                     f"{row['loss_reference']}: {'overlaps' if overlap else 'DOES NOT OVERLAP'}"
                     + (" (the verdict turned)" if turned else ""))
    return lines, misses


def tally(payload: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """``payload``'s loss verdicts over the (cell, mode) pairs ``other`` holds too: ``"0 WIN, 18 LOSS, 12 TIE"``."""
    shared = {(r["name"], r["mode"]) for r in other.get("rows", [])}
    verdicts = [r["loss_verdict"] for r in payload.get("rows", []) if (r["name"], r["mode"]) in shared]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in ("WIN", "LOSS", "TIE"))


def compare_maps(published: Path, new: Path) -> int:
    """Print the verdict lines of two map folders and a count; 1 if an interval did not overlap (or no verdict is
    shared), 2 when a folder is not a finished map, else 0."""
    from lit_prunedpo_lab.study.outputs import Refused, read_json

    try:
        payloads = [read_json(folder / "map.json", f"run the map ({_PROGRAM} ... --out {folder})")
                    for folder in (published, new)]
    except (Refused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    unfinished = [f"{folder} ({', '.join(p['unfinished'])} unfinished)"
                  for folder, p in zip((published, new), payloads) if p.get("unfinished")]
    lines, misses = verdict_lines(*payloads)
    for line in lines:
        print(line)
    if not lines:
        print(f"error: {published} and {new} hold no (cell, mode) verdict in common", file=sys.stderr)
        return 1
    print(f"{len(lines) - misses} of {len(lines)} verdicts' intervals overlap the published ones; verdicts "
          f"published {tally(payloads[0], payloads[1])}, now {tally(payloads[1], payloads[0])}"
          + (f"; not finished: {'; '.join(unfinished)}" if unfinished else ""), file=sys.stderr)
    return 1 if misses else 0


def build_parser() -> argparse.ArgumentParser:
    from lit_prunedpo_lab.study.arguments import seed_list

    parser = argparse.ArgumentParser(prog=_PROGRAM, description="Re-run a published map on other seeds, or compare "
                                                                "two maps verdict by verdict.")
    commands = parser.add_subparsers(dest="command", required=True)
    again = commands.add_parser("reproduce", help="re-run a map's stored command on other seeds and compare")
    again.add_argument("map", help="the published map's folder (its map.json)")
    again.add_argument("--seeds", type=seed_list, required=True, help="the new verdict seeds")
    again.add_argument("--tune-seeds", type=seed_list, default=None,
                       help="the new learning-rate sweep's seeds (default: the stored ones)")
    again.add_argument("--out", required=True, help="the new map's folder (resumed if it holds a map already)")
    compare = commands.add_parser("compare", help="say which verdicts of a map another map reproduces")
    compare.add_argument("published", help="the published map's folder")
    compare.add_argument("new", help="the new map's folder")
    return parser


def main(argv: Sequence[str], run_map: Callable[[list[str]], int]) -> int:
    """``reproduce`` or ``compare`` (``argv`` starts with one of them); ``run_map`` runs a map's command line (the
    map command's own ``main``, given rather than imported: the command imports this module)."""
    args = build_parser().parse_args(argv)
    if args.command == "compare":
        return compare_maps(Path(args.published), Path(args.new))
    from lit_prunedpo_lab.study.outputs import Refused

    published, out = Path(args.map), Path(args.out)
    if out.resolve() == published.resolve():
        print(f"error: --out {out} is the published map itself: choose another folder", file=sys.stderr)
        return 2
    try:
        stored = stored_argv(published)
    except (Refused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    argv = reproduction_argv(stored, args.seeds, args.tune_seeds, out, (out / "map.json").exists())
    print(f"running: {shlex.join([_PROGRAM, *argv])}", file=sys.stderr)
    return run_map(argv) or compare_maps(published, out)
