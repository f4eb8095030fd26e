"""One cell of the regime map: its noise model, its study and what ``AutoPruning`` picks in it.

:func:`run_cell` runs in a worker process when the map runs cells side by side (``--jobs`` > 1), so it takes and
returns plain data and writes only under the cell's own folder, each file whole
(:mod:`lit_prunedpo_lab.study.outputs`). A cell reused by ``--resume`` reads its records back instead of running.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import io
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo_lab.study.outputs import OutputError, read_json, write_atomic


def study_argv(out: Path, modes: Sequence[str], opt: dict[str, Any], budget: float, args: argparse.Namespace,
               work_dir: Path,
               memory_budget_mb: float | None = None) -> list[str]:
    """The ``lit-prunedpo-study`` arguments of one cell (with ``--memory-budget-mb`` when the cell has one)."""
    csv = lambda xs: ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)  # noqa: E731
    argv = ["--out", str(out), "--modes", ",".join(modes), "--no-matched", "--budget", f"{budget:g}", "--steps",
            str(opt["steps"]),
            "--evals", str(opt["evals"]), "--seeds", csv(opt["seeds"]), "--tune-seeds", csv(opt["tune_seeds"]),
            "--lr-factors", csv(args.lr_factors), "--calibration-steps", str(opt["calibration_steps"]),
            "--max-eval-pairs", str(opt["max_eval_pairs"]), "--bootstrap", str(args.bootstrap), "--threads",
            str(args.threads),
            "--work-dir", str(work_dir), "--quiet"]
    argv += [] if memory_budget_mb is None else ["--memory-budget-mb", f"{memory_budget_mb:g}"]
    return argv + ([] if args.sweep else ["--no-sweep"])


def run_cell(cell: Any, modes: Sequence[str], opt: dict[str, Any], budget: float, args: argparse.Namespace,
             cell_dir: Path,
             work_dir: Path) -> dict[str, Any]:
    """One cell: the noise model, then the study (or both reused with ``--resume``); its rows, or the error
    (``disk_full``: it could not write a file, the disk being full). Runs in a worker process with ``--jobs`` > 1,
    so it returns plain data and writes only under ``cell_dir``, each file whole."""
    import torch

    from lit_prunedpo_lab.study.map_auto import auto_row, calibrate_cell
    from lit_prunedpo_lab.study.map_report import cell_rows

    torch.set_num_threads(args.threads)
    start = time.process_time()
    reused = args.resume and (cell_dir / "study.json").exists() and (cell_dir / "noise.json").exists()
    remedy = f"delete the folder {cell_dir} to run that cell again"
    try:
        if reused:
            noise = read_json(cell_dir / "noise.json", remedy)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                report, share = measure_noise(cell, modes, opt["seeds"][0], opt["noise_pairs"], opt["noise_draws"],
                                              work_dir)
            noise = {**report, "head_share": share, "seed": opt["seeds"][0]}
            cell_dir.mkdir(parents=True, exist_ok=True)
            (cell_dir / "auto.json").unlink(missing_ok=True)  # a stopped run's, with settings nobody compared
            write_atomic(cell_dir / "noise.json", json.dumps(noise, indent=1))
            # --overwrite: a cell run again replaces the partial records of the run that was stopped in it
            argv = study_argv(cell_dir, modes, opt, budget, args, work_dir, cell.memory_budget_mb)
            run_cell_study(argv + ["--overwrite"], cell.task)
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


def run_cell_study(argv: list[str], task: Any) -> None:
    """The cell's study, through :func:`~lit_prunedpo_lab.study.protocol.run_study`: ``argv`` (:func:`study_argv`) is
    both what the cell's ``study.json`` records (``--resume`` compares it) and what the study is run with, parsed as
    the study's command line parses it; quiet, its report not printed.

    Raises:
        OutputError: the study could not write a file (a full disk).
        Refused: the cell's folder is in use.
        UsageError: the study refused its arguments (argparse's own refusals as ``SystemExit``).
    """
    from lit_prunedpo_lab.study.arguments import build_parser, resolve_options
    from lit_prunedpo_lab.study.cli import task_of
    from lit_prunedpo_lab.study.protocol import run_study

    args = build_parser().parse_args(argv)
    run_study(task_of(args, task), resolve_options(args), out=Path(args.out), overwrite=args.overwrite,
              threads=args.threads, work_dir=args.work_dir, command="lit-prunedpo-study " + " ".join(argv))


def measure_noise(cell: Any, modes: Sequence[str], seed: int, pairs: int, draws: int,
                  work_dir: Path) -> tuple[dict, float]:
    """The cell's noise report (:func:`.noise.measure`) at its initial weights, and its head share."""
    import tempfile

    from lit_prunedpo_lab.bench.cost import ModelDims
    from lit_prunedpo_lab.study.arms import Arm
    from lit_prunedpo_lab.study.map_tasks import head_share
    from lit_prunedpo_lab.study.noise import measure
    from lit_prunedpo_lab.study.runner import make_run
    from lit_prunedpo_lab.study.warm_start import warm_start

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
