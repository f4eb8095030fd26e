"""The regime map's time plan: what each cell will cost before anything is trained, and the budget that fits.

Each cell is probed (:func:`probe`): its data generated, its model built, two vanilla steps at the cell's batch
timed after one untimed, and one exact evaluation. The steps are the study runner's own
(:meth:`~lit_prunedpo_lab.study.runner.Run.train_step`), so the probe times exactly the step and the clock the study's
budgets are spent on (a Lightning ``Trainer`` would add its hooks to the time). From those measured costs, per cell, in
CPU seconds (:func:`cell_seconds`; upper bounds where an arm's cost is unknown before the calibration: every step priced
as a vanilla step at the cell's batch, every pruned mode assumed to add a cost-matched control):

* arms ``A = 1 + 2 M`` for ``M`` pruned modes; runs ``R = A (F T + S)``: ``F`` learning-rate factors on ``T``
  tuning seeds (0 without the sweep) and ``S`` verdict seeds;
* training ``R (max(budget, steps c) + c)``: a run passes both the time and the step budget, and its last step
  may overshoot;
* evaluation ``R (2 E + 1) e``: at step 0 and at up to ``E`` points of each grid;
* calibration ``(probes + M) (n + 1) (c + g)``, ``g`` = :data:`SETTLE_S` per step for the memory meter's settling;
  a cell with a memory budget adds the peaks of the ``M`` cost-matched controls ``M (n + 1) (c + g)``, every exact
  variant of vanilla and of each pruned mode (``(1 + M) V (n + 1) (2 c + g)``, ``V`` variants:
  :func:`~lit_prunedpo_lab.study.memory.fit_candidates`; a variant priced at twice a vanilla step, checkpointing and the
  chunked scorer's recomputation included) and the memory-fitted vanilla arm's runs (``FT + S``, each step ``2 c``);
  noise model ``(pairs + 1 + M draws) c``; warm start (HH-RLHF cells)
  ``(S + T) W c``; setup: the probe's own time, three times (the noise model and the study build the data and
  model again); the report (``study.json``, ``study.md``, ``study.png``): :data:`REPORT_S`.

:func:`fit_budget` finds the largest budget (0.1 s steps) whose planned total stays within the limit;
:func:`plan_map` probes every cell and plans the whole map (a resumed map keeps its first run's budget).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lit_prunedpo_lab.study.arguments import UsageError
from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.calibrate import vanilla_probe_sizes
from lit_prunedpo_lab.study.memory import fit_candidates
from lit_prunedpo_lab.study.runner import eval_batches, exact_eval, make_run
from lit_prunedpo_lab.study.map_resume import recorded_budget
from lit_prunedpo_lab.study.tasks import StudyTask


REPORT_S = 3.0  # CPU-s to write a cell's study report, its plot included (measured: 1-2 s on a tiny cell)
# CPU-s the memory meter's settling (gc.collect, malloc_trim) adds per calibration step, untimed: measured 0.21 with a
# 64-token cell's data and six runs alive (the collector walks every tokenized row)
SETTLE_S = 0.2


@dataclass(frozen=True)
class Probe:
    """Measured CPU seconds of one cell: a vanilla step at its batch, an exact evaluation, the setup."""

    step_s: float
    eval_s: float
    setup_s: float


@dataclass(frozen=True)
class PlanOptions:
    """What the plan counts: the study's settings for every cell."""

    modes: int
    steps: int
    evals: int
    seeds: int
    tune_seeds: int
    lr_factors: int
    calibration_steps: int
    noise_pairs: int
    noise_draws: int


def probe(task: StudyTask, max_eval_pairs: int | None, seed: int = 0) -> Probe:
    """Time a cell: data and model setup, 1 untimed + 2 timed vanilla steps (their mean), one
    exact evaluation of the held-out pairs the study will evaluate on. CPU seconds (``time.process_time``)."""
    start = time.process_time()
    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-map-") as work_dir:
        dm = task.datamodule(Path(work_dir))
    run = make_run(task, Arm("vanilla", task.batch_size), seed, dm)
    setup = time.process_time() - start
    for _ in range(3):
        run.train_step()
    step = sum(run.step_cpu[1:]) / 2
    batches = eval_batches(dm, max_eval_pairs)
    start = time.process_time()
    exact_eval(run.module, batches)
    return Probe(step, time.process_time() - start, setup)


def cell_seconds(p: Probe, o: PlanOptions, budget: float, batch_size: int, warm_start_steps: int = 0,
                 memory_budget: bool = False) -> float:
    """The planned CPU seconds of one cell (module docstring); ``memory_budget``: the cell has one."""
    arms = 1 + 2 * o.modes
    per_arm = o.lr_factors * o.tune_seeds + o.seeds
    runs = arms * per_arm
    c, g = p.step_s, SETTLE_S
    train = runs * (max(budget, o.steps * c) + c)
    evals = runs * (2 * o.evals + 1) * p.eval_s
    calibration = (len(vanilla_probe_sizes(batch_size)) + o.modes) * (o.calibration_steps + 1) * (c + g)
    if memory_budget:
        variants = len(fit_candidates(Arm("vanilla", batch_size)))
        calibration += o.modes * (o.calibration_steps + 1) * (c + g)
        calibration += (1 + o.modes) * variants * (o.calibration_steps + 1) * (2 * c + g)
        train += per_arm * (max(budget, o.steps * 2 * c) + 2 * c)
        evals += per_arm * (2 * o.evals + 1) * p.eval_s
    noise = (o.noise_pairs + 1 + o.modes * o.noise_draws) * c
    warm = (o.seeds + o.tune_seeds) * warm_start_steps * c
    return train + evals + calibration + noise + warm + 3 * p.setup_s + REPORT_S


def fit_budget(total: Callable[[float], float], limit_s: float, floor: float = 0.1) -> float | None:
    """The largest budget (a multiple of ``floor``) with ``total(budget) <= limit_s``; ``None`` if even ``floor``
    is over. ``total`` must not decrease with the budget."""
    if total(floor) > limit_s:
        return None
    lo, hi = 1, 1
    while total(hi * 2 * floor) <= limit_s and hi < 1_000_000:
        hi *= 2
    hi *= 2
    while hi - lo > 1:  # total(lo * floor) fits, total(hi * floor) does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid * floor) <= limit_s else (lo, mid)
    return round(lo * floor, 10)


def makespan(seconds: Sequence[float], jobs: int) -> float:
    """The wall time of running cells of ``seconds`` on ``jobs`` workers, longest first, each to the least loaded
    worker (what a pool taking cells in order, longest first, does)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}")
    loads = [0.0] * jobs
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def plan_map(cells: Sequence[Any], modes: Sequence[str], opt: Mapping[str, Any], args: argparse.Namespace,
             out: Path | None, log: Callable[[str], None]) -> tuple[float, dict[str, Any]]:
    """Probe every cell and plan the map of ``lit-prunedpo-study-map``'s parsed ``args`` (``opt``: its options with
    the defaults filled in): the training budget per run (``--budget``, a resumed map's first, or the largest that fits
    ``--limit-minutes``) and the plan as ``progress.jsonl`` records it, each cell's line and the total logged.

    Raises:
        UsageError: a cell cannot be probed (its data missing), or the plan cannot fit the limit.
    """
    plan_options = PlanOptions(len(modes), opt["steps"], opt["evals"], len(opt["seeds"]),
                               len(opt["tune_seeds"]) if args.sweep else 0,
                               len(args.lr_factors), opt["calibration_steps"], opt["noise_pairs"], opt["noise_draws"])
    probes = _probe_cells(cells, opt["max_eval_pairs"], log)
    limit_s = 60 * opt["limit_minutes"]
    seconds = {c.name: _cell_seconds(c, probes[c.name], plan_options) for c in cells}

    def total(budget: float) -> float:  # the planned wall time: the longest of --jobs queues
        return makespan([seconds[c.name](budget) for c in cells], args.jobs)

    # a resumed map keeps its first run's budget unless told otherwise: a new fit to freshly timed probes would differ
    inherited = recorded_budget(out) if args.resume and args.budget is None and out is not None else None
    budget = (inherited if inherited is not None else opt["budget"] if opt["budget"] is not None
              else fit_budget(total, limit_s))
    shown = budget if budget is not None else 0.1  # the plan is shown even when it cannot fit
    planned = {c.name: seconds[c.name](shown) for c in cells}
    wall = makespan(list(planned.values()), args.jobs)
    plan = {"budget_s": budget, "limit_min": opt["limit_minutes"], "jobs": args.jobs, "cpu_s": sum(planned.values()),
            "total_s": wall, "total_min": wall / 60,
            "cells": {c.name: {"planned_s": planned[c.name], **dataclasses.asdict(probes[c.name])} for c in cells},
            "options": dataclasses.asdict(plan_options)}
    for c in cells:
        p = probes[c.name]
        log(f"plan {c.name}: vanilla step {p.step_s:.3f} CPU-s at batch {c.task.batch_size}, evaluation {p.eval_s:.3f} "
            f"s, setup {p.setup_s:.1f} s -> {minutes(planned[c.name])}")
    log(f"plan: {len(cells)} cells x modes {','.join(modes)}, budget {shown:g} CPU-s per run, {opt['steps']} steps, "
        f"{len(opt['seeds'])} seeds: planned total {minutes(plan['total_s'])} on {args.jobs} cores "
        f"({minutes(plan['cpu_s'])} of CPU; limit {opt['limit_minutes']:g} min)")
    if budget is None:
        raise UsageError(f"the map cannot fit --limit-minutes {opt['limit_minutes']:g}: even a 0.1 s budget per run "
                         f"plans {minutes(plan['total_s'])}; drop cells, modes or seeds, or raise the limit")
    if inherited is not None:  # the finished cells ran on it: the limit only shaped the first run's plan
        log(f"resume: budget {budget:g} CPU-s per run, the first run's (its plan in {out / 'progress.jsonl'}; --budget "
            "sets another, which finished cells then refuse)")
    elif plan["total_s"] > limit_s:
        raise UsageError(f"--budget {budget:g}: the planned total {minutes(plan['total_s'])} exceeds --limit-minutes "
                         f"{opt['limit_minutes']:g}; lower --budget (or omit it: the largest that fits is chosen) or "
                         "raise the limit")
    return budget, plan


def _probe_cells(cells: Sequence[Any], max_eval_pairs: int, log: Callable[[str], None]) -> dict[str, Probe]:
    """Each cell's probe (:func:`probe`), its setup's printing dropped.

    Raises:
        UsageError: naming a cell that cannot be set up (e.g. HH-RLHF's data file missing), before anything trains.
    """
    log(f"planning: probing {len(cells)} cells (1 untimed + 2 timed vanilla steps and one evaluation each)")
    probes = {}
    for cell in cells:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                probes[cell.name] = probe(cell.task, max_eval_pairs)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cell {cell.name}: {exc}") from None
    return probes


def _cell_seconds(cell: Any, measured: Probe, plan_options: PlanOptions) -> Callable[[float], float]:
    """The planned CPU seconds of ``cell`` as a function of the training budget per run."""
    return lambda budget: cell_seconds(measured, plan_options, budget, cell.task.batch_size, cell.task.warm_start_steps,
                                       cell.memory_budget_mb is not None)
