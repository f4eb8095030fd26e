"""``lit-prunedpo-study-map``: the regime map of issue 17, the study's protocol on every cell of a grid.

Examples::

    lit-prunedpo-study-map --plan-only                         # the default map's plan: cells, budget, total
    lit-prunedpo-study-map --out study_results/map             # the default map (15 cells), fitted to 90 min
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
   learning-rate sweep, seeds, bootstrap intervals, verdicts) with its report under ``--out/cells/<cell>/``.

``map.json`` and ``map.md`` (:mod:`lit_prunedpo.study.map_report`) are rewritten after every cell and
``progress.jsonl`` appended (the plan, each cell's noise, each finished or failed cell), so a killed map keeps
its finished cells; ``--resume`` reuses them (a cell with both ``study.json`` and ``noise.json``).
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

MAP_DEFAULTS: dict[str, Any] = {"steps": 20, "evals": 6, "max_eval_pairs": 64, "seeds": [0, 1, 2, 3, 4], "tune_seeds": [100],
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
    a("--spec", default=None, help="a YAML or JSON map spec (modes and blocks; see lit_prunedpo/study/map_spec.py); "
                                   "default: the built-in map of issue 17 (--quick: two tiny cells)")
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
    a("--threads", type=count(1), default=1, help="torch threads (default 1)")
    a("--work-dir", default=None, help="warm-start cache (default: --out/work)")
    a("--out", default=None, help="folder for map.json, map.md, progress.jsonl and cells/<cell>/ (required unless --plan-only)")
    a("--plan-only", action="store_true", help="probe the cells, print the plan and stop")
    a("--resume", action="store_true", help="reuse cells already finished under --out")
    a("--quiet", action="store_true", help="no progress lines")
    return parser


def study_argv(out: Path, modes: Sequence[str], opt: dict[str, Any], budget: float, args: argparse.Namespace, work_dir: Path) -> list[str]:
    """The ``lit-prunedpo-study`` arguments of one cell."""
    csv = lambda xs: ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)  # noqa: E731
    argv = ["--out", str(out), "--modes", ",".join(modes), "--no-matched", "--budget", f"{budget:g}", "--steps", str(opt["steps"]),
            "--evals", str(opt["evals"]), "--seeds", csv(opt["seeds"]), "--tune-seeds", csv(opt["tune_seeds"]),
            "--lr-factors", csv(args.lr_factors), "--calibration-steps", str(opt["calibration_steps"]),
            "--max-eval-pairs", str(opt["max_eval_pairs"]), "--bootstrap", str(args.bootstrap), "--threads", str(args.threads),
            "--work-dir", str(work_dir), "--quiet"]
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
        policy, _ = warm_start(task, seed, dm, work_dir, task.warm_start_steps, lr=task.warm_start_lr)
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
    from lit_prunedpo.study.map_spec import DEFAULT_SPEC, QUICK_SPEC, load_spec, parse_spec

    try:
        spec = load_spec(args.spec) if args.spec else parse_spec(QUICK_SPEC if args.quick else DEFAULT_SPEC, "the built-in map")
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

    from lit_prunedpo.study.cli import main as study_main
    from lit_prunedpo.study.map_plan import PlanOptions, cell_seconds, fit_budget, minutes, probe
    from lit_prunedpo.study.map_report import cell_rows, write_map
    from lit_prunedpo.study.report import Journal

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    torch.set_num_threads(args.threads)
    plan_options = PlanOptions(len(modes), opt["steps"], opt["evals"], len(opt["seeds"]), len(opt["tune_seeds"]) if args.sweep else 0,
                               len(args.lr_factors), opt["calibration_steps"], opt["noise_pairs"], len(modes) and opt["noise_draws"])
    log(f"planning: probing {len(spec.cells)} cells (1 untimed + 2 timed vanilla steps and one evaluation each)")
    probes = {}
    for cell in spec.cells:
        with contextlib.redirect_stdout(io.StringIO()):
            probes[cell.name] = probe(cell.task, opt["max_eval_pairs"])
    limit_s = 60 * opt["limit_minutes"]

    def total(budget: float) -> float:
        return sum(cell_seconds(probes[c.name], plan_options, budget, c.task.batch_size, c.task.warm_start_steps) for c in spec.cells)

    if opt["budget"] is None:
        budget = fit_budget(total, limit_s)
        if budget is None:
            parser.error(f"the map cannot fit --limit-minutes {opt['limit_minutes']:g}: even a 0.1 s budget per run plans "
                         f"{minutes(total(0.1))}; drop cells, modes or seeds, or raise the limit")
    else:
        budget = opt["budget"]
    planned = {c.name: cell_seconds(probes[c.name], plan_options, budget, c.task.batch_size, c.task.warm_start_steps) for c in spec.cells}
    plan = {"budget_s": budget, "limit_min": opt["limit_minutes"], "total_s": sum(planned.values()), "total_min": sum(planned.values()) / 60,
            "cells": {c.name: {"planned_s": planned[c.name], **dataclasses.asdict(probes[c.name])} for c in spec.cells},
            "options": dataclasses.asdict(plan_options)}
    for c in spec.cells:
        p = probes[c.name]
        log(f"plan {c.name}: vanilla step {p.step_s:.3f} CPU-s at batch {c.task.batch_size}, evaluation {p.eval_s:.3f} s -> "
            f"{minutes(planned[c.name])}")
    log(f"plan: {len(spec.cells)} cells x modes {','.join(modes)}, budget {budget:g} CPU-s per run, {opt['steps']} steps, "
        f"{len(opt['seeds'])} seeds: planned total {minutes(plan['total_s'])} (limit {opt['limit_minutes']:g} min)")
    if plan["total_s"] > limit_s:
        parser.error(f"--budget {budget:g}: the planned total {minutes(plan['total_s'])} exceeds --limit-minutes "
                     f"{opt['limit_minutes']:g}; lower --budget (or omit it: the largest that fits is chosen) or raise the limit")
    if args.plan_only:
        print(json.dumps(plan, indent=1))
        return 0

    assert out is not None
    work_dir = Path(args.work_dir) if args.work_dir else out / "work"
    journal = Journal(out, command)
    journal.append("plan", **plan)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rows: list[dict[str, Any]] = []
    unfinished: list[str] = []
    payload: dict[str, Any] = {}
    for i, cell in enumerate(spec.cells, 1):
        cell_dir = out / "cells" / cell.name
        info = {"name": cell.name, **cell.settings()}
        start = time.process_time()
        try:
            if args.resume and (cell_dir / "study.json").exists() and (cell_dir / "noise.json").exists():
                log(f"cell {i}/{len(spec.cells)} {cell.name}: finished before, reused (--resume)")
                noise = json.loads((cell_dir / "noise.json").read_text())
            else:
                log(f"cell {i}/{len(spec.cells)} {cell.name}: noise model ({opt['noise_pairs']} pairs, {opt['noise_draws']} draws per mode)")
                with contextlib.redirect_stdout(io.StringIO()):
                    report, share = measure_noise(cell, modes, opt["seeds"][0], opt["noise_pairs"], opt["noise_draws"], work_dir)
                noise = {**report, "head_share": share, "seed": opt["seeds"][0]}
                cell_dir.mkdir(parents=True, exist_ok=True)
                (cell_dir / "noise.json").write_text(json.dumps(noise, indent=1))
                journal.append("noise", cell=cell.name, **noise)
                log(f"cell {cell.name}: head share {share:.3f}, between {noise['between']:.4g}, within "
                    + ", ".join(f"{m} {w:.4g}" for m, w in noise["within"].items()) + "; study")
                with contextlib.redirect_stdout(io.StringIO()):
                    rc = study_main(study_argv(cell_dir, modes, opt, budget, args, work_dir), task=cell.task)
                if rc != 0:
                    raise RuntimeError(f"the study exited with status {rc}")
            study = json.loads((cell_dir / "study.json").read_text())
            new = cell_rows(info, study, noise, noise["head_share"], modes)
        except (Exception, SystemExit) as exc:  # one cell's failure is recorded and the map goes on
            unfinished.append(cell.name)
            journal.append("cell_failed", cell=cell.name, error=f"{type(exc).__name__}: {exc}")
            log(f"cell {cell.name}: FAILED: {type(exc).__name__}: {exc}")
            continue
        rows += new
        spent = time.process_time() - start
        journal.append("cell", cell=cell.name, cpu_s=spent, planned_s=planned[cell.name], rows=new)
        log(f"cell {cell.name}: {spent:.0f} CPU-s (planned {planned[cell.name]:.0f}); "
            + "; ".join(f"{r['mode']} {r['loss_verdict']} {r['loss_text']}, predicted {r['prediction']} ({r['agreement']})" for r in new))
        payload = {"command": command, "modes": modes, "plan": plan, "rows": rows, "unfinished": unfinished,
                   "cells_done": i, "cells": len(spec.cells), "elapsed_min": (time.process_time() - cpu0) / 60,
                   "elapsed_wall_min": (time.perf_counter() - wall0) / 60,
                   "study_args": " ".join(study_argv(Path("cells/<cell>"), modes, opt, budget, args, work_dir))}
        write_map(payload, out)
    payload = {**payload, "command": command, "modes": modes, "plan": plan, "rows": rows, "unfinished": unfinished,
               "cells": len(spec.cells), "elapsed_min": (time.process_time() - cpu0) / 60,
               "elapsed_wall_min": (time.perf_counter() - wall0) / 60,
               "study_args": " ".join(study_argv(Path("cells/<cell>"), modes, opt, budget, args, work_dir))}
    for path in write_map(payload, out):
        log(f"wrote {path}")
    from lit_prunedpo.study.map_report import to_markdown

    print(to_markdown(payload))
    if unfinished:
        print(f"error: {len(unfinished)} of {len(spec.cells)} cells failed ({', '.join(unfinished)}): see {out / 'progress.jsonl'}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
