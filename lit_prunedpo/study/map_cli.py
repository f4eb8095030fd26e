"""``lit-prunedpo-study-map``: the regime map of issue 17, the study's protocol on every cell of a grid.

Examples::

    lit-prunedpo-study-map --plan-only                         # the default map's plan: cells, budget, total
    lit-prunedpo-study-map --out study_results/map             # the default map (13 cells), fitted to 90 min on 2 cores
    lit-prunedpo-study-map --spec hh-rlhf --limit-minutes 60 --out study_results/map-hh
    lit-prunedpo-study-map --quick --out study_results/map-quick
    lit-prunedpo-study-map --spec my-map.yaml --budget 20 --limit-minutes 240 --out study_results/my-map

The grid (:mod:`lit_prunedpo.study.map_spec`): response length, the LM head's share of a step, batch size and
pair similarity on generated tasks with a known best accuracy (:mod:`lit_prunedpo.study.map_tasks`), and
HH-RLHF with longer responses. Before anything trains, every cell is probed and the map's total is planned
(:mod:`lit_prunedpo.study.map_plan`); without ``--budget`` the training budget per run is the largest that
keeps the plan within ``--limit-minutes`` (90; ``--quick``: 5), and a ``--budget`` whose plan exceeds the
limit is refused. Then, per cell:

1. the **noise model** (:mod:`lit_prunedpo.study.noise`) at the cell's initial weights (seed = the first
   verdict seed; for HH-RLHF its warm start): between-pair variance and each mode's extra within-pair
   variance, through the module's own step; and the LM head's share of a vanilla step (cost model);
2. the **study** (``lit-prunedpo-study``'s protocol: calibration with the cost-matched vanilla control,
   learning-rate sweep, seeds, bootstrap intervals, verdicts) with its report under ``--out/cells/<cell>/``;
3. **auto** (:mod:`lit_prunedpo.study.map_auto`): what the ``AutoPruning`` callback's calibration picks in the
   cell, and its time to the loss target against same-batch vanilla, calibration included.

``map.json`` and ``map.md`` (:mod:`lit_prunedpo.study.map_report`) are rewritten after every cell and
``progress.jsonl`` appended (the plan, each cell's noise, each finished or failed cell), so a killed map keeps
its finished cells; ``--resume`` reuses them (a cell with both ``study.json`` and ``noise.json``; a reused cell
without ``auto.json`` is calibrated for it; an unfinished one is run again, replacing its partial records) and
appends to the journal.

**Resuming with other settings** is refused (:func:`resume_conflicts`): a finished cell's settings are read back
from its records (the ``lit-prunedpo-study`` command in ``study.json``, parsed as the study parses it, and the seed,
pairs and draws in ``noise.json``) and compared with the ones this run would give it; any that differ (``--steps``,
``--evals``, seeds, modes, learning-rate factors, bootstrap resamples, threads, the cell's memory budget, noise
pairs or draws...) stop the map before anything runs, naming each ``old -> new``, since reused cells would be
reported under settings they did not run with. Options that change no result (``--jobs``, ``--quiet``,
``--work-dir``, ``--limit-minutes``) do not. Without ``--budget`` a resumed map keeps the first run's budget (its
plan in ``progress.jsonl``), not a new fit to freshly timed probes. A record that is not valid JSON is refused
naming the file (delete that cell's folder to run it again).

**The output folder** (:mod:`lit_prunedpo.study.outputs`) is locked for the whole run (``--out/.lock``): a second
map into it while the first runs is refused, naming the first's process. A folder holding an earlier map
(``progress.jsonl``, ``map.json``, ``cells/``...) is refused without ``--resume``. Every record and report is
written whole (a temporary file renamed into place); a cut-off last line of ``progress.jsonl`` (a kill while
appending) is dropped on resume; a file that cannot be written (a full disk) stops the map with one line naming
it. These errors print ``error: ...``; the exit status is 2 when nothing ran, 1 when the map stopped or a cell
failed.

A memory budget over every arm's measured peak binds nothing: the cell's row and ``map.md`` say so (the memory
axis decides nothing there). A batch of 1 pair is refused by the spec (:mod:`lit_prunedpo.study.map_spec`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import errno
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo.study.cli import count, factor_list, mode_list, real, seed_list
from lit_prunedpo.study.outputs import OutputError, Refused, claim_folder, read_journal, read_json, write_atomic

MAP_DEFAULTS: dict[str, Any] = {"steps": 10, "evals": 5, "max_eval_pairs": 32, "seeds": [0, 1, 2, 3, 4], "tune_seeds": [100],
                                "calibration_steps": 3, "noise_pairs": 16, "noise_draws": 24, "limit_minutes": 90.0}
MAP_QUICK: dict[str, Any] = {"steps": 10, "evals": 3, "max_eval_pairs": 32, "seeds": [0, 1, 2], "tune_seeds": [100],
                             "calibration_steps": 2, "noise_pairs": 8, "noise_draws": 8, "limit_minutes": 5.0, "budget": 1.0}
#: What a map writes under ``--out``; any of them there means an earlier map (refused without ``--resume``).
MAP_FILES = ("progress.jsonl", "map.json", "map.md", "map.png", "cells")
#: ``lit-prunedpo-study`` options that change no result of a cell: where it writes and how much it says.
NOT_RESULTS = frozenset({"out", "work_dir", "quiet", "overwrite"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-study-map",
        description="Run the time-to-quality protocol of lit-prunedpo-study on every cell of a regime map (response length, "
                    "LM head share, batch size, pair similarity), with the noise model's prediction beside each verdict.",
    )
    a = parser.add_argument
    a("--spec", default=None, help="a built-in map (default, quick, hh-rlhf) or a YAML or JSON spec file (modes and blocks; "
                                   "see lit_prunedpo/study/map_spec.py); default: 'default' (--quick: 'quick')")
    a("--modes", type=mode_list, default=None, help="pruned modes, comma-separated (replaces the spec's)")
    a("--quick", action="store_true", help="a map of minutes: the quick spec and " + ", ".join(f"{k} {v}" for k, v in MAP_QUICK.items()))
    a("--budget", type=real(0.0), default=None, help="training CPU-s per run; default: the largest that fits --limit-minutes")
    a("--limit-minutes", type=real(0.0), default=None, help="the planned total may not exceed this (default 90; --quick 5)")
    a("--steps", type=count(1), default=None, help=f"the same-steps budget per run (default {MAP_DEFAULTS['steps']})")
    a("--evals", type=count(1), default=None, help=f"exact evaluations per budget (default {MAP_DEFAULTS['evals']})")
    a("--seeds", type=seed_list, default=None, help="verdict seeds (default 0,1,2,3,4)")
    a("--tune-seeds", type=seed_list, default=None, help="the learning-rate sweep's seeds (default 100)")
    a("--lr-factors", type=factor_list, default=[0.5, 1.0, 2.0], help="the sweep's multiples of each task's rate")
    a("--no-sweep", dest="sweep", action="store_false", help="every arm at the task's rate")
    a("--max-eval-pairs", type=count(1), default=None, help=f"held-out pairs per evaluation (default {MAP_DEFAULTS['max_eval_pairs']})")
    a("--calibration-steps", type=count(1), default=None, help="timed calibration steps per arm (default 3)")
    a("--bootstrap", type=count(100), default=2000, help="bootstrap resamples per interval (default 2000)")
    a("--noise-pairs", type=count(2), default=None, help="pairs of the noise model's batch (default 16)")
    a("--noise-draws", type=count(1), default=None, help="pruned steps per mode in the noise model (default 24)")
    a("--threads", type=count(1), default=1, help="torch threads per cell (default 1)")
    a("--jobs", type=count(1), default=2, help="cells run at once, one process each (default 2: the 2 cores the map is planned "
                                              "for); the plan's wall time is the longest queue's")
    a("--work-dir", default=None, help="warm-start cache (default: --out/work)")
    a("--out", default=None, help="folder for map.json, map.md, progress.jsonl and cells/<cell>/ (required unless --plan-only)")
    a("--plan-only", action="store_true", help="probe the cells, print the plan and stop")
    a("--resume", action="store_true", help="reuse cells already finished under --out (refused if they ran with other "
                                            "settings; without --budget, the first run's budget)")
    a("--quiet", action="store_true", help="no progress lines")
    return parser


def study_argv(out: Path, modes: Sequence[str], opt: dict[str, Any], budget: float, args: argparse.Namespace, work_dir: Path,
               memory_budget_mb: float | None = None) -> list[str]:
    """The ``lit-prunedpo-study`` arguments of one cell (with ``--memory-budget-mb`` when the cell has one)."""
    csv = lambda xs: ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)  # noqa: E731
    argv = ["--out", str(out), "--modes", ",".join(modes), "--no-matched", "--budget", f"{budget:g}", "--steps", str(opt["steps"]),
            "--evals", str(opt["evals"]), "--seeds", csv(opt["seeds"]), "--tune-seeds", csv(opt["tune_seeds"]),
            "--lr-factors", csv(args.lr_factors), "--calibration-steps", str(opt["calibration_steps"]),
            "--max-eval-pairs", str(opt["max_eval_pairs"]), "--bootstrap", str(args.bootstrap), "--threads", str(args.threads),
            "--work-dir", str(work_dir), "--quiet"]
    argv += [] if memory_budget_mb is None else ["--memory-budget-mb", f"{memory_budget_mb:g}"]
    return argv + ([] if args.sweep else ["--no-sweep"])


def cell_settings(study_args: Sequence[str], noise: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a cell's results: its ``lit-prunedpo-study`` arguments as that command parses them (so ``0.2``
    and ``0.20`` agree; options that change no result left out: :data:`NOT_RESULTS`; the sweep's seeds and factors
    only with the sweep), and the noise model's seed, pairs and draws.

    Raises:
        ValueError: if the arguments cannot be parsed.
    """
    from lit_prunedpo.study.cli import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a bad recorded command is reported by the caller
            parsed, _ = parser.parse_known_args(list(study_args))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"its arguments cannot be parsed ({exc})") from None
    settings = {k: v for k, v in vars(parsed).items() if k not in NOT_RESULTS}
    if not settings["sweep"]:
        del settings["tune_seeds"], settings["lr_factors"]
    return {**settings, "noise_seed": noise.get("seed"), "noise_pairs": noise.get("pairs"), "noise_draws": noise.get("draws")}


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
            raise Refused(f"{cell_dir / 'study.json'}: {exc}; delete the folder {cell_dir} to run that cell again") from None
        now = wanted[cell.name]
        changed = [k for k in dict.fromkeys([*had, *now]) if had.get(k) != now.get(k)]
        if changed:
            differing.append(cell.name)
            diffs.update({f"{_option(k)} {_shown(k, had.get(k))} -> {_shown(k, now.get(k))}": None for k in changed})
    if not differing:
        return None
    names = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
    return (f"--resume: {len(differing)} finished cell(s) under {out} ran with other settings than this run's: "
            f"{'; '.join(diffs)} (cells {names}); reusing them would report their results under settings they did not run "
            "with. Resume with the first run's settings, or choose another --out to run the map afresh with these")


def recorded_budget(out: Path) -> float | None:
    """The training budget of the last plan in ``out``'s ``progress.jsonl`` (``None``: no plan recorded)."""
    records, _ = read_journal(out / "progress.jsonl")
    budgets = [r.get("budget_s") for r in records if r.get("kind") == "plan" and isinstance(r.get("budget_s"), (int, float))]
    return float(budgets[-1]) if budgets else None


def claim_map_folder(out: Path, resume: bool, held: contextlib.ExitStack) -> None:
    """Lock ``out`` for this map (held by ``held``); without ``resume`` refuse a folder holding an earlier map.

    Raises:
        Refused: another map runs there (its process named), or an earlier map's outputs are there.
    """
    earlier = claim_folder(out, "map", MAP_FILES, held)
    if earlier and not resume:
        raise Refused(f"--out {out} holds an earlier map ({', '.join(earlier)}): pass --resume to go on with it (with its "
                      "settings), or choose another --out")


def measure_noise(cell: Any, modes: Sequence[str], seed: int, pairs: int, draws: int, work_dir: Path) -> tuple[dict, float]:
    """The cell's noise report (:func:`lit_prunedpo.study.noise.measure`) at its initial weights, and its head share."""
    import tempfile

    from lit_prunedpo.bench.cost import ModelDims
    from lit_prunedpo.study.arms import Arm
    from lit_prunedpo.study.map_tasks import head_share
    from lit_prunedpo.study.noise import measure
    from lit_prunedpo.study.runner import make_run
    from lit_prunedpo.study.warm_start import warm_start

    task = cell.task
    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-map-") as tmp:
        dm = task.datamodule(Path(tmp))
    policy = None
    if task.warm_start_steps > 0:
        # the cell's first warm start (the study reuses it): its progress goes where the study's does
        policy, _ = warm_start(task, seed, dm, work_dir, task.warm_start_steps, lr=task.warm_start_lr,
                               log=lambda line: print(line, file=sys.stderr, flush=True))
    run = make_run(task, Arm("vanilla", task.batch_size), seed, dm, policy=policy)
    share = head_share([b for _, b in zip(range(8), run.loader)], ModelDims.from_model(run.module.policy))
    data = copy.copy(dm)
    data.batch_size, data.seed = pairs, seed
    batch = next(iter(data.train_dataloader()))
    return measure(run.module, batch, modes, draws, seed).as_dict(), share


def main(argv: Sequence[str] | None = None) -> int:
    """Run the map described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status. An output folder
    refused, a resume with other settings or a file that cannot be written is one ``error:`` line (status 2 when
    nothing ran, 1 when the map stopped)."""
    try:
        with contextlib.ExitStack() as held:  # --out's lock, released however the map ends
            return _map(argv, held)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except OutputError as exc:
        print(f"error: {exc}; the map stopped: the finished cells are kept, rerun the same command with --resume once "
              "the file can be written", file=sys.stderr)
        return exc.status


def _map(argv: Sequence[str] | None, held: contextlib.ExitStack) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    defaults = {**MAP_DEFAULTS, **(MAP_QUICK if args.quick else {})}
    opt = {k: getattr(args, k, None) if getattr(args, k, None) is not None else v for k, v in {**defaults, "budget": defaults.get("budget")}.items()}
    if args.sweep and set(opt["tune_seeds"]) & set(opt["seeds"]):
        parser.error(f"--tune-seeds {opt['tune_seeds']} and --seeds {opt['seeds']} overlap: the sweep must run on seeds the verdict does not use")
    if args.out is None and not args.plan_only:
        parser.error("--out is required (the map writes map.json, map.md and every cell's study there); or --plan-only")
    from lit_prunedpo.study.map_spec import load_spec

    try:
        spec = load_spec(args.spec or ("quick" if args.quick else "default"))
    except ValueError as exc:
        parser.error(str(exc))
    modes = args.modes or spec.modes
    if "vanilla" in modes:
        parser.error("--modes: vanilla and its cost-matched control always run; name pruned modes only")
    out = Path(args.out) if args.out else None
    if out is not None:
        from lit_prunedpo.study.report import check_writable

        try:
            check_writable(out)
        except OSError as exc:
            parser.error(f"--out: {exc}")
        if not args.plan_only:  # a plan writes nothing there
            claim_map_folder(out, args.resume, held)
    command = "lit-prunedpo-study-map " + " ".join(sys.argv[1:] if argv is None else argv)

    import torch

    from lit_prunedpo.study.map_plan import PlanOptions, cell_seconds, fit_budget, makespan, minutes, probe
    from lit_prunedpo.study.map_report import write_map
    from lit_prunedpo.study.report import Journal

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    torch.set_num_threads(args.threads)
    plan_options = PlanOptions(len(modes), opt["steps"], opt["evals"], len(opt["seeds"]), len(opt["tune_seeds"]) if args.sweep else 0,
                               len(args.lr_factors), opt["calibration_steps"], opt["noise_pairs"], opt["noise_draws"])
    log(f"planning: probing {len(spec.cells)} cells (1 untimed + 2 timed vanilla steps and one evaluation each)")
    probes = {}
    for cell in spec.cells:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                probes[cell.name] = probe(cell.task, opt["max_eval_pairs"])
        except (OSError, ValueError) as exc:  # e.g. HH-RLHF's data file missing: refused before anything trains
            parser.error(f"cell {cell.name}: {exc}")
    limit_s = 60 * opt["limit_minutes"]

    def total(budget: float) -> float:  # the planned wall time: the longest of --jobs queues
        return makespan([cell_seconds(probes[c.name], plan_options, budget, c.task.batch_size, c.task.warm_start_steps,
                                      c.memory_budget_mb is not None)
                         for c in spec.cells], args.jobs)

    # a resumed map keeps its first run's budget unless told otherwise: a new fit to freshly timed probes would differ
    inherited = recorded_budget(out) if args.resume and args.budget is None and out is not None else None
    budget = inherited if inherited is not None else opt["budget"] if opt["budget"] is not None else fit_budget(total, limit_s)
    shown = budget if budget is not None else 0.1  # the plan is shown even when it cannot fit
    planned = {c.name: cell_seconds(probes[c.name], plan_options, shown, c.task.batch_size, c.task.warm_start_steps,
                                      c.memory_budget_mb is not None) for c in spec.cells}
    wall = makespan(list(planned.values()), args.jobs)
    plan = {"budget_s": budget, "limit_min": opt["limit_minutes"], "jobs": args.jobs, "cpu_s": sum(planned.values()),
            "total_s": wall, "total_min": wall / 60,
            "cells": {c.name: {"planned_s": planned[c.name], **dataclasses.asdict(probes[c.name])} for c in spec.cells},
            "options": dataclasses.asdict(plan_options)}
    for c in spec.cells:
        p = probes[c.name]
        log(f"plan {c.name}: vanilla step {p.step_s:.3f} CPU-s at batch {c.task.batch_size}, evaluation {p.eval_s:.3f} s, "
            f"setup {p.setup_s:.1f} s -> {minutes(planned[c.name])}")
    log(f"plan: {len(spec.cells)} cells x modes {','.join(modes)}, budget {shown:g} CPU-s per run, {opt['steps']} steps, "
        f"{len(opt['seeds'])} seeds: planned total {minutes(plan['total_s'])} on {args.jobs} cores ({minutes(plan['cpu_s'])} of CPU; "
        f"limit {opt['limit_minutes']:g} min)")
    if budget is None:
        parser.error(f"the map cannot fit --limit-minutes {opt['limit_minutes']:g}: even a 0.1 s budget per run plans "
                     f"{minutes(plan['total_s'])}; drop cells, modes or seeds, or raise the limit")
    if inherited is not None:  # the finished cells ran on it: the limit only shaped the first run's plan
        log(f"resume: budget {budget:g} CPU-s per run, the first run's (its plan in {out / 'progress.jsonl'}; --budget "
            "sets another, which finished cells then refuse)")
    elif plan["total_s"] > limit_s:
        parser.error(f"--budget {budget:g}: the planned total {minutes(plan['total_s'])} exceeds --limit-minutes "
                     f"{opt['limit_minutes']:g}; lower --budget (or omit it: the largest that fits is chosen) or raise the limit")
    if args.plan_only:
        print(json.dumps(plan, indent=1))
        return 0

    assert out is not None
    work_dir = Path(args.work_dir) if args.work_dir else out / "work"
    if args.resume:  # before anything is written: a refused resume leaves the folder as it was
        noise_settings = {"seed": opt["seeds"][0], "pairs": opt["noise_pairs"], "draws": opt["noise_draws"]}
        wanted = {c.name: cell_settings(study_argv(out / "cells" / c.name, modes, opt, budget, args, work_dir,
                                                   c.memory_budget_mb), noise_settings) for c in spec.cells}
        conflict = resume_conflicts(spec.cells, out, wanted)
        if conflict:
            raise Refused(conflict)
    journal = Journal(out, command, keep=args.resume)  # a resumed map's journal goes on after the first run's
    if journal.dropped:
        log(f"resume: dropped the cut-off last line of {journal.path} ({journal.dropped} bytes: a write the previous run "
            "did not finish)")
    journal.append("plan", **plan)
    wall0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    unfinished: list[str] = []
    study_args = " ".join(study_argv(Path("cells/<cell>"), modes, opt, budget, args, work_dir))

    def finished(cell: Any, result: dict[str, Any]) -> None:
        """Record one cell (in the parent process) and rewrite map.json / map.md with every cell so far; a cell that
        found the disk full stops the map (every cell after it would fail the same way)."""
        if result.get("error"):
            unfinished.append(cell.name)
            journal.append("cell_failed", cell=cell.name, error=result["error"])
            log(f"cell {cell.name}: FAILED: {result['error']}")
            if result.get("disk_full"):
                raise OutputError(errno.ENOSPC, result["error"])
        else:
            if not result["reused"]:
                journal.append("noise", cell=cell.name, **result["noise"])
            journal.append("cell", cell=cell.name, cpu_s=result["cpu_s"], planned_s=planned[cell.name], rows=result["rows"])
            results[cell.name] = result
            log(f"cell {cell.name}: {result['cpu_s']:.0f} CPU-s (planned {planned[cell.name]:.0f}); "
                + "; ".join(f"{r['mode']} {r['loss_verdict']} {r['loss_text']}, predicted {r['prediction']} ({r['agreement']})"
                            for r in result["rows"])
                + "".join(f"; auto: {r['choice']}, {r['loss_text']} of vanilla's time" for r in result["auto_rows"]))
            if any(r.get("memory_binds") is False for r in result["rows"]):
                log(f"warning: cell {cell.name}: its memory budget binds nothing (every arm's peak is under it): "
                    "the memory axis decides nothing in this cell")
        done = [c for c in spec.cells if c.name in results]
        cpu = sum(results[c.name]["cpu_s"] for c in done)
        if cpu > plan["cpu_s"]:
            log(f"warning: the finished cells took {minutes(cpu)} of CPU, more than the whole map's plan ({minutes(plan['cpu_s'])})")
        write_map({"command": command, "modes": modes, "plan": plan, "rows": [r for c in done for r in results[c.name]["rows"]],
                   "auto_rows": [r for c in done for r in results[c.name]["auto_rows"]],
                   "unfinished": unfinished, "cells_done": len(done), "cells": len(spec.cells), "elapsed_min": cpu / 60,
                   "elapsed_wall_min": (time.perf_counter() - wall0) / 60, "study_args": study_args}, out)

    jobs = [(cell, modes, opt, budget, args, out / "cells" / cell.name, work_dir) for cell in spec.cells]
    if args.jobs == 1:
        for i, job in enumerate(jobs, 1):
            log(f"cell {i}/{len(jobs)} {job[0].name}")
            finished(job[0], run_cell(*job))
    else:  # one process per cell at a time, each on one core (its own torch threads)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            longest_first = sorted(jobs, key=lambda job: -planned[job[0].name])  # as the plan's makespan assumes
            futures = {pool.submit(run_cell, *job): job[0] for job in longest_first}
            try:
                for future in as_completed(futures):
                    finished(futures[future], future.result())
            except BaseException:  # a stopped map starts no more cells (the running ones finish)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    for name in ("map.json", "map.md"):
        log(f"wrote {out / name}")
    print((out / "map.md").read_text())
    if unfinished:
        print(f"error: {len(unfinished)} of {len(spec.cells)} cells failed ({', '.join(unfinished)}): see {out / 'progress.jsonl'}",
              file=sys.stderr)
        return 1
    return 0


def run_cell(cell: Any, modes: Sequence[str], opt: dict[str, Any], budget: float, args: argparse.Namespace, cell_dir: Path,
             work_dir: Path) -> dict[str, Any]:
    """One cell: the noise model, then the study (or both reused with ``--resume``); its rows, or the error
    (``disk_full``: it could not write a file, the disk being full). Runs in a worker process with ``--jobs`` > 1,
    so it returns plain data and writes only under ``cell_dir``, each file whole."""
    import torch

    from lit_prunedpo.study.map_auto import auto_row, calibrate_cell
    from lit_prunedpo.study.map_report import cell_rows

    torch.set_num_threads(args.threads)
    start = time.process_time()
    reused = args.resume and (cell_dir / "study.json").exists() and (cell_dir / "noise.json").exists()
    remedy = f"delete the folder {cell_dir} to run that cell again"
    try:
        if reused:
            noise = read_json(cell_dir / "noise.json", remedy)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                report, share = measure_noise(cell, modes, opt["seeds"][0], opt["noise_pairs"], opt["noise_draws"], work_dir)
            noise = {**report, "head_share": share, "seed": opt["seeds"][0]}
            cell_dir.mkdir(parents=True, exist_ok=True)
            (cell_dir / "auto.json").unlink(missing_ok=True)  # a stopped run's, with settings nobody compared
            write_atomic(cell_dir / "noise.json", json.dumps(noise, indent=1))
            # --overwrite: a cell run again replaces the partial records of the run that was stopped in it
            argv = study_argv(cell_dir, modes, opt, budget, args, work_dir, cell.memory_budget_mb)
            run_study(argv + ["--overwrite"], cell.task)
        study = read_json(cell_dir / "study.json", remedy)
        rows = cell_rows({"name": cell.name, **cell.settings()}, study, noise, noise["head_share"], modes)
        if (cell_dir / "auto.json").exists():
            auto = read_json(cell_dir / "auto.json", remedy)
        else:  # also for a reused cell that has none: the calibration is seconds, not a study
            with contextlib.redirect_stdout(io.StringIO()):
                auto = calibrate_cell(cell, modes, opt["seeds"][0], work_dir)
            write_atomic(cell_dir / "auto.json", json.dumps(auto, indent=1))
        auto_rows = [auto_row({"name": cell.name, **cell.settings()}, study, auto)]
        cpu_s = time.process_time() - start
        if reused and (cell_dir / "cpu_s.json").exists():  # what the cell took when it ran, not its reuse
            cpu_s = read_json(cell_dir / "cpu_s.json", remedy)["cpu_s"]
        elif not reused:
            write_atomic(cell_dir / "cpu_s.json", json.dumps({"cpu_s": cpu_s}))
    except OutputError as exc:
        return {"error": str(exc), "disk_full": exc.errno == errno.ENOSPC}
    except (Exception, SystemExit) as exc:  # one cell's failure is recorded and the map goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "reused": reused, "noise": noise, "rows": rows, "auto_rows": auto_rows, "cpu_s": cpu_s}


def run_study(argv: list[str], task: Any) -> None:
    """The cell's ``lit-prunedpo-study``, its report on stdout dropped; an argument it refuses, or a non-zero exit,
    raised with the study's own error line (argparse prints it to stderr, kept here to name it in the journal).

    Raises:
        OutputError: the study could not write a file (a full disk).
        RuntimeError: the study refused its arguments or failed.
    """
    from lit_prunedpo.study.cli import run

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = run(argv, task=task)
    except (SystemExit, Refused) as exc:
        rc = exc.code if isinstance(exc, SystemExit) else f"{exc.status} ({exc})"
    finally:
        sys.stderr.write(err.getvalue())  # what the study said stays visible
    if rc != 0:
        said = [line for line in err.getvalue().splitlines() if "error:" in line]
        raise RuntimeError(f"the study exited with status {rc}" + (f": {said[-1].strip()}" if said else ""))


if __name__ == "__main__":
    raise SystemExit(main())
