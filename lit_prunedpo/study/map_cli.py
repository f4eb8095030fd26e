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
without ``auto.json`` is calibrated for it) and appends to the journal.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo.study.cli import count, factor_list, mode_list, real, seed_list

MAP_DEFAULTS: dict[str, Any] = {"steps": 10, "evals": 5, "max_eval_pairs": 32, "seeds": [0, 1, 2, 3, 4], "tune_seeds": [100],
                                "calibration_steps": 3, "noise_pairs": 16, "noise_draws": 24, "limit_minutes": 90.0}
MAP_QUICK: dict[str, Any] = {"steps": 10, "evals": 3, "max_eval_pairs": 32, "seeds": [0, 1, 2], "tune_seeds": [100],
                             "calibration_steps": 2, "noise_pairs": 8, "noise_draws": 8, "limit_minutes": 5.0, "budget": 1.0}


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
    a("--resume", action="store_true", help="reuse cells already finished under --out")
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
    """Run the map described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status."""
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

    budget = opt["budget"] if opt["budget"] is not None else fit_budget(total, limit_s)
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
    if plan["total_s"] > limit_s:
        parser.error(f"--budget {budget:g}: the planned total {minutes(plan['total_s'])} exceeds --limit-minutes "
                     f"{opt['limit_minutes']:g}; lower --budget (or omit it: the largest that fits is chosen) or raise the limit")
    if args.plan_only:
        print(json.dumps(plan, indent=1))
        return 0

    assert out is not None
    work_dir = Path(args.work_dir) if args.work_dir else out / "work"
    journal = Journal(out, command, keep=args.resume)  # a resumed map's journal goes on after the first run's
    journal.append("plan", **plan)
    wall0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    unfinished: list[str] = []
    study_args = " ".join(study_argv(Path("cells/<cell>"), modes, opt, budget, args, work_dir))

    def finished(cell: Any, result: dict[str, Any]) -> None:
        """Record one cell (in the parent process) and rewrite map.json / map.md with every cell so far."""
        if result.get("error"):
            unfinished.append(cell.name)
            journal.append("cell_failed", cell=cell.name, error=result["error"])
            log(f"cell {cell.name}: FAILED: {result['error']}")
        else:
            if not result["reused"]:
                journal.append("noise", cell=cell.name, **result["noise"])
            journal.append("cell", cell=cell.name, cpu_s=result["cpu_s"], planned_s=planned[cell.name], rows=result["rows"])
            results[cell.name] = result
            log(f"cell {cell.name}: {result['cpu_s']:.0f} CPU-s (planned {planned[cell.name]:.0f}); "
                + "; ".join(f"{r['mode']} {r['loss_verdict']} {r['loss_text']}, predicted {r['prediction']} ({r['agreement']})"
                            for r in result["rows"])
                + "".join(f"; auto: {r['choice']}, {r['loss_text']} of vanilla's time" for r in result["auto_rows"]))
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
            for future in as_completed(futures):
                finished(futures[future], future.result())
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
    """One cell: the noise model, then the study (or both reused with ``--resume``); its rows, or the error.
    Runs in a worker process with ``--jobs`` > 1, so it returns plain data and writes only under ``cell_dir``."""
    import torch

    from lit_prunedpo.study.cli import main as study_main
    from lit_prunedpo.study.map_auto import auto_row, calibrate_cell
    from lit_prunedpo.study.map_report import cell_rows

    torch.set_num_threads(args.threads)
    start = time.process_time()
    reused = args.resume and (cell_dir / "study.json").exists() and (cell_dir / "noise.json").exists()
    try:
        if reused:
            noise = json.loads((cell_dir / "noise.json").read_text())
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                report, share = measure_noise(cell, modes, opt["seeds"][0], opt["noise_pairs"], opt["noise_draws"], work_dir)
            noise = {**report, "head_share": share, "seed": opt["seeds"][0]}
            cell_dir.mkdir(parents=True, exist_ok=True)
            (cell_dir / "noise.json").write_text(json.dumps(noise, indent=1))
            with contextlib.redirect_stdout(io.StringIO()):
                rc = study_main(study_argv(cell_dir, modes, opt, budget, args, work_dir, cell.memory_budget_mb), task=cell.task)
            if rc != 0:
                raise RuntimeError(f"the study exited with status {rc}")
        study = json.loads((cell_dir / "study.json").read_text())
        rows = cell_rows({"name": cell.name, **cell.settings()}, study, noise, noise["head_share"], modes)
        if (cell_dir / "auto.json").exists():
            auto = json.loads((cell_dir / "auto.json").read_text())
        else:  # also for a reused cell that has none: the calibration is seconds, not a study
            with contextlib.redirect_stdout(io.StringIO()):
                auto = calibrate_cell(cell, modes, opt["seeds"][0], work_dir)
            (cell_dir / "auto.json").write_text(json.dumps(auto, indent=1))
        auto_rows = [auto_row({"name": cell.name, **cell.settings()}, study, auto)]
        cpu_s = time.process_time() - start
        if reused and (cell_dir / "cpu_s.json").exists():  # what the cell took when it ran, not its reuse
            cpu_s = json.loads((cell_dir / "cpu_s.json").read_text())["cpu_s"]
        elif not reused:
            (cell_dir / "cpu_s.json").write_text(json.dumps({"cpu_s": cpu_s}))
    except (Exception, SystemExit) as exc:  # one cell's failure is recorded and the map goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "reused": reused, "noise": noise, "rows": rows, "auto_rows": auto_rows, "cpu_s": cpu_s}


if __name__ == "__main__":
    raise SystemExit(main())
